// The operators' panel: the servants taken out of rotation (for everyone who
// sees the dashboard), and, for an operator who gives an admin token, the
// cordon, drain and uncordon buttons, each asking for a confirmation first.
//
// The token stays in this tab (sessionStorage, or memory when storage is
// unavailable) and goes out only as `Authorization: Bearer` on the calls of
// yadcc.scheduler.AdminService, never as a cookie: another site's page can
// neither send it nor make the browser send it.

import { h, setText } from '../dom.js';
import { fmtClock, fmtDuration, isNum, objs, str } from '../format.js';

const TOKEN_KEY = 'yadcc-admin-token';
const SERVICE = 'rpc/yadcc.scheduler.AdminService.';
const CALL_TIMEOUT_MS = 10000;
const MAX_SUGGESTIONS = 500;
const STATE_LABELS = { cordoned: 'Cordoned', draining: 'Draining', drained: 'Drained' };
const CONFIRM_TEXT = {
  CordonServant: (loc) => 'Cordon ' + loc + '? No new task will go to it; the tasks it runs go on.',
  DrainServant: (loc) => 'Drain ' + loc + '? No new task will go to it, and its state shows ' +
    'the tasks it still runs until none is left. Nothing is killed.',
  UncordonServant: (loc) => 'Uncordon ' + loc + '? It takes new tasks again at once.',
};
// The list's columns; on a phone each cell shows its label beside it
// (style.css stacks a row's cells there, so none is cut).
const COLUMN_LABELS = ['Servant', 'State', 'Reason', 'By', 'Since', 'Running', ''];
const DONE_TEXT = { CordonServant: 'Cordoned', DrainServant: 'Draining', UncordonServant: 'Uncordoned' };

let memoryToken = '';
function readToken() {
  try {
    return sessionStorage.getItem(TOKEN_KEY) || '';
  } catch (e) {
    return memoryToken;
  }
}
function keepToken(token) {
  memoryToken = token;
  try {
    if (token) sessionStorage.setItem(TOKEN_KEY, token);
    else sessionStorage.removeItem(TOKEN_KEY);
  } catch (e) { /* storage off: memory only */ }
}

// One call of the operators' service in JSON. Resolves to the answer, or
// throws an Error whose message is the scheduler's (`status` on it).
async function call(method, token, body) {
  const ctl = new AbortController();
  const timer = setTimeout(() => ctl.abort(), CALL_TIMEOUT_MS);
  try {
    let r;
    try {
      r = await fetch(SERVICE + method, {
        method: 'POST', cache: 'no-store', credentials: 'omit', signal: ctl.signal,
        headers: { 'Content-Type': 'application/json', Authorization: 'Bearer ' + token },
        body: JSON.stringify(body),
      });
    } catch (e) {
      throw new Error(e && e.name === 'AbortError' ? 'no answer in time' : 'connection failed');
    }
    let answer = null;
    try {
      answer = await r.json();
    } catch (e) { /* an answer without JSON: its status says enough */ }
    if (!r.ok) {
      const err = new Error(answer && answer.message ? str(answer.message) : 'HTTP ' + r.status);
      err.status = r.status;
      throw err;
    }
    return answer || {};
  } finally {
    clearTimeout(timer);
  }
}

function button(text, cls) {
  const b = h('button', 'btn' + (cls ? ' ' + cls : ''), text);
  b.type = 'button';
  return b;
}

function field(labelText, input) {
  const label = h('label', 'operator-field');
  label.append(h('span', 'operator-label', labelText), input);
  return label;
}

