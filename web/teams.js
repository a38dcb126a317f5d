// The teams page (#/teams, #/teams?team=NAME marks that team's row): one row per team of
// GET /api/teams (docs/HTTP_API.md) with its quota, fair-share weight and share, decayed usage
// against that share (a bar), devices running (borrowed ones counted apart), queued jobs and, when
// ftd reports them, its spend against its budget. Below, the activity seen since the page opened:
// submissions, cancels, team changes and preemptions, whose messages name who did them.
//
// Live: the stream's events (a job queued, started, stopped; a team set) refetch /api/teams, at
// most twice a second; a five-second poll keeps usage current between events (it accrues while
// jobs run and decays when they don't). A refetch that fails keeps the rows and says so above them;
// one refused for want of a token stops the refreshing until a reload (no prompt every 5 s).

import { getJSON, openStream } from './api.js';
import { el, setText, clock, number } from './format.js';

const POLL_MS = 5000;
const MIN_GAP_MS = 500;
const ACTIVITY_MAX = 50;
// The events the activity list keeps: the ones that say who acted or for whom.
const ACTIVITY_KINDS = new Set(['queued', 'cancelled', 'team_set', 'preempting']);
const COLUMNS = ['Team', 'Quota', 'Weight', 'Fair share', 'Usage (device-hours)', 'Usage vs share', 'Running',
  'Queued', 'Spend'];

export function mountTeams(root, query, app) {
  const picked = query.get('team');
  const rows = new Map();  // team name → {tr, cells}
  const tbody = el('tbody');
  const summary = el('p', { class: 'status' }, 'Loading teams…');
  const empty = el('p', { class: 'empty', hidden: true },
    'No team has a quota, a weight, usage or a job yet. Set one with: ftctl admin team set NAME --quota N --weight W');
  const activity = activityPanel();
  let timer = null;
  let inFlight = false;
  let again = false;
  let lastMs = 0;
  let closeStream = null;
  let disposed = false;
  let stopped = false;  // refused for want of a token
  let shown = false;
  root.replaceChildren(
    el('section', { class: 'teams' },
      summary,
      el('table', { class: 'grid teams-table' },
        el('thead', {}, el('tr', {}, ...COLUMNS.map((h) => el('th', {}, h)))),
        tbody),
      empty,
      el('p', { class: 'note' },
        'Fair share: a team\'s weight over the weights of the teams with work (a queued or running job). ' +
        'Usage: device-hours that halve every ftd --fair-share-half-life-ms. The bar is the team\'s part of all ' +
        'usage, the tick its fair share: within a priority class the team furthest below its share runs first. ' +
        'Borrowed: devices beyond the quota, reclaimed (checkpoint, stop, requeue) when their owner needs them. ' +
        'Set with ftctl admin team set NAME --quota N --weight W (docs/OPERATIONS.md, "Teams").'),
      activity.panel));

  function show(teams) {
    const totalUsage = teams.reduce((sum, t) => sum + t.usage_device_seconds, 0);
    const names = new Set(teams.map((t) => t.name));
    for (const [name, row] of rows) {
      if (names.has(name)) continue;
      row.tr.remove();
      rows.delete(name);
    }
    for (const team of teams) {
      let row = rows.get(team.name);
      if (!row) {
        row = buildRow(team.name, team.name === picked);
        rows.set(team.name, row);
      }
      fillRow(row.cells, team, totalUsage);
      tbody.append(row.tr);  // in the API's order (by name); moves an existing row
    }
    const sum = (key) => teams.reduce((n, t) => n + t[key], 0);
    const borrowed = sum('borrowed_devices');
    setText(summary, `${count(teams.length, 'team')} · ${count(sum('running_devices'), 'device')} running` +
      `${borrowed ? ` (${borrowed} borrowed)` : ''} · ${count(sum('queued_jobs'), 'job')} queued`);
    summary.classList.remove('error');
    empty.hidden = teams.length > 0;
    if (!shown) {
      shown = true;
      rows.get(picked)?.tr.scrollIntoView({ block: 'center' });
      app.rendered('teams', rows.size);
    }
  }

  async function load() {
    timer = null;
    inFlight = true;
    lastMs = Date.now();
    try {
      const { teams } = await getJSON('api/teams');
      if (!disposed) show(teams);
    } catch (err) {
      // Without a token the page would ask for one at every poll: it stops until a reload instead.
      stopped = err.status === 401;
      setText(summary, `Could not load teams: ${err.message}${stopped ? ' (reload the page to try again)' : ''}`);
      summary.classList.add('error');
    } finally {
      inFlight = false;
    }
    if (disposed || stopped) return;
    arm(again ? MIN_GAP_MS : POLL_MS);
    again = false;
  }

  function arm(delay) {
    clearTimeout(timer);
    timer = setTimeout(load, delay);
  }

  // A refetch soon: at once after a quiet half second, else at the end of it; one after an
  // in-flight request so the newest state lands.
  function soon() {
    if (disposed || stopped) return;
    if (inFlight) again = true;
    else arm(Math.max(0, lastMs + MIN_GAP_MS - Date.now()));
  }

  function onEvent(event) {
    if (event.kind === 'checkpoint') return;  // changes no team's figures
    if (ACTIVITY_KINDS.has(event.kind)) activity.add(event);
    soon();
  }

  (async () => {
    await load();
    if (!disposed && !stopped) closeStream = openStream('', { event: onEvent });
  })();

  return () => {
    disposed = true;
    clearTimeout(timer);
    if (closeStream) closeStream();
  };
}

