// The workers page (#/workers): each worker with its devices (memory bars),
// its host memory (what cpu_offload / paged_adamw / activation offload use), current job, slot time left and last heartbeat; lost workers are greyed.
// Loads /api/workers once, then applies the stream's `workers` messages row by
// row; a one-second timer keeps "ago" and "left" texts current.
// Above the table, the Pools panel: per worker pool (ft-worker --pool), its
// live workers, preemption rate, the mean time between preemptions M over its
// attempt history, which checkpoint.every: auto uses, and the goodput of the
// attempts that ended in it (the response's `pools`, issue #31). Each worker's
// row names its pool and the goodput of the attempts that ended on it.

import { getJSON, openStream } from './api.js';
import { el, setText, ago, bytes, duration } from './format.js';

export function mountWorkers(root, _query, app) {
  const rows = new Map();  // worker id → {worker, tr, cells}
  const tbody = el('tbody');
  const summary = el('p', { class: 'status' }, 'Loading workers…');
  const empty = el('p', { class: 'empty', hidden: true },
    'No workers have registered. Start one with: ft-worker --daemon HOST:PORT');
  const pool = poolPanel();
  let closeStream = null;
  let disposed = false;
  root.replaceChildren(
    el('section', { class: 'workers' },
      summary,
      pool.panel,
      el('table', { class: 'grid workers-table' },
        el('thead', {}, el('tr', {},
          ...['Worker', 'Pool', 'Devices', 'Job', 'Goodput', 'Slot left', 'Last heartbeat'].map((h) => el('th', {}, h)))),
        tbody),
      empty));

  function deviceCell(device) {
    const used = device.used_bytes ?? device.total_bytes - device.free_bytes;
    const pct = device.total_bytes ? Math.min(100, (100 * used) / device.total_bytes) : 0;
    return el('div', { class: 'device', title: `${device.kind}:${device.index} ${device.name}` },
      el('span', { class: 'dev-name' }, `${device.kind}:${device.index} ${device.name || ''}`),
      el('div', { class: `bar mem${pct > 90 ? ' hot' : ''}` },
        el('div', { class: 'bar-fill', style: `width:${pct.toFixed(1)}%` })),
      el('span', { class: 'dev-mem' }, `${bytes(used)} / ${bytes(device.total_bytes)}`));
  }

  function fillRow(row, worker) {
    const c = row.cells;
    const previous = row.worker;
    row.worker = worker;
    row.tr.classList.toggle('lost', !worker.alive);
    setText(c.id, worker.id);
    const hostMemory = worker.host_total_bytes
      ? `host memory ${bytes(worker.host_free_bytes)} free of ${bytes(worker.host_total_bytes)}` : '';
    setText(c.host, [worker.hostname, worker.version, hostMemory].filter(Boolean).join(' · '));
    setText(c.alive, worker.alive ? '' : 'lost');
    setText(c.pool, worker.pool || 'default');
    const g = worker.goodput;
    const device = g ? g.productive_s + g.checkpoint_s + g.restart_s + g.lost_s : 0;
    setText(c.goodput, device > 0 ? `${((100 * g.productive_s) / device).toFixed(1)}%` : '–');
    c.goodput.title = device > 0 ? splitTitle(g) : 'no attempt has ended on this worker';
    const devicesKey = JSON.stringify(worker.devices);
    if (!previous || JSON.stringify(previous.devices) !== devicesKey) {
      c.devices.replaceChildren(...worker.devices.map(deviceCell));
    }
    if (!previous || previous.running_job_id !== worker.running_job_id) {
      c.job.replaceChildren(worker.running_job_id
        ? el('a', { href: `#/jobs/${worker.running_job_id}` }, worker.running_job_id) : 'idle');
    }
    tick(row, Date.now());
  }

  function tick(row, now) {
    const w = row.worker;
    setText(row.cells.slot, w.slot_end_ms ? duration((w.slot_end_ms - now) / 1000) : 'no limit');
    setText(row.cells.heartbeat, ago(w.last_heartbeat_ms, now));
  }

  function buildRow(worker) {
    const cells = {
      id: el('span', { class: 'name' }),
      alive: el('span', { class: 'badge s-failed lost-badge' }),
      host: el('div', { class: 'reason' }),
      pool: el('td', { class: 'c-pool' }),
      devices: el('td', { class: 'c-devices' }),
      job: el('td', { class: 'c-job' }),
      goodput: el('td', { class: 'c-goodput num' }),
      slot: el('td', { class: 'c-slot num' }),
      heartbeat: el('td', { class: 'c-heartbeat num' }),
    };
    const tr = el('tr', { 'data-worker-id': worker.id },
      el('td', { class: 'c-worker' }, cells.id, ' ', cells.alive, cells.host),
      cells.pool, cells.devices, cells.job, cells.goodput, cells.slot, cells.heartbeat);
    const row = { worker: null, tr, cells };
    fillRow(row, worker);
    return row;
  }

  function apply(workers) {
    const fragment = document.createDocumentFragment();
    for (const worker of workers) {
      const row = rows.get(worker.id);
      if (row) {
        fillRow(row, worker);
      } else {
        const fresh = buildRow(worker);
        rows.set(worker.id, fresh);
        fragment.append(fresh.tr);
      }
    }
    tbody.append(fragment);
    const alive = [...rows.values()].filter((r) => r.worker.alive).length;
    setText(summary, `${rows.size} workers, ${alive} alive, ${rows.size - alive} lost`);
    empty.hidden = rows.size > 0;
  }

  const timer = setInterval(() => {
    const now = Date.now();
    for (const row of rows.values()) tick(row, now);
  }, 1000);

  (async () => {
    try {
      const list = await getJSON('api/workers');
      if (disposed) return;
      apply(list.workers);
      pool.show(list.pools);
      closeStream = openStream('', {
        workers: (msg) => {
          apply(msg.workers);
          pool.show(msg.pools);
        },
      });
      app.rendered('workers', rows.size);
    } catch (err) {
      summary.textContent = `Could not load workers: ${err.message}`;
      summary.classList.add('error');
    }
  })();

  return () => {
    disposed = true;
    clearInterval(timer);
    if (closeStream) closeStream();
  };
}

