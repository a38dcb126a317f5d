// The job page (#/jobs/ID): loss and learning-rate curves (the data.eval loss
// as points when the job has one, the lowest of them ringed) with the event timeline drawn on their time
// axis, a DPO job's rewards by step (chosen, rejected and margins, the accuracy
// on a second axis; the panel appears once a point has them, so SFT jobs never
// show it), tokens/s, step time against the time spent waiting for the memory
// techniques' copies (whether prefetching hides them), device memory (used, the planner's prediction and the device
// total on one chart), goodput (where the device time went, as a stacked bar,
// and each preemption's recovery time, also drawn as a band on the loss
// chart's timeline), the plan, who submitted it and its team (a link to the Teams page), attempts,
// the event list (whose messages name who submitted or cancelled), the job's YAML, a live log tail
// and a cancel button.
//
// Live: the stream's job/event/metric messages for this job update the stores
// below (deduplicated, so replays and the initial load may overlap); memory
// samples, the log and the full job (for its goodput, which grows with the
// running attempt) are polled every two seconds while the job is not finished. Redraws are batched to at most three a second.

import { ApiError, getJSON, postJSON, openStream } from './api.js';
import { axisFormats, eventMarkers, integerIncrs, lineChart, objectiveMetric, timeChart } from './charts.js';
import { el, setText, FINISHED, ago, bytes, clock, duration, number } from './format.js';
import { teamHref } from './teams.js';

const REDRAW_MS = 300;
const POLL_MS = 2000;
const PAGE = 10000;

// Goodput's categories of device-seconds (docs/HTTP_API.md): key, name, colour.
const GOODPUT_PARTS = [
  ['productive_s', 'productive', '#188038'],
  ['checkpoint_s', 'checkpoint', '#1a73e8'],
  ['restart_s', 'restart', '#7b1fa2'],
  ['lost_s', 'lost', '#d93025'],
];
const RECOVERY_COLOUR = '#e37400';
// The Rewards chart's series (TRL's DPO means, docs/HTTP_API.md): metric name, label, colour,
// scale ('acc': the right axis, 0..1) and uPlot series options.
const REWARDS = [
  ['rewards/chosen', 'chosen', '#188038', 'reward', {}],
  ['rewards/rejected', 'rejected', '#d93025', 'reward', {}],
  ['rewards/margins', 'margins', '#1a73e8', 'reward', { width: 2 }],
  ['rewards/accuracies', 'accuracy', '#e37400', 'acc', { dash: [6, 4] }],
];

// A step point's data_share/<k>: the rows source k of data.train has given over all rows so far
// (a job whose data.train lists several sources).
const SHARE = 'data_share/';

