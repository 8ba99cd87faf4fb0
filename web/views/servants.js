// The servants panel: compile servers that sent a heartbeat, what each can
// take now and, when it takes nothing, why, in words.

import { jumpCol, meterInit, meterSet, numCol, protocolColumn, twoLineInit } from '../cells.js';
import { h, setText, toggleClass } from '../dom.js';
import {
  NF, big, decKey, fmtBig, fmtBytes, fmtDuration, fmtInt, fraction, ipOf, isNum, locKey, num, str,
} from '../format.js';

const REASON_LABELS = {
  UNKNOWN: 'Not accepting',
  USER_INSTRUCTED: 'Disabled by its owner',
  POOR_MACHINE: 'Machine too small',
  CGROUPS_PRESENT: 'Under cgroups limits',
  BEHIND_NAT: 'Behind NAT',
  NOT_VERIFIED: 'Not verified',
};
function reasonLabel(r) {
  const name = str(r.name).replace(/^NOT_ACCEPTING_TASK_REASON_/, '');
  if (REASON_LABELS[name]) return REASON_LABELS[name];
  if (!name) return isNum(r.code) ? 'Not accepting (reason ' + r.code + ')' : 'Not accepting';
  const words = name.toLowerCase().replace(/_/g, ' ');
  return (words.charAt(0).toUpperCase() + words.slice(1)).replace(/\b(nat|cpu|ip)\b/gi, (w) => w.toUpperCase());
}

// The reference scheduler's default --servant_min_memory_for_accepting_new_task.
const LOW_MEMORY_BYTES = 10n * 1024n * 1024n * 1024n;
const STATE_RANK = { ok: 0, full: 1, off: 2, leaving: 3, ejected: 4, cordoned: 5 };
const CORDON_LABELS = { cordoned: 'Cordoned', draining: 'Draining', drained: 'Drained' };

// What a servant can do right now, in words.
function servantState(s) {
  if (s.leaving) return { kind: 'leaving', label: 'Leaving', detail: 'sent its last heartbeat' };
  // An operator took it out of rotation (views/admin.js acts on it).
  const c = s.cordon;
  if (c && typeof c === 'object') {
    const why = [str(c.reason), c.by ? 'by ' + str(c.by) : ''].filter(Boolean).join(' · ');
    return { kind: 'cordoned', label: CORDON_LABELS[str(c.state)] || 'Cordoned', detail: why };
  }
  // The scheduler took it out of rotation: its grants kept coming back at once.
  const e = s.ejection;
  if (e && typeof e === 'object' && e.state === 'ejected') {
    return { kind: 'ejected', label: 'Ejected', detail: str(e.why) };
  }
  const r = s.notAcceptingReason;
  if (r && typeof r === 'object') return { kind: 'off', label: reasonLabel(r), detail: str(r.description) };
  if (e && typeof e === 'object' && e.state === 'on_trial') {
    return { kind: 'ok', label: 'On trial', detail: 'one grant at a time after an ejection: ' + str(e.why) };
  }
  if (num(s.maxTasks) <= 0) return { kind: 'off', label: 'No capacity', detail: 'configured to run no task' };
  if (num(s.capacityAvailable) <= 0) {
    // The likeliest cause, from what the servant reported.
    const used = num(s.running) + num(s.zombies);
    const total = big(s.totalMemoryBytes);
    const avail = big(s.memoryAvailableBytes);
    let detail;
    if (used >= num(s.maxTasks)) detail = 'all ' + num(s.maxTasks) + ' slots granted';
    else if (num(s.numProcessors) > 0 && num(s.currentLoad) >= num(s.numProcessors)) {
      detail = 'load ' + num(s.currentLoad) + ' on ' + num(s.numProcessors) + ' processors';
    } else if (total !== null && total > 0n && avail !== null && avail < LOW_MEMORY_BYTES) {
      detail = 'low memory: ' + fmtBytes(s.memoryAvailableBytes) + ' free';
    } else detail = used + ' of ' + num(s.maxTasks) + ' slots granted';
    return { kind: 'full', label: 'Full', detail: detail };
  }
  return { kind: 'ok', label: 'Accepting', detail: '' };
}

// Why a servant takes no task, in a few words ('' when it takes tasks):
// the cards count the same servants as not accepting as /metrics does
// (cordoned, or a task limit of 0), and say why with these words.
export function notAcceptingWhy(s) {
  const st = servantState(s);
  if (st.kind === 'ok' || st.kind === 'full') return '';
  return st.label.charAt(0).toLowerCase() + st.label.slice(1);
}

