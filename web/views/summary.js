// The cards at the top: cluster totals, each with a line of context, and a
// warning colour where a figure needs attention. The cards are in the page
// from the start (no layout shift when figures arrive); this fills them.

import { setText, toggleClass } from '../dom.js';
import { NF, NF2, fmtInt, fmtRateWindow, isNum, num } from '../format.js';
import { notAcceptingWhy } from './servants.js';

const metricEls = {};
const subEls = {};
for (const e of document.querySelectorAll('#summary [data-metric]')) metricEls[e.dataset.metric] = e;
for (const e of document.querySelectorAll('#summary [data-sub]')) subEls[e.dataset.sub] = e;

// `totals` and `rateWindowSeconds` of one overview, with its servants and grants.
export function renderSummary(totals, rateWindowSeconds, servants, grants) {
  for (const m of Object.keys(metricEls)) {
    const v = totals[m];
    const e = metricEls[m];
    const text = m === 'grantsPerSecond' ? (isNum(v) ? NF2.format(v) : '—') : fmtInt(v);
    setText(e, text);
    const raw = isNum(v) ? String(v) : '';
    if (e.dataset.value !== raw) e.dataset.value = raw;
  }
  let dedicated = 0;
  for (const s of servants) if (s.priority === 'DEDICATED') dedicated++;
  let prefetch = 0;
  let adopted = 0;
  for (const g of grants) {
    if (g.prefetch) prefetch++;
    if (g.adopted) adopted++;
  }
  const up = num(totals.servantsUp);
  const notAccepting = Math.max(0, up - num(totals.servantsAccepting));
  setText(subEls.servantsUp, NF.format(dedicated) + ' dedicated · ' + NF.format(servants.length - dedicated) + ' user');
  // Why the others take no task, most common first: the same servants the
  // table's "Not accepting" shows and /metrics leaves out of servants_accepting.
  const why = new Map();
  for (const s of servants) {
    const w = notAcceptingWhy(s);
    if (w) why.set(w, (why.get(w) || 0) + 1);
  }
  const reasons = [...why].sort((a, b) => b[1] - a[1] || (a[0] < b[0] ? -1 : 1))
    .map(([w, n]) => NF.format(n) + ' ' + w).join(' · ');
  setText(subEls.servantsAccepting, notAccepting ? reasons || NF.format(notAccepting) + ' not accepting' : up ? 'all accepting' : 'no servant up');
  subEls.servantsAccepting.title = notAccepting
    ? NF.format(notAccepting) + ' of ' + NF.format(up) + ' servants up take no task' + (reasons ? ': ' + reasons : '')
    : '';
  // The split of the capacity adds up: running + available + unavailable =
  // capacity, plus any grants beyond the slots their servants offer now.
  const over = num(totals.runningOverCapacity);
  if (subEls.capacity.dataset.over !== String(over)) subEls.capacity.dataset.over = String(over);
  setText(subEls.capacity, over > 0 ? 'task slots; ' + NF.format(over) + ' running beyond' : 'task slots');
  subEls.capacity.title = 'Running + Available + Unavailable = Capacity' +
    (over > 0 ? ' + ' + NF.format(over) + ' grants running beyond the slots their servants offer now' : '');
  const cap = num(totals.capacity);
  setText(subEls.running, cap > 0 ? Math.round((num(totals.running) / cap) * 100) + '% of capacity' : 'no capacity');
  setText(subEls.grants, NF.format(prefetch) + ' prefetch' + (adopted ? ' · ' + NF.format(adopted) + ' adopted' : ''));
  setText(subEls.grantsPerSecond, fmtRateWindow(rateWindowSeconds));

  const card = (m) => metricEls[m].parentElement;
  toggleClass(card('servantsAccepting'), 'warn', up > 0 && num(totals.servantsAccepting) === 0);
  toggleClass(card('capacityAvailable'), 'warn', cap > 0 && num(totals.capacityAvailable) === 0);
  toggleClass(card('waiters'), 'warn', num(totals.waiters) > 0);
  toggleClass(card('zombies'), 'warn', num(totals.zombies) > 0);
}
