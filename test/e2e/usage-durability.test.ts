// Zero loss and zero double count: three nodes under load while the control plane is SIGKILLed and
// restarted twice and one node is SIGKILLed (during the second outage, with unacknowledged reports in
// its journal) and restarted from its --data-dir. Afterwards the stored request-log rows equal the
// responses the clients received, the usage rows equal the model calls answered 200, and the
// organisation's spend equals the sum of the recorded costs. Every phase lasts until each client has
// received a number of responses (no fixed sleeps), and node 2 is killed once its journal on disk
// holds the rows of the last responses its client received.
import assert from 'node:assert/strict';
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { crc32 } from 'node:zlib';
import { after, test } from 'node:test';
import { decodeLogColumns } from '../../proto/lib/log-columns.js';
import { LogColumns, Report } from '../../proto/gen/tollgate/v1/sync.js';
import { USAGE_FLAG } from '../../data-plane/sync/journal-segments.js';
import { configYaml } from '../helpers/config.js';
import { consoleClient, createKey, type DemoKey } from '../helpers/console.js';
import { eventually, waitUntilKnown } from '../helpers/data-plane.js';
import { bearer } from '../helpers/http.js';
import { logRowsOf, queryDb as query } from '../helpers/usage-db.js';
import { startControlPlane, startDataPlane, stopAll, tempDir, type ControlPlane, type DataPlane } from '../helpers/processes.js';

after(stopAll);

async function logRows(dbPath: string, keyIds: string[], sinceMs: number): Promise<number> {
  return (await logRowsOf(dbPath, keyIds)).filter((r) => r.atMs >= sinceMs).length;
}

/**
 * The user agents of the request-log rows in a node's journal on disk (read only: complete records
 * with a good checksum, as the node reads them at start; a record still being written is not counted).
 */
function journaledAgents(dataDir: string): Set<string> {
  const dir = join(dataDir, 'journal');
  const agents = new Set<string>();
  let names: string[];
  try {
    names = readdirSync(dir).filter((n) => /^seg-\d+\.log$/.test(n)).sort();
  } catch {
    return agents;
  }
  for (const name of names) {
    let data: Buffer;
    try {
      data = readFileSync(join(dir, name));
    } catch {
      continue; // acknowledged and removed meanwhile
    }
    for (let off = 0; off + 8 <= data.length; ) {
      // A usage record (written as its answer ends) has the length's top bit set: skipped here.
      const word = data.readUInt32LE(off);
      const len = (word & ~USAGE_FLAG) >>> 0;
      if (off + 8 + len > data.length) break;
      const payload = data.subarray(off + 8, off + 8 + len);
      if (crc32(payload) !== data.readUInt32LE(off + 4)) break;
      if ((word & USAGE_FLAG) !== 0) {
        off += 8 + len;
        continue;
      }
      for (const b of Report.decode(payload).logBlocks) for (const row of decodeLogColumns(LogColumns.decode(b.columns)).rows) agents.add(row.userAgent);
      off += 8 + len;
    }
  }
  return agents;
}

/** A client that keeps sending chat requests to one node until stopped; counts what it received. */
class Load {
  /** Responses of requests that reached authentication (an edge 429 does not: it is not logged). */
  received = 0;
  edgeRefused = 0;
  ok = 0;
  failed = 0;
  /** Per worker, the user agent of its last received response (each request has its own). */
  readonly lastAgents: string[] = [];
  private running = true;
  private paused: Promise<void> | null = null;
  private unpause = () => {};
  private inFlight = 0;
  private readonly waiters = new Set<() => void>();
  private done: Promise<void>;
  url: string;

  constructor(url: string, private readonly keys: DemoKey[], private readonly label: string, concurrency = 2) {
    this.url = url;
    this.done = Promise.all(Array.from({ length: concurrency }, (_, w) => this.loop(w))).then(() => undefined);
  }

  private notify(): void {
    for (const w of [...this.waiters]) w();
  }

