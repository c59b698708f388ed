import { SqliteLogStore } from '../../control-plane/store/sqlite-log-store.js';
import { LogBlocksBuilder } from '../../proto/lib/log-columns.js';
import { Report } from '../../proto/gen/tollgate/v1/sync.js';
import { mkdtempSync } from 'node:fs';
async function main() {
  const now = Date.now();
  const store = await SqliteLogStore.open(`${mkdtempSync('/tmp/w-')}/logs.db`, { retentionDays: 30, now: () => now });
  const mk = (seq: number, n: number) => {
    const b = new LogBlocksBuilder();
    for (let i = 0; i < n; i++) b.add({ requestId: `r${seq}-${i}`, atMs: now + i, keyId: 'key_1', projectId: 'p', orgId: 'o', clientIp: `10.0.${i & 255}.${(i >> 8) & 255}`, userAgent: 'autocannon', method: 'POST', path: '/v1/chat/completions', status: 200, latencyUs: 800 + i, bytesIn: 190, bytesOut: 400, model: 'bench-chat', promptTokens: 12, completionTokens: 30, costMicros: 40, reason: '', keyPrefix: '' });
    return Report.encode({ seq, usage: [], lastUsed: [], logs: undefined, instanceId: 'x', usageTotals: [], logBlocks: b.blocks() }).finish();
  };
  for (const n of [1000, 1000, 1000]) {
    const reps = Array.from({ length: 300 }, (_, i) => mk(0, n));
    const c0 = process.cpuUsage();
    let d = 0, w = 0;
    for (const [i, bytes] of reps.entries()) { const t0 = process.cpuUsage(); const bl = Report.decode(bytes).logBlocks; const t1 = process.cpuUsage(t0); d += t1.user + t1.system; await store.writeBlocks({ nodeId: 'n', instanceId: 'i' }, (globalThis as any).seq = ((globalThis as any).seq ?? 0) + 1, bl); }
    const c = process.cpuUsage(c0);
    console.log(`${n} rows/report (${reps[0].length} bytes): ${((c.user + c.system) / reps.length).toFixed(0)} µs CPU per report (user ${(c.user / reps.length).toFixed(0)}); decode ${(d / reps.length).toFixed(0)}`);
  }
}
main();
