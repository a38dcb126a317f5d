// A real ftune cluster on loopback for the browser tests: ftd (gRPC and HTTP on
// ephemeral ports), ft-worker processes, a tiny model made by ft-train, jobs
// (SFT on token data, or DPO on preference pairs) submitted with ftctl. Every process it starts is killed by stop(), by pid
// (and, for workers, their ft-train descendants).
//
// Failure: start() and the helpers throw an Error naming what did not happen
// and where its log is.

import { spawn, execFileSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';

export const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

// Reads --name value pairs from argv into an object.
export function parseArgs(argv, required) {
  const args = {};
  for (let i = 0; i < argv.length; i++) {
    if (!argv[i].startsWith('--')) throw new Error(`unexpected argument '${argv[i]}'`);
    args[argv[i].slice(2)] = argv[++i];
  }
  const missing = required.filter((k) => !args[k]);
  if (missing.length) throw new Error(`missing --${missing.join(', --')} (CMake passes these; see tests/web/CMakeLists.txt)`);
  return args;
}

// playwright-core from the npm fixture, and Debian's Chromium (never a download).
export async function launchChromium(nodeModules) {
  const executablePath = process.env.FT_CHROMIUM || '/usr/bin/chromium';
  if (!fs.existsSync(executablePath)) {
    throw new Error(`Chromium not found at ${executablePath}: run deploy/install-deps.sh (it installs Debian's ` +
      "'chromium'), or point FT_CHROMIUM at a Chromium binary");
  }
  const entry = path.join(nodeModules, 'playwright-core', 'index.mjs');
  if (!fs.existsSync(entry)) {
    throw new Error(`playwright-core not found at ${entry}: the web_npm_install test (npm ci in tests/web) must run ` +
      'first; run ctest with -R web so the fixture runs');
  }
  const { chromium } = await import(entry);
  return chromium.launch({ executablePath, headless: true, args: ['--no-sandbox'] });
}

// Descendants of pid (children, grandchildren, ...) from /proc.
function descendants(pid) {
  const parent = new Map();
  for (const entry of fs.readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      const stat = fs.readFileSync(`/proc/${entry}/stat`, 'utf8');
      const ppid = Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]);
      parent.set(Number(entry), ppid);
    } catch {
      // The process ended while we looked.
    }
  }
  const found = [];
  let frontier = [pid];
  while (frontier.length) {
    const next = [];
    for (const [child, ppid] of parent) if (frontier.includes(ppid)) next.push(child);
    found.push(...next);
    frontier = next;
  }
  return found;
}

export class Cluster {
  // bins: {ftd, worker, ftctl, train}; dir: a scratch directory (emptied).
  constructor(bins, dir, { lease_ms = 3000, client_token = '' } = {}) {
    this.bins = bins;
    this.dir = dir;
    this.lease_ms = lease_ms;
    this.token = client_token;
    this.procs = new Map();  // name → ChildProcess
    fs.rmSync(dir, { recursive: true, force: true });
    fs.mkdirSync(path.join(dir, 'job'), { recursive: true });
  }

  spawnLogged(name, argv, onLine) {
    const log = fs.createWriteStream(path.join(this.dir, `${name}.log`));
    const child = spawn(argv[0], argv.slice(1), { stdio: ['pipe', 'pipe', 'pipe'] });
    let pendingText = '';
    const take = (chunk) => {
      log.write(chunk);
      if (!onLine) return;
      pendingText += chunk.toString();
      const lines = pendingText.split('\n');
      pendingText = lines.pop();
      lines.forEach(onLine);
    };
    child.stdout.on('data', take);
    child.stderr.on('data', take);
    child.exited = new Promise((resolve) => child.on('exit', (code, signal) => resolve(code ?? 128)));
    this.procs.set(name, child);
    return child;
  }

  logOf(name) {
    try {
      return fs.readFileSync(path.join(this.dir, `${name}.log`), 'utf8');
    } catch {
      return '';
    }
  }

