// Small shared helpers for the pages: building elements, formatting bytes,
// durations and times, and the inline-SVG loss sparkline of the jobs table.
// All are pure functions of their arguments (no network, no globals).

export const STATES = ['queued', 'running', 'preempted', 'succeeded', 'failed', 'cancelled'];
export const FINISHED = new Set(['succeeded', 'failed', 'cancelled']);

// el('a', {href: '#/x', class: 'y'}, 'text', child...) → an element.
export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    if (key === 'class') node.className = value;
    else if (key.startsWith('on')) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value === true ? '' : value);
  }
  for (const child of children) {
    if (child !== null && child !== undefined) node.append(child);
  }
  return node;
}

// Sets textContent only when it changed (keeps the DOM quiet under live updates).
export function setText(node, text) {
  const value = String(text);
  if (node.textContent !== value) node.textContent = value;
}

export function bytes(n) {
  if (n === null || n === undefined || !Number.isFinite(n)) return '–';
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let i = 0;
  let v = n;
  while (Math.abs(v) >= 1024 && i < units.length - 1) {
    v /= 1024;
    i++;
  }
  return `${v.toFixed(i === 0 || v >= 100 ? 0 : 1)} ${units[i]}`;
}

// 3725 → "1h 2m", 75 → "1m 15s", null → "–".
export function duration(seconds) {
  if (seconds === null || seconds === undefined || !Number.isFinite(seconds)) return '–';
  const s = Math.max(0, Math.round(seconds));
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m ${s % 60}s`;
  if (s < 86400) return `${Math.floor(s / 3600)}h ${Math.floor((s % 3600) / 60)}m`;
  return `${Math.floor(s / 86400)}d ${Math.floor((s % 86400) / 3600)}h`;
}

export function ago(ms, now = Date.now()) {
  if (!ms) return 'never';
  return `${duration((now - ms) / 1000)} ago`;
}

export function clock(ms) {
  if (!ms) return '–';
  const d = new Date(ms);
  const today = new Date();
  const time = d.toLocaleTimeString([], { hour12: false });
  return d.toDateString() === today.toDateString() ? time : `${d.toLocaleDateString()} ${time}`;
}

export function number(x, digits = 4) {
  if (x === null || x === undefined || !Number.isFinite(x)) return '–';
  return Math.abs(x) >= 1000 ? Math.round(x).toLocaleString() : x.toPrecision(digits);
}

const SVG = 'http://www.w3.org/2000/svg';

// A 80×20 polyline of `values` (the server already downsampled to ≤ 32 points).
// Drawn inline rather than with uPlot: a thousand uPlot instances (one canvas
// and its handlers each) would cost more than the rest of the jobs page.
export function sparkline(values, width = 80, height = 20) {
  const svg = document.createElementNS(SVG, 'svg');
  svg.setAttribute('width', width);
  svg.setAttribute('height', height);
  svg.setAttribute('class', 'spark');
  updateSparkline(svg, values);
  return svg;
}

export function updateSparkline(svg, values) {
  const finite = (values || []).filter(Number.isFinite);
  const key = finite.join(',');
  if (svg.dataset.key === key) return;
  svg.dataset.key = key;
  svg.replaceChildren();
  if (finite.length < 2) return;
  const width = Number(svg.getAttribute('width'));
  const height = Number(svg.getAttribute('height'));
  const lo = Math.min(...finite);
  const hi = Math.max(...finite);
  const span = hi - lo || 1;
  const points = finite.map((v, i) => {
    const x = (i / (finite.length - 1)) * (width - 2) + 1;
    const y = height - 1 - ((v - lo) / span) * (height - 2);
    return `${x.toFixed(1)},${y.toFixed(1)}`;
  });
  const line = document.createElementNS(SVG, 'polyline');
  line.setAttribute('points', points.join(' '));
  svg.append(line);
  const title = document.createElementNS(SVG, 'title');
  title.textContent = `loss ${number(finite[0])} → ${number(finite[finite.length - 1])}`;
  svg.append(title);
}
