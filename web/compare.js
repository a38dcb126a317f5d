// The compare page (#/compare?jobs=ID,ID&x=step|tokens): the loss and eval
// loss curves of several jobs overlaid on one chart, one colour per job, by
// optimizer step or by target tokens trained on; and, when any of them reports
// it (DPO runs), their reward margins (rewards/margins) on a second chart on
// the same axis, one line per such run. The URL holds the selection
// and the axis, so a reload or a shared link shows the same view. Live: new
// metric points of the selected jobs are added as they arrive (at most four
// redraws a second).
//
// Success: every selected job that exists has its two series; a job that does
// not exist (or cannot be read) gets an error line naming it, and the others
// are drawn anyway.

import { getJSON, openStream } from './api.js';
import { axisFormats, integerIncrs, lineChart, objectiveMetric } from './charts.js';
import { el, number } from './format.js';

const PAGE = 5000;
const REDRAW_MS = 250;
const COLOURS = ['#1a73e8', '#d93025', '#188038', '#e37400', '#7b1fa2', '#00897b', '#5f6368', '#c2185b'];
export const X_AXES = { step: 'optimizer step', tokens: 'target tokens trained on' };
const MARGINS = 'rewards/margins';

// The selection in a compare URL: job ids (unique, in order) and the x axis.
export function parseSelection(query) {
  const ids = [...new Set((query.get('jobs') || '').split(',').map((s) => s.trim()).filter(Boolean))];
  const x = query.get('x') in X_AXES ? query.get('x') : 'step';
  return { ids, x };
}

export function compareHash(ids, x = 'step') {
  const params = new URLSearchParams({ jobs: ids.join(',') });
  if (x !== 'step') params.set('x', x);
  return `#/compare?${params}`;
}

