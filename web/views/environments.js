// The environments panel: compiler digests the servants offer, with the
// free slots, running tasks and waiters of each.

import { jumpCol, meterInit, meterSet, numCol } from '../cells.js';
import { fmtInt, num, str } from '../format.js';

const columns = [
  {
    id: 'digest', label: 'Compiler digest', rowHeader: true, cls: 'c-digest-full mono', minW: 260,
    sort: (e) => str(e.digest),
    text: (e) => str(e.digest),
  },
  jumpCol({ id: 'servants', label: 'Servants', numeric: true, w: 96, sort: (e) => num(e.servants) },
    'servants', (e) => fmtInt(num(e.servants)), (e) => (num(e.servants) > 0 ? str(e.digest) : ''),
    () => 'show the servants offering this environment'),
  numCol('capacityAvailable', 'Free slots', (e) => e.capacityAvailable, { w: 96 }),
  jumpCol({ id: 'running', label: 'Running', numeric: true, w: 90, sort: (e) => num(e.running) },
    'grants', (e) => fmtInt(num(e.running)), (e) => (num(e.running) > 0 ? str(e.digest) : ''),
    () => 'show the grants for this environment'),
  numCol('waiters', 'Waiters', (e) => e.waiters, { w: 86, cls: 'c-warn-if' }),
  {
    id: 'usage', label: 'In use', cls: 'c-meter', w: 160, firstDir: -1, title: 'Running over running plus free slots',
    sort: (e) => { const d = num(e.running) + num(e.capacityAvailable); return d > 0 ? num(e.running) / d : 0; },
    sig: (e) => num(e.running) + '/' + num(e.capacityAvailable),
    init: meterInit,
    render: (c, e) => {
      const d = num(e.running) + num(e.capacityAvailable);
      const frac = d > 0 ? num(e.running) / d : null;
      meterSet(c, frac, frac === null ? '—' : Math.round(frac * 100) + '%',
        num(e.running) + ' running, ' + num(e.capacityAvailable) + ' free');
    },
  },
];

export const environmentsPanel = {
  name: 'environments',
  keyAttr: 'digest',
  noun: 'environments',
  emptyText: 'No servant offers a compiler environment.',
  placeholder: 'Filter by compiler digest…',
  caption: 'Compiler environments offered by servants',
  keyOf: (e) => e.digest,
  defaultSort: ['servants', -1],
  haystack: (e) => str(e.digest),
  columns: columns,
};
