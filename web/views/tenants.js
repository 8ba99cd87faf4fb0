// The tenants panel: each tenant of --tenants_file (or the one tenant
// `default` of the token flags), its share of the farm's slots now against
// its weight's share, its waiting calls, grants per second and wait
// percentiles (api/v1/tenants).

import { meterInit, meterSet, numCol } from '../cells.js';
import { NF2, fmtDuration, isNum, num, str } from '../format.js';

const pct = (v) => (isNum(v) ? Math.round(v * 100) + '%' : '—');
const seconds = (v) => (isNum(v) ? fmtDuration(v * 1000) : '—');

const columns = [
  {
    id: 'name', label: 'Tenant', rowHeader: true, minW: 140,
    sort: (t) => str(t.name),
    text: (t) => str(t.name) + (t.configured === false ? ' (removed)' : ''),
  },
  {
    id: 'weight', label: 'Weight', numeric: true, w: 80, sort: (t) => num(t.weight),
    text: (t) => (isNum(t.weight) ? NF2.format(t.weight) : '—'),
  },
  {
    id: 'share', label: 'Share now / by weight', cls: 'c-meter', w: 190, firstDir: -1,
    title: 'Slots it holds over the farm\'s slots, against its weight\'s share of the configured weights',
    sort: (t) => num(t.share),
    sig: (t) => num(t.share) + '/' + num(t.weightShare) + '/' + str(t.maxShare),
    init: meterInit,
    render: (c, t) => {
      const cap = isNum(t.maxShare) ? ', at most ' + pct(t.maxShare) + ' while others wait' : '';
      meterSet(c, isNum(t.share) ? t.share : null, pct(t.share) + ' / ' + pct(t.weightShare),
        num(t.held) + ' slots held; its weight\'s share is ' + pct(t.weightShare) + cap);
    },
  },
  {
    id: 'maxShare', label: 'Max share', numeric: true, w: 92, sort: (t) => (isNum(t.maxShare) ? t.maxShare : 2),
    text: (t) => (isNum(t.maxShare) ? pct(t.maxShare) : '—'),
  },
  numCol('held', 'Held', (t) => t.held, { w: 74 }),
  numCol('waiting', 'Waiting', (t) => t.waiting, { w: 86, cls: 'c-warn-if' }),
  {
    id: 'rate', label: 'Grants/s', numeric: true, w: 90, sort: (t) => num(t.grantsPerSecond),
    text: (t) => (isNum(t.grantsPerSecond) ? NF2.format(t.grantsPerSecond) : '—'),
  },
  {
    id: 'p50', label: 'Wait p50', numeric: true, w: 90, sort: (t) => num(t.waitP50Seconds),
    text: (t) => seconds(t.waitP50Seconds),
  },
  {
    id: 'p95', label: 'Wait p95', numeric: true, w: 90, sort: (t) => num(t.waitP95Seconds),
    text: (t) => seconds(t.waitP95Seconds),
  },
  numCol('grantsTotal', 'Grants', (t) => t.grantsTotal, { w: 90 }),
];

export const tenantsPanel = {
  name: 'tenants',
  keyAttr: 'tenant',
  noun: 'tenants',
  emptyText: 'No tenant.',
  placeholder: 'Filter by tenant…',
  caption: 'Tenants sharing the farm by weight',
  keyOf: (t) => str(t.name),
  defaultSort: ['weight', -1],
  haystack: (t) => str(t.name),
  columns: columns,
};