export function mountJob(root, id, app) {
  const store = {
    job: null,
    metrics: new Map(),  // "epoch:step" → point
    events: new Map(),  // seq → event
    memory: new Map(),  // "time:worker:device" → sample
    predicted: 0,
    log: '',
  };
  const dirty = new Set();
  let redrawTimer = null;
  let pollTimer = null;
  let closeStream = null;
  let disposed = false;
  let loaded = false;  // initial load done: later lifecycle events refetch the job
  let detailInFlight = false;
  let detailAgain = false;

  const ui = buildPage(root, id);
  app.charts = {};
  const markers = eventMarkers(() => sortedEvents());
  const charts = {
    loss: timeChart(ui.lossChart, {
      series: [
        { label: 'loss', scale: 'loss', stroke: '#1a73e8', width: 2 },
        { label: 'lr', scale: 'lr', stroke: '#e37400', dash: [6, 4] },
        // data.eval loss: points only, at the steps that were evaluated (null elsewhere).
        { label: 'eval loss', scale: 'loss', stroke: '#d93025', paths: () => null, points: { show: true, size: 7, fill: '#d93025' } },
        // The best (lowest) eval loss: a ring around that one point (checkpoint.keep_best keeps its checkpoint).
        { label: 'best eval', scale: 'loss', stroke: '#188038', paths: () => null,
          points: { show: true, size: 15, width: 2, fill: 'transparent' } },
      ],
      axes: [
        { scale: 'loss', label: 'loss', size: 60, values: axisFormats.number },
        { scale: 'lr', label: 'learning rate', side: 1, size: 70, grid: { show: false }, values: axisFormats.number },
      ],
      plugins: [markers, recoveryBands(() => recoveries())],
      xRange: (min, max) => eventRange(min, max),
    }),
    tokens: timeChart(ui.tokensChart, {
      series: [{ label: 'tokens/s', stroke: '#188038', scale: 'tps' }],
      axes: [{ scale: 'tps', size: 70, values: axisFormats.number }],
      plugins: [eventMarkers(() => sortedEvents().filter((e) => e.kind !== 'checkpoint'))],
      xRange: (min, max) => eventRange(min, max),
      height: 160,
    }),
    // Step wall time and, of it, the wait for copy-stream transfers (offloaded
    // activations and weights, paged optimizer states) that compute did not hide.
    timing: timeChart(ui.timingChart, {
      series: [
        { label: 'step s', stroke: '#1a73e8', scale: 's', width: 2 },
        { label: 'copy wait s', stroke: '#d93025', scale: 's', fill: '#d9302522' },
      ],
      axes: [{ scale: 's', size: 70, values: axisFormats.number }],
      xRange: (min, max) => eventRange(min, max),
      height: 160,
    }),
    memory: null,  // built once the devices are known (one used/total pair per device)
    rewards: null,  // built once a point has the objective's rewards (DPO jobs)
  };
  app.charts = charts;
  app.job = store;

  // ---- data → charts and tables ---------------------------------------------------------

  function sortedEvents() {
    return [...store.events.values()].sort((a, b) => a.seq - b.seq);
  }

  // The charts' time axis spans the metrics and the events from the first
  // start on, so markers before the first step (started) are visible too; the
  // time spent queued before that is left to the event list.
  function eventRange(min, max) {
    let lo = Number.isFinite(min) ? min : Infinity;
    let hi = Number.isFinite(max) ? max : -Infinity;
    const events = sortedEvents();
    const first = events.findIndex((e) => e.kind === 'started');
    for (const event of first >= 0 ? events.slice(first) : events) {
      lo = Math.min(lo, event.time_ms / 1000);
      hi = Math.max(hi, event.time_ms / 1000);
    }
    if (!Number.isFinite(lo)) lo = hi = Date.now() / 1000;
    if (hi - lo < 10) hi = lo + 10;
    const pad = (hi - lo) * 0.02;
    return [lo - pad, hi + pad];
  }

  function drawMetrics() {
    const points = [...store.metrics.values()].sort((a, b) => a.time_ms - b.time_ms || a.step - b.step);
    const t = points.map((p) => p.time_ms / 1000);
    const evalLoss = points.map((p) => finite(p.eval_loss));
    charts.loss.setData([t, points.map((p) => finite(p.loss)), points.map((p) => finite(p.lr)), evalLoss,
      bestOnly(evalLoss)]);
    charts.tokens.setData([t, points.map((p) => finite(p.tokens_per_s))]);
    charts.timing.setData([t, points.map((p) => finite(p.step_seconds)), points.map((p) => finite(p.copy_wait_seconds))]);
    drawRewards(points);
    drawMixture(points);
  }

  // The Data mixture panel: each source's share of the rows trained so far (the newest step's
  // data_share/<k>), shown once a point has them.
  function drawMixture(points) {
    const shares = (p) => Object.entries(p.objective_metrics || {}).filter(([name]) => name.startsWith(SHARE));
    const newest = points.filter((p) => shares(p).length > 0).pop();
    if (!newest) return;
    ui.mixturePanel.hidden = false;
    const rows = shares(newest).map(([name, v]) => [Number(name.slice(SHARE.length)), v]).sort((a, b) => a[0] - b[0]);
    if (ui.mixture.childElementCount !== rows.length) {
      ui.mixture.replaceChildren(...rows.map(([k]) => {
        const fill = el('div', { class: 'bar-fill' });
        return el('tr', { 'data-source': k }, el('td', {}, `data.train[${k}]`), el('td', { class: 'share' }),
          el('td', {}, el('div', { class: 'bar wide' }, fill)));
      }));
    }
    rows.forEach(([, v], i) => {
      const row = ui.mixture.children[i];
      setText(row.querySelector('.share'), `${(100 * v).toFixed(1)}%`);
      row.querySelector('.bar-fill').style.width = `${(100 * v).toFixed(1)}%`;
    });
  }

  // The Rewards panel, by optimizer step (a step replayed after a resume: the newest epoch's
  // point): shown and its chart built once a point has any of REWARDS.
  function drawRewards(points) {
    const byStep = new Map();
    for (const p of points) {
      if (!REWARDS.some(([name]) => objectiveMetric(p, name) !== null)) continue;
      if (!byStep.has(p.step) || byStep.get(p.step).epoch <= p.epoch) byStep.set(p.step, p);
    }
    if (!byStep.size) return;
    if (!charts.rewards) {
      ui.rewardsPanel.hidden = false;
      charts.rewards = lineChart(ui.rewardsChart, {
        series: REWARDS.map(([, label, stroke, scale, options]) => ({ label, stroke, scale, ...options })),
        x: { time: false },
        xAxis: { label: 'optimizer step', values: axisFormats.integer, incrs: integerIncrs },
        scales: { acc: { range: () => [0, 1] } },
        axes: [
          { scale: 'reward', label: 'reward (β · log-ratio)', size: 60, values: axisFormats.number },
          { scale: 'acc', label: 'accuracy', side: 1, size: 50, grid: { show: false }, values: axisFormats.number },
        ],
      });
    }
    const rows = [...byStep.values()].sort((a, b) => a.step - b.step);
    charts.rewards.setData([rows.map((p) => p.step), ...REWARDS.map(([name]) => rows.map((p) => objectiveMetric(p, name)))]);
  }

  function drawMemory() {
    const samples = [...store.memory.values()].sort((a, b) => a.time_ms - b.time_ms);
    const devices = [...new Set(samples.map((s) => `${s.worker_id}/${s.device}`))];
    const key = devices.join('|');
    if (!charts.memory || charts.memory.ftDevices !== key) {
      if (charts.memory) charts.memory.ftDispose();
      ui.memoryChart.replaceChildren();
      const palette = ['#1a73e8', '#e37400', '#7b1fa2', '#188038', '#d93025', '#00838f'];
      const series = [{ label: 'predicted', scale: 'bytes', stroke: '#d93025', dash: [8, 4], width: 2 }];
      devices.forEach((device, i) => {
        const colour = palette[i % palette.length];
        series.push({ label: `used ${device}`, scale: 'bytes', stroke: colour, width: 2, fill: `${colour}22` });
        series.push({ label: `total ${device}`, scale: 'bytes', stroke: colour, dash: [2, 3] });
      });
      charts.memory = timeChart(ui.memoryChart, {
        series,
        scales: { bytes: { range: (u, min, max) => [0, Math.max(max || 0, store.predicted) * 1.05 || 1] } },
        axes: [{ scale: 'bytes', values: axisFormats.bytes, size: 70 }],
        plugins: [eventMarkers(() => sortedEvents().filter((e) => e.kind !== 'checkpoint'))],
        xRange: (min, max) => eventRange(min, max),
      });
      charts.memory.ftDevices = key;
    }
    const times = [...new Set(samples.map((s) => s.time_ms))];
    const index = new Map(times.map((t, i) => [t, i]));
    const data = [times.map((t) => t / 1000), times.map(() => store.predicted || null)];
    for (const device of devices) {
      const used = new Array(times.length).fill(null);
      const total = new Array(times.length).fill(null);
      for (const s of samples) {
        if (`${s.worker_id}/${s.device}` !== device) continue;
        used[index.get(s.time_ms)] = s.used_bytes;
        total[index.get(s.time_ms)] = s.total_bytes;
      }
      data.push(used, total);
    }
    charts.memory.setData(data);
    setText(ui.memoryNote, samples.length
      ? `${samples.length} samples from ${devices.length} device(s); predicted ${bytes(store.predicted)}`
      : `No device samples yet; predicted ${store.predicted ? bytes(store.predicted) : 'unknown'}`);
  }

  function drawEvents() {
    const events = sortedEvents().reverse();
    ui.events.replaceChildren(...events.map((e) =>
      el('tr', { class: `k-${e.kind}` },
        el('td', { class: 'num' }, clock(e.time_ms)),
        el('td', {}, el('span', { class: `badge k-${e.kind}` }, e.kind)),
        el('td', {}, e.worker_id || ''),
        el('td', { class: 'num' }, e.step || ''),
        el('td', {}, e.message || ''))));
    charts.loss.redraw(false, false);
  }

  function drawJob() {
    const job = store.job;
    if (!job) return;
    setText(ui.title, job.name || job.id);
    setText(ui.state, job.state);
    ui.state.className = `badge s-${job.state}`;
    setText(ui.reason, job.reason || '');
    const total = job.total_steps || 0;
    ui.bar.style.width = `${total ? Math.min(100, (100 * job.steps_done) / total).toFixed(1) : 0}%`;
    setText(ui.steps, `step ${job.steps_done} / ${total || '?'}` +
      (job.state === 'running' && job.eta_s != null ? ` · ETA ${duration(job.eta_s)}` : ''));
    ui.cancel.disabled = FINISHED.has(job.state);
    const plan = job.plan;
    const rows = [
      ['last loss', number(job.last_loss)],
      ['tokens/s', number(job.tokens_per_s)],
      ['committed step', job.committed_step],
      ['plan', plan ? `${plan.micro_batch} micro × ${plan.accumulation} accumulation × ${plan.world} world` : 'not planned yet'],
      ['predicted memory', store.predicted ? bytes(store.predicted) : 'unknown'],
      ['priority', job.priority],
      ['submitted by', job.submitted_by || '–'],
      ['team', job.team ? el('a', { href: teamHref(job.team) }, job.team) : '–'],
      ['attempts', `${job.attempts} (${job.preemptions} preempted, ${job.failures} failed)`],
      ['worker', job.worker_id || '–'],
      ['created', clock(job.created_ms)],
      ['updated', `${clock(job.updated_ms)} (${ago(job.updated_ms)})`],
      ['output', job.output_dir || '–'],
    ];
    ui.summary.replaceChildren(...rows.flatMap(([k, v]) =>
      [el('dt', {}, k), el('dd', { 'data-field': k.replace(/ /g, '-') }, v instanceof Node ? v : String(v))]));
    if (job.attempts_list) {
      ui.attempts.replaceChildren(...job.attempts_list.slice().reverse().map((a) =>
        el('tr', { class: `o-${a.outcome}` },
          el('td', { class: 'num' }, a.number),
          el('td', { class: 'num' }, a.epoch),
          el('td', { 'data-field': 'ranks', title: rankTitle(a) },
            a.ranks && a.ranks.length ? a.ranks.map((r) => r.worker_id).join(' · ') : a.worker_id),
          el('td', {}, el('span', { class: `badge o-${a.outcome}` }, a.outcome)),
          el('td', {}, a.reason || ''),
          el('td', { class: 'num' }, clock(a.started_ms)),
          el('td', { class: 'num' }, a.ended_ms ? clock(a.ended_ms) : '–'),
          el('td', { class: 'num' }, `${a.start_step} → ${a.end_step}`),
          el('td', { class: 'num' }, a.steps_lost),
          el('td', { class: 'num' }, a.micro_batch ? `${a.micro_batch}×${a.accumulation}×${a.world}` : '–'),
          el('td', { class: 'num', 'data-field': 'goodput' }, attemptGoodput(a)))));
    }
    drawGoodput();
    if (job.spec_yaml !== undefined) setText(ui.yaml, job.spec_yaml);
  }

  // A multi-rank attempt's ranks, one per line: "rank 0: w1 device 0".
  function rankTitle(a) {
    if (!a.ranks || !a.ranks.length) return '';
    return a.ranks.map((r) => `rank ${r.rank}: ${r.worker_id} device ${r.device}`).join('\n');
  }

  // The job's recoveries, each placed on the time axis: recovery_s[i] began when
  // attempt recovery_after[i] ended (its preemption; daemon/goodput.h). Each:
  // {seconds, from_ms (that attempt's end; null if the page has not its row), after}.
  function recoveries() {
    const g = store.job && store.job.goodput;
    if (!g || !g.recovery_s) return [];
    const byNumber = new Map((store.job.attempts_list || []).map((a) => [a.number, a]));
    return g.recovery_s.map((seconds, i) => {
      const after = (g.recovery_after || [])[i];
      const a = byNumber.get(after);
      return { seconds, from_ms: a ? a.ended_ms : null, after: a ? after : null };
    });
  }

  function drawGoodput() {
    const g = store.job && store.job.goodput;
    const view = ui.goodput;
    if (!g) {
      setText(view.line, 'This ftd does not report goodput.');
      return;
    }
    const total = GOODPUT_PARTS.reduce((sum, [key]) => sum + (g[key] || 0), 0);
    for (const [key, name] of GOODPUT_PARTS) {
      const value = g[key] || 0;
      const share = total > 0 ? (100 * value) / total : 0;
      const segment = view.segments[key];
      segment.style.width = `${share.toFixed(2)}%`;
      segment.title = `${name}: ${seconds(value)} (${share.toFixed(1)}%)`;
      segment.dataset.seconds = value.toFixed(1);
      setText(view.values[key], `${seconds(value)} (${share.toFixed(1)}%)`);
      view.values[key].dataset.seconds = value.toFixed(1);
    }
    setText(view.line, total > 0
      ? `goodput ${(100 * g.goodput).toFixed(1)}% of ${seconds(total)} device time · queued ${seconds(g.queue_s)}`
      : `no device time yet · queued ${seconds(g.queue_s)}`);
    setText(view.cost, costLine(g.cost));
    const list = recoveries();
    const sorted = list.map((r) => r.seconds).sort((a, b) => a - b);
    setText(view.recoverySummary, sorted.length
      ? `${sorted.length} ${sorted.length === 1 ? 'recovery' : 'recoveries'} (loss known → next first step): ` +
        `p50 ${seconds(sorted[Math.floor((sorted.length - 1) / 2)])}, max ${seconds(sorted[sorted.length - 1])}` +
        ' (orange bands on the loss chart)'
      : 'no recovery from a preemption yet');
    const key = list.map((r) => `${r.after}:${r.seconds}`).join('|');
    if (view.recoveryList.dataset.key !== key) {
      view.recoveryList.dataset.key = key;
      view.recoveryList.replaceChildren(...list.map((r) => el('li', { 'data-seconds': r.seconds.toFixed(1) },
        r.after ? `after attempt ${r.after} (ended ${clock(r.from_ms)}): ${seconds(r.seconds)}` : seconds(r.seconds))));
      charts.loss.redraw(false, false);
    }
  }

  function drawLog() {
    const atBottom = ui.log.scrollTop + ui.log.clientHeight >= ui.log.scrollHeight - 4;
    setText(ui.log, store.log || '(no log yet)');
    if (atBottom) ui.log.scrollTop = ui.log.scrollHeight;
  }

  // An attempt's device-seconds: productive · overhead (checkpoint + restart) · lost.
  function attemptGoodput(a) {
    const g = a.goodput;
    if (!g) return '–';
    return `${g.productive_s.toFixed(1)} · ${(g.checkpoint_s + g.restart_s).toFixed(1)} · ${g.lost_s.toFixed(1)}`;
  }

  const drawers = { metrics: drawMetrics, memory: drawMemory, events: drawEvents, job: drawJob, log: drawLog };

  function changed(what) {
    dirty.add(what);
    if (!redrawTimer) redrawTimer = setTimeout(redraw, REDRAW_MS);
  }

  function redraw() {
    redrawTimer = null;
    if (disposed) return;
    for (const what of dirty) drawers[what]();
    dirty.clear();
  }

  // `values` with every entry but the first lowest one null (all null when none is finite).
  function bestOnly(values) {
    let best = -1;
    values.forEach((v, i) => {
      if (v !== null && (best < 0 || v < values[best])) best = i;
    });
    return values.map((v, i) => (i === best ? v : null));
  }

  // ---- loading ---------------------------------------------------------------------------

  function finite(x) {
    return Number.isFinite(x) ? x : null;
  }

  function addMetric(point) {
    store.metrics.set(`${point.epoch}:${point.step}`, point);
  }

  function addEvent(event) {
    if (store.events.has(event.seq)) return;
    store.events.set(event.seq, event);
    // Attempts, plan and the YAML come only with the full job: refetch on lifecycle events.
    if (loaded && event.kind !== 'checkpoint') refreshDetail();
  }

  // The full job (attempts, plan, YAML); a request made while one is in flight
  // runs once more after it, so the newest state always lands.
  async function loadDetail() {
    if (detailInFlight) {
      detailAgain = true;
      return;
    }
    detailInFlight = true;
    try {
      do {
        detailAgain = false;
        const job = await getJSON(`api/jobs/${id}`);
        store.job = job;
        store.predicted = job.predicted_bytes || 0;
        changed('job');
        changed('memory');
      } while (detailAgain && !disposed);
    } finally {
      detailInFlight = false;
    }
  }

  function refreshDetail() {
    loadDetail().catch((err) => console.warn(`ftune: reloading ${id} failed`, err));
  }

  async function loadMetrics() {
    for (let after = -1; ;) {
      const q = after >= 0 ? `after_step=${after}&` : '';
      const { points } = await getJSON(`api/jobs/${id}/metrics?${q}limit=${PAGE}`);
      points.forEach(addMetric);
      if (points.length < PAGE) break;
      after = points[points.length - 1].step;
    }
    changed('metrics');
  }

  async function loadEvents() {
    const { events } = await getJSON(`api/jobs/${id}/events?limit=${PAGE}`);
    events.forEach(addEvent);
    changed('events');
  }

  let memoryAfter = 0;
  async function loadMemory() {
    const { predicted_bytes: predicted, samples } = await getJSON(`api/jobs/${id}/memory?after_ms=${memoryAfter}`);
    if (predicted) store.predicted = predicted;
    for (const s of samples) {
      store.memory.set(`${s.time_ms}:${s.worker_id}:${s.device}`, s);
      memoryAfter = Math.max(memoryAfter, s.time_ms);
    }
    changed('memory');
  }

  async function loadLog() {
    const text = await getJSON(`api/jobs/${id}/log?tail_bytes=65536`);
    if (text !== store.log) {
      store.log = text;
      changed('log');
    }
  }

  async function poll() {
    pollTimer = null;
    if (disposed) return;
    try {
      await Promise.all([loadMemory(), loadLog(), loadDetail()]);
    } catch (err) {
      console.warn('ftune: poll failed', err);
    }
    if (!disposed && !(store.job && FINISHED.has(store.job.state))) pollTimer = setTimeout(poll, POLL_MS);
  }

  ui.cancel.addEventListener('click', async () => {
    if (!window.confirm(`Cancel ${id}? Its newest checkpoint is kept.`)) return;
    setText(ui.message, 'Cancelling…');
    try {
      store.job = await postJSON(`api/jobs/${id}/cancel`, 'cancel jobs');
      setText(ui.message, `Cancelled ${id}.`);
      changed('job');
    } catch (err) {
      setText(ui.message, err.status === 409 ? `Not cancelled: ${err.message}` : `Cancel failed: ${err.message}`);
    }
  });

  (async () => {
    try {
      await loadDetail();
      if (disposed) return;
      closeStream = openStream(id, {
        job: (summary) => {
          if (summary.id !== id) return;
          const attemptsChanged = !store.job || summary.attempts !== store.job.attempts || summary.state !== store.job.state;
          store.job = { ...store.job, ...summary };
          changed('job');
          if (attemptsChanged) refreshDetail();
          if (!FINISHED.has(summary.state) && !pollTimer) poll();
        },
        event: (event) => {
          if (event.job_id !== id) return;
          addEvent(event);
          changed('events');
        },
        metric: (point) => {
          if (point.job_id !== id) return;
          addMetric(point);
          changed('metrics');
        },
      });
      await Promise.all([loadMetrics(), loadEvents(), loadMemory(), loadLog()]);
      loaded = true;
      redraw();
      app.rendered('job', store.metrics.size);
      if (!FINISHED.has(store.job.state)) pollTimer = setTimeout(poll, POLL_MS);
    } catch (err) {
      const text = err instanceof ApiError && err.status === 404
        ? `No job ${id}: it may have been mistyped; see the jobs list.` : `Could not load ${id}: ${err.message}`;
      root.replaceChildren(el('p', { class: 'status error' }, text, ' ', el('a', { href: '#/jobs' }, 'All jobs')));
    }
  })();

  return () => {
    disposed = true;
    clearTimeout(redrawTimer);
    clearTimeout(pollTimer);
    if (closeStream) closeStream();
    for (const chart of Object.values(charts)) if (chart) chart.ftDispose();
  };
}

