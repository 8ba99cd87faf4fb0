// yadcc scheduler dashboard: the entry module. Plain JavaScript modules, no
// build step, no dependencies.
//
// Polls api/v1/overview every 2 s and api/v1/history every 5 s and updates the
// page in place: table rows are keyed (servant location, grant id, environment
// digest, requester IP) and reused, a cell is written only when what it shows
// changed, and the user's sort, filter, scroll position and focus survive
// every refresh. All data goes into the page through textContent /
// attributes, never HTML. 64-bit values (ids, byte counts, everAssigned)
// stay strings or BigInt.
//
// Modules: format.js (numbers, times, sort keys), dom.js, store.js (saved
// choices), api.js (fetching), table.js (the one table every panel uses),
// cells.js (shared columns), chart.js and chart-geometry.js (history),
// views/*.js (one per panel, the cards, the tabs, the connection banner and
// the operators' panel, views/admin.js). The Tenants panel polls
// api/v1/tenants beside the overview.

import {
  HISTORY_EVERY_MS, HISTORY_URL, HttpError, OVERVIEW_EVERY_MS, OVERVIEW_URL, TENANTS_URL, fetchJson,
  isUnauthorized,
} from './api.js';
import { createChart } from './chart.js';
import { setText } from './dom.js';
import { NF, fmtDuration, isNum, objs, str } from './format.js';
import { Table } from './table.js';
import { setUpOperator } from './views/admin.js';
import { environmentsPanel } from './views/environments.js';
import { grantsPanel, tasksInfo } from './views/grants.js';
import { requesterRows, requestersPanel } from './views/requesters.js';
import { servantsPanel } from './views/servants.js';
import { conn, markFailed, markLive, watchConnection } from './views/status.js';
import { renderSummary } from './views/summary.js';
import { setUpTabs } from './views/tabs.js';
import { tenantsPanel } from './views/tenants.js';

// A link in one table opens another panel; the tabs know how.
let jumpTo = () => {};
const onJump = (name, query) => jumpTo(name, query);
const tables = {};
for (const panel of [servantsPanel, grantsPanel, environmentsPanel, requestersPanel, tenantsPanel]) {
  tables[panel.name] = new Table(Object.assign({ onJump: onJump }, panel));
}
jumpTo = setUpTabs(tables);

const chart = createChart(document.getElementById('chart'));
const renderOperator = setUpOperator(document.getElementById('operator'), () => pollOverview());
const uptimeEl = document.getElementById('uptime');
const leadershipEl = document.getElementById('leadership');
const mainEl = document.getElementById('dashboard');
const countEls = {};
for (const k of Object.keys(tables)) countEls[k] = document.querySelector('[data-count="' + k + '"]');

const stats = { renders: 0, lastMs: 0, maxMs: 0, totalMs: 0, lastTables: {}, lastBytes: 0, lastParseMs: 0 };