const columns = [
  {
    id: 'location', label: 'Servant', rowHeader: true, cls: 'c-loc', w: 160,
    sort: (s) => locKey(s.location),
    sig: (s) => str(s.location) + '|' + str(s.reportedLocation),
    init: twoLineInit,
    render: (c, s) => {
      const loc = str(s.location);
      const rep = str(s.reportedLocation);
      c._a.textContent = loc;
      c._b.textContent = rep && rep !== loc ? 'reports ' + rep : '';
      c.title = rep && rep !== loc ? 'observed ' + loc + ', reported ' + rep : loc;
    },
  },
  {
    id: 'state', label: 'State', cls: 'c-state', minW: 180,
    title: 'Whether it takes tasks, why not, and whether it is a dedicated or a user machine',
    sort: (s) => { const st = servantState(s); return STATE_RANK[st.kind] + ':' + st.label; },
    sig: (s) => { const st = servantState(s); return st.kind + '|' + st.label + '|' + st.detail + '|' + str(s.priority); },
    init: (c) => {
      const top = h('span', 'line1');
      const badge = h('span', 'badge');
      const tag = h('span', 'tag');
      top.append(badge, tag);
      const detail = h('span', 'detail');
      c.append(top, detail);
      c._badge = badge;
      c._tag = tag;
      c._detail = detail;
    },
    render: (c, s) => {
      const st = servantState(s);
      const p = str(s.priority);
      c._badge.textContent = st.label;
      c._badge.className = 'badge b-' + st.kind;
      c._tag.textContent = p === 'DEDICATED' ? 'dedicated' : p === 'USER' ? 'user' : (p.toLowerCase() || 'user');
      c._tag.className = 'tag ' + (p === 'DEDICATED' ? 't-dedicated' : 't-user');
      c._detail.textContent = st.detail;
      c.title = (st.detail ? st.label + ': ' + st.detail : st.label) + ' (' + c._tag.textContent + ' servant)';
    },
  },
  protocolColumn((s) => ipOf(s.location)),
  numCol('version', 'Ver', (s) => s.version, { w: 50, title: 'Daemon version' }),
  {
    id: 'envs', label: 'Envs', numeric: true, w: 58, title: 'Compiler environments it offers',
    sort: (s) => (Array.isArray(s.environments) ? s.environments.length : 0),
    sig: (s) => (Array.isArray(s.environments) ? s.environments.join(' ') : ''),
    render: (c, s) => {
      const envs = Array.isArray(s.environments) ? s.environments.map(str) : [];
      c.textContent = NF.format(envs.length);
      c.title = envs.join('\n');
    },
  },
  {
    id: 'load', label: 'Load', cls: 'c-meter', w: 124, firstDir: -1,
    title: 'Current load (running processes) over processors',
    sort: (s) => (num(s.numProcessors) > 0 ? num(s.currentLoad) / num(s.numProcessors) : num(s.currentLoad)),
    sig: (s) => num(s.currentLoad) + '/' + num(s.numProcessors),
    init: meterInit,
    render: (c, s) => {
      const load = num(s.currentLoad);
      const procs = num(s.numProcessors);
      const frac = procs > 0 ? Math.min(1, load / procs) : null;
      meterSet(c, frac, NF.format(load) + ' / ' + NF.format(procs),
        'load ' + load + ' on ' + procs + ' processors' + (frac === null ? '' : ' (' + Math.round(frac * 100) + '%)'));
    },
  },
  {
    id: 'memory', label: 'Memory free', cls: 'c-meter', w: 130, firstDir: 1,
    title: 'Memory free on the servant (the figure); the bar is the share of its own total in use, full = all of its memory in use, so bars of machines of different sizes compare shares, not sizes',
    sort: (s) => decKey(s.memoryAvailableBytes),
    sig: (s) => str(s.memoryAvailableBytes) + '/' + str(s.totalMemoryBytes),
    init: meterInit,
    render: (c, s) => {
      const total = big(s.totalMemoryBytes);
      const avail = big(s.memoryAvailableBytes);
      if (total === null || total === 0n) {
        meterSet(c, null, 'not reported', 'memory not reported');
        return;
      }
      const freeFrac = fraction(s.memoryAvailableBytes, s.totalMemoryBytes);
      meterSet(c, freeFrac === null ? null : 1 - freeFrac, fmtBytes(s.memoryAvailableBytes),
        fmtBytes(s.memoryAvailableBytes) + ' free of ' + fmtBytes(s.totalMemoryBytes) +
        (avail === null ? '' : ' (' + fmtBytes((total - (avail > total ? total : avail)).toString()) + ' in use)') +
        '; the bar is full when all of it is in use');
    },
  },
  {
    id: 'slots', label: 'Slots', numeric: true, w: 80,
    title: 'Free / most: task slots free for a new task right now, over the most tasks it takes (0 when not accepting); full = 0 free (all granted, or load, low memory or a cordon takes the rest)',
    sort: (s) => num(s.capacityAvailable) * 1e6 + num(s.maxTasks),
    sig: (s) => num(s.capacityAvailable) + '/' + num(s.maxTasks) + '/' + str(s.typicalGrantMs),
    init: (c) => {
      c._free = h('span', 'free');
      c._max = h('span', 'of');
      c.append(c._free, c._max);
    },
    render: (c, s) => {
      c._free.textContent = fmtInt(num(s.capacityAvailable));
      c._max.textContent = ' / ' + fmtInt(num(s.maxTasks));
      toggleClass(c._free, 'zero', num(s.capacityAvailable) === 0);
      // Rule "observed speed": what orders it within its tier, shown
      // where the slots are rather than in a column of its own.
      const held = s.typicalGrantMs === null || s.typicalGrantMs === undefined ? ''
        : '; its grants come back in ' + (num(s.typicalGrantMs) / 1000).toFixed(1) + ' s typically';
      c.title = num(s.capacityAvailable) + ' free of ' + num(s.maxTasks) + ' slots (full at 0 free)' + held;
    },
  },
  jumpCol({
    id: 'running', label: 'Running', numeric: true, w: 82, title: 'Tasks granted there; click to see its grants',
    sort: (s) => num(s.running),
  }, 'grants', (s) => fmtInt(num(s.running)),
  (s) => (num(s.running) + num(s.zombies) > 0 ? str(s.location) : ''),
  (s) => 'show the grants on ' + str(s.location)),
  numCol('zombies', 'Zombies', (s) => s.zombies, { w: 84, cls: 'c-warn-if', title: 'Grants whose lease expired while the servant still runs the task' }),
  numCol('reportedRunningTasks', 'Reported', (s) => s.reportedRunningTasks, { w: 88, title: 'Tasks the servant reports running' }),
  numCol('waiters', 'Waiters', (s) => s.waiters, { w: 80, cls: 'c-warn-if', title: 'Requests waiting for quota this servant could serve' }),
  {
    id: 'everAssigned', label: 'Assigned', numeric: true, w: 96, title: 'Tasks ever granted to it',
    sort: (s) => decKey(s.everAssigned),
    sig: (s) => str(s.everAssigned),
    render: (c, s) => { c.textContent = fmtBig(s.everAssigned); c.title = c.textContent + ' tasks granted since its first heartbeat'; },
  },
  {
    id: 'discovered', label: 'Up for', numeric: true, w: 80, firstDir: -1,
    title: 'Time since its first heartbeat (hover: when it expires without a new one)',
    sort: (s) => -num(s.discoveredAtMs),
    sig: (s, ctx) => {
      const up = isNum(s.discoveredAtMs) ? fmtDuration(Math.max(0, ctx.now - s.discoveredAtMs)) : '—';
      const left = isNum(s.expiresAtMs) ? s.expiresAtMs - ctx.now : null;
      return up + '|' + (left === null ? '' : left <= 0 ? 'now' : fmtDuration(left)) + '|' + (left !== null && left < 3000 ? '!' : '');
    },
    render: (c, s, ctx) => {
      const up = isNum(s.discoveredAtMs) ? fmtDuration(Math.max(0, ctx.now - s.discoveredAtMs)) : '—';
      const left = isNum(s.expiresAtMs) ? s.expiresAtMs - ctx.now : null;
      setText(c, up);
      c.title = (isNum(s.discoveredAtMs) ? 'first heartbeat at ' + new Date(s.discoveredAtMs).toLocaleString() : '') +
        (left === null ? '' : '\nexpires ' + (left <= 0 ? 'now' : 'in ' + fmtDuration(left)) + ' without a heartbeat');
      toggleClass(c, 'warn', left !== null && left < 3000 && !s.leaving);
    },
  },
];