  private async loop(w: number): Promise<void> {
    let i = w;
    while (this.running) {
      if (this.paused) {
        await this.paused;
        continue;
      }
      const key = this.keys[i++ % this.keys.length];
      const agent = `durability-${this.label}-${w}-${i}`;
      this.inFlight++;
      try {
        const res = await fetch(`${this.url}/v1/chat/completions`, {
          method: 'POST',
          // Many client addresses behind the trusted proxy, so the per-IP edge budget rarely refuses.
          headers: { ...bearer(key.key), 'content-type': 'application/json', 'user-agent': agent, 'x-forwarded-for': `10.${w}.${(i >> 8) & 255}.${i & 255}` },
          body: JSON.stringify({ model: 'demo-chat', messages: [{ role: 'user', content: `request ${i}` }] }),
        });
        const text = await res.text();
        if (res.status === 429 && JSON.parse(text).error?.type === 'api_error') {
          this.edgeRefused++;
          continue;
        }
        this.received++;
        this.lastAgents[w] = agent;
        if (res.status === 200) this.ok++;
      } catch {
        // No answer (the node was killed mid-request): nothing was received.
        this.failed++;
        await new Promise((r) => setTimeout(r, 20));
      } finally {
        this.inFlight--;
        this.notify();
      }
    }
  }

  private until(check: () => boolean, what: string, timeoutMs = 120_000): Promise<void> {
    return new Promise((resolve, reject) => {
      const test = () => {
        if (!check()) return;
        this.waiters.delete(test);
        clearTimeout(timer);
        resolve();
      };
      const timer = setTimeout(() => {
        this.waiters.delete(test);
        reject(new Error(`${this.label}: timed out waiting for ${what} (received ${this.received}, failed ${this.failed})`));
      }, timeoutMs);
      this.waiters.add(test);
      test();
    });
  }

  /** Resolves once `n` more responses than now were received. */
  more(n: number): Promise<void> {
    const target = this.received + n;
    return this.until(() => this.received >= target, `${n} more responses`);
  }

  /** Stops sending; resolves once no request of this client is in flight. */
  async pause(): Promise<void> {
    this.paused = new Promise((r) => (this.unpause = r));
    await this.until(() => this.inFlight === 0, 'no request in flight');
  }

  resume(url?: string): void {
    if (url) this.url = url;
    this.paused = null;
    this.unpause();
  }

  async stop(): Promise<void> {
    this.running = false;
    this.resume();
    await this.done;
  }
}

/** Each client received `n` more responses. */
const phase = (loads: Load[], n: number) => Promise.all(loads.map((l) => l.more(n)));

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

