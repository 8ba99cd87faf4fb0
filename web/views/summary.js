// The cards at the top, built here: cluster totals, each with a line of
// context, and a warning colour where a figure needs attention.

import { h, setText, toggleClass } from '../dom.js';
import { NF, NF2, fmtInt, isNum, num } from '../format.js';

// The cards, in page order: [metric in `totals`, title, fixed second line
// ('' when renderSummary writes it)].
const CARDS = [
  ['servantsUp', 'Servants up', ''],
  ['servantsAccepting', 'Accepting', ''],
  ['capacity', 'Capacity', 'task slots'],
  ['running', 'Running', ''],
  ['capacityAvailable', 'Available', 'free slots now'],
  ['capacityUnavailable', 'Unavailable', 'slots that take no task'],
  ['waiters', 'Waiters', 'queued for quota'],
  ['zombies', 'Zombies', 'lease expired, still running'],
  ['grants', 'Grants', ''],
  ['grantsPerSecond', 'Grants / s', 'grant rate'],
];
const METRICS = CARDS.map(([metric]) => metric);
const metricEls = {};
const subEls = {};
const cardList = document.querySelector('#summary .cards');
for (const [metric, title, sub] of CARDS) {
  const card = h('div', 'card');
  const value = h('dd', 'value', '—');
  value.dataset.metric = metric;
  value.dataset.value = '';
  // A no-break space keeps an empty second line as tall as a written one.
  const subEl = h('dd', 'sub', sub || '\u00a0');
  subEl.dataset.sub = metric;
  card.append(h('dt', '', title), value, subEl);
  cardList.append(card);
  metricEls[metric] = value;
  subEls[metric] = subEl;
}

export function renderSummary(totals, servants, grants) {
  for (const m of METRICS) {
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
  setText(subEls.servantsAccepting, notAccepting ? NF.format(notAccepting) + ' not accepting' : up ? 'all accepting' : 'no servant up');
  const cap = num(totals.capacity);
  setText(subEls.running, cap > 0 ? Math.round((num(totals.running) / cap) * 100) + '% of capacity' : 'no capacity');
  setText(subEls.grants, NF.format(prefetch) + ' prefetch' + (adopted ? ' · ' + NF.format(adopted) + ' adopted' : ''));

  const card = (m) => metricEls[m].parentElement;
  toggleClass(card('servantsAccepting'), 'warn', up > 0 && num(totals.servantsAccepting) === 0);
  toggleClass(card('capacityAvailable'), 'warn', cap > 0 && num(totals.capacityAvailable) === 0);
  toggleClass(card('waiters'), 'warn', num(totals.waiters) > 0);
  toggleClass(card('zombies'), 'warn', num(totals.zombies) > 0);
}