// `root`: the panel's section. `refresh()`: asks for a fresh overview after
// an action. Returns `render(overview)`, called on every overview.
export function setUpOperator(root, refresh) {
  const status = h('p', 'operator-status');
  status.id = 'operator-status';
  status.setAttribute('role', 'status');

  // A form, so that browsers treat the field as a password's; it is never
  // submitted (the page's CSP allows no form action).
  const login = h('form', 'operator-login');
  login.id = 'operator-login';
  login.noValidate = true;
  const tokenEl = h('input');
  tokenEl.type = 'password';
  tokenEl.id = 'operator-token';
  tokenEl.autocomplete = 'off';
  tokenEl.spellcheck = false;
  const useBtn = button('Use token', 'primary');
  useBtn.id = 'operator-use';
  useBtn.type = 'submit';
  login.append(field('Admin token', tokenEl), useBtn,
    h('span', 'operator-note', 'Kept in this tab only and sent as an Authorization header, never as a cookie.'));

  const act = h('div', 'operator-act');
  act.id = 'operator-act';
  const locationEl = h('input');
  locationEl.id = 'operator-location';
  locationEl.placeholder = 'IP:port, as the servant reports it';
  locationEl.spellcheck = false;
  locationEl.autocomplete = 'off';
  const known = h('datalist');
  known.id = 'operator-locations';
  locationEl.setAttribute('list', known.id);
  const reasonEl = h('input');
  reasonEl.id = 'operator-reason';
  reasonEl.maxLength = 200;
  reasonEl.placeholder = 'why, for the other operators';
  const cordonBtn = button('Cordon…');
  cordonBtn.dataset.action = 'CordonServant';
  const drainBtn = button('Drain…');
  drainBtn.dataset.action = 'DrainServant';
  const forgetBtn = button('Forget token');
  forgetBtn.id = 'operator-forget';
  act.append(field('Servant', locationEl), known, field('Reason', reasonEl), cordonBtn, drainBtn, forgetBtn);

  const list = h('table', 'data operator-list');
  list.id = 'operator-cordons';
  list.createCaption().append('Servants out of rotation');
  const head = list.createTHead().insertRow();
  for (const label of COLUMN_LABELS) {
    const th = h('th', '', label);
    th.scope = 'col';
    head.append(th);
  }
  const body = list.createTBody();
  const empty = h('p', 'empty', 'No servant is cordoned.');

  const dialog = h('dialog', 'operator-confirm');
  dialog.id = 'operator-confirm';
  const question = h('p', 'operator-question');
  question.id = 'operator-question';
  const confirmBtn = button('Confirm', 'primary');
  confirmBtn.id = 'operator-yes';
  const cancelBtn = button('Cancel');
  cancelBtn.id = 'operator-no';
  const choices = h('div', 'operator-choices');
  choices.append(cancelBtn, confirmBtn);
  dialog.append(question, choices);
  dialog.setAttribute('aria-labelledby', question.id);

  root.append(login, act, status, list, empty, dialog);

  let token = readToken();
  let pending = null;
  let lastOverview = null;

  function say(text, bad) {
    setText(status, text);
    status.classList.toggle('bad', !!bad);
  }

  function show() {
    login.hidden = !!token;
    act.hidden = !token;
    root.classList.toggle('acting', !!token);
  }

  async function useToken() {
    const given = tokenEl.value;
    if (!given) return;
    useBtn.disabled = true;
    try {
      await call('ListServantStates', given, {});
      token = given;
      keepToken(token);
      tokenEl.value = '';
      say('Acting with this admin token.');
    } catch (e) {
      say(e.status === 401 || e.status === 403 ? 'The scheduler refused this token: ' + e.message : e.message, true);
    } finally {
      useBtn.disabled = false;
      show();
      if (lastOverview) render(lastOverview);
    }
  }

  function ask(method, location) {
    if (!location) {
      say('Name the servant (IP:port) first.', true);
      locationEl.focus();
      return;
    }
    pending = { method: method, location: location, reason: method === 'UncordonServant' ? '' : reasonEl.value };
    setText(question, CONFIRM_TEXT[method](location));
    if (typeof dialog.showModal === 'function') dialog.showModal();
    else dialog.setAttribute('open', '');
    confirmBtn.focus();
  }

  function closeDialog() {
    if (typeof dialog.close === 'function') dialog.close();
    else dialog.removeAttribute('open');
  }

  async function confirmed() {
    const p = pending;
    pending = null;
    closeDialog();
    if (!p) return;
    const body = p.method === 'UncordonServant' ? { location: p.location } : { location: p.location, reason: p.reason };
    try {
      await call(p.method, token, body);
      say(DONE_TEXT[p.method] + ' ' + p.location + '.');
      if (p.method !== 'UncordonServant') reasonEl.value = '';
    } catch (e) {
      if (e.status === 401 || e.status === 403) {
        token = '';
        keepToken('');
        show();
      }
      say(p.method.replace('Servant', '') + ' ' + p.location + ' failed: ' + e.message, true);
    }
    refresh();
  }

  login.addEventListener('submit', (ev) => {
    ev.preventDefault();
    useToken();
  });
  forgetBtn.addEventListener('click', () => {
    token = '';
    keepToken('');
    say('Token forgotten.');
    show();
    if (lastOverview) render(lastOverview);
  });
  for (const b of [cordonBtn, drainBtn]) {
    b.addEventListener('click', () => ask(b.dataset.action, locationEl.value.trim()));
  }
  body.addEventListener('click', (ev) => {
    const b = ev.target.closest('button[data-action]');
    if (b && body.contains(b)) ask(b.dataset.action, b.dataset.location);
  });
  confirmBtn.addEventListener('click', confirmed);
  cancelBtn.addEventListener('click', () => {
    pending = null;
    closeDialog();
    say('Nothing done.');
  });
  dialog.addEventListener('cancel', () => { pending = null; });

  // The list of cordons, from the overview, with buttons for an operator.
  let drawn = '';
  function render(overview) {
    lastOverview = overview;
    const cordons = objs(overview.cordons);
    const now = isNum(overview.generatedAtMs) ? overview.generatedAtMs : Date.now();
    // Rows (and the buttons in them) are rebuilt only when what they show
    // changed, so a button does not vanish under a pointer every poll.
    const sig = (token ? 'op|' : '|') +
      cordons.map((c) => [c.location, c.state, c.reason, c.by, c.sinceMs, c.running, c.registered].join(',')).join(';');
    if (sig === drawn) return;
    drawn = sig;
    const rows = cordons.map((c) => {
      const tr = document.createElement('tr');
      const loc = str(c.location);
      tr.dataset.cordon = loc;
      const since = isNum(c.sinceMs) ? fmtClock(c.sinceMs) : '—';
      const state = STATE_LABELS[str(c.state)] || str(c.state);
      const cells = [loc, state + (c.registered ? '' : ' (not registered)'), str(c.reason) || '—', str(c.by),
        since, String(isNum(c.running) ? c.running : 0)];
      cells.forEach((text, i) => {
        const cell = h(i === 0 ? 'th' : 'td', i === 1 ? 'st-' + str(c.state) : '', text);
        cell.dataset.label = COLUMN_LABELS[i];
        if (i === 0) cell.scope = 'row';
        if (i === 4 && isNum(c.sinceMs)) {
          cell.title = new Date(c.sinceMs).toLocaleString() + ' (' + fmtDuration(Math.max(0, now - c.sinceMs)) + ' ago)';
        }
        tr.append(cell);
      });
      // The buttons sit in a box of their own: a flex cell would stop being
      // a table cell and shift the row against its header.
      const actions = h('td', 'operator-actions');
      const buttons = h('div', 'operator-buttons');
      if (token) {
        for (const [method, text] of [['UncordonServant', 'Uncordon…'], ['DrainServant', 'Drain…']]) {
          if (method === 'DrainServant' && c.state !== 'cordoned') continue;
          const b = button(text);
          b.dataset.action = method;
          b.dataset.location = loc;
          buttons.append(b);
        }
      }
      actions.append(buttons);
      tr.append(actions);
      return tr;
    });
    body.replaceChildren(...rows);
    list.hidden = rows.length === 0;
    empty.hidden = rows.length > 0;
  }

  // The servants the page knows, as suggestions for the location field:
  // filled when an operator goes to type one (a big farm's thousand options
  // would weigh on every page otherwise), at most MAX_SUGGESTIONS of them.
  locationEl.addEventListener('focus', () => {
    const servants = lastOverview ? objs(lastOverview.servants).slice(0, MAX_SUGGESTIONS) : [];
    known.replaceChildren(...servants.map((s) => {
      const o = h('option');
      o.value = str(s.reportedLocation) || str(s.location);
      return o;
    }));
  });
  locationEl.addEventListener('blur', () => known.replaceChildren());

  show();
  return render;
}
