// Browser test of ftd's dashboard (issue #8, acceptance 1): a real ftd, two
// real ft-workers and a real CPU LoRA job; Debian's Chromium (headless,
// driven by playwright-core) checks that
//   1. the jobs list shows the job,
//   2. a live update arrives without a reload (the step count grows while the
//      page stays the same document),
//   3. the loss chart has points, its lowest eval loss marked as the best, the data mixture's shares,
//   4. the memory chart shows used vs predicted vs total,
//   5. killing the running worker (SIGKILL, trainer too) puts a preemption
//      marker on the loss chart's timeline and the job resumes on the other
//      worker,
//   6. cancel from the page works (it asks for the client token on 401) and
//      the job ends cancelled,
//   7. the goodput panel (issue #31) shows the device time split as a stacked
//      bar whose seconds are /api/jobs/ID's goodput, live while running and
//      exactly once the job ended, and the kill's recovery on the timeline; and
//      its cost (issue #44: the workers' --price) as /api/jobs/ID's goodput.cost,
//   8. the workers page's Pool panel (issue #31) counts the kill's preemption
//      and shows the mean time between preemptions M that /api/workers reports,
//   9. the Teams page (issue #44): a team's quota and weight set with ftctl while the page is open,
//      then a member's two jobs (one running, one queued), appear live as /api/teams reports them,
//      with the activity naming who acted; the jobs list links the job's team to its row, and the
//      job page shows the submitter, the team and the "submitted by" event.
// Screenshots of every stage are written under --out and their paths printed.
//
//   node dashboard_test.mjs --ftd BIN --worker BIN --ftctl BIN --train BIN
//        --source SRC_DIR --node-modules DIR --out DIR
// Exit status 0 when every check passed, 1 otherwise (the reason and the
// daemon's log tail on stderr).

import path from 'node:path';
import { BrowserTest, Cluster, launchChromium, parseArgs } from './cluster.mjs';

const args = parseArgs(process.argv.slice(2), ['ftd', 'worker', 'ftctl', 'train', 'source', 'node-modules', 'out']);
const TOKEN = 'web-test-token';
const test = new BrowserTest('dashboard browser test', args.out);
const check = (condition, message) => test.check(condition, message);
const shot = (page, name) => test.shot(page, name);
const pageWaitFor = (...a) => test.pageWaitFor(...a);
let cluster;
let browser;

