// Talking to ftd: JSON requests with bearer tokens, and the live event stream.
//
// Success: getJSON/postJSON resolve with the parsed body. Failure: they reject
// with an ApiError carrying the HTTP status and the server's {"error": ...}
// text. A 401 asks the user for a token once (kept in localStorage) and retries.

const VIEW_TOKEN_KEY = 'ftune.viewToken';
const ACTION_TOKEN_KEY = 'ftune.token';

export class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

function storedToken(key) {
  try {
    return localStorage.getItem(key) || '';
  } catch {
    return '';
  }
}

function storeToken(key, value) {
  try {
    if (value) localStorage.setItem(key, value);
    else localStorage.removeItem(key);
  } catch {
    // Private windows may refuse storage; the token then lasts this request only.
  }
}

async function request(method, path, tokenKey, what) {
  for (let asked = false; ; asked = true) {
    const headers = { Accept: 'application/json' };
    // ftd refuses an action without it on an ftd without tokens: a page on another site cannot send it.
    if (method !== 'GET') headers['Content-Type'] = 'application/json';
    const token = storedToken(tokenKey) || storedToken(VIEW_TOKEN_KEY);
    if (token) headers.Authorization = `Bearer ${token}`;
    const res = await fetch(path, { method, headers });
    if (res.status === 401 && !asked) {
      const entered = window.prompt(
        `ftd needs a token to ${what} (the server said: ${await errorText(res)}). ` +
          'Enter it (kept in this browser):',
        '');
      if (!entered) throw new ApiError(401, `a token is needed to ${what}`);
      storeToken(tokenKey, entered.trim());
      continue;
    }
    if (!res.ok) throw new ApiError(res.status, await errorText(res));
    const type = res.headers.get('Content-Type') || '';
    return type.includes('application/json') ? res.json() : res.text();
  }
}

async function errorText(res) {
  const text = await res.text();
  try {
    return JSON.parse(text).error || text;
  } catch {
    return text || `HTTP ${res.status}`;
  }
}

// GET a JSON (or text) resource; asks for the view token on 401.
export function getJSON(path) {
  return request('GET', path, VIEW_TOKEN_KEY, 'view this dashboard');
}

// POST an action; asks for the client token on 401.
export function postJSON(path, what) {
  return request('POST', path, ACTION_TOKEN_KEY, what);
}

// Opens /api/stream (optionally for one job) and calls handlers[kind](data)
// for each message kind (job, event, metric, workers). EventSource reconnects by
// itself and sends Last-Event-ID, so no event is missed. Returns close().
export function openStream(jobId, handlers) {
  const params = new URLSearchParams();
  if (jobId) params.set('job', jobId);
  const token = storedToken(VIEW_TOKEN_KEY);
  if (token) params.set('token', token);
  const source = new EventSource(`api/stream?${params}`);
  for (const kind of ['job', 'event', 'metric', 'workers']) {
    source.addEventListener(kind, (message) => {
      if (!handlers[kind]) return;
      let data;
      try {
        data = JSON.parse(message.data);
      } catch {
        console.warn(`ftune: unreadable ${kind} message`, message.data);
        return;
      }
      handlers[kind](data);
    });
  }
  const live = document.getElementById('live');
  source.onopen = () => setLive(live, true);
  source.onerror = () => setLive(live, false);
  return () => {
    source.close();
    setLive(live, null);
  };
}

function setLive(el, up) {
  if (!el) return;
  el.textContent = up === null ? '' : up ? 'live' : 'reconnecting…';
  el.classList.toggle('up', up === true);
  el.classList.toggle('down', up === false);
}