test('three nodes under load, control plane killed and restarted twice, one node killed and restarted: every response is stored once and spend equals the costs', async (t) => {
  let cp: ControlPlane = await startControlPlane({ configYaml: configYaml((c) => (c.trusted_proxies = ['127.0.0.1/32'])) });
  const restartCp = async () => {
    cp = await startControlPlane({ dir: cp.dir, secrets: cp.secrets, listen: cp.address, configPath: cp.configPath });
  };
  const dataDirs = [tempDir('tollgate-node-a-'), tempDir('tollgate-node-b-'), tempDir('tollgate-node-c-')];
  const nodes: DataPlane[] = [];
  for (let i = 0; i < 3; i++) nodes.push(await startDataPlane(cp, { nodeId: `dur-${i}`, extraArgs: ['--data-dir', dataDirs[i]] }));

  const c = consoleClient(cp.address, cp.secrets.operatorToken);
  const first = await createKey(c, { tier: 'paid' });
  await c.creditOrg({ orgId: first.orgId, amountMicros: 1_000_000_000, note: 'durability test' });
  const keys: DemoKey[] = [first];
  for (let i = 0; i < 5; i++) keys.push(await createKey(c, { orgId: first.orgId, projectId: first.projectId }));
  c.close();
  for (const n of nodes) for (const k of keys) await waitUntilKnown(n.url, k.key);
  const loadStart = Date.now() + 1;
  while (Date.now() <= loadStart) await sleep(2);

  const loads = nodes.map((n, i) => new Load(n.url, keys.slice(i * 2, i * 2 + 2), `node${i}`));
  // A failed step must not leave the loads running: the file would never end (seen: the suite hung here).
  t.after(() => Promise.all(loads.map((l) => l.stop())));
  await phase(loads, 60);
  // First outage: the nodes keep answering without their control plane.
  await cp.proc.kill('SIGKILL');
  await phase(loads, 60);
  await restartCp();
  await phase(loads, 60);
  // Second outage; meanwhile node 2 has no traffic, then is killed with unacknowledged reports in its journal.
  await cp.proc.kill('SIGKILL');
  await phase(loads, 30);
  await loads[2].pause();
  // Node 2 is killed once its journal on disk holds the rows of each worker's last response (reports
  // are journaled in order, so every earlier response's rows are there too).
  const last = loads[2].lastAgents.filter(Boolean);
  await eventually(async () => {
    const agents = journaledAgents(dataDirs[2]);
    return last.every((a) => agents.has(a));
  }, `node 2 journaled the rows of its last responses (${last.join(', ')})`, 30_000);
  await nodes[2].proc.kill('SIGKILL');
  await restartCp();
  nodes[2] = await startDataPlane(cp, { nodeId: 'dur-2', extraArgs: ['--data-dir', dataDirs[2]] });
  assert.match(nodes[2].proc.output() + (await nodes[2].proc.waitFor(/journal: \d+ unacknowledged reports/, 10_000))[0], /journal: \d+ unacknowledged reports/);
  loads[2].resume(nodes[2].url);
  await phase(loads, 60);
  await Promise.all(loads.map((l) => l.stop()));

  const received = loads.reduce((s, l) => s + l.received, 0);
  const ok = loads.reduce((s, l) => s + l.ok, 0);
  assert.ok(received > 100, `enough load: ${received} responses`);
  const keyIds = keys.map((k) => k.keyId);
  // The organisation's only model calls are the load's (waiting for keys to be known asks for /v1/models).
  const usageCount = async () => (await query<{ n: number }>(cp.dbPath, `SELECT COALESCE(SUM(requests), 0) AS n FROM usage_minutes WHERE org_id = ?`, [first.orgId]))[0].n;
  let logs = 0;
  let usage = 0;
  await eventually(async () => {
    logs = await logRows(cp.dbPath, keyIds, loadStart);
    usage = await usageCount();
    return logs >= received && usage >= ok;
  }, `all rows stored (logs ${logs}/${received}, usage ${usage}/${ok})`, 60_000).catch((err) => {
    throw new Error(`${(err as Error).message}: logs ${logs} of ${received}, usage ${usage} of ${ok}`);
  });
  // Every node's journal is empty: nothing is left to send (so nothing can arrive later and be counted twice).
  for (const n of nodes) await n.proc.kill('SIGTERM');
  assert.equal(await logRows(cp.dbPath, keyIds, loadStart), received, 'request-log rows equal the responses the clients received');
  assert.equal(await usageCount(), ok, 'usage counts exactly the model calls answered 200');
  const [spend] = await query<{ spend: number; sum: number }>(
    cp.dbPath,
    'SELECT (SELECT spend_total_micros FROM orgs WHERE id = ?) AS spend, (SELECT COALESCE(SUM(cost_micros), 0) FROM usage_minutes WHERE org_id = ?) AS sum',
    [first.orgId, first.orgId],
  );
  assert.ok(spend.sum > 0);
  assert.equal(spend.spend, spend.sum, 'total spend equals the sum of the recorded costs');
  const [month] = await query<{ spend: number }>(cp.dbPath, 'SELECT SUM(spend_micros) AS spend FROM org_spend WHERE org_id = ?', [first.orgId]);
  assert.equal(month.spend, spend.sum, 'monthly spend equals the sum of the recorded costs');
});