async function main() {
  cluster = new Cluster({ ftd: args.ftd, worker: args.worker, ftctl: args.ftctl, train: args.train, source: args.source },
    path.join(args.out, 'cluster'), { lease_ms: 3000, client_token: TOKEN });
  test.cluster = cluster;
  browser = await launchChromium(args['node-modules']);
  test.browser = browser;
  await cluster.startDaemon();
  console.log(`ftd: gRPC ${cluster.address}, dashboard ${cluster.url}`);
  const pools = { w1: 'spot-a', w2: 'spot-b' };  // a pool each: M and goodput are kept per pool
  cluster.startWorker('w1', ['--pool', pools.w1, '--price', '360']);  // $360 a device-hour (10 cents a second): the job's cost
  cluster.startWorker('w2', ['--pool', pools.w2, '--price', '360']);
  const id = cluster.ftctl('submit', cluster.writeJob('web', { steps: 20000, every_steps: 200, eval_every: 25, mixture: true,
    train_extra: 'optimizer: paged_adamw, activation_checkpointing: offload' })).split(/\s/)[0];
  check(/^j-\d+$/.test(id), `ftctl submitted job ${id}`);

  const page = await browser.newPage({ viewport: { width: 1400, height: 1000 } });
  const pageErrors = [];
  page.on('pageerror', (err) => pageErrors.push(err.message));
  page.on('console', (msg) => {
    if (msg.type() === 'error') console.log(`browser console: ${msg.text()}`);
  });

  // 1. The jobs list shows the job.
  // With a client token ftd serves the dashboard only with a token: opened as
  // /?token=... the page gets its read cookie (actions still ask, step 6).
  await page.goto(`${cluster.url}?token=${TOKEN}#/jobs`);
  const row = `tr[data-job-id="${id}"]`;
  await page.waitForSelector(row, { timeout: 15000 });
  check((await page.textContent(`${row} .name`)) === 'web', 'the jobs list shows the job by name');

  // 2. A live update without reload: a marker set on this document survives while the step count grows.
  await page.evaluate(() => {
    window.__sameDocument = true;
  });
  const stepsOf = async () => Number(((await page.textContent(`${row} .steps`)) || '0/0').split('/')[0]);
  const firstSteps = await stepsOf();
  await cluster.waitFor('the running job to progress in the open jobs page', async () => (await stepsOf()) >= firstSteps + 5,
    60000);
  check(await page.evaluate(() => window.__sameDocument === true),
    `live update without reload: steps ${firstSteps} -> ${await stepsOf()} on the same document`);
  check((await page.textContent(`${row} .badge`)) === 'running', 'the row shows the job running');
  await shot(page, '1-jobs-live');

  // 3. The job page's loss chart has points.
  await page.click(`${row} a.name`);
  await page.waitForSelector('body[data-rendered="job"]', { timeout: 15000 });
  const lossPoints = await pageWaitFor(page, 'loss points in the loss chart',
    () => window.ftune.charts.loss.data[1].filter(Number.isFinite).length, (n) => n >= 3, 30000);
  check(lossPoints >= 3, `the loss chart has ${lossPoints} points`);
  const evalPoints = await pageWaitFor(page, 'eval loss points in the loss chart',
    () => window.ftune.charts.loss.data[3].filter(Number.isFinite).length, (n) => n >= 2, 30000);
  check(evalPoints >= 2, `the loss chart has ${evalPoints} eval loss points`);
  // 3a. The best (lowest) eval loss is ringed: one point of its own series (issue #45).
  const best = await page.evaluate(() => {
    const d = window.ftune.charts.loss.data;
    return { evals: d[3].filter(Number.isFinite), best: d[4].filter(Number.isFinite) };
  });
  check(best.best.length === 1 && best.best[0] === Math.min(...best.evals),
    `the best of ${best.evals.length} eval losses is marked (${best.best[0]})`);
  check(await page.evaluate(() => window.__sameDocument === true), 'opening the job did not reload the page');
  // 3c. The job mixes two sources 3:1: the Data mixture panel shows each one's share (issue #45).
  const shares = await pageWaitFor(page, 'the data mixture panel',
    () => [...document.querySelectorAll('#mixture tr[data-source] .share')].map((c) => c.textContent),
    (s) => s.length === 2 && s[0] !== '', 30000);
  check(shares[0] === '75.0%' && shares[1] === '25.0%', `the data mixture panel shows the shares (${shares.join(', ')})`);

  // 3b. Step time against the copy wait of the memory techniques (the job pages its
  // optimizer states and offloads activations).
  const timing = await pageWaitFor(page, 'step time points in the timing chart', () => {
    const d = window.ftune.charts.timing.data;
    return { step: d[1].filter(Number.isFinite), wait: d[2].filter(Number.isFinite) };
  }, (x) => x.step.length >= 3 && x.wait.some((w) => w > 0), 30000);
  check(timing.step.every((s) => s > 0), `the timing chart has ${timing.step.length} step times`);
  check(timing.wait.every((w, i) => w >= 0 && w <= timing.step[i]),
    `copy waits lie within their steps (largest ${Math.max(...timing.wait).toExponential(2)} s)`);

  // 4. Memory: used vs predicted vs total on one chart.
  const memory = await pageWaitFor(page, 'device memory samples in the memory chart', () => {
    const chart = window.ftune.charts.memory;
    if (!chart) return null;
    const series = chart.series.map((s, i) => ({ label: s.label, values: chart.data[i].filter(Number.isFinite) }));
    return series.slice(1);
  }, (s) => s && s.length >= 3 && s.every((x) => x.values.length > 0), 30000);
  const labels = memory.map((s) => s.label);
  const used = memory.find((s) => s.label.startsWith('used '));
  const total = memory.find((s) => s.label.startsWith('total '));
  const predicted = memory.find((s) => s.label === 'predicted');
  check(used && total && predicted, `the memory chart has used, predicted and total series (${labels.join(', ')})`);
  check(predicted.values[0] > 0, `the planner's prediction is drawn (${predicted.values[0]} bytes)`);
  const workers = (await cluster.api('api/workers')).workers;
  const hostTotal = workers[0].devices[0].total_bytes;
  check(hostTotal > 0 && total.values.every((v) => v === hostTotal),
    `the device total is the ${hostTotal} bytes the worker reports`);
  check(used.values.every((v) => v > 0 && v <= hostTotal), 'used memory lies between 0 and the total');
  await shot(page, '2-job-running');

  // 5. Kill the running worker: a preemption marker on the timeline, the job resumes on the other worker.
  const before = await cluster.api(`api/jobs/${id}`);
  check(before.state === 'running' && before.worker_id, `the job runs on ${before.worker_id}`);
  const victim = before.worker_id;
  const other = victim === 'w1' ? 'w2' : 'w1';
  const killed = cluster.killWorker(victim);
  console.log(`killed ${victim} (pids ${killed.join(' ')}) at step ${before.steps_done}`);
  const markers = await pageWaitFor(page, 'a preempted/lost marker on the loss chart',
    () => window.ftune.charts.loss.ftMarkers || [], (m) => m.some((x) => x.kind === 'preempted' || x.kind === 'lost'),
    cluster.lease_ms + 15000);
  check(true, `the timeline shows ${markers.filter((m) => m.kind !== 'checkpoint').map((m) => m.label).join(', ')}`);
  await pageWaitFor(page, `the page to show the job running on ${other}`,
    () => document.querySelector('[data-field="worker"]')?.textContent, (w) => w === other, cluster.lease_ms + 15000);
  await pageWaitFor(page, 'a resumed marker after the preemption',
    () => (window.ftune.charts.loss.ftMarkers || []).map((m) => m.kind),
    (kinds) => kinds.includes('resumed'), 15000);
  const after = await cluster.api(`api/jobs/${id}`);
  check(after.worker_id === other && after.attempts >= 2 && after.preemptions >= 1,
    `the job resumed on ${other} (attempts ${after.attempts}, preemptions ${after.preemptions})`);
  check(await page.evaluate(() => document.querySelectorAll('#main tr.k-preempted, #main tr.k-lost').length > 0),
    'the event list shows the preemption');
  await page.waitForTimeout(1000);  // one more redraw so the screenshot has the resumed run
  await shot(page, '3-job-preempted-resumed');

  // 7a. Goodput while running: the kill's recovery (its end → the next attempt's first step) is
  // listed and drawn as a band on the loss chart; the bar has productive time and the kill's cost.
  const running = await pageWaitFor(page, 'the recovery in the goodput panel and on the timeline', () => ({
    recoveries: [...document.querySelectorAll('#goodput .gp-recoveries li')].map((li) => Number(li.dataset.seconds)),
    bands: window.ftune.charts.loss.ftRecoveries || [],
    productive: Number(document.querySelector('#goodput-bar [data-part="productive_s"]').dataset.seconds),
  }), (x) => x.recoveries.length >= 1 && x.bands.length >= 1 && x.productive > 0, cluster.lease_ms + 30000);
  const apiRunning = (await cluster.api(`api/jobs/${id}`)).goodput;
  check(apiRunning.recovery_s.length >= 1 && running.recoveries[0] === round1(apiRunning.recovery_s[0]),
    `the goodput panel lists the recovery ${running.recoveries[0]} s (API ${apiRunning.recovery_s[0]} s) and the ` +
    `loss chart draws it (${running.bands.map((b) => b.label).join(', ')})`);
  check(apiRunning.recovery_s[0] > 0 && apiRunning.recovery_s[0] < (cluster.lease_ms / 1000) + 60,
    `the recovery took ${apiRunning.recovery_s[0].toFixed(1)} s (lease ${cluster.lease_ms} ms)`);

  // 6. Cancel from the page; ftd wants the client token, the page asks for it once and keeps it.
  const dialogs = [];
  page.on('dialog', async (dialog) => {
    dialogs.push(dialog.type());
    if (dialog.type() === 'prompt') await dialog.accept(TOKEN);
    else await dialog.accept();
  });
  await page.click('#cancel');
  await page.waitForSelector('.job-head .badge.s-cancelled', { timeout: 15000 });
  check(dialogs.includes('prompt'), `the page asked for the token after a 401 (dialogs: ${dialogs.join(', ')})`);
  check(await page.evaluate((t) => localStorage.getItem('ftune.token') === t, TOKEN), 'the token is kept in localStorage');
  const final = await cluster.waitFor('the job to end cancelled', async () => {
    const job = await cluster.api(`api/jobs/${id}`);
    return job.state === 'cancelled' ? job : null;
  }, 15000);
  check(final.state === 'cancelled', `ftd reports ${id} cancelled`);
  check(cluster.ftctl('status', id).includes('cancelled'), 'ftctl status agrees');
  await pageWaitFor(page, 'the cancelled marker on the timeline',
    () => (window.ftune.charts.loss.ftMarkers || []).map((m) => m.kind), (k) => k.includes('cancelled'), 10000);
  check(await page.isDisabled('#cancel'), 'the cancel button is disabled once the job ended');
  await shot(page, '4-job-cancelled');

  // 7b. Goodput once the job ended: the figures are final, and the panel shows exactly the API's.
  const apiFinal = await cluster.waitFor('every attempt of the cancelled job to have ended', async () => {
    const job = await cluster.api(`api/jobs/${id}`);
    return job.attempts_list.every((a) => a.outcome !== 'running' && a.ended_ms > 0) ? job.goodput : null;
  }, 15000);
  // The page refetches the job on the attempt's end (its "stopped" event), which may come after the cancel.
  const parts = ['productive_s', 'checkpoint_s', 'restart_s', 'lost_s'];
  const shown = await pageWaitFor(page, "the goodput panel to show the ended job's figures", readGoodputPanel,
    (x) => parts.every((part) => x.parts[part] === round1(apiFinal[part])), 15000);
  for (const part of parts) {
    check(shown.parts[part] === round1(apiFinal[part]) && shown.legend[part] === round1(apiFinal[part]),
      `the panel's ${part} is the API's ${apiFinal[part].toFixed(3)} s (bar ${shown.parts[part]}, ` +
      `legend ${shown.legend[part]}, ${shown.widths[part]} wide)`);
  }
  const deviceTotal = parts.reduce((sum, part) => sum + apiFinal[part], 0);
  check(apiFinal.productive_s > 0 && apiFinal.restart_s > 0 && apiFinal.lost_s > 0,
    'the bar has productive, restart and lost time (the kill lost the steps after the last checkpoint)');
  for (const part of parts) {
    const expected = (100 * apiFinal[part]) / deviceTotal;
    check(Math.abs(parseFloat(shown.widths[part]) - expected) < 0.01,
      `the ${part} segment is ${expected.toFixed(2)}% of the bar`);
  }
  check(shown.line.includes(`goodput ${(100 * apiFinal.goodput).toFixed(1)}%`),
    `the panel says "${shown.line}" (API goodput ${apiFinal.goodput.toFixed(4)}, queued ${apiFinal.queue_s} s)`);
  check(/^1 recovery .*p50 .*max /.test(shown.recoveries), `the panel sums up the recoveries: "${shown.recoveries}"`);
  const usd = (x) => x.toLocaleString('en-US', { style: 'currency', currency: 'USD' });
  check(apiFinal.cost.total > 0 && Math.abs(apiFinal.cost.total - (deviceTotal * 360) / 3600) < 1e-9 &&
    shown.cost.startsWith(`cost ${usd(apiFinal.cost.total)}: productive ${usd(apiFinal.cost.productive)}, ` +
      `lost ${usd(apiFinal.cost.lost)}`),
  `the panel shows the job's cost, its device time at $360 a device-hour: "${shown.cost}"`);
  await test.shotOf(page, '#goodput', '6-goodput-panel');

  // The workers page: both workers, the killed one greyed out as lost.
  await page.goto(`${cluster.url}#/workers`);
  await page.waitForSelector('body[data-rendered="workers"]', { timeout: 15000 });
  await page.waitForSelector(`tr[data-worker-id="${victim}"].lost`, { timeout: cluster.lease_ms + 10000 });
  check(!(await page.$(`tr[data-worker-id="${other}"].lost`)), `${victim} is greyed as lost, ${other} is not`);
  check((await page.$$(`tr[data-worker-id="${other}"] .device .bar`)).length === 1, `${other} shows its device's memory bar`);
  const hostLine = await page.textContent(`tr[data-worker-id="${other}"] .c-worker .reason`);
  check(/host memory .* free of /.test(hostLine), `${other} shows the host memory it reports (${hostLine})`);
  for (const w of [victim, other]) {
    const shownPool = await page.textContent(`tr[data-worker-id="${w}"] .c-pool`);
    check(shownPool === pools[w], `${w}'s row names its pool ${pools[w]} ("${shownPool}")`);
  }
  // The victim's ended attempt: its goodput on its row, as /api/workers' split says.
  const victimGoodput = await cluster.waitFor(`${victim}'s goodput`, async () => {
    const api = (await cluster.api('api/workers')).workers.find((w) => w.id === victim).goodput;
    const device = api.productive_s + api.checkpoint_s + api.restart_s + api.lost_s;
    const shown = await page.textContent(`tr[data-worker-id="${victim}"] .c-goodput`);
    return device > 0 && shown === `${((100 * api.productive_s) / device).toFixed(1)}%` ? { api, shown } : null;
  }, 15000);
  check(victimGoodput.api.lost_s > 0, `${victim}'s row shows goodput ${victimGoodput.shown} of its ended attempt ` +
    `(lost ${victimGoodput.api.lost_s.toFixed(1)} s)`);
  await shot(page, '5-workers');

  // 8. The Pools panel: the kill's preemption counted in the victim's pool, M as /api/workers'
  // pools say (every attempt there has ended, so its history no longer moves; the panel follows
  // it through the stream); the other pool still has the prior.
  const pool = await cluster.waitFor('the Pools panel to show the preemption and the API\'s M', async () => {
    const api = (await cluster.api('api/workers')).pools.find((p) => p.pool === pools[victim]);
    const shown = await page.evaluate((name) => {
      const field = (f) => document.querySelector(`#pool tr[data-pool="${name}"] [data-field="${f}"]`);
      return field('mtbf') && {
        visible: !document.getElementById('pool').hidden,
        preemptions: Number(field('history').dataset.preemptions),
        rate: field('rate').textContent,
        mtbf: field('mtbf').textContent,
        history: field('history').textContent,
        goodput: field('goodput').textContent,
      };
    }, pools[victim]);
    const ready = api && shown && shown.visible && shown.preemptions === api.preemptions && api.preemptions >= 1 &&
      shown.mtbf === `${(api.mtbf_s / 60).toFixed(1)} min`;
    return ready ? { api, shown } : null;
  }, 15000);
  check(pool.shown.preemptions >= 1 && !pool.api.mtbf_is_prior,
    `the ${pools[victim]} row counts ${pool.shown.preemptions} preemption(s): "${pool.shown.history}"`);
  check(pool.shown.mtbf === `${(pool.api.mtbf_s / 60).toFixed(1)} min`,
    `the ${pools[victim]} row's M is "${pool.shown.mtbf}" (API mtbf_s ${pool.api.mtbf_s.toFixed(1)} s = ` +
    `${pool.api.attempt_seconds.toFixed(1)} s of attempts / ${pool.api.preemptions})`);
  check(Math.abs(Number(pool.shown.rate) - pool.api.preemptions_per_hour) < 0.1,
    `the ${pools[victim]} row shows ${pool.shown.rate} preemptions per hour (API ` +
    `${pool.api.preemptions_per_hour.toFixed(3)})`);
  check(pool.shown.goodput === `${(100 * pool.api.goodput.goodput).toFixed(1)}%`,
    `the ${pools[victim]} row shows goodput ${pool.shown.goodput} of its ended attempts`);
  const otherMtbf = await page.textContent(`#pool tr[data-pool="${pools[other]}"] [data-field="mtbf"]`);
  check(/prior: no preemption yet/.test(otherMtbf), `the ${pools[other]} row keeps the prior M ("${otherMtbf}")`);
  await test.shotOf(page, '#pool', '7-pool-panel');

  const teamsStart = Date.now();
  await teamsStage(page);
  console.log(`the Teams stage took ${((Date.now() - teamsStart) / 1000).toFixed(1)} s`);

  check(pageErrors.length === 0, `no JavaScript errors in the page${pageErrors.length ? `: ${pageErrors.join('; ')}` : ''}`);
}

