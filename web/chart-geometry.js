// The chart's arithmetic, apart from the page: round axis steps, samples
// reduced to one point per half pixel, and SVG path strings.

import { NF, NF2 } from './format.js';

// Time between axis labels: the smallest round step giving at most `count`.
const TIME_STEPS_S = [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600];
export function timeStep(spanMs, count) {
  for (const s of TIME_STEPS_S) if (spanMs / (s * 1000) <= count) return s * 1000;
  return 3600 * 1000;
}

export function niceStep(max, count, integer) {
  if (!(max > 0)) return 1;
  const raw = max / count;
  const p = Math.pow(10, Math.floor(Math.log10(raw)));
  const f = raw / p;
  let step = (f <= 1 ? 1 : f <= 2 ? 2 : f <= 2.5 ? 2.5 : f <= 5 ? 5 : 10) * p;
  if (integer) step = Math.max(1, Math.round(step));
  return step;
}
export const fmtTick = (v) => (Math.abs(v) >= 10000 ? NF.format(Math.round(v / 1000)) + 'k' : NF2.format(v));

// Samples from `x0` on as runs of points, one per half pixel (the peak in
// it), a new run wherever samples are more than `maxGap` ms apart; `px` maps
// a time to its x. Each point: { x, c: capacity, r: running, w: waiters,
// g: grants per second }.
export function segments(samples, x0, px, maxGap) {
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
  return segs;
}

export function linePath(pts, key, y) {
  let d = '';
  for (let i = 0; i < pts.length; i++) d += (i ? 'L' : 'M') + pts[i].x + ' ' + y(pts[i][key]).toFixed(1);
  if (pts.length === 1) d += 'h1';
  return d;
}
export function areaPath(pts, key, y, base) {
  let d = 'M' + pts[0].x + ' ' + base.toFixed(1);
  for (const p of pts) d += 'L' + p.x + ' ' + y(p[key]).toFixed(1);
  const endX = pts.length === 1 ? pts[0].x + 1 : pts[pts.length - 1].x;
  if (pts.length === 1) d += 'L' + endX + ' ' + y(pts[0][key]).toFixed(1);
  return d + 'L' + endX + ' ' + base.toFixed(1) + 'Z';
}
