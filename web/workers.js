// The workers page (#/workers): each worker with its devices (memory bars),
// its host memory (what cpu_offload / paged_adamw / activation offload use), current job, slot time left and last heartbeat; lost workers are greyed.
// Loads /api/workers once, then applies the stream's `workers` messages row by
// row; a one-second timer keeps "ago" and "left" texts current.
// Above the table, the Pool panel: the preemption rate and the mean time
// between preemptions M over ftd's attempt history (the response's `pool`,
// issue #31), which checkpoint.every: auto uses. One pool: every worker of this ftd.

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
          ...['Worker', 'Devices', 'Job', 'Slot left', 'Last heartbeat'].map((h) => el('th', {}, h)))),
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
      devices: el('td', { class: 'c-devices' }),
      job: el('td', { class: 'c-job' }),
      slot: el('td', { class: 'c-slot num' }),
      heartbeat: el('td', { class: 'c-heartbeat num' }),
    };
    const tr = el('tr', { 'data-worker-id': worker.id },
      el('td', { class: 'c-worker' }, cells.id, ' ', cells.alive, cells.host),
      cells.devices, cells.job, cells.slot, cells.heartbeat);
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
      pool.show(list.pool);
      closeStream = openStream('', {
        workers: (msg) => {
          apply(msg.workers);
          pool.show(msg.pool);
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

// The Pool panel: preemptions per hour, M, and the attempt time they come from.
// show(pool) fills it from /api/workers' `pool`; hidden while there is none (an older ftd).
function poolPanel() {
  const field = (name) => el('dd', { 'data-field': name });
  const fields = { rate: field('rate'), mtbf: field('mtbf'), history: field('history') };
  const panel = el('section', { class: 'panel pool', id: 'pool', hidden: true },
    el('h2', {}, 'Pool'),
    el('dl', { class: 'summary' },
      el('dt', {}, 'Preemptions per hour'), fields.rate,
      el('dt', {}, 'Mean time between preemptions'), fields.mtbf,
      el('dt', {}, 'From'), fields.history),
    el('p', { class: 'note' },
      'M is what checkpoint.every: auto uses: each job checkpoints about every √(2·C·M), ' +
      'C its measured checkpoint write time. One pool: every worker of this ftd.'));

  function show(p) {
    panel.hidden = !p;
    if (!p) return;
    const rate = p.preemptions_per_hour;
    setText(fields.rate, rate.toFixed(rate < 10 ? 2 : 1));
    fields.rate.dataset.value = rate;
    setText(fields.mtbf, p.mtbf_is_prior ? `${minutes(p.mtbf_s)} (prior: no preemption yet)` : minutes(p.mtbf_s));
    fields.mtbf.dataset.seconds = p.mtbf_s;
    fields.mtbf.dataset.prior = p.mtbf_is_prior;
    setText(fields.history, `${p.preemptions} preemption${p.preemptions === 1 ? '' : 's'} in ` +
      `${duration(p.attempt_seconds)} of attempts`);
    fields.history.dataset.preemptions = p.preemptions;
  }
  return { panel, show };
}