// 9. The Teams page. The one live worker is idle (the first job ended), so a team with a quota of
// one device runs one of its two jobs and queues the other.
async function teamsStage(page) {
  const alice = cluster.addUser('alice', 'nlp');
  await page.goto(`${cluster.url}#/teams`);
  await page.waitForSelector('body[data-rendered="teams"]', { timeout: 15000 });
  await page.waitForSelector('#live.up', { timeout: 15000 });  // the stream is open: no event is missed
  await page.evaluate(() => {
    window.__teamsDocument = true;
  });
  cluster.ftctl('admin', 'team', 'set', 'nlp', '--quota', '1', '--weight', '2');
  const jobs = ['nlp-a', 'nlp-b'].map((name) =>
    cluster.ftctlAs(alice, 'submit', cluster.writeJob(name, { steps: 20000, every_steps: 1000 })).split(/\s/)[0]);
  // Every team /api/teams lists has its row, showing what the API says, once nlp runs one job and
  // queues the other (the admin's first job, of no team, has its usage too).
  const { teams, rows } = await cluster.waitFor('the Teams page to show every team as /api/teams does', async () => {
    const listed = (await cluster.api('api/teams')).teams;
    const nlp = listed.find((t) => t.name === 'nlp');
    if (!nlp || nlp.running_devices !== 1 || nlp.queued_jobs !== 1) return null;
    const shown = await page.evaluate(readTeamRows);
    return shown.length === listed.length && listed.every((t, i) => rowShows(shown[i], t)) ?
      { teams: listed, rows: shown } : null;
  }, 30000);
  const api = teams.find((t) => t.name === 'nlp');
  check(api.quota_devices === 1 && api.weight === 2 && api.borrowed_devices === 0,
    `/api/teams: nlp has quota ${api.quota_devices}, weight ${api.weight}, ${api.running_devices} device running ` +
    `(${api.borrowed_devices} borrowed), ${api.queued_jobs} job queued, fair share ${api.fair_share}`);
  teams.forEach((t, i) => {
    const row = rows[i];
    check(true, `the ${row.team} row shows quota ${row.quota}, weight ${row.weight}, share ${row.share} (the bar's ` +
      `tick at ${row.tick}%), running ${row.running}, queued ${row.queued}, spend "${row.spend}"`);
    // The page's usage is from its own read: a running device adds a second each second until the next one (5 s).
    const slack = t.running_devices * 6 + 0.01 * t.usage_device_seconds;
    check(Math.abs(row.seconds - t.usage_device_seconds) <= slack &&
      Math.abs(parseFloat(row.usage) - row.seconds / 3600) <= 0.005 * (row.seconds / 3600),
    `the ${row.team} row's usage is ${row.usage} device-hours (${row.seconds.toFixed(1)} device-s; API ` +
      `${t.usage_device_seconds.toFixed(1)})`);
  });
  check(await page.evaluate(() => window.__teamsDocument === true), 'the Teams page updated without a reload');
  const activity = await test.pageWaitFor(page, 'the activity to name the admin and alice',
    () => [...document.querySelectorAll('#activity tr')].map((tr) => tr.textContent),
    (a) => a.some((t) => t.includes('team nlp: a quota of 1 devices, weight 2, no queue cap, no budget by admin')) &&
      a.filter((t) => t.includes('submitted by alice (team nlp)')).length === 2, 15000);
  check(true, `the activity lists ${activity.length} events naming who acted`);
  await shot(page, '8-teams');

  // The jobs list: the submitter beside the id, the team a link to its row on the Teams page.
  await page.goto(`${cluster.url}#/jobs`);
  const jobRow = `tr[data-job-id="${jobs[0]}"]`;
  await page.waitForSelector(`${jobRow} a.id[href]`, { timeout: 15000 });
  const owner = await page.textContent(`${jobRow} .id`);
  check(owner === `${jobs[0]} · alice · nlp`, `the jobs list names the submitter and team ("${owner}")`);
  await page.click(`${jobRow} a.id[href]`);
  await page.waitForSelector('body[data-rendered="teams"] tr.picked[data-team="nlp"]', { timeout: 15000 });
  check(true, "the job's team links to its row on the Teams page");

  // The job page: submitter and team, and the event that names the submitter.
  await page.goto(`${cluster.url}#/jobs/${jobs[0]}`);
  const summary = await test.pageWaitFor(page, 'the job page to show its submitter, team and events', () => ({
    by: document.querySelector('[data-field="submitted-by"]')?.textContent,
    team: document.querySelector('[data-field="team"] a')?.getAttribute('href'),
    events: [...document.querySelectorAll('#main tr.k-queued')].map((tr) => tr.lastElementChild.textContent),
  }), (x) => x.by === 'alice' && x.team && x.events.length > 0, 15000);
  check(summary.team === '#/teams?team=nlp', `the job page shows submitted by ${summary.by}, team ${summary.team}`);
  check(summary.events.some((t) => t.includes('submitted by alice (team nlp)')),
    `the job's event list names the submitter ("${summary.events[0]}")`);
}