function buildRow(name, picked) {
  const cells = {
    quota: el('td', { class: 'num', 'data-field': 'quota' }),
    weight: el('td', { class: 'num', 'data-field': 'weight' }),
    share: el('td', { class: 'num', 'data-field': 'share' }),
    usage: el('td', { class: 'num', 'data-field': 'usage' }),
    usageFill: el('div', { class: 'bar-fill' }),
    shareTick: el('div', { class: 'share-tick' }),
    usageText: el('span', { class: 'steps' }),
    running: el('td', { class: 'num', 'data-field': 'running' }),
    queued: el('td', { class: 'num', 'data-field': 'queued' }),
    spendText: el('span', { 'data-field': 'spend' }),
    spendFill: el('div', { class: 'bar-fill' }),
  };
  cells.usageBar = el('div', { class: 'bar share-bar' }, cells.usageFill, cells.shareTick);
  cells.spendBar = el('div', { class: 'bar spend-bar', hidden: true }, cells.spendFill);
  const tr = el('tr', { 'data-team': name, class: picked ? 'picked' : null },
    el('td', { class: 'name', 'data-field': 'team' }, teamName(name)),
    cells.quota, cells.weight, cells.share, cells.usage,
    el('td', { class: 'c-usage-share', 'data-field': 'usage-share' }, cells.usageBar, cells.usageText),
    cells.running, cells.queued,
    el('td', { class: 'c-spend' }, cells.spendText, cells.spendBar));
  return { tr, cells };
}

function fillRow(c, t, totalUsage) {
  setText(c.quota, t.quota_devices < 0 ? 'none' : `${t.quota_devices}`);
  setText(c.weight, `${t.weight}`);
  setText(c.share, percent(t.fair_share));
  setText(c.usage, number(t.usage_device_seconds / 3600, 3));
  c.usage.dataset.seconds = t.usage_device_seconds;
  const part = totalUsage > 0 ? t.usage_device_seconds / totalUsage : 0;
  c.usageFill.style.width = `${(100 * Math.min(1, part)).toFixed(1)}%`;
  c.shareTick.style.left = `${(100 * Math.min(1, t.fair_share)).toFixed(1)}%`;
  c.usageBar.classList.toggle('over', part > t.fair_share);
  setText(c.usageText, `${percent(part)} of usage`);
  c.usageBar.title = `${percent(part)} of all teams' decayed usage; fair share ${percent(t.fair_share)}`;
  setText(c.running, `${t.running_devices}${t.borrowed_devices ? ` (${t.borrowed_devices} borrowed)` : ''}`);
  setText(c.queued, `${t.queued_jobs}${t.max_queued >= 0 ? ` of ${t.max_queued}` : ''}`);
  fillSpend(c, t);
}

// Spend and budget (docs/OPERATIONS.md, "Money"); "—" from an ftd that does not report them. The
// bar appears when a budget is set.
function fillSpend(c, t) {
  const spend = Number.isFinite(t.spend) ? t.spend : null;
  const budget = Number.isFinite(t.budget) ? t.budget : null;
  setText(c.spendText, spend === null ? '—' : `${usd(spend)}${budget === null ? '' : ` of ${usd(budget)} budget`}`);
  c.spendBar.hidden = spend === null || budget === null;
  if (c.spendBar.hidden) return;
  const used = budget > 0 ? spend / budget : 1;
  c.spendFill.style.width = `${(100 * Math.min(1, used)).toFixed(1)}%`;
  c.spendBar.classList.toggle('hot', used >= 0.9);
  c.spendBar.title = `${percent(used)} of the budget spent`;
}

// The activity list: the newest ACTIVITY_MAX events of ACTIVITY_KINDS since the page opened.
function activityPanel() {
  const list = el('tbody');
  const none = el('p', { class: 'empty' }, 'Nothing yet.');
  const panel = el('section', { class: 'panel activity', id: 'activity' },
    el('h2', {}, 'Activity since this page opened: submissions, cancels, team changes, preemptions'),
    el('div', { class: 'scroll' }, el('table', { class: 'grid' }, list)), none);
  function add(e) {
    none.hidden = true;
    list.prepend(el('tr', { class: `k-${e.kind}`, 'data-seq': e.seq },
      el('td', { class: 'num' }, clock(e.time_ms)),
      el('td', {}, el('span', { class: `badge k-${e.kind}` }, e.kind)),
      el('td', {}, e.job_id ? el('a', { href: `#/jobs/${e.job_id}` }, e.job_id) : ''),
      el('td', { class: 'message' }, e.message || '')));
    while (list.childElementCount > ACTIVITY_MAX) list.lastElementChild.remove();
  }
  return { panel, add };
}

// A job's team on other pages links here; "" is the jobs of no team (submitted before users
// existed, or with the client token).
export function teamHref(name) {
  return `#/teams?${new URLSearchParams({ team: name })}`;
}

function teamName(name) {
  return name === '' ? '(no team)' : name;
}

// count(1, 'job') → "1 job", count(2, 'job') → "2 jobs".
function count(n, noun) {
  return `${n} ${noun}${n === 1 ? '' : 's'}`;
}

function percent(x) {
  return `${(100 * x).toFixed(1)}%`;
}

function usd(x) {
  return x.toLocaleString('en-US', { style: 'currency', currency: 'USD' });
}