function buildPage(root, id) {
  const ui = {
    title: el('h1', {}, id),
    state: el('span', { class: 'badge' }),
    reason: el('span', { class: 'reason' }),
    cancel: el('button', { type: 'button', class: 'danger', id: 'cancel' }, 'Cancel job'),
    message: el('span', { class: 'message', role: 'status' }),
    bar: el('div', { class: 'bar-fill' }),
    steps: el('span', { class: 'steps' }),
    summary: el('dl', { class: 'summary' }),
    lossChart: el('div', { class: 'chart', id: 'chart-loss' }),
    rewardsChart: el('div', { class: 'chart', id: 'chart-rewards' }),
    tokensChart: el('div', { class: 'chart', id: 'chart-tokens' }),
    timingChart: el('div', { class: 'chart', id: 'chart-timing' }),
    memoryChart: el('div', { class: 'chart', id: 'chart-memory' }),
    memoryNote: el('p', { class: 'note' }),
    events: el('tbody'),
    attempts: el('tbody'),
    log: el('pre', { class: 'log', id: 'log' }),
    yaml: el('pre', { class: 'yaml' }),
    goodput: goodputView(),
  };
  const panel = (title, ...children) => el('section', { class: 'panel' }, el('h2', {}, title), ...children);
  ui.rewardsPanel = el('section', { class: 'panel', id: 'rewards', hidden: true },
    el('h2', {}, 'Rewards (DPO) by step: chosen, rejected, margins; accuracy on the right'), ui.rewardsChart);
  const table = (heads, body) =>
    el('table', { class: 'grid' }, el('thead', {}, el('tr', {}, ...heads.map((h) => el('th', {}, h)))), body);
  ui.mixture = el('tbody');
  ui.mixturePanel = el('section', { class: 'panel', id: 'mixture', hidden: true },
    el('h2', {}, 'Data mixture: each source\'s share of the rows trained so far'),
    table(['source', 'share', ''], ui.mixture));
  root.replaceChildren(el('div', { class: 'job' },
    el('p', { class: 'crumbs' }, el('a', { href: '#/jobs' }, 'Jobs'), ` / ${id}`),
    el('div', { class: 'job-head' }, ui.title, ui.state, ui.reason, el('span', { class: 'spacer' }), ui.message, ui.cancel),
    el('div', { class: 'progress-line' }, el('div', { class: 'bar wide' }, ui.bar), ui.steps),
    el('div', { class: 'panels' },
      panel('Summary', ui.summary),
      ui.goodput.panel,
      panel('Loss, eval loss and learning rate (markers: events)', ui.lossChart),
      ui.rewardsPanel,
      ui.mixturePanel,
      panel('Tokens per second', ui.tokensChart),
      panel('Step time and copy wait (memory techniques)', ui.timingChart),
      panel('Device memory: used, predicted, total', ui.memoryChart, ui.memoryNote),
      panel('Events', el('div', { class: 'scroll' }, table(['time', 'event', 'worker', 'step', 'message'], ui.events))),
      panel('Attempts', el('div', { class: 'scroll' },
        table(['#', 'epoch', 'worker (ranks)', 'outcome', 'reason', 'started', 'ended', 'steps', 'lost', 'plan',
          'productive · overhead · lost (device s)'], ui.attempts))),
      panel('Log (tail)', ui.log),
      panel('job.yaml', ui.yaml))));
  return ui;
}

