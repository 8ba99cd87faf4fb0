// The one table every panel uses: it builds the panel's toolbar (filter,
// optional "show" choice, row count), the table and its pager from the
// panel's description, and keeps rows keyed and reused across refreshes.
//
// Columns give a sort key, and either `text` (the cell's text) or `sig` +
// `render` (a signature of what the cell shows, and how to show it); a cell
// is touched only when that string changes, so sort, filter, scroll position
// and focus survive every refresh.

import { h, setText, toggleClass } from './dom.js';
import { NF, str } from './format.js';
import { saveUi, ui } from './store.js';

// At most this many rows are in the DOM: a table of thousands of rows costs
// the browser too much layout on every refresh. A hidden panel's table is
// not drawn at all until its tab is shown. A phone shows a few rows at a
// time, and laying out a page of 50 was most of its main thread's work per
// refresh at 1,000 servants (BENCHMARKS.md, the dashboard on a phone): it
// pages by 20. The width is style.css's phone layout's.
const PAGE_ROWS = 50;
const PHONE_PAGE_ROWS = 20;
const phone = typeof matchMedia === 'function' ? matchMedia('(max-width: 640px)') : null;
const pageRows = () => (phone && phone.matches ? PHONE_PAGE_ROWS : PAGE_ROWS);

// The panel's controls, from its description (the page holds only the empty
// tab panel).
function buildPanel(panel, o) {
  const filterLabel = h('label', 'filter');
  const filterEl = h('input');
  filterEl.type = 'search';
  filterEl.id = o.name + '-filter';
  filterEl.placeholder = o.placeholder;
  filterEl.autocomplete = 'off';
  filterEl.spellcheck = false;
  filterLabel.append(h('span', 'visually-hidden', 'Filter ' + o.name), filterEl);
  const toolbar = h('div', 'toolbar');
  toolbar.append(filterLabel);
  let showEl = null;
  if (o.showOptions) {
    const showLabel = h('label', 'select');
    showEl = h('select');
    showEl.id = o.name + '-show';
    for (const [value, label] of o.showOptions) {
      const option = h('option', '', label);
      option.value = value;
      showEl.append(option);
    }
    showLabel.append(h('span', 'visually-hidden', 'Show'), showEl);
    toolbar.append(showLabel);
  }
  const infoEl = h('span', 'toolbar-info');
  infoEl.id = o.name + '-info';
  toolbar.append(infoEl);

  const table = h('table', 'data');
  table.id = o.name + '-table';
  table.createCaption().append(o.caption);
  table.caption.className = 'visually-hidden';
  table.createTHead().insertRow();
  table.createTBody();
  const wrap = h('div', 'table-wrap');
  wrap.append(table);
  const emptyEl = h('p', 'empty');
  emptyEl.hidden = true;
  const moreEl = h('div', 'more');
  panel.replaceChildren(toolbar, wrap, emptyEl, moreEl);
  return { filterEl, showEl, infoEl, table, emptyEl, moreEl, wrap };
}

// Numbers that need attention (columns marked `c-warn-if`) get a warning colour.
function warnIfNonZero(col) {
  if (!col.cls || !col.cls.includes('c-warn-if') || col.render) return col;
  const get = col.text;
  return Object.assign({}, col, {
    sig: (it, ctx) => get(it, ctx),
    render: (c, it, ctx) => {
      const v = get(it, ctx);
      c.textContent = v;
      toggleClass(c, 'warn', v !== '0' && v !== '—');
    },
  });
}

