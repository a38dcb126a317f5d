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
//      still drawn,
//   6. (issue #43) a real DPO job's page, opened while the job waited for a
//      worker, shows no Rewards panel until its first step, then draws its
//      rewards live (chosen, rejected, margins, accuracy: every step's values
//      from ftd's API) without a reload; an SFT job's page has none; ftctl
//      status prints the DPO job's newest rewards and nothing of the kind for
//      an SFT job; comparing it with an SFT run adds the rewards/margins chart
//      with the DPO run's line alone (absent when only SFT runs are compared).
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
const DPO_STEPS = 30;
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
    // The rewards/margins chart (DPO runs), null while hidden.
    margins: window.ftune.charts.margins && !document.getElementById('compare-margins').hidden ? {
      labels: window.ftune.charts.margins.series.slice(1).map((s) => s.label),
      values: window.ftune.charts.margins.data.slice(1).map((d) => d.filter(Number.isFinite)),
    } : null,
  };
}

// The job page's Rewards chart: its series labels and finite values, null until it is shown.
function readRewards() {
  const chart = window.ftune.charts.rewards;
  if (!chart || document.getElementById('rewards').hidden) return null;
  return {
    labels: chart.series.slice(1).map((s) => s.label),
    values: chart.data.slice(1).map((d) => d.filter(Number.isFinite)),
    sameDocument: window.__sameDocument === true,
  };
}

// 6b-6c: the DPO job's page drew its rewards live; an SFT job's page has none; ftctl status.
async function checkDpoJob(dpo, page, sft) {
  const { cluster } = test;
  check(dpo.points.length === DPO_STEPS && dpo.points.every((p) => Number.isFinite(p.objective_metrics['rewards/margins'])),
    `the DPO job ${dpo.id} ran ${DPO_STEPS} steps, each with its rewards in the API`);
  const names = ['rewards/chosen', 'rewards/rejected', 'rewards/margins', 'rewards/accuracies'];
  const shown = await test.pageWaitFor(page, 'the Rewards chart with every step', readRewards,
    (v) => v && v.values.every((d) => d.length === DPO_STEPS), 15000);
  check(shown.sameDocument, 'the rewards arrived live: the page was not reloaded');
  check(JSON.stringify(shown.labels) === JSON.stringify(['chosen', 'rejected', 'margins', 'accuracy']),
    `the Rewards chart has chosen, rejected, margins and accuracy (${shown.labels.join(', ')})`);
  names.forEach((name, i) => {
    const api = dpo.points.map((p) => p.objective_metrics[name]);
    check(shown.values[i].every((v, k) => Math.abs(v - api[k]) < 1e-9), `its ${shown.labels[i]} line is the API's ${name} of every step`);
  });
  const first = dpo.points[0].objective_metrics;
  const last = dpo.points[DPO_STEPS - 1].objective_metrics;
  check(last['rewards/margins'] > first['rewards/margins'],
    `the margin rose (${first['rewards/margins'].toFixed(3)} → ${last['rewards/margins'].toFixed(3)})`);
  await test.shotOf(page, '#rewards', '0-dpo-rewards-chart');

  await page.goto(`${cluster.url}#/jobs/${sft.id}`);
  await page.waitForSelector('body[data-rendered="job"]', { timeout: 15000 });
  check(await page.evaluate(() => document.getElementById('rewards').hidden && window.ftune.charts.rewards === null),
    `the SFT job ${sft.id}'s page has no Rewards panel`);

  const status = cluster.ftctl('status', dpo.id);
  const want = `rewards   margins ${last['rewards/margins'].toFixed(4)}, accuracies ${last['rewards/accuracies'].toFixed(4)}, ` +
    `chosen ${last['rewards/chosen'].toFixed(4)}, rejected ${last['rewards/rejected'].toFixed(4)}`;
  check(status.includes(want), `ftctl status ${dpo.id} prints the newest step's rewards: "${want}"`);
  check(/^logps +chosen -?\d/m.test(status), 'and its log-probabilities');
  const sftStatus = cluster.ftctl('status', sft.id);
  check(!/rewards|logps/.test(sftStatus), `ftctl status ${sft.id} (SFT) prints no rewards`);
}

