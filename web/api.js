// Talking to the scheduler: the JSON endpoints, with a timeout, the page's
// own credentials (the browser resends the basic auth the person gave), and
// errors that say what went wrong in words.

export const OVERVIEW_URL = 'api/v1/overview';
export const HISTORY_URL = 'api/v1/history';
export const TENANTS_URL = 'api/v1/tenants';
// How often the page asks: the overview drives the tables and cards, the
// history (one sample a second, an hour of them) only the chart.
export const OVERVIEW_EVERY_MS = 2000;
export const HISTORY_EVERY_MS = 5000;
const FETCH_TIMEOUT_MS = 10000;

export class HttpError extends Error {
  constructor(status, statusText) {
    super('HTTP ' + status + (statusText ? ' ' + statusText : ''));
    this.status = status;
  }
}

// A 401: the scheduler wants credentials the page does not have.
export const isUnauthorized = (e) => e instanceof HttpError && e.status === 401;

// The parsed answer. `measured`, when given, gets the answer's size
// (`lastBytes`) and the time JSON.parse took (`lastParseMs`).
export async function fetchJson(url, measured) {
  const ctl = typeof AbortController === 'function' ? new AbortController() : null;
  const timer = ctl ? setTimeout(() => ctl.abort(), FETCH_TIMEOUT_MS) : 0;
  try {
    let r;
    try {
      r = await fetch(url, {
        cache: 'no-store', credentials: 'same-origin',
        headers: { Accept: 'application/json' }, signal: ctl ? ctl.signal : undefined,
      });
    } catch (e) {
      if (e && e.name === 'AbortError') throw new Error('no answer within ' + FETCH_TIMEOUT_MS / 1000 + ' s');
      throw new Error('connection failed');
    }
    if (!r.ok) throw new HttpError(r.status, r.statusText);
    const body = await r.text();
    if (measured) measured.lastBytes = body.length;
    try {
      const t0 = performance.now();
      const parsed = JSON.parse(body);
      if (measured) measured.lastParseMs = performance.now() - t0;
      return parsed;
    } catch (e) {
      throw new Error('the answer is not JSON');
    }
  } finally {
    clearTimeout(timer);
  }
}
