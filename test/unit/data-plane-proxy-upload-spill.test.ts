// The node-wide spill budget: an upload's bytes on disk are taken from it block by block, a block that
// does not fit fails the upload with NODE_BUSY (503, retry-after), and removing the file gives back.
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import type { GatewayError } from '../../data-plane/errors.js';
import { BodyBudget } from '../../data-plane/limits/body-budget.js';
import { UploadSpill } from '../../data-plane/proxy/upload-spill.js';

test('spilled bytes count against the spill budget and its shares, and are given back on remove', async (t) => {
  // Issue 21: before, spills were not bounded node-wide: five held 20 MiB uploads put 101 MB in TMPDIR.
  const dir = mkdtempSync(join(tmpdir(), 'spill-budget-'));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  const budget = new BodyBudget(4 * 1024 * 1024);
  const a = new UploadSpill(dir, 256 * 1024, { budget, owner: 'org-a', account: 'acct' });
  let failed: GatewayError | null = null;
  a.onError((e) => (failed = e));
  a.write(Buffer.alloc(768 * 1024));
  assert.equal(failed, null);
  assert.ok(budget.held('org-a') >= 512 * 1024, `held ${budget.held('org-a')}`);
  // Past the organisation's quarter (1 MiB): refused.
  a.write(Buffer.alloc(1024 * 1024));
  assert.equal(failed!.code, 'NODE_BUSY');
  assert.equal(failed!.retryAfterSec, 1);
  assert.match(failed!.message, /organisation/);
  // Another organisation of the same account shares the account's quarter.
  const b = new UploadSpill(dir, 0, { budget, owner: 'org-b', account: 'acct' });
  let failedB: GatewayError | null = null;
  b.onError((e) => (failedB = e));
  b.write(Buffer.alloc(512 * 1024));
  assert.equal(failedB!.code, 'NODE_BUSY');
  assert.match(failedB!.message, /account/);
  a.remove();
  b.remove();
  assert.equal(budget.held(), 0);
});
