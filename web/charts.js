// uPlot charts of the job page: time-axis line charts that fill their
// container's width, and a plugin that draws the job's events as labelled
// vertical markers on the time axis; the reading of a point's objective
// metrics (DPO's rewards) shared by the job and compare pages. uPlot is loaded as a global by index.html
// (ftd serves it from web/node_modules/uplot/dist as /vendor/).

import { bytes, number } from './format.js';

// Marker colour and whether it gets a text label (checkpoints are frequent).
const MARKERS = {
  queued: ['#9aa0a6', true],
  started: ['#1e8e3e', true],
  resumed: ['#1e8e3e', true],
  reattached: ['#7b1fa2', true],
  checkpoint: ['#1a73e8', false],
  preempted: ['#e37400', true],
  lost: ['#e37400', true],
  slot_end: ['#e37400', true],
  stopped: ['#5f6368', true],
  refused: ['#7b1fa2', false],
  attempt_failed: ['#d93025', true],
  succeeded: ['#188038', true],
  failed: ['#d93025', true],
  cancelled: ['#5f6368', true],
};

export const EVENT_KINDS_ON_TIMELINE = new Set(Object.keys(MARKERS));

// A uPlot plugin: vertical lines at each event's time_ms, labelled with its
// kind (and step). getEvents() is read at every draw, so new events only need
// a redraw. The markers drawn last are kept on u.ftMarkers (read by tests).
export function eventMarkers(getEvents) {
  function draw(u) {
    const { ctx, bbox } = u;
    const [xmin, xmax] = [u.scales.x.min, u.scales.x.max];
    const drawn = [];
    ctx.save();
    ctx.font = `${Math.round(11 * devicePixelRatio)}px system-ui, sans-serif`;
    ctx.textBaseline = 'top';
    let labelRow = 0;
    for (const event of getEvents()) {
      const style = MARKERS[event.kind];
      const t = event.time_ms / 1000;
      if (!style || t < xmin || t > xmax) continue;
      const x = Math.round(u.valToPos(t, 'x', true));
      ctx.strokeStyle = style[0];
      ctx.lineWidth = (style[1] ? 2 : 1) * devicePixelRatio;
      ctx.setLineDash(style[1] ? [] : [4 * devicePixelRatio, 3 * devicePixelRatio]);
      ctx.beginPath();
      ctx.moveTo(x, bbox.top);
      ctx.lineTo(x, bbox.top + bbox.height);
      ctx.stroke();
      const label = event.step ? `${event.kind} @${event.step}` : event.kind;
      if (style[1]) {
        ctx.fillStyle = style[0];
        const y = bbox.top + 2 * devicePixelRatio + (labelRow++ % 4) * 13 * devicePixelRatio;
        const width = ctx.measureText(label).width;
        const left = x + 3 * devicePixelRatio + width > bbox.left + bbox.width ? x - 3 * devicePixelRatio - width : x + 3 * devicePixelRatio;
        ctx.fillText(label, left, y);
      }
      drawn.push({ kind: event.kind, time_ms: event.time_ms, step: event.step, label });
    }
    ctx.restore();
    u.ftMarkers = drawn;
  }
  return { hooks: { draw: [draw] } };
}

function widthOf(container) {
  return Math.max(300, container.clientWidth || 800);
}

// A line chart in `container` that fills its width. series: [{label, scale,
// stroke, dash, width}]; x: uPlot's options for the x scale; scales: options
// of the other scales by name; axes: axes after x (xAxis: x's own).
export function lineChart(container, { series, x = {}, xAxis = {}, scales = {}, axes = [], plugins = [], height = 240 }) {
  const options = {
    width: widthOf(container),
    height,
    plugins,
    cursor: { drag: { x: true, y: false } },
    scales: { x, ...scales },
    axes: [xAxis, ...axes],
    series: [{}, ...series.map((s) => ({ spanGaps: true, points: { show: false }, width: 1.5, ...s }))],
    legend: { live: true },
  };
  const chart = new uPlot(options, [[], ...series.map(() => [])], container);
  const observer = new ResizeObserver(() => {
    const width = widthOf(container);
    if (width !== chart.width) chart.setSize({ width, height });
  });
  observer.observe(container);
  chart.ftDispose = () => {
    observer.disconnect();
    chart.destroy();
  };
  return chart;
}

// A time-axis chart: lineChart with x in seconds since the epoch. xRange gets
// the data's own first and last time: for a single point uPlot would
// otherwise pass a span of 1,000 days.
export function timeChart(container, { xRange, ...options }) {
  return lineChart(container, {
    ...options,
    x: { time: true, range: xRange ? (u) => xRange(u.data[0][0], u.data[0][u.data[0].length - 1]) : undefined },
  });
}

// A metric point's objective metric (DPO: 'rewards/margins', ...; the point's
// objective_metrics from /api/jobs/ID/metrics or the stream), or null when the
// point has none (an SFT job, an older ftd) or it is not finite.
export function objectiveMetric(point, name) {
  const value = point.objective_metrics ? point.objective_metrics[name] : undefined;
  return Number.isFinite(value) ? value : null;
}

export const axisFormats = {
  bytes: (u, values) => values.map((v) => bytes(v)),
  number: (u, values) => values.map((v) => (v !== 0 && Math.abs(v) < 1e-3 ? v.toExponential(1) : number(v, 3))),
  integer: (u, values) => values.map((v) => Math.round(v).toLocaleString('en-US')),
};

// Tick steps of an axis that only holds whole numbers (steps, tokens): 1, 2, 5, 10, 20, ...
export const integerIncrs = Array.from({ length: 30 }, (_, i) => [1, 2, 5][i % 3] * 10 ** Math.floor(i / 3));
