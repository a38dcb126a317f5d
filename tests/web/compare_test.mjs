// Browser test of the dashboard's compare view (issue #20, acceptance 4): a
// real ftd, two real ft-workers and two real CPU LoRA jobs with evaluation
// that differ in learning rate; Debian's Chromium (headless, driven by
// playwright-core) checks that
//   1. ticking both jobs on the jobs page enables Compare, and the ticks are
//      kept in the jobs page's URL,
//   2. Compare shows both runs: one loss line and one set of eval loss points
//      per job, with every step's loss equal to ftd's API, both colours drawn
//      on the canvas, and the legend naming both jobs,
//   3. reloading the compare URL restores the same selection,
//   4. "by tokens" puts the runs on the target-token axis (the last x is the
//      job's tokens at its last step), and the URL says so,
//   5. a job id that does not exist gets an error line and the other run is
//      still drawn.
// Screenshots of each stage are written under --out and their paths printed.
//
//   node compare_test.mjs --ftd BIN --worker BIN --ftctl BIN --train BIN
//        --source SRC_DIR --node-modules DIR --out DIR
// Exit status 0 when every check passed, 1 otherwise (the reason and the
// daemon's log tail on stderr).

import path from 'node:path';
import { BrowserTest, Cluster, launchChromium, parseArgs } from './cluster.mjs';

const args = parseArgs(process.argv.slice(2), ['ftd', 'worker', 'ftctl', 'train', 'source', 'node-modules', 'out']);
const STEPS = 40;
const test = new BrowserTest('compare view browser test', args.out);
const check = (condition, message) => test.check(condition, message);

// What the compare page shows, read from the page: the chart's series labels,
// the x values and, per series, the number of finite values and the values;
// the legend's text; and how many canvas pixels have each run's colour.
function readCompare() {
  const chart = window.ftune.charts.compare;
  if (!chart || document.body.dataset.rendered !== 'compare') return null;
  const canvas = chart.ctx.canvas;
  const pixels = chart.ctx.getImageData(0, 0, canvas.width, canvas.height).data;
  const colours = {};
  for (const run of window.ftune.compare.runs) colours[run.colour] = 0;
  const hex = (i) => `#${[0, 1, 2].map((k) => pixels[i + k].toString(16).padStart(2, '0')).join('')}`;
  for (let i = 0; i < pixels.length; i += 4) {
    const c = hex(i);
    if (c in colours) colours[c]++;
  }
  return {
    hash: location.hash,
    // The axis the drawn chart was built for: the hash changes before its hashchange re-renders.
    x: window.ftune.compare.x,
    labels: chart.series.slice(1).map((s) => s.label),
    xs: chart.data[0],
    values: chart.data.slice(1).map((d) => d.filter(Number.isFinite)),
    legend: document.querySelector('.u-legend').textContent,
    runs: [...document.querySelectorAll('ul.runs li')].map((li) => li.dataset.jobId),
    errors: [...document.querySelectorAll('ul.errors li')].map((li) => li.textContent),
    colours,
  };
}

