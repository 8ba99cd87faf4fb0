// The requesters panel: machines whose delegates ask for grants, as icemon
// lists its clients. Rates come from successive counters (`grantsTotal`,
// `refusedTotal`, 64-bit decimal strings), measured between two overviews.

import { jumpCol, numCol, protocolColumn, protocolOf } from '../cells.js';
import { toggleClass } from '../dom.js';
import { NF2, big, decKey, fmtBig, isNum, locKey, num, objs, str } from '../format.js';

const columns = [
  jumpCol({ id: 'ip', label: 'Machine', rowHeader: true, cls: 'c-loc', w: 170, sort: (r) => locKey(r.ip) },
    'grants', (r) => str(r.ip), (r) => str(r.ip), (r) => 'show the grants held by ' + str(r.ip)),
  protocolColumn((r) => str(r.ip)),
  numCol('grantsHeld', 'Grants held', (r) => r.grantsHeld, { w: 100, title: 'Grants it holds now' }),
  numCol('waiting', 'Waiting', (r) => r.waiting, { w: 84, cls: 'c-warn-if', title: 'Calls it has queued for quota' }),
  {
    id: 'rate', label: 'Grants / s', numeric: true, w: 96, firstDir: -1,
    title: 'Grants it received per second, between the last two updates',
    sort: (r) => (isNum(r.rate) ? r.rate : -1),
    text: (r) => (isNum(r.rate) ? NF2.format(r.rate) : '—'),
  },
  {
    id: 'grantsTotal', label: 'Grants total', numeric: true, w: 110,
    title: 'Grants it received since the scheduler started',
    sort: (r) => decKey(r.grantsTotal),
    text: (r) => fmtBig(r.grantsTotal),
  },
  {
    id: 'refused', label: 'Refused renewals', numeric: true, w: 130,
    title: 'Renewals or frees of grants it does not own, refused since start',
    sort: (r) => decKey(r.refusedTotal),
    sig: (r) => str(r.refusedTotal) + '|' + (isNum(r.refusedRate) ? r.refusedRate : ''),
    render: (c, r) => {
      const total = big(r.refusedTotal);
      c.textContent = fmtBig(r.refusedTotal);
      c.title = isNum(r.refusedRate) ? NF2.format(r.refusedRate) + ' per second lately' : '';
      toggleClass(c, 'warn', total !== null && total > 0n);
    },
  },
  {
    id: 'capRefusals', label: 'Refused at cap', numeric: true, w: 116,
    title: 'Long polls answered “no quota” at once since start because a waiter cap was full',
    sort: (r) => decKey(r.waitCapRefusals),
    sig: (r) => str(r.waitCapRefusals),
    render: (c, r) => {
      const total = big(r.waitCapRefusals);
      c.textContent = fmtBig(r.waitCapRefusals);
      toggleClass(c, 'warn', total !== null && total > 0n);
    },
  },
];

export const requestersPanel = {
  name: 'requesters',
  keyAttr: 'requester',
  noun: 'machines',
  emptyText: 'No machine holds or waits for a grant.',
  placeholder: 'Filter by machine or protocol…',
  caption: 'Requesters: machines whose delegates ask for grants',
  showOptions: [
    ['all', 'All machines'],
    ['holding', 'Holding grants'],
    ['waiting', 'Waiting'],
    ['refused', 'With refused renewals'],
  ],
  keyOf: (r) => r.ip,
  defaultSort: ['grantsHeld', -1],
  haystack: (r, ctx) => str(r.ip) + ' ' + protocolOf(ctx, str(r.ip)),
  show: (r, mode) => {
    switch (mode) {
      case 'holding': return num(r.grantsHeld) > 0;
      case 'waiting': return num(r.waiting) > 0;
      case 'refused': return big(r.refusedTotal) !== null && big(r.refusedTotal) > 0n;
      default: return true;
    }
  },
  columns: columns,
};

// Previous counters per machine: { grants: BigInt, refused: BigInt, atMs, rate, refusedRate }.
const requesterCounters = new Map();
function perSecond(now, before, atMs, beforeMs) {
  if (now === null || before === null || !(atMs > beforeMs) || now < before) return null;
  return Number(now - before) / ((atMs - beforeMs) / 1000);
}

// The panel's rows and the tail of its info line: `requesters` as the
// scheduler reports it; without it (an older scheduler), what the grants
// tell: who holds how many.
export function requesterRows(d, grants, atMs) {
  if (!Array.isArray(d.requesters)) {
    const held = new Map();
    for (const g of grants) {
      const ip = str(g.requester);
      if (ip) held.set(ip, (held.get(ip) || 0) + 1);
    }
    return {
      rows: Array.from(held, ([ip, n]) => ({ ip: ip, grantsHeld: n, waiting: null, rate: null })),
      infoSuffix: ' · from grants (this scheduler reports no requester counters)',
    };
  }
  const rows = [];
  const seen = new Set();
  for (const r of objs(d.requesters)) {
    const ip = str(r.ip);
    if (!ip) continue;
    seen.add(ip);
    const grants = big(r.grantsTotal);
    const refused = big(r.refusedTotal);
    const prev = requesterCounters.get(ip);
    let rate = prev ? prev.rate : null;
    let refusedRate = prev ? prev.refusedRate : null;
    if (prev && atMs > prev.atMs) {
      rate = perSecond(grants, prev.grants, atMs, prev.atMs);
      refusedRate = perSecond(refused, prev.refused, atMs, prev.atMs);
    }
    // The same document twice (served from the scheduler's cache) keeps the last rate.
    if (!prev || atMs > prev.atMs) {
      requesterCounters.set(ip, { grants: grants, refused: refused, atMs: atMs, rate: rate, refusedRate: refusedRate });
    }
    rows.push(Object.assign({}, r, { ip: ip, rate: rate, refusedRate: refusedRate }));
  }
  for (const ip of requesterCounters.keys()) if (!seen.has(ip)) requesterCounters.delete(ip);
  return { rows: rows, infoSuffix: '' };
}
