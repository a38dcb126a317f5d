// The jobs page (#/jobs): every job with its state, progress, loss sparkline,
// attempts, ETA, priority, worker, and who submitted it (user · team, a link to the team's row on
// the Teams page); filters by state and text; counts per
// state; a tick box per job and a Compare button that opens the ticked jobs'
// loss curves on one chart (compare.js). Filters and ticks live in the URL. Loads the list once, then applies live `job` messages from the stream
// to the affected rows only, at most four times a second, so it stays smooth
// with thousands of jobs.

import { getJSON, openStream } from './api.js';
import { compareHash } from './compare.js';
import { teamHref } from './teams.js';
import { el, setText, STATES, duration, number, sparkline, updateSparkline } from './format.js';

const FLUSH_MS = 250;

export function mountJobs(root, query, app) {
  const filter = {
    states: new Set((query.get('state') || '').split(',').filter((s) => STATES.includes(s))),
    text: query.get('q') || '',
  };
  const selected = new Set((query.get('sel') || '').split(',').filter(Boolean));  // ticked for Compare
  const rows = new Map();  // job id → {job, tr, cells}
  const pending = new Map();  // job id → newest summary not yet drawn
  let flushTimer = null;
  let closeStream = null;
  let disposed = false;

  const chips = el('div', { class: 'chips', role: 'group', 'aria-label': 'filter by state' });
  const search = el('input', {
    type: 'search', placeholder: 'search name or id', value: filter.text, 'aria-label': 'search jobs',
  });
  const tbody = el('tbody');
  const empty = el('p', { class: 'empty', hidden: true }, 'No jobs match.');
  const status = el('p', { class: 'status' }, 'Loading jobs…');
  const compare = el('a', { class: 'button compare', role: 'button', 'aria-disabled': 'true' }, 'Compare');
  root.replaceChildren(
    el('section', { class: 'jobs' },
      el('div', { class: 'toolbar' }, chips, search, compare),
      status,
      el('table', { class: 'grid jobs-table' },
        el('thead', {}, el('tr', {},
          el('th', { class: 'c-pick', title: 'tick jobs to compare their loss curves' }, '⇄'),
          ...['State', 'Job', 'Progress', 'Loss', 'Attempts', 'ETA', 'Priority', 'Worker']
            .map((h) => el('th', {}, h)))),
        tbody),
      empty));

  const chipButtons = new Map();
  for (const state of ['all', ...STATES]) {
    const count = el('span', { class: 'count' }, '0');
    const button = el('button', { type: 'button', class: `chip s-${state}`, 'data-state': state },
      state, ' ', count);
    button.addEventListener('click', () => {
      if (state === 'all') filter.states.clear();
      else if (filter.states.has(state)) filter.states.delete(state);
      else filter.states.add(state);
      applyFilter();
    });
    chipButtons.set(state, { button, count });
    chips.append(button);
  }
  search.addEventListener('input', () => {
    filter.text = search.value;
    applyFilter();
  });

  function matches(job) {
    if (filter.states.size && !filter.states.has(job.state)) return false;
    const q = filter.text.trim().toLowerCase();
    return !q || job.id.toLowerCase().includes(q) || (job.name || '').toLowerCase().includes(q);
  }

  function applyFilter() {
    let shown = 0;
    for (const row of rows.values()) {
      const visible = matches(row.job);
      if (row.tr.hidden === visible) row.tr.hidden = !visible;
      if (visible) shown++;
    }
    empty.hidden = shown > 0;
    for (const [state, { button }] of chipButtons) {
      const on = state === 'all' ? filter.states.size === 0 : filter.states.has(state);
      button.classList.toggle('on', on);
      button.setAttribute('aria-pressed', on);
    }
    updateUrl();
  }

  function updateUrl() {
    const params = new URLSearchParams();
    if (filter.states.size) params.set('state', [...filter.states].join(','));
    if (filter.text) params.set('q', filter.text);
    if (selected.size) params.set('sel', [...selected].join(','));
    const hash = `#/jobs${params.size ? `?${params}` : ''}`;
    if (location.hash !== hash) history.replaceState(null, '', hash);
  }

  // Compare opens the ticked jobs, in the order they were ticked (two at least).
  function updateCompare() {
    const n = selected.size;
    setText(compare, n ? `Compare ${n}` : 'Compare');
    if (n >= 2) {
      compare.setAttribute('href', compareHash([...selected]));
      compare.setAttribute('aria-disabled', 'false');
      compare.title = 'loss curves of the ticked jobs on one chart';
    } else {
      compare.removeAttribute('href');
      compare.setAttribute('aria-disabled', 'true');
      compare.title = 'tick two jobs or more to compare them';
    }
  }

  function onPick(id, on) {
    if (on) selected.add(id);
    else selected.delete(id);
    updateCompare();
    updateUrl();
  }

  function updateCounts() {
    const counts = Object.fromEntries(STATES.map((s) => [s, 0]));
    for (const { job } of rows.values()) counts[job.state] = (counts[job.state] || 0) + 1;
    for (const [state, { count }] of chipButtons) {
      setText(count, state === 'all' ? rows.size : counts[state] || 0);
    }
  }

  function buildRow(job) {
    const pick = el('input', { type: 'checkbox', 'aria-label': `compare ${job.id}`, checked: selected.has(job.id) });
    pick.addEventListener('change', () => onPick(job.id, pick.checked));
    const cells = {
      state: el('span', { class: 'badge' }),
      name: el('a', { href: `#/jobs/${job.id}`, class: 'name' }),
      // "j-000042 · alice · nlp": the id (when the name shows instead), who submitted it and its
      // team, one link to the team's row on the Teams page (one element: 1,000 rows lay out faster).
      // A job's team never changes, so the link is set here; without a team it is plain text.
      id: el('a', job.team ? { class: 'id owner', href: teamHref(job.team), title: `team ${job.team} on the Teams page` }
        : { class: 'id' }),
      reason: el('div', { class: 'reason' }),
      bar: el('div', { class: 'bar-fill' }),
      steps: el('span', { class: 'steps' }),
      loss: el('span', { class: 'loss' }),
      spark: sparkline(job.loss_spark),
      attempts: el('td', { class: 'c-attempts num' }),
      eta: el('td', { class: 'c-eta num' }),
      priority: el('td', { class: 'c-priority num' }),
      worker: el('td', { class: 'c-worker' }),
    };
    const tr = el('tr', { 'data-job-id': job.id },
      el('td', { class: 'c-pick' }, pick),
      el('td', { class: 'c-state' }, cells.state),
      el('td', { class: 'c-job' }, cells.name, ' ', cells.id, cells.reason),
      el('td', { class: 'c-progress' }, el('div', { class: 'bar' }, cells.bar), cells.steps),
      el('td', { class: 'c-loss' }, cells.loss, cells.spark),
      cells.attempts, cells.eta, cells.priority, cells.worker);
    const row = { job, tr, cells };
    fillRow(row, job);
    return row;
  }

  function fillRow(row, job) {
    const c = row.cells;
    row.job = job;
    row.tr.className = `s-${job.state}`;
    setText(c.state, job.state);
    c.state.className = `badge s-${job.state}`;
    setText(c.name, job.name || job.id);
    setText(c.id, [job.name ? job.id : '', job.submitted_by, job.team].filter(Boolean).join(' · '));
    setText(c.reason, job.reason || '');
    const total = job.total_steps || 0;
    const pct = total ? Math.min(100, (100 * job.steps_done) / total) : 0;
    const width = `${pct.toFixed(1)}%`;
    if (c.bar.style.width !== width) c.bar.style.width = width;
    setText(c.steps, `${job.steps_done}/${total || '?'}`);
    setText(c.loss, number(job.last_loss));
    updateSparkline(c.spark, job.loss_spark);
    setText(c.attempts, `${job.attempts}${job.preemptions ? ` · ${job.preemptions} preempted` : ''}` +
      `${job.failures ? ` · ${job.failures} failed` : ''}`);
    setText(c.eta, job.state === 'running' ? duration(job.eta_s) : '–');
    setText(c.priority, job.priority);
    setText(c.worker, job.worker_id || '');
  }

  // Newest first: a new job goes before the first row created earlier than it.
  function insertRow(row) {
    let before = null;
    for (const other of rows.values()) {
      if (other.job.created_ms < row.job.created_ms && (!before || other.job.created_ms > before.job.created_ms)) {
        before = other;
      }
    }
    tbody.insertBefore(row.tr, before ? before.tr : null);
  }

  function flush() {
    flushTimer = null;
    for (const job of pending.values()) {
      const row = rows.get(job.id);
      if (row) {
        fillRow(row, job);
        const visible = matches(job);
        if (row.tr.hidden === visible) row.tr.hidden = !visible;
      } else {
        const fresh = buildRow(job);
        rows.set(job.id, fresh);
        insertRow(fresh);
        fresh.tr.hidden = !matches(job);
      }
    }
    pending.clear();
    updateCounts();
    empty.hidden = [...rows.values()].some((r) => !r.tr.hidden);
  }

  function onJob(job) {
    pending.set(job.id, job);
    if (!flushTimer) flushTimer = setTimeout(flush, FLUSH_MS);
  }

  (async () => {
    try {
      const list = await getJSON('api/jobs?limit=10000');
      if (disposed) return;
      const fragment = document.createDocumentFragment();
      for (const job of list.jobs) {
        const row = buildRow(job);
        rows.set(job.id, row);
        fragment.append(row.tr);
      }
      tbody.append(fragment);
      status.hidden = true;
      updateCounts();
      updateCompare();
      applyFilter();
      closeStream = openStream('', { job: onJob });
      app.rendered('jobs', rows.size);
    } catch (err) {
      status.textContent = `Could not load jobs: ${err.message}`;
      status.classList.add('error');
    }
  })();

  return () => {
    disposed = true;
    if (flushTimer) clearTimeout(flushTimer);
    if (closeStream) closeStream();
  };
}
