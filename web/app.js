// yadcc scheduler dashboard. Plain JavaScript, no dependencies.
//
// Polls api/v1/overview every 2 s and api/v1/history every 5 s and updates the
// page in place: table rows are keyed (servant location, grant id, environment
// digest) and reused, a cell is written only when what it shows changed, and
// the user's sort, filter, scroll position and focus survive every refresh.
// All data goes into the page through textContent / attributes, never HTML.
// 64-bit values (ids, byte counts, everAssigned) stay strings or BigInt.
'use strict';

(function () {
  const OVERVIEW_URL = 'api/v1/overview';
  const HISTORY_URL = 'api/v1/history';
  const OVERVIEW_EVERY_MS = 2000;
  const HISTORY_EVERY_MS = 5000;
  const FETCH_TIMEOUT_MS = 10000;
  const PAGE_ROWS = 100;
  const STORE_KEY = 'yadcc-dashboard-v1';
  const SVG_NS = 'http://www.w3.org/2000/svg';

  // ---------------------------------------------------------------- helpers

  const NF = new Intl.NumberFormat('en-US');
  const NF1 = new Intl.NumberFormat('en-US', { minimumFractionDigits: 1, maximumFractionDigits: 1 });
  const NF2 = new Intl.NumberFormat('en-US', { maximumFractionDigits: 2 });
  const CLOCK = new Intl.DateTimeFormat(undefined, {
    hour: '2-digit', minute: '2-digit', second: '2-digit', hourCycle: 'h23',
  });
  const CLOCK_HM = new Intl.DateTimeFormat(undefined, { hour: '2-digit', minute: '2-digit', hourCycle: 'h23' });

  const isNum = (v) => typeof v === 'number' && Number.isFinite(v);
  const num = (v) => (isNum(v) ? v : 0);
  const str = (v) => (v === null || v === undefined ? '' : String(v));
  const objs = (v) => (Array.isArray(v) ? v.filter((x) => x !== null && typeof x === 'object') : []);
  const fmtInt = (v) => (isNum(v) ? NF.format(v) : '—');
  const fmtClock = (ms) => CLOCK.format(new Date(ms));

  function h(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    return e;
  }

  function setText(e, t) {
    if (e.textContent !== t) e.textContent = t;
  }

  function toggleClass(e, cls, on) {
    if (e.classList.contains(cls) !== on) e.classList.toggle(cls, on);
  }

  // Non-negative decimal integers that may exceed 2^53 arrive as strings.
  const DECIMAL = /^\d+$/;
  function big(v) {
    if (typeof v === 'string' && DECIMAL.test(v)) return BigInt(v);
    if (typeof v === 'number' && Number.isSafeInteger(v) && v >= 0) return BigInt(v);
    return null;
  }
  // Sort key of a decimal string: zero-padded so plain string order is numeric order.
  function decKey(v) {
    const s = str(v);
    if (!DECIMAL.test(s)) return '~' + s;
    return s.replace(/^0+(?=\d)/, '').padStart(24, '0');
  }
  // Thousands separators on a decimal string, without going through Number.
  function fmtBig(v) {
    const s = str(v);
    if (!DECIMAL.test(s)) return s || '—';
    return s.replace(/^0+(?=\d)/, '').replace(/\B(?=(\d{3})+(?!\d))/g, ',');
  }
  const BYTE_UNITS = ['B', 'KiB', 'MiB', 'GiB', 'TiB', 'PiB', 'EiB'];
  function fmtBytes(v) {
    const b = big(v);
    if (b === null) return str(v) || '—';
    let unit = 0;
    let div = 1n;
    while (unit < BYTE_UNITS.length - 1 && b >= div * 1024n) {
      div *= 1024n;
      unit += 1;
    }
    if (unit === 0) return b.toString() + ' B';
    const tenths = (b * 10n + div / 2n) / div;
    const whole = tenths / 10n;
    if (whole >= 100n) return whole.toString() + ' ' + BYTE_UNITS[unit];
    return whole.toString() + '.' + (tenths % 10n).toString() + ' ' + BYTE_UNITS[unit];
  }
  // a / b for BigInt-able values, as a number in [0, 1]; null when unknown.
  function fraction(a, b) {
    const x = big(a);
    const y = big(b);
    if (x === null || y === null || y === 0n) return null;
    const r = Number((x * 10000n) / y) / 10000;
    return Math.max(0, Math.min(1, r));
  }

  function fmtDuration(ms) {
    if (!isNum(ms)) return '—';
    const neg = ms < 0;
    let v = Math.abs(ms);
    let out;
    if (v < 10000) out = NF1.format(v / 1000) + ' s';
    else if (v < 60000) out = Math.floor(v / 1000) + ' s';
    else {
      v = Math.floor(v / 1000);
      const d = Math.floor(v / 86400);
      const hr = Math.floor((v % 86400) / 3600);
      const m = Math.floor((v % 3600) / 60);
      const s = v % 60;
      if (d > 0) out = d + 'd ' + hr + 'h';
      else if (hr > 0) out = hr + 'h ' + m + 'm';
      else out = m + 'm ' + s + 's';
    }
    return neg ? '-' + out : out;
  }

  // "10.0.0.2:8335" -> zero-padded key so 10.0.0.10 sorts after 10.0.0.9.
  const locKeyCache = new Map();
  function locKey(v) {
    const s = str(v);
    let k = locKeyCache.get(s);
    if (k === undefined) {
      k = s.toLowerCase().replace(/\d+/g, (d) => d.padStart(6, '0'));
      if (locKeyCache.size > 20000) locKeyCache.clear();
      locKeyCache.set(s, k);
    }
    return k;
  }

  const shortDigest = (d) => (d.length > 16 ? d.slice(0, 12) + '…' : d);

  // "10.0.0.2:8335" -> "10.0.0.2", "[::1]:8335" -> "::1": the key of peerProtocols.
  function ipOf(location) {
    const s = str(location);
    const v6 = /^\[([^\]]+)\]:\d+$/.exec(s);
    if (v6) return v6[1];
    const colon = s.lastIndexOf(':');
    return colon > 0 && s.indexOf(':') === colon ? s.slice(0, colon) : s;
  }
  // The protocol a machine's daemon speaks, when the scheduler reports it.
  const protocolOf = (ctx, ip) => (ctx.protocols && ctx.protocols.get(ip)) || '';
  const protocolColumn = (ipOfItem) => ({
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

  // What a servant can do right now, in words.
  function servantState(s) {
    if (s.leaving) return { kind: 'leaving', label: 'Leaving', detail: 'sent its last heartbeat' };
    const r = s.notAcceptingReason;
    if (r && typeof r === 'object') return { kind: 'off', label: reasonLabel(r), detail: str(r.description) };
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
  // The reference scheduler's default --servant_min_memory_for_accepting_new_task.
  const LOW_MEMORY_BYTES = 10n * 1024n * 1024n * 1024n;
  const STATE_RANK = { ok: 0, full: 1, off: 2, leaving: 3 };

  // ------------------------------------------------------ persisted UI state

  const ui = (function load() {
    let saved = null;
    try {
      saved = JSON.parse(localStorage.getItem(STORE_KEY) || 'null');
    } catch (e) {
      saved = null;
    }
    if (!saved || typeof saved !== 'object') saved = {};
    if (!saved.tables || typeof saved.tables !== 'object') saved.tables = {};
    return saved;
  })();
  let saveTimer = 0;
  function saveUi() {
    clearTimeout(saveTimer);
    saveTimer = setTimeout(() => {
      try {
        localStorage.setItem(STORE_KEY, JSON.stringify(ui));
      } catch (e) { /* private mode or quota: not important */ }
    }, 200);
  }

  // ------------------------------------------------------------ the tables

  // A table whose rows are keyed and reused across refreshes. Columns give a
  // sort key, and either `text` (the cell's text) or `sig` + `render` (a
  // signature of what the cell shows, and how to show it); a cell is touched
  // only when that string changes.
  class Table {
    constructor(o) {
      Object.assign(this, o);
      this.panel = document.getElementById(o.name);
      this.table = this.panel.querySelector('table');
      this.tbody = this.table.tBodies[0];
      this.emptyEl = this.panel.querySelector('.empty');
      this.filterEl = document.getElementById(o.name + '-filter');
      this.showEl = document.getElementById(o.name + '-show');
      this.infoEl = document.getElementById(o.name + '-info');
      this.colById = new Map(this.columns.map((c) => [c.id, c]));
      this.rows = new Map();
      this.items = [];
      this.ctx = {};
      this.gen = 0;
      this.page = 0;
      this.lastRenderMs = 0;
      this.infoSuffix = '';

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
      this.buildMore();

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
      this.tbody.addEventListener('click', (ev) => {
        const b = ev.target.closest('button[data-jump]');
        if (b && this.tbody.contains(b)) jumpTo(b.dataset.jump, b.dataset.query || '');
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
      for (const col of this.columns) {
        const b = col.th.firstChild;
        const label = b.firstChild;
        const ind = b.lastChild;
        const cs = getComputedStyle(b);
        const need = Math.ceil(label.scrollWidth + ind.offsetWidth + parseFloat(cs.columnGap || '0') +
          parseFloat(cs.paddingLeft) + parseFloat(cs.paddingRight)) + 2;
        if (col.w && need > col.w) {
          col.w = need;
          col.th.style.width = need + 'px';
        } else if (!col.w && need > (col.minW || 0)) {
          col.minW = need;
        }
      }
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

    // At most PAGE_ROWS rows are in the DOM: a table of thousands of rows costs
    // the browser too much layout on every refresh.
    buildMore() {
      const more = this.panel.querySelector('.more');
      this.moreText = h('span', 'more-text');
      const nav = h('span', 'pager');
      const mk = (label, aria, fn) => {
        const b = h('button', 'btn', label);
        b.type = 'button';
        b.setAttribute('aria-label', aria);
        b.addEventListener('click', () => {
          this.page = fn(this.page, this.pages);
          this.render();
          this.panel.querySelector('.table-wrap').scrollTop = 0;
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

    render() {
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
      this.pages = Math.max(1, Math.ceil(keyed.length / PAGE_ROWS));
      if (this.page > this.pages - 1) this.page = this.pages - 1;
      const start = this.page * PAGE_ROWS;
      const end = Math.min(keyed.length, start + PAGE_ROWS);
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

  // Cell builders shared by the tables.

  function meterInit(c) {
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
  function meterSet(c, frac, label, title) {
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

  function twoLineInit(c) {
    const a = h('span', 'line1');
    const b = h('span', 'line2');
    c.append(a, b);
    c._a = a;
    c._b = b;
  }

  const numCol = (id, label, get, extra) => Object.assign({
    id: id, label: label, numeric: true, w: 74,
    sort: (it) => num(get(it)),
    text: (it) => fmtInt(get(it)),
  }, extra || {});

  // ---------------------------------------------------------- servants

  const servantsTable = new Table({
    name: 'servants',
    keyAttr: 'location',
    noun: 'servants',
    emptyText: 'No servant has sent a heartbeat yet.',
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
        case 'not-accepting': return kind === 'off' || kind === 'leaving';
        case 'busy': return kind === 'full';
        case 'dedicated': return s.priority === 'DEDICATED';
        case 'user': return s.priority !== 'DEDICATED';
        case 'leaving': return !!s.leaving;
        default: return true;
      }
    },
    rowClass: (s) => 'st-' + servantState(s).kind,
    columns: [
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
        title: 'Available memory; the bar shows memory in use',
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
            (avail === null ? '' : ' (' + fmtBytes((total - (avail > total ? total : avail)).toString()) + ' in use)'));
        },
      },
      {
        id: 'slots', label: 'Slots', numeric: true, w: 80,
        title: 'Task slots free right now / most tasks it takes (0 when not accepting)',
        sort: (s) => num(s.capacityAvailable) * 1e6 + num(s.maxTasks),
        sig: (s) => num(s.capacityAvailable) + '/' + num(s.maxTasks),
        init: (c) => {
          c._free = h('span', 'free');
          c._max = h('span', 'of');
          c.append(c._free, c._max);
        },
        render: (c, s) => {
          c._free.textContent = fmtInt(num(s.capacityAvailable));
          c._max.textContent = ' / ' + fmtInt(num(s.maxTasks));
          toggleClass(c._free, 'zero', num(s.capacityAvailable) === 0);
          c.title = num(s.capacityAvailable) + ' free of ' + num(s.maxTasks) + ' slots';
        },
      },
      {
        id: 'running', label: 'Running', numeric: true, w: 82, title: 'Tasks granted there; click to see its grants',
        sort: (s) => num(s.running),
        sig: (s) => num(s.running) + '|' + str(s.location),
        init: jumpInit,
        render: (c, s) => jumpSet(c, fmtInt(num(s.running)), 'grants', num(s.running) + num(s.zombies) > 0 ? str(s.location) : '',
          'show the grants on ' + str(s.location)),
      },
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
    ],
  });

  // ------------------------------------------------------------ grants

  const grantFlags = (g) => (g.zombie ? 'z' : '') + (g.prefetch ? 'p' : '') + (g.adopted ? 'a' : '');

  const grantsTable = new Table({
    name: 'grants',
    keyAttr: 'grant-id',
    noun: 'grants',
    emptyText: 'No grant is outstanding.',
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
    columns: [
      {
        id: 'id', label: 'Grant id', rowHeader: true, cls: 'c-id mono', w: 200,
        sort: (g) => decKey(g.id),
        text: (g) => str(g.id),
      },
      {
        id: 'servant', label: 'Servant', cls: 'c-loc', w: 170,
        sort: (g) => locKey(g.servant),
        sig: (g) => str(g.servant),
        init: jumpInit,
        render: (c, g) => jumpSet(c, str(g.servant) || '—', 'servants', str(g.servant), 'show servant ' + str(g.servant)),
      },
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
    ],
  });

  // ------------------------------------------------------ environments

  const envTable = new Table({
    name: 'environments',
    keyAttr: 'digest',
    noun: 'environments',
    emptyText: 'No servant offers a compiler environment.',
    keyOf: (e) => e.digest,
    defaultSort: ['servants', -1],
    haystack: (e) => str(e.digest),
    columns: [
      {
        id: 'digest', label: 'Compiler digest', rowHeader: true, cls: 'c-digest-full mono', minW: 260,
        sort: (e) => str(e.digest),
        text: (e) => str(e.digest),
      },
      {
        id: 'servants', label: 'Servants', numeric: true, w: 96,
        sort: (e) => num(e.servants),
        sig: (e) => num(e.servants) + '|' + str(e.digest),
        init: jumpInit,
        render: (c, e) => jumpSet(c, fmtInt(num(e.servants)), 'servants', num(e.servants) > 0 ? str(e.digest) : '',
          'show the servants offering this environment'),
      },
      numCol('capacityAvailable', 'Free slots', (e) => e.capacityAvailable, { w: 96 }),
      {
        id: 'running', label: 'Running', numeric: true, w: 90,
        sort: (e) => num(e.running),
        sig: (e) => num(e.running) + '|' + str(e.digest),
        init: jumpInit,
        render: (c, e) => jumpSet(c, fmtInt(num(e.running)), 'grants', num(e.running) > 0 ? str(e.digest) : '',
          'show the grants for this environment'),
      },
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
    ],
  });

  // ------------------------------------------------------- requesters

  // Machines whose delegates ask for grants, as icemon lists its clients.
  // Rates come from successive counters (`grantsTotal`, `refusedTotal`,
  // 64-bit decimal strings), measured between two overviews.
  const requestersTable = new Table({
    name: 'requesters',
    keyAttr: 'requester',
    noun: 'machines',
    emptyText: 'No machine holds or waits for a grant.',
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
    columns: [
      {
        id: 'ip', label: 'Machine', rowHeader: true, cls: 'c-loc', w: 170,
        sort: (r) => locKey(r.ip),
        sig: (r) => str(r.ip),
        init: jumpInit,
        render: (c, r) => jumpSet(c, str(r.ip), 'grants', str(r.ip), 'show the grants held by ' + str(r.ip)),
      },
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
    ],
  });

  // Previous counters per machine: { grants: BigInt, refused: BigInt, atMs }.
  const requesterCounters = new Map();
  function perSecond(now, before, atMs, beforeMs) {
    if (now === null || before === null || !(atMs > beforeMs) || now < before) return null;
    return Number(now - before) / ((atMs - beforeMs) / 1000);
  }
  // `requesters` as the scheduler reports it; without it (an older
  // scheduler), what the grants tell: who holds how many.
  function requesterRows(d, grants, atMs) {
    if (!Array.isArray(d.requesters)) {
      const held = new Map();
      for (const g of grants) {
        const ip = str(g.requester);
        if (ip) held.set(ip, (held.get(ip) || 0) + 1);
      }
      requestersTable.infoSuffix = ' · from grants (this scheduler reports no requester counters)';
      return Array.from(held, ([ip, n]) => ({ ip: ip, grantsHeld: n, waiting: null, rate: null }));
    }
    requestersTable.infoSuffix = '';
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
    return rows;
  }

  // Numbers that need attention get a warning colour.
  for (const t of [servantsTable, grantsTable, envTable, requestersTable]) {
    for (const col of t.columns) {
      if (col.cls && col.cls.includes('c-warn-if') && !col.render) {
        const get = col.text;
        col.sig = (it, ctx) => get(it, ctx);
        col.render = (c, it, ctx) => {
          const v = get(it, ctx);
          c.textContent = v;
          toggleClass(c, 'warn', v !== '0' && v !== '—');
        };
      }
    }
  }

  const tables = { servants: servantsTable, grants: grantsTable, environments: envTable, requesters: requestersTable };

  // -------------------------------------------------------------- tabs

  const tabs = Array.from(document.querySelectorAll('[role="tab"]'));
  function selectTab(name, focus) {
    for (const tab of tabs) {
      const on = tab.getAttribute('aria-controls') === name;
      tab.setAttribute('aria-selected', on ? 'true' : 'false');
      tab.tabIndex = on ? 0 : -1;
      document.getElementById(tab.getAttribute('aria-controls')).hidden = !on;
      if (on && focus) tab.focus();
    }
    if (tables[name]) tables[name].fitHeader();
    ui.tab = name;
    saveUi();
    if (location.hash !== '#tab=' + name && history.replaceState) history.replaceState(null, '', '#tab=' + name);
  }
  tabs.forEach((tab, i) => {
    tab.addEventListener('click', () => selectTab(tab.getAttribute('aria-controls'), false));
    tab.addEventListener('keydown', (ev) => {
      let j = -1;
      if (ev.key === 'ArrowRight') j = (i + 1) % tabs.length;
      else if (ev.key === 'ArrowLeft') j = (i - 1 + tabs.length) % tabs.length;
      else if (ev.key === 'Home') j = 0;
      else if (ev.key === 'End') j = tabs.length - 1;
      if (j >= 0) {
        ev.preventDefault();
        selectTab(tabs[j].getAttribute('aria-controls'), true);
      }
    });
  });
  const hashTab = /^#tab=(\w+)$/.exec(location.hash);
  selectTab(hashTab && tables[hashTab[1]] ? hashTab[1] : tables[ui.tab] ? ui.tab : 'servants', false);
  window.addEventListener('hashchange', () => {
    const m = /^#tab=(\w+)$/.exec(location.hash);
    if (m && tables[m[1]]) selectTab(m[1], false);
  });

  function jumpTo(name, query) {
    const t = tables[name];
    if (!t) return;
    t.setQuery(query, 'all');
    selectTab(name, false);
    t.filterEl.focus({ preventScroll: true });
    const r = t.panel.closest('.tables').getBoundingClientRect();
    if (r.top < 0 || r.top > window.innerHeight * 0.6) t.panel.closest('.tables').scrollIntoView({ block: 'start' });
  }

  // ----------------------------------------------------------- summary

  const METRICS = ['servantsUp', 'servantsAccepting', 'capacity', 'running', 'capacityAvailable',
    'capacityUnavailable', 'waiters', 'zombies', 'grants', 'grantsPerSecond'];
  const metricEls = {};
  const subEls = {};
  for (const m of METRICS) {
    metricEls[m] = document.querySelector('#summary [data-metric="' + m + '"]');
    subEls[m] = document.querySelector('#summary [data-sub="' + m + '"]');
  }

  function renderSummary(totals, servants, grants) {
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

  // ------------------------------------------------------------- chart

  const chart = (function () {
    const box = document.getElementById('chart');
    const M = { l: 46, r: 14, t: 10, gap: 26, b: 22 };
    const TOP_H = 190;
    const BOT_H = 64;
    const H = M.t + TOP_H + M.gap + BOT_H + M.b;
    const svg = document.createElementNS(SVG_NS, 'svg');
    svg.setAttribute('class', 'chart-svg');
    svg.setAttribute('role', 'img');
    svg.setAttribute('height', String(H));
    const title = document.createElementNS(SVG_NS, 'title');
    svg.append(title);
    const mk = (tag, cls, parent) => {
      const e = document.createElementNS(SVG_NS, tag);
      if (cls) e.setAttribute('class', cls);
      (parent || svg).append(e);
      return e;
    };
    const grid = mk('g', 'grid');
    const capArea = mk('path', 'area s-capacity');
    const runArea = mk('path', 'area s-running');
    const capLine = mk('path', 'line s-capacity');
    const runLine = mk('path', 'line s-running');
    const waitLine = mk('path', 'line s-waiters');
    const gpsArea = mk('path', 'area s-gps');
    const gpsLine = mk('path', 'line s-gps');
    const cursor = mk('line', 'cursor');
    const panelLabels = mk('g', 'panel-labels');
    const noData = mk('text', 'nodata');
    cursor.style.display = 'none';
    const tip = h('div', 'tip');
    tip.hidden = true;
    tip.setAttribute('aria-hidden', 'true');
    box.append(svg, tip);

    let samples = [];
    let intervalS = 1;
    let width = 0;
    let scale = null; // { x0, x1, px(x), ... } of the last draw
    let hoverX = null;
    const legend = {};
    for (const k of ['capacity', 'running', 'waiters', 'grantsPerSecond']) legend[k] = document.querySelector('[data-legend="' + k + '"]');

    // Time between axis labels: the smallest round step giving at most `count`.
    const TIME_STEPS_S = [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600];
    function timeStep(spanMs, count) {
      for (const s of TIME_STEPS_S) if (spanMs / (s * 1000) <= count) return s * 1000;
      return 3600 * 1000;
    }

    const RANGES_S = [300, 900, 3600];
    const RANGE_NAMES = { 300: 'Last 5 minutes', 900: 'Last 15 minutes', 3600: 'Last hour' };
    // Two samples' worth, so a single sample is a point at the right, not a division by zero.
    const MIN_SPAN_MS = 2000;
    let rangeS = RANGES_S.includes(ui.rangeSeconds) ? ui.rangeSeconds : 3600;
    const heading = document.getElementById('history-title');
    const rangeButtons = Array.from(document.querySelectorAll('#range button[data-range]'));
    function showRange() {
      for (const b of rangeButtons) b.setAttribute('aria-pressed', Number(b.dataset.range) === rangeS ? 'true' : 'false');
    }
    for (const b of rangeButtons) {
      b.addEventListener('click', () => {
        rangeS = Number(b.dataset.range);
        ui.rangeSeconds = rangeS;
        saveUi();
        showRange();
        draw();
      });
    }
    showRange();
    function setTitle(x0, x1) {
      const n = samples.length;
      const full = n && samples[0].atMs <= x1 - rangeS * 1000;
      setText(heading, !n ? 'History' : full ? RANGE_NAMES[rangeS] : 'Since ' + fmtClock(samples[0].atMs) +
        ' (' + fmtDuration(x1 - samples[0].atMs) + ')');
    }

    function niceStep(max, count, integer) {
      if (!(max > 0)) return 1;
      const raw = max / count;
      const p = Math.pow(10, Math.floor(Math.log10(raw)));
      const f = raw / p;
      let step = (f <= 1 ? 1 : f <= 2 ? 2 : f <= 2.5 ? 2.5 : f <= 5 ? 5 : 10) * p;
      if (integer) step = Math.max(1, Math.round(step));
      return step;
    }
    const fmtTick = (v) => (Math.abs(v) >= 10000 ? NF.format(Math.round(v / 1000)) + 'k' : NF2.format(v));

    function text(parent, cls, x, y, t, anchor) {
      const e = mk('text', cls, parent);
      e.setAttribute('x', x.toFixed(1));
      e.setAttribute('y', y.toFixed(1));
      if (anchor) e.setAttribute('text-anchor', anchor);
      e.textContent = t;
      return e;
    }
    function hline(parent, cls, x1, x2, y) {
      const e = mk('line', cls, parent);
      e.setAttribute('x1', x1);
      e.setAttribute('x2', x2);
      e.setAttribute('y1', y.toFixed(1));
      e.setAttribute('y2', y.toFixed(1));
    }

    function draw() {
      width = Math.max(320, Math.floor(box.clientWidth));
      svg.setAttribute('width', String(width));
      svg.setAttribute('viewBox', '0 0 ' + width + ' ' + H);
      const plotW = width - M.l - M.r;
      const topY0 = M.t + TOP_H; // baseline of the top panel
      const botY0 = M.t + TOP_H + M.gap + BOT_H;
      const n = samples.length;
      const last = n ? samples[n - 1].atMs : Date.now();
      const x1 = last;
      // The chosen range, or less: a fresh scheduler's first minutes fill
      // the width instead of a sliver at the right edge of an empty hour.
      const first = n ? samples[0].atMs : last;
      const x0 = Math.min(last - MIN_SPAN_MS, Math.max(first, last - rangeS * 1000));
      box.dataset.rangeSeconds = String(rangeS);
      box.dataset.spanSeconds = String(Math.round((x1 - x0) / 1000));
      setTitle(x0, x1);
      const px = (t) => M.l + ((t - x0) / (x1 - x0)) * plotW;

      let topMax = 0;
      let gpsMax = 0;
      for (const s of samples) {
        if (s.atMs < x0) continue;
        topMax = Math.max(topMax, s.capacity, s.running, s.waiters);
        gpsMax = Math.max(gpsMax, s.grantsPerSecond);
      }
      const topStep = niceStep(topMax || 4, 4, true);
      const topTop = Math.max(topStep, Math.ceil(topMax / topStep) * topStep);
      const gpsStep = niceStep(gpsMax || 1, 2, false);
      const gpsTop = Math.max(gpsStep, Math.ceil(gpsMax / gpsStep) * gpsStep);
      const yTop = (v) => topY0 - (v / topTop) * TOP_H;
      const yBot = (v) => botY0 - (v / gpsTop) * BOT_H;

      // Grid and axes (a few dozen nodes, rebuilt per draw).
      grid.replaceChildren();
      for (let v = 0; v <= topTop + 1e-9; v += topStep) {
        hline(grid, v === 0 ? 'axis' : 'gridline', M.l, width - M.r, yTop(v));
        text(grid, 'tick', M.l - 6, yTop(v) + 4, fmtTick(v), 'end');
      }
      for (let v = 0; v <= gpsTop + 1e-9; v += gpsStep) {
        hline(grid, v === 0 ? 'axis' : 'gridline', M.l, width - M.r, yBot(v));
        text(grid, 'tick', M.l - 6, yBot(v) + 4, fmtTick(v), 'end');
      }
      const tickMs = timeStep(x1 - x0, Math.max(2, Math.floor(plotW / 90)));
      const tickFmt = tickMs < 60000 ? CLOCK : CLOCK_HM;
      const firstTick = Math.ceil(x0 / tickMs) * tickMs;
      for (let t = firstTick; t <= x1; t += tickMs) {
        const x = px(t);
        const v = mk('line', 'gridline vtick', grid);
        v.setAttribute('x1', x.toFixed(1));
        v.setAttribute('x2', x.toFixed(1));
        v.setAttribute('y1', String(M.t));
        v.setAttribute('y2', String(botY0));
        text(grid, 'tick', x, botY0 + 16, tickFmt.format(new Date(t)), 'middle');
      }
      panelLabels.replaceChildren();
      text(panelLabels, 'plabel', M.l + 6, M.t + 12, 'tasks');
      text(panelLabels, 'plabel', M.l + 6, topY0 + M.gap + 12, 'grants / s');

      // Series: one point per half pixel (the peak in it), broken at gaps.
      const maxGap = Math.max(5000, 3 * intervalS * 1000);
      const segs = [];
      let seg = [];
      let cur = null;
      let prevAt = null;
      for (const s of samples) {
        if (s.atMs < x0) continue;
        if (prevAt !== null && s.atMs - prevAt > maxGap) {
          if (cur) seg.push(cur);
          if (seg.length) segs.push(seg);
          seg = [];
          cur = null;
        }
        prevAt = s.atMs;
        const x = Math.round(px(s.atMs) * 2) / 2;
        if (cur && cur.x === x) {
          cur.c = Math.max(cur.c, s.capacity);
          cur.r = Math.max(cur.r, s.running);
          cur.w = Math.max(cur.w, s.waiters);
          cur.g = Math.max(cur.g, s.grantsPerSecond);
        } else {
          if (cur) seg.push(cur);
          cur = { x: x, c: s.capacity, r: s.running, w: s.waiters, g: s.grantsPerSecond };
        }
      }
      if (cur) seg.push(cur);
      if (seg.length) segs.push(seg);

      const line = (pts, key, y) => {
        let d = '';
        for (let i = 0; i < pts.length; i++) d += (i ? 'L' : 'M') + pts[i].x + ' ' + y(pts[i][key]).toFixed(1);
        if (pts.length === 1) d += 'h1';
        return d;
      };
      const area = (pts, key, y, base) => {
        let d = 'M' + pts[0].x + ' ' + base.toFixed(1);
        for (const p of pts) d += 'L' + p.x + ' ' + y(p[key]).toFixed(1);
        const endX = pts.length === 1 ? pts[0].x + 1 : pts[pts.length - 1].x;
        if (pts.length === 1) d += 'L' + endX + ' ' + y(pts[0][key]).toFixed(1);
        return d + 'L' + endX + ' ' + base.toFixed(1) + 'Z';
      };
      let cap = '', run = '', wait = '', gps = '', capA = '', runA = '', gpsA = '';
      for (const pts of segs) {
        cap += line(pts, 'c', yTop);
        run += line(pts, 'r', yTop);
        wait += line(pts, 'w', yTop);
        gps += line(pts, 'g', yBot);
        capA += area(pts, 'c', yTop, topY0);
        runA += area(pts, 'r', yTop, topY0);
        gpsA += area(pts, 'g', yBot, botY0);
      }

      capLine.setAttribute('d', cap);
      runLine.setAttribute('d', run);
      waitLine.setAttribute('d', wait);
      gpsLine.setAttribute('d', gps);
      capArea.setAttribute('d', capA);
      runArea.setAttribute('d', runA);
      gpsArea.setAttribute('d', gpsA);

      noData.setAttribute('x', String(M.l + plotW / 2));
      noData.setAttribute('y', String(M.t + TOP_H / 2));
      noData.setAttribute('text-anchor', 'middle');
      noData.textContent = n ? '' : 'No history yet';

      scale = { x0: x0, x1: x1, px: px, plotW: plotW, yTop: yTop, yBot: yBot, bottom: botY0 };
      updateTitle();
      if (hoverX !== null) hover(hoverX);
    }


    function updateTitle() {
      const n = samples.length;
      if (!n) {
        title.textContent = 'History chart: no samples yet';
        return;
      }
      const s = samples[n - 1];
      let peakRun = 0;
      let peakWait = 0;
      for (const x of samples) {
        if (scale && x.atMs < scale.x0) continue;
        peakRun = Math.max(peakRun, x.running);
        peakWait = Math.max(peakWait, x.waiters);
      }
      title.textContent = heading.textContent + ': now capacity ' + s.capacity + ', running ' + s.running + ', waiters ' +
        s.waiters + ', ' + s.grantsPerSecond + ' grants per second; peak running ' + peakRun +
        ', peak waiters ' + peakWait + '.';
    }

    function nearest(t) {
      let lo = 0;
      let hi = samples.length - 1;
      while (lo < hi) {
        const mid = (lo + hi) >> 1;
        if (samples[mid].atMs < t) lo = mid + 1;
        else hi = mid;
      }
      if (lo > 0 && Math.abs(samples[lo - 1].atMs - t) < Math.abs(samples[lo].atMs - t)) lo -= 1;
      return samples[lo];
    }

    function hover(x) {
      hoverX = x;
      if (!scale || !samples.length || x < M.l || x > width - M.r) {
        cursor.style.display = 'none';
        tip.hidden = true;
        return;
      }
      const t = scale.x0 + ((x - M.l) / scale.plotW) * (scale.x1 - scale.x0);
      const s = nearest(t);
      if (!s || Math.abs(s.atMs - t) > 60000) {
        cursor.style.display = 'none';
        tip.hidden = true;
        return;
      }
      const cx = scale.px(s.atMs);
      cursor.setAttribute('x1', cx.toFixed(1));
      cursor.setAttribute('x2', cx.toFixed(1));
      cursor.setAttribute('y1', String(M.t));
      cursor.setAttribute('y2', String(scale.bottom));
      cursor.style.display = '';
      const rows = [
        ['', fmtClock(s.atMs)],
        ['s-capacity', 'Capacity ' + NF.format(s.capacity) + ' (' + NF.format(s.capacityAvailable) + ' free)'],
        ['s-running', 'Running ' + NF.format(s.running)],
        ['s-waiters', 'Waiters ' + NF.format(s.waiters)],
        ['s-gps', 'Grants/s ' + NF2.format(s.grantsPerSecond)],
      ];
      if (tip.childElementCount !== rows.length) {
        tip.replaceChildren(...rows.map(() => h('div')));
      }
      rows.forEach(([cls, t2], i) => {
        const d = tip.children[i];
        d.className = cls ? 'tip-row ' + cls : 'tip-time';
        d.textContent = t2;
      });
      tip.hidden = false;
      const tipW = tip.offsetWidth;
      let left = cx + 12;
      if (left + tipW > width - 4) left = cx - 12 - tipW;
      tip.style.left = Math.max(0, left) + 'px';
      tip.style.top = (M.t + 8) + 'px';
    }

    svg.addEventListener('mousemove', (ev) => {
      const r = svg.getBoundingClientRect();
      hover(ev.clientX - r.left);
    });
    svg.addEventListener('mouseleave', () => {
      hoverX = null;
      cursor.style.display = 'none';
      tip.hidden = true;
    });

    let lastWidth = 0;
    if (typeof ResizeObserver === 'function') {
      new ResizeObserver(() => {
        const w = Math.floor(box.clientWidth);
        if (w !== lastWidth) {
          lastWidth = w;
          draw();
        }
      }).observe(box);
    }

    function setLegend(s) {
      const vals = s ? {
        capacity: NF.format(s.capacity), running: NF.format(s.running),
        waiters: NF.format(s.waiters), grantsPerSecond: NF2.format(s.grantsPerSecond),
      } : { capacity: '—', running: '—', waiters: '—', grantsPerSecond: '—' };
      for (const k in vals) setText(legend[k], vals[k]);
    }

    return {
      set(history) {
        const raw = objs(history && history.samples);
        intervalS = isNum(history && history.intervalSeconds) && history.intervalSeconds > 0 ? history.intervalSeconds : 1;
        const out = [];
        for (const s of raw) {
          if (!isNum(s.atMs)) continue;
          out.push({
            atMs: s.atMs, capacity: num(s.capacity), capacityAvailable: num(s.capacityAvailable),
            running: num(s.running), waiters: num(s.waiters), grantsPerSecond: num(s.grantsPerSecond),
          });
        }
        out.sort((a, b) => a.atMs - b.atMs);
        samples = out;
        setLegend(out[out.length - 1]);
        draw();
      },
      draw: draw,
    };
  })();

  // --------------------------------------------------- fetch and status

  const statusEl = document.getElementById('status');
  const updatedEl = document.getElementById('updated');
  const uptimeEl = document.getElementById('uptime');
  const bannerEl = document.getElementById('banner');
  const bannerTitle = document.getElementById('banner-title');
  const bannerText = document.getElementById('banner-text');
  const mainEl = document.getElementById('dashboard');
  const countEls = {};
  for (const k of Object.keys(tables)) countEls[k] = document.querySelector('[data-count="' + k + '"]');

  const conn = { state: 'connecting', lastOkAt: 0, failingSince: 0, error: '' };
  const stats = { renders: 0, lastMs: 0, maxMs: 0, totalMs: 0, lastTables: {}, lastBytes: 0, lastParseMs: 0 };

  class HttpError extends Error {
    constructor(status, statusText) {
      super('HTTP ' + status + (statusText ? ' ' + statusText : ''));
      this.status = status;
    }
  }

  async function fetchJson(url) {
    const ctl = typeof AbortController === 'function' ? new AbortController() : null;
    const timer = ctl ? setTimeout(() => ctl.abort(), FETCH_TIMEOUT_MS) : 0;
    try {
      let r;
      try {
        r = await fetch(url, {
          cache: 'no-store', credentials: 'same-origin',
          headers: { Accept: 'application/json' }, signal: ctl ? ctl.signal : undefined,
        });
      } catch (e) {
        if (e && e.name === 'AbortError') throw new Error('no answer within ' + FETCH_TIMEOUT_MS / 1000 + ' s');
        throw new Error('connection failed');
      }
      if (!r.ok) throw new HttpError(r.status, r.statusText);
      const body = await r.text();
      stats.lastBytes = body.length;
      try {
        const t0 = performance.now();
        const parsed = JSON.parse(body);
        if (url === OVERVIEW_URL) stats.lastParseMs = performance.now() - t0;
        return parsed;
      } catch (e) {
        throw new Error('the answer is not JSON');
      }
    } finally {
      clearTimeout(timer);
    }
  }

  function setState(state) {
    conn.state = state;
    const label = state === 'live' ? 'live'
      : state === 'unreachable' ? 'unreachable'
        : state === 'unauthorized' ? 'unauthorized' : 'connecting';
    setText(statusEl, label);
    statusEl.className = 'status status-' + state;
    toggleClass(mainEl, 'stale', state === 'unreachable' || state === 'unauthorized');
    mainEl.setAttribute('aria-busy', state === 'connecting' ? 'true' : 'false');
    updateBanner();
  }

  function updateBanner() {
    const down = conn.state === 'unreachable' || conn.state === 'unauthorized';
    bannerEl.hidden = !down;
    if (!down) return;
    const now = Date.now();
    if (conn.state === 'unauthorized') {
      setText(bannerTitle, 'Not authorised.');
      setText(bannerText, 'The scheduler asks for credentials (HTTP 401). Reload the page to sign in.' +
        (conn.lastOkAt ? ' Showing the data of ' + fmtClock(conn.lastOkAt) + '.' : ''));
      return;
    }
    setText(bannerTitle, 'Scheduler unreachable.');
    const err = conn.error.charAt(0).toUpperCase() + conn.error.slice(1);
    setText(bannerText, err + ' since ' + fmtClock(conn.failingSince) + '. ' + (conn.lastOkAt
      ? 'Last successful update at ' + fmtClock(conn.lastOkAt) + ' (' + fmtDuration(now - conn.lastOkAt) +
        ' ago); the figures below are from then.'
      : 'No data received yet.') + ' Retrying every ' + OVERVIEW_EVERY_MS / 1000 + ' s.');
  }
  // A scheduler that accepts connections but never answers is down too.
  const STALL_MS = 4 * OVERVIEW_EVERY_MS;
  setInterval(() => {
    if (conn.state === 'live' && !document.hidden && Date.now() - conn.lastOkAt > STALL_MS) {
      conn.failingSince = conn.lastOkAt + OVERVIEW_EVERY_MS;
      conn.error = 'no answer for ' + STALL_MS / 1000 + ' s';
      setState('unreachable');
    }
    if (conn.state !== 'live') updateBanner();
  }, 1000);

  function renderOverview(d) {
    const t0 = performance.now();
    const servants = objs(d.servants);
    const grants = objs(d.grants);
    const tasks = objs(d.runningTasks);
    const envs = objs(d.environments);
    const tasksByGrant = new Map();
    for (const t of tasks) if (t.grantId !== null && t.grantId !== undefined) tasksByGrant.set(str(t.grantId), t);
    const protocols = new Map();
    if (d.peerProtocols && typeof d.peerProtocols === 'object' && !Array.isArray(d.peerProtocols)) {
      for (const [ip, label] of Object.entries(d.peerProtocols)) if (typeof label === 'string') protocols.set(ip, label);
    }
    const ctx = {
      now: isNum(d.generatedAtMs) ? d.generatedAtMs : Date.now(), tasksByGrant: tasksByGrant, protocols: protocols,
    };
    const requesters = requesterRows(d, grants, ctx.now);

    // Tasks servants report under a grant the scheduler no longer has.
    const grantIds = new Set();
    for (const g of grants) grantIds.add(str(g.id));
    let orphans = 0;
    for (const t of tasks) if (!grantIds.has(str(t.grantId))) orphans++;
    grantsTable.infoSuffix = ' · ' + NF.format(tasks.length) + ' tasks reported' +
      (orphans ? ' (' + NF.format(orphans) + ' without a grant)' : '');

    renderSummary(d.totals && typeof d.totals === 'object' ? d.totals : {}, servants, grants);
    servantsTable.setItems(servants, ctx);
    grantsTable.setItems(grants, ctx);
    envTable.setItems(envs, ctx);
    requestersTable.setItems(requesters, ctx);
    setText(countEls.requesters, NF.format(requesters.length));
    setText(countEls.servants, NF.format(servants.length));
    setText(countEls.grants, NF.format(grants.length));
    setText(countEls.environments, NF.format(envs.length));

    setText(uptimeEl, isNum(d.uptimeSeconds) ? fmtDuration(d.uptimeSeconds * 1000) : '—');
    const ms = performance.now() - t0;
    stats.renders++;
    stats.lastMs = ms;
    stats.maxMs = Math.max(stats.maxMs, ms);
    stats.totalMs += ms;
    stats.lastTables = {
      servants: servantsTable.lastRenderMs, grants: grantsTable.lastRenderMs, environments: envTable.lastRenderMs,
      requesters: requestersTable.lastRenderMs,
    };
    mainEl.dataset.renderMs = ms.toFixed(1);
  }

  let overviewTimer = 0;
  let historyTimer = 0;

  let overviewBusy = false;
  async function pollOverview() {
    if (overviewBusy) return; // one request at a time: answers never arrive out of order
    overviewBusy = true;
    clearTimeout(overviewTimer);
    const started = performance.now();
    try {
      const data = await fetchJson(OVERVIEW_URL);
      if (!data || typeof data !== 'object' || Array.isArray(data)) throw new Error('unexpected answer');
      renderOverview(data);
      conn.lastOkAt = Date.now();
      conn.failingSince = 0;
      conn.error = '';
      updatedEl.dateTime = new Date(conn.lastOkAt).toISOString();
      setText(updatedEl, fmtClock(conn.lastOkAt));
      if (conn.state !== 'live') {
        setState('live');
        pollHistory(); // catch up at once after an outage
      }
    } catch (e) {
      if (!conn.failingSince || conn.state === 'live') conn.failingSince = Date.now();
      conn.error = e && e.message ? e.message : String(e);
      setState(e instanceof HttpError && e.status === 401 ? 'unauthorized' : 'unreachable');
      if (!(e instanceof HttpError)) console.warn('overview:', e);
    } finally {
      overviewBusy = false;
      const wait = Math.max(250, OVERVIEW_EVERY_MS - (performance.now() - started));
      overviewTimer = setTimeout(pollOverview, wait);
    }
  }

  let historyBusy = false;
  async function pollHistory() {
    if (historyBusy) return;
    historyBusy = true;
    clearTimeout(historyTimer);
    const started = performance.now();
    try {
      chart.set(await fetchJson(HISTORY_URL));
    } catch (e) {
      // The overview poll reports the outage; the chart keeps its last data.
    } finally {
      historyBusy = false;
      historyTimer = setTimeout(pollHistory, Math.max(250, HISTORY_EVERY_MS - (performance.now() - started)));
    }
  }

  document.addEventListener('visibilitychange', () => {
    if (!document.hidden && conn.lastOkAt && Date.now() - conn.lastOkAt > OVERVIEW_EVERY_MS * 2) pollOverview();
  });

  window.yadccDashboard = {
    stats: stats,
    tables: tables,
    refresh: pollOverview,
    connection: conn,
  };

  chart.draw();
  pollOverview();
  pollHistory();
})();
