// A node killed with SIGKILL loses nothing it answered: every usage record reaches the node's journal
// file (a write, not an fsync) before the answer's last byte, and a node restarted with the same
// --data-dir bills what the killed process answered last. Before the fix, the node journaled usage
// only at its next flush (every 250 ms), so the answers of its last moments were never billed:
// 6,000 answers, 5,994 billed.
import assert from 'node:assert/strict';
import { after, test } from 'node:test';
import { consoleClient, createKey } from '../helpers/console.js';
import { waitUntilKnown } from '../helpers/data-plane.js';
import { bearer } from '../helpers/http.js';
import { startControlPlane, startDataPlane, stopAll, tempDir } from '../helpers/processes.js';
import { usageTotalsOfKey, waitForUsageTotals } from '../helpers/usage-db.js';

after(stopAll);

test('a node SIGKILLed right after its answers bills every one of them once restarted from its --data-dir', { timeout: 120_000 }, async () => {
  const cp = await startControlPlane();
  const dataDir = tempDir('tollgate-sigkill-');
  let node = await startDataPlane(cp, { nodeId: 'killed', extraArgs: ['--data-dir', dataDir] });
  const c = consoleClient(cp.address, cp.secrets.operatorToken);
  const k = await createKey(c, { tier: 'paid' });
  await c.creditOrg({ orgId: k.orgId, amountMicros: 10_000_000, note: 'test' });
  c.close();
  await waitUntilKnown(node.url, k.key);

  // Answers counted as they arrive whole; the node is killed the moment the last one has.
  const answers = 40;
  let received = 0;
  for (let i = 0; i < answers; i++) {
    const res = await fetch(`${node.url}/v1/chat/completions`, {
      method: 'POST',
      headers: { ...bearer(k.key), 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'demo-chat', messages: [{ role: 'user', content: `answer ${i}` }] }),
    });
    assert.equal(res.status, 200);
    await res.json();
    received++;
  }
  await node.proc.kill('SIGKILL');
  assert.equal(received, answers);

  node = await startDataPlane(cp, { nodeId: 'killed', extraArgs: ['--data-dir', dataDir] });
  await waitForUsageTotals(cp.dbPath, k.keyId, answers, 30_000);
  const billed = (await usageTotalsOfKey(cp.dbPath, k.keyId)).reduce((n, r) => n + r.requests, 0);
  assert.equal(billed, answers, 'billed requests = answers received: none lost, none twice');
});