export class Table {
  // `o`: name (the tab panel's id), noun, emptyText, placeholder, caption,
  // showOptions (optional), keyOf, keyAttr, defaultSort, haystack, show,
  // rowClass, columns, onJump(panelName, query).
  constructor(o) {
    Object.assign(this, o);
    this.columns = o.columns.map(warnIfNonZero);
    this.panel = document.getElementById(o.name);
    const parts = buildPanel(this.panel, o);
    this.table = parts.table;
    this.tbody = this.table.tBodies[0];
    this.emptyEl = parts.emptyEl;
    this.filterEl = parts.filterEl;
    this.showEl = parts.showEl;
    this.infoEl = parts.infoEl;
    this.wrap = parts.wrap;
    this.colById = new Map(this.columns.map((c) => [c.id, c]));
    this.rows = new Map();
    this.items = [];
    this.ctx = {};
    this.gen = 0;
    this.page = 0;
    this.lastRenderMs = 0;
    this.perPage = 0;
    this.infoSuffix = '';
    this.stale = true;

    const saved = ui.tables[o.name] || {};
    this.sortId = this.colById.has(saved.sort) ? saved.sort : o.defaultSort[0];
    this.sortDir = saved.dir === 1 || saved.dir === -1 ? saved.dir : o.defaultSort[1];
    this.query = typeof saved.filter === 'string' ? saved.filter : '';
    this.mode = 'all';
    if (this.showEl && typeof saved.show === 'string' &&
        Array.from(this.showEl.options).some((opt) => opt.value === saved.show)) {
      this.mode = saved.show;
    }
    this.filterEl.value = this.query;
    if (this.showEl) this.showEl.value = this.mode;

    this.buildHeader();
    this.buildMore(parts.moreEl);

    let filterTimer = 0;
    this.filterEl.addEventListener('input', () => {
      clearTimeout(filterTimer);
      filterTimer = setTimeout(() => this.setQuery(this.filterEl.value, this.mode), 120);
    });
    this.filterEl.addEventListener('keydown', (ev) => {
      if (ev.key === 'Enter') {
        clearTimeout(filterTimer);
        this.setQuery(this.filterEl.value, this.mode);
      }
    });
    if (this.showEl) this.showEl.addEventListener('change', () => this.setQuery(this.query, this.showEl.value));
    if (phone && phone.addEventListener) phone.addEventListener('change', () => this.render());
    this.tbody.addEventListener('click', (ev) => {
      const b = ev.target.closest('button[data-jump]');
      if (b && this.tbody.contains(b) && this.onJump) this.onJump(b.dataset.jump, b.dataset.query || '');
    });
  }

  save() {
    ui.tables[this.name] = { sort: this.sortId, dir: this.sortDir, filter: this.query, show: this.mode };
    saveUi();
  }

  setQuery(q, mode) {
    if (q === this.query && mode === this.mode) return;
    this.query = q;
    this.mode = mode;
    if (this.filterEl.value !== q) this.filterEl.value = q;
    if (this.showEl && this.showEl.value !== mode) this.showEl.value = mode;
    this.page = 0;
    this.save();
    this.render();
  }

  buildHeader() {
    const tr = this.table.tHead.rows[0];
    for (const col of this.columns) {
      const th = document.createElement('th');
      th.scope = 'col';
      th.className = ((col.cls || '').replace(/\bmono\b/, '') + (col.numeric ? ' num' : '')).trim();
      if (col.w) th.style.width = col.w + 'px';
      if (col.title) th.title = col.title;
      const b = h('button', 'sort');
      b.type = 'button';
      b.append(h('span', 'label', col.label), h('span', 'sort-ind'));
      b.querySelector('.sort-ind').setAttribute('aria-hidden', 'true');
      b.addEventListener('click', () => this.sortBy(col.id));
      th.append(b);
      col.th = th;
      tr.append(th);
    }
    this.fitted = false;
    this.setMinWidth();
    this.updateSortHeaders();
    this.fitHeader();
  }

  setMinWidth() {
    const minWidth = this.columns.reduce((a, c) => a + (c.w || c.minW || 120), 0);
    this.table.style.minWidth = minWidth + 'px';
  }