export function mountCompare(root, query, app) {
  const { ids, x } = parseSelection(query);
  const runs = ids.map((id, i) => ({ id, colour: COLOURS[i % COLOURS.length], job: null, points: new Map() }));
  let chart = null;
  let margins = null;  // the rewards/margins chart, while a run reports them
  let redrawTimer = null;
  let closeStream = null;
  let disposed = false;

  const status = el('p', { class: 'status' }, ids.length ? 'Loading runs…' : '');
  const errors = el('ul', { class: 'errors' });
  const legend = el('ul', { class: 'runs' });
  const axisButtons = Object.entries(X_AXES).map(([key, label]) => el('a', {
    href: compareHash(ids, key), class: `chip${key === x ? ' on' : ''}`, 'data-x': key, 'aria-pressed': key === x,
  }, `by ${key}`, el('span', { class: 'sr' }, ` (${label})`)));
  const chartBox = el('div', { class: 'chart compare-chart' });
  const marginsBox = el('div', { class: 'chart compare-chart' });
  const marginsPanel = el('div', { class: 'panel', id: 'compare-margins', hidden: true },
    el('h2', {}, `DPO reward margin (rewards/margins) by ${X_AXES[x]}`), marginsBox);
  root.replaceChildren(el('section', { class: 'compare' },
    el('p', { class: 'crumbs' }, el('a', { href: '#/jobs' }, 'Jobs'), ' / compare'),
    el('div', { class: 'toolbar' }, el('h1', {}, 'Compare runs'), el('div', { class: 'chips' }, ...axisButtons)),
    status, errors, legend,
    el('div', { class: 'panel' }, el('h2', {}, `Loss (lines) and eval loss (points) by ${X_AXES[x]}`), chartBox),
    marginsPanel));

  if (!ids.length) {
    status.replaceChildren('No runs selected: tick jobs on the ',
      el('a', { href: '#/jobs' }, 'jobs page'), ' and press Compare.');
    app.rendered('compare', 0);
    return () => {};
  }

  function label(run) {
    return run.job && run.job.name ? `${run.job.name} (${run.id})` : run.id;
  }

  function buildChart() {
    const series = [];
    for (const run of runs) {
      series.push({ label: `${label(run)} loss`, scale: 'loss', stroke: run.colour, width: 2 });
      series.push({
        label: `${label(run)} eval loss`, scale: 'loss', stroke: run.colour, paths: () => null,
        points: { show: true, size: 7, fill: run.colour },
      });
    }
    chart = lineChart(chartBox, {
      series,
      x: { time: false },
      xAxis: { label: X_AXES[x], values: axisFormats.integer, incrs: integerIncrs },
      axes: [{ scale: 'loss', label: 'loss', size: 60, values: axisFormats.number }],
      height: 380,
    });
    app.charts = { compare: chart };
  }

  // The x value of a point on this page's axis (null when the run did not report it).
  function xOf(point) {
    const v = x === 'tokens' ? point.tokens : point.step;
    return Number.isFinite(v) ? v : null;
  }

  // One table per run ([x, loss, eval loss], newest attempt's point per step),
  // joined on x by uPlot (a run without a point at some x gets null there).
  function draw() {
    redrawTimer = null;
    if (!chart) return;
    const tables = runs.map((run) => {
      const rows = [...run.points.values()].map((p) => [xOf(p), p.loss, p.eval_loss])
        .filter((r) => r[0] !== null).sort((a, b) => a[0] - b[0]);
      return [rows.map((r) => r[0]), rows.map((r) => finite(r[1])), rows.map((r) => finite(r[2]))];
    });
    const data = uPlot.join(tables);
    chart.setData(data.length > 1 ? data : [[], ...runs.flatMap(() => [[], []])]);
    drawMargins();
  }

  // One [x, margin] table per run, by x (points without either left out).
  function marginTable(run) {
    const rows = [...run.points.values()].map((p) => [xOf(p), objectiveMetric(p, MARGINS)])
      .filter((r) => r[0] !== null && r[1] !== null).sort((a, b) => a[0] - b[0]);
    return [rows.map((r) => r[0]), rows.map((r) => r[1])];
  }

  // The margins chart: one line per run that reports rewards/margins, built again when that set
  // of runs changes (a DPO run's first point arrives); hidden while none does.
  function drawMargins() {
    const tables = runs.map((run) => ({ run, table: marginTable(run) })).filter((t) => t.table[0].length);
    const key = tables.map((t) => t.run.id).join(',');
    if (!margins || margins.ftRuns !== key) {
      if (margins) margins.ftDispose();
      margins = null;
      delete app.charts.margins;
      marginsBox.replaceChildren();
      marginsPanel.hidden = !tables.length;
      if (!tables.length) return;
      margins = lineChart(marginsBox, {
        series: tables.map(({ run }) => ({ label: `${label(run)} margin`, scale: 'margin', stroke: run.colour, width: 2 })),
        x: { time: false },
        xAxis: { label: X_AXES[x], values: axisFormats.integer, incrs: integerIncrs },
        axes: [{ scale: 'margin', label: 'reward margin', size: 60, values: axisFormats.number }],
        height: 280,
      });
      margins.ftRuns = key;
      app.charts.margins = margins;
    }
    margins.setData(uPlot.join(tables.map((t) => t.table)));
  }

  function scheduleDraw() {
    if (!redrawTimer && !disposed) redrawTimer = setTimeout(draw, REDRAW_MS);
  }

  // A step replayed after a resume is kept once: the newest epoch's point.
  function addPoint(run, point) {
    const old = run.points.get(point.step);
    if (!old || old.epoch <= point.epoch) run.points.set(point.step, point);
  }

  function showLegend() {
    legend.replaceChildren(...runs.map((run) => el('li', { 'data-job-id': run.id },
      el('span', { class: 'swatch', style: `background:${run.colour}` }),
      el('a', { href: `#/jobs/${encodeURIComponent(run.id)}`, class: 'name' }, label(run)),
      ` ${run.job.state} · ${run.points.size} steps · loss ${number(lastLoss(run))} `,
      el('a', { href: compareHash(ids.filter((id) => id !== run.id), x), class: 'remove', title: 'remove from the comparison' }, '×'))));
  }

  async function load(run) {
    try {
      run.job = await getJSON(`api/jobs/${encodeURIComponent(run.id)}`);
      for (let after = -1; ;) {
        const q = after >= 0 ? `after_step=${after}&` : '';
        const { points } = await getJSON(`api/jobs/${encodeURIComponent(run.id)}/metrics?${q}limit=${PAGE}`);
        points.forEach((p) => addPoint(run, p));
        if (points.length < PAGE) break;
        after = points[points.length - 1].step;
      }
    } catch (err) {
      run.job = null;
      errors.append(el('li', { class: 'error', 'data-job-id': run.id }, `${run.id}: ${err.message}`));
    }
  }

  (async () => {
    await Promise.all(runs.map(load));
    if (disposed) return;
    runs.splice(0, runs.length, ...runs.filter((r) => r.job));  // only readable runs get series
    status.hidden = runs.length > 0;
    if (!runs.length) status.textContent = 'None of the selected runs could be read.';
    app.compare = { x, runs: runs.map(({ id, colour }) => ({ id, colour })) };
    showLegend();
    buildChart();
    draw();
    const byId = new Map(runs.map((r) => [r.id, r]));
    closeStream = openStream('', {
      metric: (point) => {
        const run = byId.get(point.job_id);
        if (!run) return;
        addPoint(run, point);
        scheduleDraw();
      },
      job: (job) => {
        const run = byId.get(job.id);
        if (run && run.job.state !== job.state) {
          run.job = { ...run.job, ...job };
          showLegend();
        }
      },
    });
    app.rendered('compare', runs.length);
  })();

  return () => {
    disposed = true;
    if (redrawTimer) clearTimeout(redrawTimer);
    if (closeStream) closeStream();
    if (chart) chart.ftDispose();
    if (margins) margins.ftDispose();
  };
}

function finite(v) {
  return Number.isFinite(v) ? v : null;
}

function lastLoss(run) {
  let best = null;
  for (const p of run.points.values()) if (Number.isFinite(p.loss) && (!best || p.step > best.step)) best = p;
  return best ? best.loss : null;
}
