// The grants panel: task quota handed to delegates, with the task each
// servant reports running under it.

import { jumpCol } from '../cells.js';
import { h, toggleClass } from '../dom.js';
import { NF, decKey, fmtDuration, locKey, num, shortDigest, str } from '../format.js';

const grantFlags = (g) => (g.zombie ? 'z' : '') + (g.prefetch ? 'p' : '') + (g.adopted ? 'a' : '');

const columns = [
  {
    // A fingerprint of the id (the id is a capability): sha256 of its digits, 12 hex.
    id: 'id', label: 'Grant', rowHeader: true, cls: 'c-id mono', w: 130,
    sort: (g) => str(g.id),
    text: (g) => str(g.id),
  },
  jumpCol({ id: 'servant', label: 'Servant', cls: 'c-loc', w: 170, sort: (g) => locKey(g.servant) },
    'servants', (g) => str(g.servant) || '—', (g) => str(g.servant), (g) => 'show servant ' + str(g.servant)),
  {
    id: 'requester', label: 'Requester', cls: 'c-loc', w: 150,
    sort: (g) => locKey(g.requester),
    sig: (g) => str(g.requester),
    render: (c, g) => {
      const r = str(g.requester);
      c.textContent = r || 'unknown';
      c.title = r ? r : 'requester unknown (grant adopted after a restart)';
      toggleClass(c, 'muted', !r);
    },
  },
  {
    id: 'environment', label: 'Environment', cls: 'c-digest mono', w: 150,
    sort: (g) => str(g.environment),
    sig: (g) => str(g.environment),
    render: (c, g) => {
      const e = str(g.environment);
      c.textContent = e ? shortDigest(e) : 'unknown';
      c.title = e || 'environment unknown';
      toggleClass(c, 'muted', !e);
    },
  },
  {
    id: 'age', label: 'Age', numeric: true, w: 84, firstDir: -1, title: 'Time since the grant was made',
    sort: (g) => num(g.ageMs),
    text: (g) => fmtDuration(g.ageMs),
  },
  {
    id: 'lease', label: 'Lease left', numeric: true, w: 92, firstDir: 1, title: 'Time until the lease expires unless renewed',
    sort: (g) => (g.zombie ? -1 : num(g.leaseLeftMs)),
    sig: (g) => (g.zombie ? 'expired' : fmtDuration(g.leaseLeftMs)) + (num(g.leaseLeftMs) < 3000 ? '!' : ''),
    render: (c, g) => {
      c.textContent = g.zombie ? 'expired' : fmtDuration(g.leaseLeftMs);
      toggleClass(c, 'warn', !g.zombie && num(g.leaseLeftMs) < 3000);
      toggleClass(c, 'bad', !!g.zombie);
    },
  },
  {
    id: 'flags', label: 'Flags', w: 180,
    sort: (g) => grantFlags(g) || '~',
    sig: grantFlags,
    render: (c, g) => {
      const parts = [];
      if (g.zombie) parts.push(['Zombie', 'b-bad', 'lease expired; the servant still runs the task']);
      if (g.prefetch) parts.push(['Prefetch', 'b-info', 'granted ahead of need']);
      if (g.adopted) parts.push(['Adopted', 'b-muted', 'recovered from a servant report after a restart']);
      c.replaceChildren(...parts.map(([t, cls, title]) => {
        const b = h('span', 'badge ' + cls, t);
        b.title = title;
        return b;
      }));
    },
  },
  {
    id: 'task', label: 'Running task', cls: 'c-task', minW: 200, title: 'The task the servant reports under this grant',
    sort: (g, ctx) => { const t = ctx.tasksByGrant.get(str(g.id)); return t ? decKey(t.servantTaskId) : '~'; },
    sig: (g, ctx) => { const t = ctx.tasksByGrant.get(str(g.id)); return t ? str(t.servantTaskId) + '|' + str(t.taskDigest) + '|' + str(t.servant) : ''; },
    init: (c) => {
      const id = h('span', 'task-id');
      const dg = h('span', 'mono task-digest');
      c.append(id, dg);
      c._id = id;
      c._dg = dg;
    },
    render: (c, g, ctx) => {
      const t = ctx.tasksByGrant.get(str(g.id));
      toggleClass(c, 'muted', !t);
      if (!t) {
        c._id.textContent = 'not reported';
        c._dg.textContent = '';
        c.title = 'the servant reports no task under this grant';
        return;
      }
      c._id.textContent = 'task ' + str(t.servantTaskId);
      c._dg.textContent = shortDigest(str(t.taskDigest));
      c.title = 'task ' + str(t.servantTaskId) + ' on ' + str(t.servant) + '\n' + str(t.taskDigest);
    },
  },
];

export const grantsPanel = {
  name: 'grants',
  keyAttr: 'grant-id',
  noun: 'grants',
  emptyText: 'No grant is outstanding.',
  placeholder: 'Filter by id, servant, requester, environment, task…',
  caption: 'Grants (task quota given to delegates) and the tasks servants report for them',
  showOptions: [
    ['all', 'All grants'],
    ['zombie', 'Zombies'],
    ['prefetch', 'Prefetch'],
    ['adopted', 'Adopted'],
    ['unreported', 'No task reported'],
  ],
  keyOf: (g) => g.id,
  defaultSort: ['age', -1],
  haystack: (g, ctx) => {
    const t = ctx.tasksByGrant.get(str(g.id));
    return [str(g.id), str(g.servant), str(g.requester), str(g.environment),
      g.zombie ? 'zombie' : '', g.prefetch ? 'prefetch' : '', g.adopted ? 'adopted' : '',
      t ? str(t.servantTaskId) + ' ' + str(t.taskDigest) : ''].join(' ');
  },
  show: (g, mode, ctx) => {
    switch (mode) {
      case 'zombie': return !!g.zombie;
      case 'prefetch': return !!g.prefetch;
      case 'adopted': return !!g.adopted;
      case 'unreported': return !ctx.tasksByGrant.has(str(g.id));
      default: return true;
    }
  },
  rowClass: (g) => (g.zombie ? 'st-zombie' : ''),
  columns: columns,
};

// The info line's tail: how many tasks the servants report, and how many of
// them run under a grant the scheduler no longer has.
export function tasksInfo(grants, tasks) {
  const grantIds = new Set();
  for (const g of grants) grantIds.add(str(g.id));
  let orphans = 0;
  for (const t of tasks) if (!grantIds.has(str(t.grantId))) orphans++;
  return ' · ' + NF.format(tasks.length) + ' tasks reported' +
    (orphans ? ' (' + NF.format(orphans) + ' without a grant)' : '');
}
