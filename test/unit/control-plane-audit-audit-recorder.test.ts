import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { queryAudit } from '../../control-plane/audit/audit-query.js';
import { AuditRecorder, auditId, callerAddressOf } from '../../control-plane/audit/audit-recorder.js';
import { SqliteDb } from '../../control-plane/store/sqlite-db.js';
import { runMigrations } from '../../control-plane/store/migrate.js';
import { generateKey, generateToken, newId } from '../../proto/lib/keys.js';

const newIdSample = newId('acct');

test('ids are kept; key values, tokens and secrets are never stored as ids', () => {
  const rows: [string, string][] = [
    ['key_abcdefghijkl', 'key_abcdefghijkl'],
    [newIdSample, newIdSample],
    [' org_x1 ', 'org_x1'],
    [generateKey('tollgate'), ''],
    [generateToken('acct'), ''],
    [generateToken('op'), ''],
    ['whsec_c2VjcmV0', ''],
    ['two words', ''],
  ];
  for (const [input, want] of rows) assert.equal(auditId(input), want, input.slice(0, 8));
});

test('the caller address is the peer without its port', () => {
  const rows: [string, string][] = [
    ['ipv4:127.0.0.1:50123', '127.0.0.1'],
    ['ipv6:[::1]:40000', '::1'],
    ['ipv6:[2001:db8::7]:1', '2001:db8::7'],
    ['unix:/tmp/sock', '/tmp/sock'],
  ];
  for (const [peer, want] of rows) assert.equal(callerAddressOf(peer), want);
});

test('entries older than the retention are deleted; newer ones stay', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'tollgate-audit-'));
  const db = await SqliteDb.open(join(dir, 'state.db'));
  t.after(async () => {
    await db.close();
    rmSync(dir, { recursive: true, force: true });
  });
  await runMigrations(db);
  const clock = { ms: Date.UTC(2026, 0, 31) };
  const audit = new AuditRecorder(db, { now: () => clock.ms, retentionDays: 30 });
  const entry = (daysAgo: number) => ({ atMs: clock.ms - daysAgo * 86_400_000, actor: 'operator', action: 'org.credit', targetId: 'org_a', orgId: 'org_a', outcome: 'ok' as const, callerAddress: '127.0.0.1' });
  for (const d of [0, 29, 30.5, 100]) await audit.record(entry(d));
  assert.equal(await audit.applyRetention(), 2);
  const left = await queryAudit(db, { visibleOrgs: 'all', limit: 10 });
  assert.deepEqual(left.map((r) => (clock.ms - r.at_ms) / 86_400_000), [0, 29]);
  assert.deepEqual(await queryAudit(db, { visibleOrgs: [], limit: 10 }), []);
  assert.equal((await queryAudit(db, { visibleOrgs: ['org_a'], action: 'org.credit', limit: 10 })).length, 2);
});