// The goodput panel's elements: a stacked bar with one segment per category,
// its legend (seconds and share), the goodput line and the recoveries.
function goodputView() {
  const view = {
    segments: {},
    values: {},
    bar: el('div', { class: 'gp-bar', id: 'goodput-bar' }),
    legend: el('ul', { class: 'gp-legend' }),
    line: el('p', { class: 'gp-line', 'data-field': 'goodput' }),
    cost: el('p', { class: 'note', 'data-field': 'cost' }),
    recoverySummary: el('p', { class: 'note', 'data-field': 'recoveries' }),
    recoveryList: el('ul', { class: 'gp-recoveries' }),
  };
  for (const [key, name, colour] of GOODPUT_PARTS) {
    view.segments[key] = el('div', { class: 'gp-seg', 'data-part': key, style: `background: ${colour}` });
    view.values[key] = el('span', { class: 'num' });
    view.bar.append(view.segments[key]);
    view.legend.append(el('li', { 'data-part': key },
      el('span', { class: 'swatch', style: `background: ${colour}` }), `${name} `, view.values[key]));
  }
  view.panel = el('section', { class: 'panel', id: 'goodput' },
    el('h2', {}, 'Goodput: where the device time went'), view.line, view.cost, view.bar, view.legend,
    view.recoverySummary, view.recoveryList);
  return view;
}