function renderOverview(d) {
  const t0 = performance.now();
  const servants = objs(d.servants);
  const grants = objs(d.grants);
  const tasks = objs(d.runningTasks);
  const envs = objs(d.environments);
  const tasksByGrant = new Map();
  for (const t of tasks) if (t.grantId !== null && t.grantId !== undefined) tasksByGrant.set(str(t.grantId), t);
  const protocols = new Map();
  if (d.peerProtocols && typeof d.peerProtocols === 'object' && !Array.isArray(d.peerProtocols)) {
    for (const [ip, label] of Object.entries(d.peerProtocols)) if (typeof label === 'string') protocols.set(ip, label);
  }
  const ctx = {
    now: isNum(d.generatedAtMs) ? d.generatedAtMs : Date.now(), tasksByGrant: tasksByGrant, protocols: protocols,
    rateWindowSeconds: d.rateWindowSeconds,
  };
  const requesters = requesterRows(d, grants);
  tables.requesters.infoSuffix = requesters.infoSuffix;
  tables.grants.infoSuffix = tasksInfo(grants, tasks);

  // Cards, legend and tables from this one document: they always agree.
  const totals = d.totals && typeof d.totals === 'object' ? d.totals : {};
  renderSummary(totals, d.rateWindowSeconds, servants, grants);
  chart.setNow(totals, d.generatedAtMs);
  const items = { servants: servants, grants: grants, environments: envs, requesters: requesters.rows };
  for (const name of Object.keys(items)) {
    tables[name].setItems(items[name], ctx);
    setText(countEls[name], NF.format(items[name].length));
  }

  renderOperator(d);
  setText(uptimeEl, isNum(d.uptimeSeconds) ? fmtDuration(d.uptimeSeconds * 1000) : '—');
  // Only with a hot standby: this instance's part ("standby, leader is X").
  const role = typeof d.leadership === 'string' ? d.leadership : '';
  leadershipEl.hidden = role === '';
  setText(leadershipEl, role);
  leadershipEl.className = 'status ' + (role === 'leader' ? 'status-live' : 'status-standby');
  const ms = performance.now() - t0;
  stats.renders++;
  stats.lastMs = ms;
  stats.maxMs = Math.max(stats.maxMs, ms);
  stats.totalMs += ms;
  stats.lastTables = {};
  for (const name of Object.keys(tables)) stats.lastTables[name] = tables[name].lastRenderMs;
  mainEl.dataset.renderMs = ms.toFixed(1);
}

let overviewTimer = 0;
let historyTimer = 0;

let overviewBusy = false;
async function pollOverview() {
  if (overviewBusy) return; // one request at a time: answers never arrive out of order
  overviewBusy = true;
  clearTimeout(overviewTimer);
  const started = performance.now();
  try {
    const data = await fetchJson(OVERVIEW_URL, stats);
    if (!data || typeof data !== 'object' || Array.isArray(data)) throw new Error('unexpected answer');
    renderOverview(data);
    if (markLive()) pollHistory(); // catch up at once after an outage
  } catch (e) {
    markFailed(e && e.message ? e.message : String(e), isUnauthorized(e));
    if (!(e instanceof HttpError)) console.warn('overview:', e);
  } finally {
    overviewBusy = false;
    const wait = Math.max(250, OVERVIEW_EVERY_MS - (performance.now() - started));
    overviewTimer = setTimeout(pollOverview, wait);
  }
}

// The tenants come from their own endpoint, polled with the overview.
function renderTenants(d) {
  const rows = d && typeof d === 'object' ? objs(d.tenants) : [];
  tables.tenants.setItems(rows, { now: Date.now() });
  setText(countEls.tenants, NF.format(rows.length));
}

let tenantsBusy = false;
async function pollTenants() {
  if (tenantsBusy) return;
  tenantsBusy = true;
  try {
    renderTenants(await fetchJson(TENANTS_URL));
  } catch (e) {
    // The overview poll reports the outage; the panel keeps its last rows.
  } finally {
    tenantsBusy = false;
    setTimeout(pollTenants, OVERVIEW_EVERY_MS);
  }
}

let historyBusy = false;
async function pollHistory() {
  if (historyBusy) return;
  historyBusy = true;
  clearTimeout(historyTimer);
  const started = performance.now();
  try {
    chart.set(await fetchJson(HISTORY_URL));
  } catch (e) {
    // The overview poll reports the outage; the chart keeps its last data.
  } finally {
    historyBusy = false;
    historyTimer = setTimeout(pollHistory, Math.max(250, HISTORY_EVERY_MS - (performance.now() - started)));
  }
}

document.addEventListener('visibilitychange', () => {
  if (!document.hidden && conn.lastOkAt && Date.now() - conn.lastOkAt > OVERVIEW_EVERY_MS * 2) pollOverview();
});

window.yadccDashboard = {
  stats: stats,
  tables: tables,
  refresh: pollOverview,
  connection: conn,
};

watchConnection();
pollOverview();
pollHistory();
pollTenants();