export const servantsPanel = {
  name: 'servants',
  keyAttr: 'location',
  noun: 'servants',
  emptyText: 'No servant has sent a heartbeat yet.',
  placeholder: 'Filter by location, version, reason, environment digest…',
  caption: 'Servants (compile servers) that sent a heartbeat',
  showOptions: [
    ['all', 'All servants'],
    ['accepting', 'Accepting'],
    ['not-accepting', 'Not accepting'],
    ['busy', 'No capacity left'],
    ['dedicated', 'Dedicated'],
    ['user', 'User'],
    ['leaving', 'Leaving'],
    ['cordoned', 'Out of rotation'],
  ],
  keyOf: (s) => s.location,
  defaultSort: ['location', 1],
  haystack: (s) => {
    const st = servantState(s);
    return [str(s.location), str(s.reportedLocation), 'v' + str(s.version), str(s.priority), st.label, st.detail,
      s.notAcceptingReason ? str(s.notAcceptingReason.name) : '', s.leaving ? 'leaving' : '',
      Array.isArray(s.environments) ? s.environments.join(' ') : ''].join(' ');
  },
  show: (s, mode) => {
    const kind = servantState(s).kind;
    switch (mode) {
      case 'accepting': return kind === 'ok' || kind === 'full';
      case 'not-accepting': return kind === 'off' || kind === 'leaving' || kind === 'cordoned' || kind === 'ejected';
      case 'busy': return kind === 'full';
      case 'dedicated': return s.priority === 'DEDICATED';
      case 'user': return s.priority !== 'DEDICATED';
      case 'leaving': return !!s.leaving;
      case 'cordoned': return kind === 'cordoned' || kind === 'ejected';
      default: return true;
    }
  },
  rowClass: (s) => 'st-' + servantState(s).kind,
  columns: columns,
};
