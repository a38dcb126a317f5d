// Dashboard load test (issue #8, acceptance 4): a real ftd seeded with 100
// simulated workers heartbeating over gRPC and 1,000 queued jobs
// (web_seed_cluster), then Chromium loads the jobs page and the workers page
// several times each and reports the time from navigation start until the page
// shows all its rows (window.ftune.renderedMs, set by the page itself), and how
// long a live filter takes. Fails when a median exceeds --limit-ms (1000 by
// default; FT_WEB_LOAD_LIMIT_MS overrides it on a slow machine).
//
//   node load_test.mjs --ftd BIN --seed BIN --source SRC_DIR --node-modules DIR --out DIR
//        [--jobs 1000] [--workers 100] [--loads 5] [--limit-ms 1000]

import path from 'node:path';
import { Cluster, launchChromium, parseArgs } from './cluster.mjs';

const args = parseArgs(process.argv.slice(2), ['ftd', 'seed', 'source', 'node-modules', 'out']);
const JOBS = Number(args.jobs || 1000);
const WORKERS = Number(args.workers || 100);
const LOADS = Number(args.loads || 5);
const LIMIT_MS = Number(process.env.FT_WEB_LOAD_LIMIT_MS || args['limit-ms'] || 1000);

const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
const fmt = (xs) => `median ${median(xs).toFixed(0)} ms, min ${Math.min(...xs).toFixed(0)}, max ${Math.max(...xs).toFixed(0)} ` +
  `over ${xs.length} loads`;

let cluster;
let browser;

// Loads `hash` in a fresh page `LOADS` times; returns the render times (ms since navigation start).
async function timeLoads(hash, page_name, expected) {
  const times = [];
  for (let i = 0; i < LOADS; i++) {
    const page = await browser.newPage({ viewport: { width: 1400, height: 1000 } });
    const errors = [];
    page.on('pageerror', (err) => errors.push(err.message));
    await page.goto(`${cluster.url}${hash}`);
    await page.waitForSelector(`body[data-rendered="${page_name}"]`, { timeout: 30000 });
    const { ms, items, rows } = await page.evaluate((name) => ({
      ms: window.ftune.renderedMs[name],
      items: Number(document.body.dataset.items),
      rows: document.querySelectorAll('#main tbody tr:not([data-pool])').length,  // the Pools panel's rows apart
    }), page_name);
    if (errors.length) throw new Error(`JavaScript errors on ${hash}: ${errors.join('; ')}`);
    if (items !== expected || rows !== expected) {
      throw new Error(`${hash} rendered ${rows} rows (${items} items), expected ${expected}`);
    }
    times.push(ms);
    if (i === LOADS - 1) {
      const file = path.join(args.out, `load-${page_name}.png`);
      await page.screenshot({ path: file });
      console.log(`screenshot: ${file}`);
      if (page_name === 'jobs') await timeFilter(page);
    }
    await page.close();
  }
  return times;
}

// Typing in the search box and toggling a state chip: time until the table shows the result.
async function timeFilter(page) {
  const ms = await page.evaluate(async () => {
    const input = document.querySelector('.toolbar input[type=search]');
    const t0 = performance.now();
    input.value = 'load-99';
    input.dispatchEvent(new Event('input'));
    await new Promise(requestAnimationFrame);
    return performance.now() - t0;
  });
  const shown = await page.$$eval('#main tbody tr:not([hidden])', (rows) => rows.length);
  console.log(`jobs page: text filter over ${JOBS} rows took ${ms.toFixed(1)} ms (to next frame), ${shown} rows shown`);
  if (shown !== 11) throw new Error(`filter 'load-99' shows ${shown} rows, expected 11 (load-99, load-990..999)`);
}

async function main() {
  cluster = new Cluster({ ftd: args.ftd, source: args.source }, path.join(args.out, 'cluster'), { lease_ms: 10000 });
  browser = await launchChromium(args['node-modules']);
  await cluster.startDaemon();
  const seeded = new Promise((resolve, reject) => {
    const seed = cluster.spawnLogged('seed', [args.seed, '--daemon', cluster.address, '--workers', String(WORKERS),
      '--jobs', String(JOBS), '--dir', path.join(cluster.dir, 'job')], (line) => {
      if (line.startsWith('seeded:')) resolve(line);
    });
    seed.exited.then((code) => reject(new Error(`web_seed_cluster exited with ${code}: ${cluster.logOf('seed')}`)));
  });
  console.log(await seeded);
  const jobs = await cluster.api('api/jobs?limit=10000');
  const workers = await cluster.api('api/workers');
  if (jobs.jobs.length !== JOBS || workers.workers.length !== WORKERS) {
    throw new Error(`ftd lists ${jobs.jobs.length} jobs and ${workers.workers.length} workers, expected ${JOBS} and ${WORKERS}`);
  }
  const jobsTimes = await timeLoads('#/jobs', 'jobs', JOBS);
  const workersTimes = await timeLoads('#/workers', 'workers', WORKERS);
  console.log(`jobs page, ${JOBS} jobs: rendered in ${fmt(jobsTimes)} (limit ${LIMIT_MS} ms)`);
  console.log(`workers page, ${WORKERS} workers: rendered in ${fmt(workersTimes)} (limit ${LIMIT_MS} ms)`);
  for (const [name, times] of [['jobs', jobsTimes], ['workers', workersTimes]]) {
    if (median(times) >= LIMIT_MS) throw new Error(`the ${name} page took ${median(times).toFixed(0)} ms (median) >= ${LIMIT_MS} ms`);
  }
}

let status = 0;
try {
  await main();
  console.log('PASS: dashboard load test');
} catch (err) {
  status = 1;
  console.error(`FAIL: ${err.stack || err.message}`);
  if (cluster) console.error(`--- ftd log (tail) ---\n${cluster.logOf('ftd').slice(-3000)}`);
} finally {
  if (browser) await browser.close().catch(() => {});
  if (cluster) await cluster.stop();
}
process.exit(status);