  // Starts ftd; resolves once it printed both its gRPC and dashboard addresses.
  async startDaemon(extra = []) {
    const argv = [this.bins.ftd, '--listen', '127.0.0.1:0', '--http', '127.0.0.1:0', '--data-dir',
      path.join(this.dir, 'ftd'), '--lease-ms', String(this.lease_ms), '--heartbeat-ms', '300', '--tick-ms', '100',
      '--requeue-backoff-ms', '200', '--min-slot-ms', '10000', ...extra];
    if (this.bins.source) argv.push('--web-dir', path.join(this.bins.source, 'web'));
    // A client token needs a worker token too (ftd refuses to start otherwise).
    if (this.token) argv.push('--client-token', this.token, '--worker-token', `${this.token}-worker`);
    await new Promise((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(
        `ftd did not print 'ftd: listening on' and 'ftd: dashboard at' within 20 s; log:\n${this.logOf('ftd')}`)), 20000);
      const child = this.spawnLogged('ftd', argv, (line) => {
        let m = line.match(/ftd: listening on (\S+)/);
        if (m) this.address = m[1];
        m = line.match(/ftd: dashboard at (http:\/\/\S+?)\/?$/);
        if (m) this.url = `${m[1]}/`;
        if (this.address && this.url) {
          clearTimeout(timer);
          resolve();
        }
      });
      child.exited.then((code) => reject(new Error(`ftd exited with ${code}; log:\n${this.logOf('ftd')}`)));
    });
  }

  // Without --cpu-memory the worker reports the host's real memory (total and used).
  startWorker(id, extra = []) {
    return this.spawnLogged(`worker-${id}`, [this.bins.worker, '--daemon', this.address, '--id', id, '--ft-train',
      this.bins.train, '--work-dir', path.join(this.dir, `w-${id}`),
      ...(this.token ? ['--token', `${this.token}-worker`] : []), ...extra]);
  }

  // SIGKILL a worker and every process under it (its trainers): a node lost without notice.
  killWorker(id) {
    const child = this.procs.get(`worker-${id}`);
    const victims = [child.pid, ...descendants(child.pid)];
    for (const pid of victims) {
      try {
        process.kill(pid, 'SIGKILL');
      } catch {
        // Already gone.
      }
    }
    return victims;
  }

  // A tiny Llama and token data under dir/job, and a job.yaml; returns its path.
  // eval_every: also evaluate on the training file every that many steps (data.eval).
  // train_extra: more keys of the train map (e.g. 'optimizer: paged_adamw').
  // mixture: data.train lists the file twice, weights 3 and 1 (each step reports data_share/0, /1).
  writeJob(name, { steps, every_steps, eval_every = 0, lr = '1.0e-2', extra = '', train_extra = '', mixture = false }) {
    const job = this.jobFiles();
    const file = path.join(job, `${name}.yaml`);
    const train = mixture ? '[{path: data.jsonl, weight: 3}, {path: data.jsonl, weight: 1}]' : 'data.jsonl';
    fs.writeFileSync(file, `name: ${name}
model: {path: model, dtype: fp32}
adapter: {type: lora, r: 8, alpha: 16}
data: {train: ${train}, format: tokens, seq_len: 64, packing: false, shuffle: true${eval_every ? ', eval: data.jsonl' : ''}}
train: {max_steps: ${steps}, global_batch_size: 8, micro_batch_size: 2, lr: ${lr}, warmup_steps: 3${eval_every ? `, eval_every_steps: ${eval_every}` : ''}${train_extra ? `, ${train_extra}` : ''}}
checkpoint: {every_steps: ${every_steps}, every_minutes: 0, keep: 3}
output: {dir: out-${name}}
${extra}`);
    return file;
  }

  // The tiny Llama (vocab 256) and token data under dir/job, made once; returns dir/job.
  jobFiles() {
    const job = path.join(this.dir, 'job');
    if (!fs.existsSync(path.join(job, 'model', 'config.json'))) {
      execFileSync(this.bins.train, ['make-model', '--preset', 'tiny-llama', '--out', path.join(job, 'model')],
        { stdio: 'pipe' });
      fs.copyFileSync(path.join(this.bins.source, 'examples', 'tiny-lora', 'data.jsonl'), path.join(job, 'data.jsonl'));
    }
    return job;
  }

  // A DPO job (LoRA, train.objective: dpo) on 32 preference pairs in the token-ids form, each
  // chosen response a run of consecutive ids and each rejected one scattered ids (a preference
  // the adapter learns within a few dozen steps: the margin rises); returns its job.yaml's path.
  writeDpoJob(name, { steps, every_steps }) {
    const job = this.jobFiles();
    const pairs = path.join(job, 'pairs.jsonl');
    if (!fs.existsSync(pairs)) {
      let seed = 7;
      const id = () => 3 + ((seed = (seed * 1103515245 + 12345) % 2147483648) % 253);  // 3..255 < vocab 256
      const rows = Array.from({ length: 32 }, () => {
        const start = id() % 200;
        return JSON.stringify({
          prompt_ids: Array.from({ length: 6 }, id),
          chosen_ids: Array.from({ length: 8 }, (_, k) => 3 + start + k),
          rejected_ids: Array.from({ length: 8 }, id),
        });
      });
      fs.writeFileSync(pairs, `${rows.join('\n')}\n`);
    }
    const file = path.join(job, `${name}.yaml`);
    fs.writeFileSync(file, `name: ${name}
model: {path: model, dtype: fp32}
adapter: {type: lora, r: 8, alpha: 16}
data: {train: pairs.jsonl, format: preference, seq_len: 32, shuffle: true}
train: {max_steps: ${steps}, global_batch_size: 4, micro_batch_size: 2, lr: 2.0e-2, warmup_steps: 2, objective: dpo, dpo: {beta: 0.1}}
checkpoint: {every_steps: ${every_steps}, every_minutes: 0, keep: 2}
output: {dir: out-${name}}
`);
    return file;
  }

  ftctl(...args) {
    return this.ftctlAs(this.token, ...args);
  }

  // ftctl with another token, e.g. a user's from `ftctl admin user add` (see addUser).
  ftctlAs(token, ...args) {
    const argv = ['--addr', this.address, ...(token ? ['--token', token] : []), ...args];
    return execFileSync(this.bins.ftctl, argv, { encoding: 'utf8' }).trim();
  }

  // Adds a user with the client token (an admin's); returns the user's token.
  addUser(name, team, role = 'member') {
    const reply = JSON.parse(this.ftctl('--json', 'admin', 'user', 'add', name, '--team', team, '--role', role));
    if (!reply.token) throw new Error(`ftctl admin user add ${name} printed no token: ${JSON.stringify(reply)}`);
    return reply.token;
  }

  // GET a JSON resource from ftd's HTTP API (the test's own view of the truth).
  async api(pathAndQuery) {
    // Reads need a token whenever ftd has one.
    const res = await fetch(new URL(pathAndQuery, this.url),
      { headers: this.token ? { Authorization: `Bearer ${this.token}` } : {} });
    if (!res.ok) throw new Error(`GET ${pathAndQuery}: HTTP ${res.status} ${await res.text()}`);
    return res.json();
  }

  // Polls fn() until it returns a truthy value; throws `what` after timeout_ms.
  async waitFor(what, fn, timeout_ms) {
    const end = Date.now() + timeout_ms;
    let last;
    while (Date.now() < end) {
      last = await fn();
      if (last) return last;
      await sleep(100);
    }
    throw new Error(`timed out after ${timeout_ms} ms waiting for ${what}`);
  }

  async stop() {
    for (const [name, child] of this.procs) {
      if (child.exitCode !== null || child.signalCode !== null) continue;
      const victims = name.startsWith('worker-') ? [child.pid, ...descendants(child.pid)] : [child.pid];
      for (const pid of victims) {
        try {
          process.kill(pid, 'SIGKILL');
        } catch {
          // Already gone.
        }
      }
      await child.exited;
    }
  }
}