  // Widen a column whose header label does not fit (fonts differ between
  // machines). Needs layout, so it runs once the panel is visible.
  fitHeader() {
    if (this.fitted || this.panel.hidden) return;
    this.fitted = true;
    // Every width is read before any is written: a write between reads
    // would make the browser lay the page out again for each column.
    const needs = this.columns.map((col) => {
      const b = col.th.firstChild;
      const label = b.firstChild;
      const ind = b.lastChild;
      const cs = getComputedStyle(b);
      return Math.ceil(label.scrollWidth + ind.offsetWidth + parseFloat(cs.columnGap || '0') +
        parseFloat(cs.paddingLeft) + parseFloat(cs.paddingRight)) + 2;
    });
    this.columns.forEach((col, i) => {
      const need = needs[i];
      if (col.w && need > col.w) {
        col.w = need;
        col.th.style.width = need + 'px';
      } else if (!col.w && need > (col.minW || 0)) {
        col.minW = need;
      }
    });
    this.setMinWidth();
  }

  updateSortHeaders() {
    for (const col of this.columns) {
      const on = col.id === this.sortId;
      if (on) col.th.setAttribute('aria-sort', this.sortDir > 0 ? 'ascending' : 'descending');
      else col.th.removeAttribute('aria-sort');
      toggleClass(col.th, 'sorted', on);
    }
  }

  sortBy(id) {
    const col = this.colById.get(id);
    if (!col) return;
    if (this.sortId === id) this.sortDir = -this.sortDir;
    else {
      this.sortId = id;
      this.sortDir = col.firstDir || (col.numeric ? -1 : 1);
    }
    this.page = 0;
    this.save();
    this.updateSortHeaders();
    this.render();
  }

  buildMore(more) {
    this.moreText = h('span', 'more-text');
    const nav = h('span', 'pager');
    const mk = (label, aria, fn) => {
      const b = h('button', 'btn', label);
      b.type = 'button';
      b.setAttribute('aria-label', aria);
      b.addEventListener('click', () => {
        this.page = fn(this.page, this.pages);
        this.render();
        this.wrap.scrollTop = 0;
      });
      nav.append(b);
      return b;
    };
    this.firstBtn = mk('« First', 'first page', () => 0);
    this.prevBtn = mk('‹ Previous', 'previous page', (p) => Math.max(0, p - 1));
    this.nextBtn = mk('Next ›', 'next page', (p, n) => Math.min(n - 1, p + 1));
    this.lastBtn = mk('Last »', 'last page', (p, n) => n - 1);
    more.append(this.moreText, nav);
    this.moreEl = more;
    this.pages = 1;
    more.hidden = true;
  }

  setItems(items, ctx) {
    this.items = items;
    this.ctx = ctx;
    this.render();
  }

  matches(it, tokens) {
    if (this.mode !== 'all' && this.show && !this.show(it, this.mode, this.ctx)) return false;
    if (tokens.length === 0) return true;
    const hay = this.haystack(it, this.ctx).toLowerCase();
    for (const t of tokens) if (!hay.includes(t)) return false;
    return true;
  }

  // The panel became visible: fit its header and draw what changed meanwhile.
  reveal() {
    this.fitHeader();
    if (this.stale) this.render();
  }

