// The dashboard's entry point: routes the URL hash to a page (#/jobs,
// #/jobs/ID, #/compare?jobs=ID,ID, #/workers, #/teams), disposing the previous page (its stream and timers)
// first. window.ftune exposes the current page's charts and render timing for
// tests and curious users: ftune.renderedMs[page] is the time (ms since
// navigation start) at which the page first showed its data.

import { mountCompare } from './compare.js';
import { mountJob } from './job.js';
import { mountJobs } from './jobs.js';
import { mountTeams } from './teams.js';
import { mountWorkers } from './workers.js';
import { el } from './format.js';

const app = {
  page: null,
  charts: {},
  renderedMs: {},
  // Called by a page when its data is on screen.
  rendered(page, items) {
    if (!(page in this.renderedMs)) this.renderedMs[page] = performance.now();
    document.body.dataset.rendered = page;
    document.body.dataset.items = items;
  },
};
window.ftune = app;

let dispose = null;

function route() {
  const hash = location.hash.replace(/^#/, '') || '/jobs';
  const [path, search = ''] = hash.split('?');
  const query = new URLSearchParams(search);
  const main = document.getElementById('main');
  if (dispose) dispose();
  dispose = null;
  app.charts = {};
  delete document.body.dataset.rendered;
  const parts = path.split('/').filter(Boolean);
  let page = 'jobs';
  if (parts[0] === 'jobs' && parts.length === 1) {
    dispose = mountJobs(main, query, app);
  } else if (parts[0] === 'jobs' && parts.length === 2) {
    page = 'job';
    dispose = mountJob(main, decodeURIComponent(parts[1]), app);
  } else if (parts[0] === 'compare' && parts.length === 1) {
    page = 'compare';
    dispose = mountCompare(main, query, app);
  } else if (parts[0] === 'workers' && parts.length === 1) {
    page = 'workers';
    dispose = mountWorkers(main, query, app);
  } else if (parts[0] === 'teams' && parts.length === 1) {
    page = 'teams';
    dispose = mountTeams(main, query, app);
  } else {
    page = 'none';
    main.replaceChildren(el('p', { class: 'status error' }, `No page '${hash}'. `,
      el('a', { href: '#/jobs' }, 'Jobs'), ', ', el('a', { href: '#/workers' }, 'Workers'), ' or ',
      el('a', { href: '#/teams' }, 'Teams'), '.'));
  }
  app.page = page;
  for (const link of document.querySelectorAll('[data-nav]')) {
    link.classList.toggle('current', link.dataset.nav === (page === 'job' || page === 'compare' ? 'jobs' : page));
  }
}

if (typeof uPlot === 'undefined') {
  document.getElementById('main').replaceChildren(el('p', { class: 'status error' },
    'uPlot did not load from vendor/uPlot.iife.min.js: ftd serves it from web/node_modules/uplot; ' +
    "run 'npm ci' in web/ (the build does this) or reinstall ftune."));
} else {
  window.addEventListener('hashchange', route);
  route();
}
