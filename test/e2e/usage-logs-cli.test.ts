// `tollgate logs` refuses bad input with one clear line: malformed times, statuses and limits are
// usage errors (400, exit 2), a window that ends before it starts and an account asking for no key,
// project or organisation are refused by the control plane (400), an unknown key is 404.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { ListRequestLogsRequest } from '../../proto/gen/tollgate/v1/console.js';
import { assertFails, assertUsageError, createOrgWithProjectAsync, runMany } from '../helpers/console-cli.js';
import { startGateway } from '../helpers/gateway-fixture.js';

test('tollgate logs: bad input gets one clear line', async (t) => {
  const { cp } = await startGateway(t, { nodes: 0 });
  const op = cp.secrets.operatorToken;
  const { owner, orgId } = await createOrgWithProjectAsync(cp, op, 'logs-input');
  const [since, status, limit, order, noScope, unknownKey, page] = await runMany(cp, [
    [op, ['logs', '--key', 'key_x', '--since', 'yesterday']],
    [op, ['logs', '--org', orgId, '--status', '999']],
    [op, ['logs', '--org', orgId, '--limit', '0']],
    [op, ['logs', '--org', orgId, '--since', '2025-03-02T00:00:00Z', '--until', '2025-03-01T00:00:00Z']],
    [owner.token, ['logs']],
    [owner.token, ['logs', '--key', 'key_doesnotexist']],
    [op, ['logs', '--org', orgId, '--page', 'not-a-token']],
  ]);
  assertUsageError(since, 'a time that is not one', /--since must be a time/);
  assertUsageError(status, 'a status that is not one', /--status must be an HTTP status/);
  assertUsageError(limit, 'a limit of 0', /--limit must be 1 to 1000/);
  assertUsageError(order, 'a window that ends before it starts', /--since must be before --until/);
  assertFails(noScope, 400, 'an account asking for every log', { message: /give a key, a project or an organisation/ });
  assertFails(unknownKey, 404, 'an unknown key', { message: /key key_doesnotexist not found/ });
  assertFails(page, 400, 'a page token the server never gave', { message: /page_token/ });
});

test('a key value given where a key id belongs is refused without being echoed, by the CLI and the control plane', async (t) => {
  // Before: `tollgate key show sk-…`, `key revoke sk-…` and `logs --key sk-…` answered
  // "404 key sk-tollgate-… not found": the full key value came back in the error message.
  const gw = await startGateway(t, { nodes: 0 });
  const [cp, c] = [gw.cp, gw.console];
  const op = cp.secrets.operatorToken;
  const { key } = await gw.fundedKey();
  const secret = key.slice(key.length - 20);
  const runs = await runMany(cp, [
    [op, ['key', 'show', key]],
    [op, ['key', 'revoke', key]],
    [op, ['logs', '--key', key]],
    [op, ['--json', 'key', 'show', ` ${key}`]],
  ]);
  for (const r of runs) {
    assert.notEqual(r.code, 0);
    assert.ok(!(r.stderr + r.stdout).includes(secret), `the value is not echoed: ${r.stderr}`);
    assert.match(r.stderr, /key value, not a key id/);
  }
  // The control plane itself (another client than our CLI) refuses it the same way.
  for (const call of [() => c.getKey({ keyId: key }), () => c.revokeKey({ keyId: key }), () => c.listRequestLogs(ListRequestLogsRequest.fromPartial({ keyId: key }))]) {
    await assert.rejects(call(), (err: any) => {
      assert.equal(err.code, 3, err.details);
      assert.ok(!String(err.details).includes(secret), err.details);
      return true;
    });
  }
  assert.ok(!cp.proc.output().includes(secret), 'nor logged by the control plane');
});
