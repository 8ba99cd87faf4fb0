// The connection state in the top bar and the banner that explains an
// outage: since when, the last good update, and that the figures are stale.

import { setText, toggleClass } from '../dom.js';
import { OVERVIEW_EVERY_MS } from '../api.js';
import { fmtClock, fmtDuration } from '../format.js';

const statusEl = document.getElementById('status');
const updatedEl = document.getElementById('updated');
const bannerEl = document.getElementById('banner');
const bannerTitle = document.getElementById('banner-title');
const bannerText = document.getElementById('banner-text');
const mainEl = document.getElementById('dashboard');

export const conn = { state: 'connecting', lastOkAt: 0, failingSince: 0, error: '' };

// A scheduler that accepts connections but never answers is down too.
const STALL_MS = 4 * OVERVIEW_EVERY_MS;

export function watchConnection() {
  setInterval(() => {
    if (conn.state === 'live' && !document.hidden && Date.now() - conn.lastOkAt > STALL_MS) {
      conn.failingSince = conn.lastOkAt + OVERVIEW_EVERY_MS;
      conn.error = 'no answer for ' + STALL_MS / 1000 + ' s';
      setState('unreachable');
    }
    if (conn.state !== 'live') updateBanner();
  }, 1000);
}

export function markLive() {
  conn.lastOkAt = Date.now();
  conn.failingSince = 0;
  conn.error = '';
  updatedEl.dateTime = new Date(conn.lastOkAt).toISOString();
  setText(updatedEl, fmtClock(conn.lastOkAt));
  const wasDown = conn.state !== 'live';
  if (wasDown) setState('live');
  return wasDown;
}

export function markFailed(message, unauthorized) {
  if (!conn.failingSince || conn.state === 'live') conn.failingSince = Date.now();
  conn.error = message;
  setState(unauthorized ? 'unauthorized' : 'unreachable');
}

function setState(state) {
  conn.state = state;
  const label = state === 'live' ? 'live'
    : state === 'unreachable' ? 'unreachable'
      : state === 'unauthorized' ? 'unauthorized' : 'connecting';
  setText(statusEl, label);
  statusEl.className = 'status status-' + state;
  toggleClass(mainEl, 'stale', state === 'unreachable' || state === 'unauthorized');
  mainEl.setAttribute('aria-busy', state === 'connecting' ? 'true' : 'false');
  updateBanner();
}

function updateBanner() {
  const down = conn.state === 'unreachable' || conn.state === 'unauthorized';
  bannerEl.hidden = !down;
  if (!down) return;
  const now = Date.now();
  if (conn.state === 'unauthorized') {
    setText(bannerTitle, 'Not authorised.');
    setText(bannerText, 'The scheduler asks for credentials (HTTP 401). Reload the page to sign in.' +
      (conn.lastOkAt ? ' Showing the data of ' + fmtClock(conn.lastOkAt) + '.' : ''));
    return;
  }
  setText(bannerTitle, 'Scheduler unreachable.');
  const err = conn.error.charAt(0).toUpperCase() + conn.error.slice(1);
  setText(bannerText, err + ' since ' + fmtClock(conn.failingSince) + '. ' + (conn.lastOkAt
    ? 'Last successful update at ' + fmtClock(conn.lastOkAt) + ' (' + fmtDuration(now - conn.lastOkAt) +
      ' ago); the figures below are from then.'
    : 'No data received yet.') + ' Retrying every ' + OVERVIEW_EVERY_MS / 1000 + ' s.');
}