// "41.0 min", as ftd writes M in its events and `ftctl status`.
function minutes(seconds) {
  return `${(seconds / 60).toFixed(1)} min`;
}

// "productive 12.0 s · checkpoint 0.4 s · restart 3.1 s · lost 2.2 s" (device-seconds).
function splitTitle(g) {
  return ['productive', 'checkpoint', 'restart', 'lost']
    .map((k) => `${k} ${duration(g[`${k}_s`])}`).join(' · ');
}

// The Pools panel: one row per pool with its live workers, preemptions per hour, M, the attempt
// time they come from, and the goodput of its ended attempts. show(pools) fills it from
// /api/workers' `pools`; hidden while there is none (an older ftd).
function poolPanel() {
  const tbody = el('tbody');
  const panel = el('section', { class: 'panel pool', id: 'pool', hidden: true },
    el('h2', {}, 'Pools'),
    el('table', { class: 'grid pools-table' },
      el('thead', {}, el('tr', {},
        ...['Pool', 'Workers', 'Preemptions per hour', 'Mean time between preemptions', 'From', 'Goodput']
          .map((h) => el('th', {}, h)))),
      tbody),
    el('p', { class: 'note' },
      'M is what checkpoint.every: auto uses: a job checkpoints about every √(2·C·M), C its measured ' +
      'checkpoint write time, M its worker\'s pool\'s. Goodput: productive ÷ all device time of the ' +
      'attempts that ended in the pool.'));

  function row(p) {
    const cell = (name, text, data = {}) => el('td', { 'data-field': name, ...data }, text);
    const rate = p.preemptions_per_hour;
    const g = p.goodput;
    return el('tr', { 'data-pool': p.pool },
      cell('pool', p.pool),
      cell('workers', String(p.workers_alive)),
      cell('rate', rate.toFixed(rate < 10 ? 2 : 1), { 'data-value': rate }),
      cell('mtbf', p.mtbf_is_prior ? `${minutes(p.mtbf_s)} (prior: no preemption yet)` : minutes(p.mtbf_s),
        { 'data-seconds': p.mtbf_s, 'data-prior': p.mtbf_is_prior }),
      cell('history', `${p.preemptions} preemption${p.preemptions === 1 ? '' : 's'} in ` +
        `${duration(p.attempt_seconds)} of attempts`, { 'data-preemptions': p.preemptions }),
      cell('goodput', p.attempts > 0 ? `${(100 * g.goodput).toFixed(1)}%` : '–',
        { 'data-value': g.goodput, title: splitTitle(g) }));
  }

  function show(pools) {
    panel.hidden = !pools || pools.length === 0;
    if (panel.hidden) return;
    tbody.replaceChildren(...pools.map(row));
  }
  return { panel, show };
}
