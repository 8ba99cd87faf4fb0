// Turning the scheduler's JSON into text: numbers, 64-bit decimal strings,
// byte counts, durations, clock times, and sort keys that order them right.
// Nothing here touches the page.

export const NF = new Intl.NumberFormat('en-US');
export const NF2 = new Intl.NumberFormat('en-US', { maximumFractionDigits: 2 });
const NF1 = new Intl.NumberFormat('en-US', { minimumFractionDigits: 1, maximumFractionDigits: 1 });
export const CLOCK = new Intl.DateTimeFormat(undefined, {
  hour: '2-digit', minute: '2-digit', second: '2-digit', hourCycle: 'h23',
});
export const CLOCK_HM = new Intl.DateTimeFormat(undefined, { hour: '2-digit', minute: '2-digit', hourCycle: 'h23' });

export const isNum = (v) => typeof v === 'number' && Number.isFinite(v);
export const num = (v) => (isNum(v) ? v : 0);
export const str = (v) => (v === null || v === undefined ? '' : String(v));
export const objs = (v) => (Array.isArray(v) ? v.filter((x) => x !== null && typeof x === 'object') : []);
export const fmtInt = (v) => (isNum(v) ? NF.format(v) : '—');
export const fmtClock = (ms) => CLOCK.format(new Date(ms));
// The window a rate was measured over, in words (`rateWindowSeconds`).
export const fmtRateWindow = (seconds) =>
  (isNum(seconds) && seconds > 0 ? 'over the last ' + NF.format(Math.round(seconds)) + ' s' : 'no rate yet');

// Non-negative decimal integers that may exceed 2^53 arrive as strings.
const DECIMAL = /^\d+$/;
export function big(v) {
  if (typeof v === 'string' && DECIMAL.test(v)) return BigInt(v);
  if (typeof v === 'number' && Number.isSafeInteger(v) && v >= 0) return BigInt(v);
  return null;
}
// Sort key of a decimal string: zero-padded so plain string order is numeric order.
export function decKey(v) {
  const s = str(v);
  if (!DECIMAL.test(s)) return '~' + s;
  return s.replace(/^0+(?=\d)/, '').padStart(24, '0');
}
// Thousands separators on a decimal string, without going through Number.
export function fmtBig(v) {
  const s = str(v);
  if (!DECIMAL.test(s)) return s || '—';
  return s.replace(/^0+(?=\d)/, '').replace(/\B(?=(\d{3})+(?!\d))/g, ',');
}
const BYTE_UNITS = ['B', 'KiB', 'MiB', 'GiB', 'TiB', 'PiB', 'EiB'];
export function fmtBytes(v) {
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
export function fraction(a, b) {
  const x = big(a);
  const y = big(b);
  if (x === null || y === null || y === 0n) return null;
  const r = Number((x * 10000n) / y) / 10000;
  return Math.max(0, Math.min(1, r));
}

export function fmtDuration(ms) {
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
export function locKey(v) {
  const s = str(v);
  let k = locKeyCache.get(s);
  if (k === undefined) {
    k = s.toLowerCase().replace(/\d+/g, (d) => d.padStart(6, '0'));
    if (locKeyCache.size > 20000) locKeyCache.clear();
    locKeyCache.set(s, k);
  }
  return k;
}

export const shortDigest = (d) => (d.length > 16 ? d.slice(0, 12) + '…' : d);

// "10.0.0.2:8335" -> "10.0.0.2", "[::1]:8335" -> "::1": the key of peerProtocols.
export function ipOf(location) {
  const s = str(location);
  const v6 = /^\[([^\]]+)\]:\d+$/.exec(s);
  if (v6) return v6[1];
  const colon = s.lastIndexOf(':');
  return colon > 0 && s.indexOf(':') === colon ? s.slice(0, colon) : s;
}