  render() {
    if (this.panel.hidden) {
      this.stale = true;
      return;
    }
    this.stale = false;
    const t0 = performance.now();
    const ctx = this.ctx;
    const tokens = this.query.toLowerCase().split(/\s+/).filter(Boolean);
    let list = this.items;
    if (tokens.length || this.mode !== 'all') list = list.filter((it) => this.matches(it, tokens));

    const col = this.colById.get(this.sortId);
    const dir = this.sortDir;
    const keyed = new Array(list.length);
    for (let i = 0; i < list.length; i++) {
      const it = list[i];
      keyed[i] = { it: it, k: col.sort(it, ctx), id: str(this.keyOf(it)) };
    }
    keyed.sort((a, b) => {
      if (a.k < b.k) return -dir;
      if (a.k > b.k) return dir;
      return a.id < b.id ? -1 : a.id > b.id ? 1 : 0;
    });

    // Keep focus where it is even if its row moves.
    const focused = document.activeElement;
    const gen = ++this.gen;
    const perPage = pageRows();
    // Across the phone width the page keeps its first row in view.
    if (this.perPage && perPage !== this.perPage) this.page = Math.floor((this.page * this.perPage) / perPage);
    this.perPage = perPage;
    this.pages = Math.max(1, Math.ceil(keyed.length / perPage));
    if (this.page > this.pages - 1) this.page = this.pages - 1;
    const start = this.page * perPage;
    const end = Math.min(keyed.length, start + perPage);
    const tbody = this.tbody;
    let cursor = tbody.firstChild;
    let placed = 0;
    for (let i = start; i < end; i++) {
      const { it, id } = keyed[i];
      let row = this.rows.get(id);
      if (row && row.gen === gen) continue; // duplicate key: show it once
      if (!row) {
        row = this.createRow(id);
        this.rows.set(id, row);
      }
      row.gen = gen;
      this.updateRow(row, it, ctx);
      if (row.tr === cursor) cursor = cursor.nextSibling;
      else tbody.insertBefore(row.tr, cursor);
      placed++;
    }
    while (cursor) {
      const next = cursor.nextSibling;
      tbody.removeChild(cursor);
      cursor = next;
    }
    for (const [id, row] of this.rows) if (row.gen !== gen) this.rows.delete(id);
    if (focused && focused !== document.activeElement && focused.isConnected && focused.focus) {
      focused.focus({ preventScroll: true });
    }

    const total = this.items.length;
    const matched = keyed.length;
    this.emptyEl.hidden = placed > 0;
    if (placed === 0) {
      setText(this.emptyEl, total === 0 ? this.emptyText : 'No ' + this.noun + ' match the filter.');
    }
    this.moreEl.hidden = this.pages <= 1;
    if (this.pages > 1) {
      setText(this.moreText, NF.format(start + 1) + '–' + NF.format(end) + ' of ' + NF.format(matched) + ' ' +
        this.noun + ' · page ' + (this.page + 1) + ' of ' + this.pages);
      const atStart = this.page === 0;
      const atEnd = this.page >= this.pages - 1;
      if (this.firstBtn.disabled !== atStart) this.firstBtn.disabled = this.prevBtn.disabled = atStart;
      if (this.lastBtn.disabled !== atEnd) this.lastBtn.disabled = this.nextBtn.disabled = atEnd;
    }
    setText(this.infoEl, (matched === total
      ? NF.format(total) + ' ' + this.noun
      : NF.format(matched) + ' of ' + NF.format(total) + ' ' + this.noun) + this.infoSuffix);
    this.lastRenderMs = performance.now() - t0;
  }

  createRow(id) {
    const tr = document.createElement('tr');
    tr.setAttribute('data-' + this.keyAttr, id);
    const cells = [];
    for (const col of this.columns) {
      const c = document.createElement(col.rowHeader ? 'th' : 'td');
      if (col.rowHeader) c.scope = 'row';
      c.dataset.col = col.id;
      const cls = (col.cls || '') + (col.numeric ? ' num' : '');
      if (cls) c.className = cls.trim();
      if (col.init) col.init(c);
      tr.append(c);
      cells.push(c);
    }
    return { tr: tr, cells: cells, sigs: new Array(this.columns.length), cls: '', gen: 0 };
  }

  updateRow(row, it, ctx) {
    const cols = this.columns;
    for (let i = 0; i < cols.length; i++) {
      const col = cols[i];
      const v = col.sig ? col.sig(it, ctx) : col.text(it, ctx);
      if (v !== row.sigs[i]) {
        row.sigs[i] = v;
        if (col.render) col.render(row.cells[i], it, ctx);
        else row.cells[i].textContent = v;
      }
    }
    if (this.rowClass) {
      const c = this.rowClass(it, ctx);
      if (c !== row.cls) {
        row.cls = c;
        row.tr.className = c;
      }
    }
  }
}