// The frame of a browser test: check() prints each check and throws on the
// first that fails; shot() keeps a full-page screenshot under `out`, shotOf()
// one of an element;
// pageWaitFor() polls a value read from the page. run(main) runs the test and
// exits: 0 and "PASS: <title>" when main resolved, 1 and "FAIL: <reason>"
// (with a screenshot of the page and the tail of ftd's log) when it threw.
// main sets `cluster` and `browser` on the test so that run() stops them.
export class BrowserTest {
  constructor(title, out) {
    this.title = title;
    this.out = out;
    this.shots = [];
    this.cluster = null;
    this.browser = null;
  }

  check(condition, message) {
    if (!condition) throw new Error(`check failed: ${message}`);
    console.log(`ok: ${message}`);
  }

  async shot(page, name) {
    const file = path.join(this.out, `${name}.png`);
    await page.screenshot({ path: file, fullPage: true });
    this.shots.push(file);
  }

  // A screenshot of the element `selector` alone (e.g. one panel).
  async shotOf(page, selector, name) {
    const file = path.join(this.out, `${name}.png`);
    await page.locator(selector).screenshot({ path: file });
    this.shots.push(file);
  }

  // Reads fn() in the page until pred(value) holds; returns that value.
  // A read that throws (the page is between documents after a navigation, or
  // not yet built) counts as "not yet"; the timeout's error names the last one.
  async pageWaitFor(page, what, fn, pred, timeout_ms) {
    let lastError = null;
    try {
      return await this.cluster.waitFor(what, async () => {
        try {
          const value = await page.evaluate(fn);
          lastError = null;
          return pred(value) ? value : null;
        } catch (err) {
          lastError = err;
          return null;
        }
      }, timeout_ms);
    } catch (err) {
      if (lastError) err.message += ` (the last read of the page threw: ${lastError.message})`;
      throw err;
    }
  }

  async run(main) {
    let status = 0;
    try {
      await main();
      console.log(`PASS: ${this.title}`);
    } catch (err) {
      status = 1;
      console.error(`FAIL: ${err.stack || err.message}`);
      if (this.browser) {
        try {
          const pages = this.browser.contexts().flatMap((c) => c.pages());
          if (pages.length) await this.shot(pages[0], 'failure');
        } catch {
          // The browser itself may be what failed.
        }
      }
      if (this.cluster) console.error(`--- ftd log (tail) ---\n${this.cluster.logOf('ftd').slice(-4000)}`);
    } finally {
      if (this.browser) await this.browser.close().catch(() => {});
      if (this.cluster) await this.cluster.stop();
      for (const file of this.shots) console.log(`screenshot: ${file}`);
    }
    process.exit(status);
  }
}