async function main() {
  const cluster = new Cluster({ ftd: args.ftd, worker: args.worker, ftctl: args.ftctl, train: args.train, source: args.source },
    path.join(args.out, 'cluster'), { lease_ms: 3000 });
  test.cluster = cluster;
  test.browser = await launchChromium(args['node-modules']);
  await cluster.startDaemon();
  cluster.startWorker('w1');
  cluster.startWorker('w2');
  const jobs = [['fast', '2.0e-2'], ['slow', '2.0e-3']].map(([name, lr]) => ({
    name,
    id: cluster.ftctl('submit', cluster.writeJob(name, { steps: STEPS, every_steps: 20, eval_every: 10, lr })).split(/\s/)[0],
  }));
  for (const job of jobs) {
    await cluster.waitFor(`${job.id} to succeed`, async () => (await cluster.api(`api/jobs/${job.id}`)).state === 'succeeded', 120000);
    job.points = (await cluster.api(`api/jobs/${job.id}/metrics?limit=1000`)).points;
  }
  check(jobs.every((j) => j.points.length === STEPS), `both jobs ran ${STEPS} steps (${jobs.map((j) => j.id).join(', ')})`);

  const page = await test.browser.newPage({ viewport: { width: 1400, height: 1000 } });
  const pageErrors = [];
  page.on('pageerror', (err) => pageErrors.push(err.message));

  // 1. Tick both jobs on the jobs page; Compare turns on and the URL keeps the ticks.
  await page.goto(`${cluster.url}#/jobs`);
  await page.waitForSelector('body[data-rendered="jobs"]', { timeout: 15000 });
  check((await page.getAttribute('a.compare', 'aria-disabled')) === 'true', 'Compare is off with nothing ticked');
  for (const job of jobs) await page.check(`tr[data-job-id="${job.id}"] .c-pick input`);
  check((await page.getAttribute('a.compare', 'aria-disabled')) === 'false', 'Compare is on with two jobs ticked');
  const sel = new URLSearchParams((await page.evaluate(() => location.hash)).split('?')[1] || '').get('sel');
  check(sel === jobs.map((j) => j.id).join(','), `the jobs page's URL keeps the ticks (sel=${sel})`);
  await test.shot(page, '1-jobs-ticked');

  // 2. Both runs on one chart.
  await page.click('a.compare');
  let view = await test.pageWaitFor(page, 'the compare view with both runs', readCompare,
    (v) => v && v.values.length === 4 && v.values[0].length === STEPS && v.values[2].length === STEPS, 15000);
  const wantHash = `#/compare?jobs=${encodeURIComponent(jobs.map((j) => j.id).join(','))}`;
  check(view.hash === wantHash, `the URL holds the selection (${view.hash})`);
  jobs.forEach((job, i) => {
    const loss = job.points.map((p) => p.loss);
    check(view.values[2 * i].every((v, k) => Math.abs(v - loss[k]) < 1e-9), `${job.name}'s loss line is its ${STEPS} losses from the API`);
    const evals = job.points.filter((p) => Number.isFinite(p.eval_loss)).length;
    check(evals >= 4 && view.values[2 * i + 1].length === evals, `${job.name} has its ${evals} eval loss points`);
    check(view.labels[2 * i].includes(job.name) && view.labels[2 * i].includes(job.id), `the series label names ${job.name} (${job.id})`);
    check(view.legend.includes(`${job.name} (${job.id}) loss`), `the chart's legend names ${job.name}`);
  });
  check(JSON.stringify(view.runs) === JSON.stringify(jobs.map((j) => j.id)), 'the runs list names both jobs');
  const drawn = Object.values(view.colours);
  check(drawn.length === 2 && drawn.every((n) => n > 50), `both runs' colours are drawn on the canvas (${JSON.stringify(view.colours)} pixels)`);
  check(view.xs[view.xs.length - 1] === STEPS, 'the x axis is the step');
  await test.shot(page, '2-compare-by-step');

  // 3. A reload of the URL restores the selection.
  await page.reload();
  view = await test.pageWaitFor(page, 'the compare view after a reload', readCompare,
    (v) => v && v.values.length === 4 && v.values[0].length === STEPS && v.values[2].length === STEPS, 15000);
  check(view.hash === wantHash && JSON.stringify(view.runs) === JSON.stringify(jobs.map((j) => j.id)),
    'reloading the URL shows the same two runs');

  // 4. By target tokens.
  await page.click('a[data-x="tokens"]');
  view = await test.pageWaitFor(page, 'the compare view by tokens', readCompare,
    (v) => v && v.x === 'tokens' && v.hash.includes('x=tokens') && v.values.length === 4 && v.values[0].length === STEPS,
    15000);
  const lastTokens = jobs.map((j) => j.points[j.points.length - 1].tokens);
  check(lastTokens.every((t) => Number.isInteger(t) && t > STEPS), `the API reports tokens per step (${lastTokens})`);
  check(view.xs[view.xs.length - 1] === Math.max(...lastTokens), `the x axis runs to the jobs' tokens (${view.xs[view.xs.length - 1]})`);
  await test.shot(page, '3-compare-by-tokens');

  // 5. An unknown job: an error line naming it, and the known run still drawn.
  await page.goto(`${cluster.url}#/compare?jobs=${jobs[0].id},j-999999`);
  view = await test.pageWaitFor(page, 'the compare view with an unknown job', readCompare,
    (v) => v && v.errors.length === 1 && v.values.length === 2 && v.values[0].length === STEPS, 15000);
  check(view.errors[0].startsWith('j-999999:'), `the unknown job gets an error line (${view.errors[0]})`);
  await test.shot(page, '4-compare-unknown-job');

  check(pageErrors.length === 0, `no JavaScript errors in the page${pageErrors.length ? `: ${pageErrors.join('; ')}` : ''}`);
}

await test.run(main);