// The Teams page's rows, in order, as text (run in the page).
function readTeamRows() {
  return [...document.querySelectorAll('tr[data-team]')].map((row) => {
    const f = (field) => row.querySelector(`[data-field="${field}"]`);
    const text = (field) => f(field).textContent;
    return {
      name: row.dataset.team, team: text('team'), quota: text('quota'), weight: text('weight'), share: text('share'),
      usage: text('usage'), seconds: Number(f('usage').dataset.seconds), running: text('running'),
      queued: text('queued'), spend: text('spend'),
      tick: parseFloat(row.querySelector('.share-tick').style.left),  // a percentage
    };
  });
}

// Whether a row shows team t of /api/teams (its usage apart, and a running team's spend but for its
// form: they move between reads).
function rowShows(row, t) {
  const money = (x) => x.toLocaleString('en-US', { style: 'currency', currency: 'USD' });
  const budget = Number.isFinite(t.budget) ? ` of ${money(t.budget)} budget` : '';
  const spend = !Number.isFinite(t.spend) ? '—' : `${money(t.spend)}${budget}`;
  if (row && spend !== '—' && t.running_devices > 0) {
    if (!/^\$[\d,]+\.\d\d/.test(row.spend) || !row.spend.endsWith(budget)) return false;
    row = { ...row, spend };
  }
  const want = {
    name: t.name, team: t.name || '(no team)', quota: t.quota_devices < 0 ? 'none' : `${t.quota_devices}`,
    weight: `${t.weight}`, share: `${(100 * t.fair_share).toFixed(1)}%`, tick: round1(100 * t.fair_share),
    running: `${t.running_devices}${t.borrowed_devices ? ` (${t.borrowed_devices} borrowed)` : ''}`,
    queued: `${t.queued_jobs}${t.max_queued >= 0 ? ` of ${t.max_queued}` : ''}`, spend,
  };
  return row && Object.keys(want).every((k) => row[k] === want[k]);
}

function round1(x) {
  return Number(x.toFixed(1));
}

// What the goodput panel shows: each segment's seconds and width, the legend's seconds, its text lines.
function readGoodputPanel() {
  const of = (selector, read) =>
    Object.fromEntries([...document.querySelectorAll(selector)].map((n) => [n.dataset.part, read(n)]));
  return {
    parts: of('#goodput-bar .gp-seg', (n) => Number(n.dataset.seconds)),
    widths: of('#goodput-bar .gp-seg', (n) => n.style.width),
    legend: of('#goodput .gp-legend li', (n) => Number(n.querySelector('.num').dataset.seconds)),
    line: document.querySelector('#goodput [data-field="goodput"]').textContent,
    recoveries: document.querySelector('#goodput [data-field="recoveries"]').textContent,
    cost: document.querySelector('#goodput [data-field="cost"]').textContent,
  };
}

await test.run(main);