async function main() {
  const cluster = new Cluster({ ftd: args.ftd, worker: args.worker, ftctl: args.ftctl, train: args.train, source: args.source },
    path.join(args.out, 'cluster'), { lease_ms: 3000 });
  test.cluster = cluster;
  test.browser = await launchChromium(args['node-modules']);
  await cluster.startDaemon();
  const pageErrors = [];
  // 6a. The DPO job, submitted before any worker joins: its page renders with no step and no
  // Rewards panel, so every reward it draws later came live through the stream.
  const dpo = { name: 'dpo', id: cluster.ftctl('submit', cluster.writeDpoJob('dpo', { steps: DPO_STEPS, every_steps: 15 })).split(/\s/)[0] };
  const dpoPage = await test.browser.newPage({ viewport: { width: 1400, height: 1000 } });
  dpoPage.on('pageerror', (err) => pageErrors.push(err.message));
  await dpoPage.goto(`${cluster.url}#/jobs/${dpo.id}`);
  await dpoPage.waitForSelector('body[data-rendered="job"]', { timeout: 15000 });
  check(await dpoPage.evaluate(() => {
    window.__sameDocument = true;  // kept until a reload
    return document.body.dataset.items === '0' && document.getElementById('rewards').hidden && window.ftune.charts.rewards === null;
  }), `${dpo.id}'s page shows no step and no Rewards panel before a worker joins`);

  cluster.startWorker('w1');
  cluster.startWorker('w2');
  const jobs = [['fast', '2.0e-2'], ['slow', '2.0e-3']].map(([name, lr]) => ({
    name,
    id: cluster.ftctl('submit', cluster.writeJob(name, { steps: STEPS, every_steps: 20, eval_every: 10, lr })).split(/\s/)[0],
  }));
  for (const job of [...jobs, dpo]) {
    await cluster.waitFor(`${job.id} to succeed`, async () => (await cluster.api(`api/jobs/${job.id}`)).state === 'succeeded', 120000);
    job.points = (await cluster.api(`api/jobs/${job.id}/metrics?limit=1000`)).points;
  }
  check(jobs.every((j) => j.points.length === STEPS), `both jobs ran ${STEPS} steps (${jobs.map((j) => j.id).join(', ')})`);
  await checkDpoJob(dpo, dpoPage, jobs[0]);

  const page = await test.browser.newPage({ viewport: { width: 1400, height: 1000 } });
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

  // 6d. An SFT run and the DPO run: the margins chart has the DPO run's line alone.
  check(view.margins === null, 'comparing SFT runs only shows no rewards/margins chart');
  await page.goto(`${cluster.url}#/compare?jobs=${jobs[0].id},${dpo.id}`);
  view = await test.pageWaitFor(page, 'the compare view with the DPO run\'s margins', readCompare,
    (v) => v && v.runs.length === 2 && v.margins && v.margins.values.length === 1 && v.margins.values[0].length === DPO_STEPS,
    15000);
  const margins = dpo.points.map((p) => p.objective_metrics['rewards/margins']);
  check(view.margins.values[0].every((v, k) => Math.abs(v - margins[k]) < 1e-9) && view.margins.labels[0].includes(dpo.id),
    `the margins chart has ${dpo.id}'s ${DPO_STEPS} margins from the API (${margins[0].toFixed(3)} → ${margins[DPO_STEPS - 1].toFixed(3)}) and no line for ${jobs[0].id}`);
  await test.shotOf(page, '#compare-margins', '5-compare-dpo-margins');

  check(pageErrors.length === 0, `no JavaScript errors in the page${pageErrors.length ? `: ${pageErrors.join('; ')}` : ''}`);
}

await test.run(main);
