// Column and cell builders the panels share: numbers, meters, links to
// another panel, two-line cells and the protocol a machine speaks.

import { h, toggleClass } from './dom.js';
import { fmtInt, num } from './format.js';

export function meterInit(c) {
  const wrap = h('div', 'meter');
  const track = h('div', 'track');
  const fill = h('div', 'fill');
  track.append(fill);
  const label = h('span', 'mlabel');
  wrap.append(track, label);
  c.append(wrap);
  c._fill = fill;
  c._label = label;
}
// The bar is scaled with a transform: no layout when the value moves.
export function meterSet(c, frac, label, title) {
  const scale = frac === null ? 0 : Math.round(frac * 1000) / 1000;
  if (c._scale !== scale) {
    c._scale = scale;
    c._fill.style.transform = 'scaleX(' + scale + ')';
  }
  const cls = 'fill' + (frac === null ? '' : frac >= 0.9 ? ' lvl-bad' : frac >= 0.7 ? ' lvl-warn' : ' lvl-ok');
  if (c._fill.className !== cls) c._fill.className = cls;
  if (c._label.textContent !== label) c._label.textContent = label;
  if (c.title !== (title || '')) c.title = title || '';
}

function jumpInit(c) {
  const b = h('button', 'link');
  b.type = 'button';
  c.append(b);
  c._btn = b;
}
function jumpSet(c, text, target, query, title) {
  const b = c._btn;
  if (b.textContent !== text) b.textContent = text;
  if (b.dataset.jump !== target) b.dataset.jump = target;
  if (b.dataset.query !== query) b.dataset.query = query;
  if (b.disabled !== !query) b.disabled = !query;
  if (b.title !== (title || '')) b.title = title || '';
}
// A cell whose text is a button showing panel `target` filtered on
// `query(it)`; disabled when the query is empty (nothing to show there).
export function jumpCol(column, target, text, query, hint) {
  return Object.assign({}, column, {
    sig: (it) => text(it) + '|' + query(it) + '|' + hint(it),
    init: jumpInit,
    render: (c, it) => jumpSet(c, text(it), target, query(it), hint(it)),
  });
}

export function twoLineInit(c) {
  const a = h('span', 'line1');
  const b = h('span', 'line2');
  c.append(a, b);
  c._a = a;
  c._b = b;
}

export const numCol = (id, label, get, extra) => Object.assign({
  id: id, label: label, numeric: true, w: 74,
  sort: (it) => num(get(it)),
  text: (it) => fmtInt(get(it)),
}, extra || {});

// The protocol a machine's daemon speaks, when the scheduler reports it.
export const protocolOf = (ctx, ip) => (ctx.protocols && ctx.protocols.get(ip)) || '';
export const protocolColumn = (ipOfItem) => ({
  id: 'protocol', label: 'Protocol', cls: 'c-proto', w: 92,
  title: 'Protocol its daemon speaks to the scheduler (as last seen)',
  sort: (it, ctx) => protocolOf(ctx, ipOfItem(it)) || '~',
  sig: (it, ctx) => protocolOf(ctx, ipOfItem(it)),
  render: (c, it, ctx) => {
    const p = protocolOf(ctx, ipOfItem(it));
    c.textContent = p || '—';
    c.title = p ? p : 'not reported';
    toggleClass(c, 'muted', !p);
  },
});
