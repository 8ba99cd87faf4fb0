// The history chart: capacity, running and waiters above, grants per second
// below, over 5 min / 15 min / 1 h (or less: it spans the data it has), with
// a hover read-out. Plain SVG, redrawn per overview poll and per resize.
//
// The legend shows the overview's totals (the document the cards and tables
// show), and the chart ends on that same point, so they agree at every
// instant; the server's history ring supplies the points before it.

import { areaPath, fmtTick, linePath, niceStep, segments, timeStep } from './chart-geometry.js';
import { h, setText } from './dom.js';
import { CLOCK, CLOCK_HM, NF, NF2, fmtClock, fmtDuration, isNum, num, objs } from './format.js';
import { saveUi, ui } from './store.js';

const SVG_NS = 'http://www.w3.org/2000/svg';

const RANGES_S = [300, 900, 3600];
const RANGE_NAMES = { 300: 'Last 5 minutes', 900: 'Last 15 minutes', 3600: 'Last hour' };
// Two samples' worth, so a single sample is a point at the right, not a division by zero.
const MIN_SPAN_MS = 2000;

// The chart inside `box`; returns { set(history), setNow(totals, atMs), draw() }.
export function createChart(box) {
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

  let samples = []; // what is drawn: the ring, then the overview's point
  let ring = [];
  let now = null;
  let intervalS = 1;
  let width = 0;
  let scale = null; // { x0, x1, px(x), ... } of the last draw
  let hoverX = null;
  const legend = {};
  for (const k of ['capacity', 'running', 'waiters', 'grantsPerSecond']) legend[k] = document.querySelector('[data-legend="' + k + '"]');

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

  // Drawn at most once a frame, however many updates arrive in it.
  let drawPending = false;
  function scheduleDraw() {
    if (drawPending) return;
    drawPending = true;
    requestAnimationFrame(() => {
      drawPending = false;
      draw();
    });
  }

  // The box's width as the resize observer last saw it: reading it in every
  // draw would force a layout of the whole page right after the tables
  // changed.
  let boxWidth = 0;
  function draw() {
    if (!boxWidth) boxWidth = Math.floor(box.clientWidth);
    width = Math.max(320, boxWidth);
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

    const segs = segments(samples, x0, px, Math.max(5000, 3 * intervalS * 1000));
    let cap = '', run = '', wait = '', gps = '', capA = '', runA = '', gpsA = '';
    for (const pts of segs) {
      cap += linePath(pts, 'c', yTop);
      run += linePath(pts, 'r', yTop);
      wait += linePath(pts, 'w', yTop);
      gps += linePath(pts, 'g', yBot);
      capA += areaPath(pts, 'c', yTop, topY0);
      runA += areaPath(pts, 'r', yTop, topY0);
      gpsA += areaPath(pts, 'g', yBot, botY0);
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

  if (typeof ResizeObserver === 'function') {
    new ResizeObserver((entries) => {
      const w = Math.floor(entries[entries.length - 1].contentRect.width);
      if (w !== boxWidth) {
        boxWidth = w;
        scheduleDraw();
      }
    }).observe(box);
  }

  function merge() {
    samples = now && (!ring.length || now.atMs > ring[ring.length - 1].atMs) ? ring.concat([now]) : ring;
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
      ring = out;
      merge();
      // The overview's next point (every 2 s) draws the new samples with
      // it: one redraw for both instead of one each (a full redraw costs a
      // phone's main thread most of a frame). Before any overview, now.
      if (!now) scheduleDraw();
    },
    // The overview's totals, generated at `atMs`: the legend and the last point.
    setNow(totals, atMs) {
      now = isNum(atMs) ? {
        atMs: atMs, capacity: num(totals.capacity), capacityAvailable: num(totals.capacityAvailable),
        running: num(totals.running), waiters: num(totals.waiters), grantsPerSecond: num(totals.grantsPerSecond),
      } : null;
      setLegend(now);
      merge();
      scheduleDraw();
    },
    draw: draw,
  };
}
