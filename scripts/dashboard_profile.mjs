// The dashboard's own main-thread time per overview update, by script, in
// headless Chromium over DevTools as Lighthouse's mobile preset sees it (a
// 412 x 823 phone, CPU slowed 4 x). Against a running scheduler's page, e.g.
// `--demo` plus `yadcc-loadgen grant-cycles --servants 1000 --protocol flare`:
//   node --experimental-websocket scripts/dashboard_profile.mjs http://127.0.0.1:8336/ 20
// (Node 20; the second argument is the measured seconds, after 8 s of load).
// Prints per update: Chromium's task, script, layout and style time, then
// the sampled self time per script and per function.

import { spawn } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';

const [url, seconds] = process.argv.slice(2);
const chrome = spawn('chromium', ['--headless', '--no-sandbox', '--disable-gpu', '--remote-debugging-port=0',
  `--user-data-dir=${os.tmpdir()}/yadcc-profile-${process.pid}`, '--window-size=412,823', 'about:blank'], { stdio: ['ignore', 'ignore', 'pipe'] });
let buf = '';
const wsUrl = await new Promise((res) => chrome.stderr.on('data', (d) => { buf += d; const m = buf.match(/ws:\/\/\S+/); if (m) res(m[0]); }));
const ws = new WebSocket(wsUrl);
await new Promise((r) => ws.onopen = r);
let id = 0; const pend = new Map();
ws.onmessage = (e) => { const m = JSON.parse(e.data); if (m.id && pend.has(m.id)) { pend.get(m.id)(m); pend.delete(m.id); } };
const cmd = (method, params = {}, sessionId) => new Promise((r) => { const i = ++id; pend.set(i, r); ws.send(JSON.stringify({ id: i, method, params, sessionId })); });
const t = await cmd('Target.createTarget', { url: 'about:blank' });
const s = (await cmd('Target.attachToTarget', { targetId: t.result.targetId, flatten: true })).result.sessionId;
await cmd('Emulation.setDeviceMetricsOverride', { width: 412, height: 823, deviceScaleFactor: 1.75, mobile: true }, s);
await cmd('Emulation.setCPUThrottlingRate', { rate: 4 }, s);
await cmd('Performance.enable', {}, s);
await cmd('Profiler.enable', {}, s);
await cmd('Page.navigate', { url }, s);
await new Promise((r) => setTimeout(r, 8000));
const ev = async (expr) => (await cmd('Runtime.evaluate', { expression: expr, returnByValue: true }, s)).result.result.value;
const metrics = async () => Object.fromEntries((await cmd('Performance.getMetrics', {}, s)).result.metrics.map((m) => [m.name, m.value]));
const m0 = await metrics(); const r0 = await ev('window.yadccDashboard.stats.renders');
await cmd('Profiler.setSamplingInterval', { interval: 200 }, s);
await cmd('Profiler.start', {}, s);
await new Promise((r) => setTimeout(r, seconds * 1000));
const prof = (await cmd('Profiler.stop', {}, s)).result.profile;
const m1 = await metrics(); const r1 = await ev('window.yadccDashboard.stats.renders');
const n = r1 - r0;
const d = (k) => ((m1[k] - m0[k]) * 1000 / n).toFixed(1);
console.log(`updates ${n}; per update (ms, 4x CPU throttle): task ${d('TaskDuration')}, script ${d('ScriptDuration')}, layout ${d('LayoutDuration')}, style ${d('RecalcStyleDuration')}`);
const dt = prof.timeDeltas.reduce((a, b) => a + b, 0) / prof.samples.length / 1000;
const byNode = new Map(prof.nodes.map((x) => [x.id, x]));
const hits = new Map();
for (const sid of prof.samples) hits.set(sid, (hits.get(sid) || 0) + 1);
const byUrl = {};
const byFn = {};
for (const [sid, c] of hits) {
  const node = byNode.get(sid); const f = node.callFrame;
  const u = (f.url || '(' + f.functionName + ')').replace(/^.*\//, '');
  if (u === '(idle)' || u === '(program)') continue;
  byUrl[u] = (byUrl[u] || 0) + c * dt;
  const k = u + ':' + (f.functionName || '?');
  byFn[k] = (byFn[k] || 0) + c * dt;
}
const top = (o) => Object.entries(o).sort((a, b) => b[1] - a[1]).slice(0, 12).map(([k, v]) => `${k} ${(v / n).toFixed(1)}`).join(', ');
console.log('self ms per update by script: ' + top(byUrl));
console.log('by function: ' + top(byFn));
chrome.kill();
ws.close();
await new Promise((r) => setTimeout(r, 500));
fs.rmSync(`${os.tmpdir()}/yadcc-profile-${process.pid}`, { recursive: true, force: true, maxRetries: 5, retryDelay: 200 });
process.exit(0);