// What the device time cost, by category (docs/OPERATIONS.md, "Money"); "" when not priced.
function costLine(c) {
  if (!c || !(c.total > 0)) return '';
  const money = (x) => x.toLocaleString('en-US', { style: 'currency', currency: 'USD' });
  return `cost ${money(c.total)}: productive ${money(c.productive)}, lost ${money(c.lost)}, ` +
    `overhead ${money(c.checkpoint + c.restart)} (checkpoints and restarts)`;
}

// 4.25 → "4.3 s", 4523 → "4523 s (1h 15m)".
function seconds(s) {
  if (s === null || s === undefined || !Number.isFinite(s)) return '–';
  return s < 60 ? `${s.toFixed(1)} s` : `${s.toFixed(0)} s (${duration(s)})`;
}

// A uPlot plugin: each recovery as a translucent band from the preempted
// attempt's end to the next attempt's first step, labelled with its length.
// The bands drawn last are kept on u.ftRecoveries (read by tests).
function recoveryBands(getRecoveries) {
  function draw(u) {
    const { ctx, bbox } = u;
    const drawn = [];
    ctx.save();
    ctx.font = `${Math.round(11 * devicePixelRatio)}px system-ui, sans-serif`;
    ctx.textBaseline = 'bottom';
    for (const r of getRecoveries()) {
      if (r.from_ms === null) continue;
      const from = u.valToPos(r.from_ms / 1000, 'x', true);
      const to = u.valToPos(r.from_ms / 1000 + r.seconds, 'x', true);
      const left = Math.max(bbox.left, Math.min(from, to));
      const right = Math.min(bbox.left + bbox.width, Math.max(from, to));
      if (right <= left) continue;
      ctx.fillStyle = `${RECOVERY_COLOUR}33`;
      ctx.fillRect(left, bbox.top, right - left, bbox.height);
      const label = `recovery ${seconds(r.seconds)}`;
      ctx.fillStyle = RECOVERY_COLOUR;
      ctx.fillText(label, left + 3 * devicePixelRatio, bbox.top + bbox.height - 2 * devicePixelRatio);
      drawn.push({ from_ms: r.from_ms, seconds: r.seconds, label });
    }
    ctx.restore();
    u.ftRecoveries = drawn;
  }
  return { hooks: { draw: [draw] } };
}
