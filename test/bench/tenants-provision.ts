// bench:tenants' tenants: the control plane's config, the K keys in O organisations seeded straight
// into its SQLite database (then, for PostgreSQL, moved into a real server by the tested move), the
// Zipf law that picks a key, and the wait until a node knows the keys.
import { join } from 'node:path';
import { SqliteDb } from '../../control-plane/store/sqlite-db.js';
import { moveSqliteToPostgres } from '../../control-plane/store/sqlite-to-postgres.js';
import { hashKey } from '../../proto/lib/keys.js';
import { configYaml } from '../helpers/config.js';
import { consoleClient, createKey } from '../helpers/console.js';
import { startPostgres } from '../helpers/postgres-server.js';
import { startControlPlane, type ControlPlane, type DataPlane } from '../helpers/processes.js';
import { treeCpuMicros } from './procstat.js';
import { opts, sleep } from './tenants-options.js';

/** The store a run's control plane keeps its state in, and how to read its database server's CPU. */
export interface Store {
  name: 'sqlite' | 'postgres';
  /** CPU µs of the database server's processes so far; null: SQLite, inside the control plane. */
  dbCpu: (() => number | null) | null;
}

export interface Provisioned {
  cp: ControlPlane;
  store: Store;
  /** The control key (its own organisation), with `withControl`. */
  controlKey: string | null;
  /** Stops the control plane and the database server. */
  stop(): Promise<void>;
}

/**
 * A control plane on `storeName` holding `keys` keys in `orgs` organisations (and a control key):
 * created on SQLite, seeded there, and for PostgreSQL moved into one database of a fresh server
 * with control-plane/store/sqlite-to-postgres.ts (what `npm run move-to-postgres` runs), then
 * restarted on it with --database-url and the same secrets.
 */
export async function provision(storeName: Store['name'], keys: number, orgs: number, withControl: boolean): Promise<Provisioned> {
  const first = await startControlPlane({ configYaml: benchConfig() });
  let controlKey: string | null = null;
  if (withControl) {
    const admin = consoleClient(first.address, first.secrets.operatorToken);
    controlKey = (await createKey(admin, { tier: 'bench' })).key;
    admin.close();
  }
  await first.proc.kill('SIGTERM');
  const seed0 = performance.now();
  await seedTenants(first.dbPath, first.secrets.pepper, keys, orgs);
  console.log(`  ${storeName}: seeded ${keys.toLocaleString('en')} keys in ${orgs.toLocaleString('en')} organisations in ${((performance.now() - seed0) / 1000).toFixed(1)} s`);
  let databaseUrl: string | undefined;
  let store: Store = { name: 'sqlite', dbCpu: null };
  let stopDb = async () => {};
  if (storeName === 'postgres') {
    const pgServer = await startPostgres();
    process.once('exit', () => pgServer.stopNow());
    stopDb = () => pgServer.stop();
    databaseUrl = await pgServer.createDatabase('tollgate_bench');
    const move0 = performance.now();
    const moved = await moveSqliteToPostgres({ dbPath: first.dbPath, logsDbPath: join(first.dir, 'logs.db') }, databaseUrl, () => {});
    const rows = moved.tables.reduce((n, t) => n + t.rows, 0);
    console.log(`  postgres: moved ${rows.toLocaleString('en')} rows into PostgreSQL (server pid ${pgServer.pid}) in ${((performance.now() - move0) / 1000).toFixed(1)} s`);
    store = { name: 'postgres', dbCpu: () => treeCpuMicros(pgServer.pid) };
  }
  const nodeArgs = opts['cpu-prof'] ? ['--cpu-prof', `--cpu-prof-dir=${opts['cpu-prof']}`] : [];
  const cp = await startControlPlane({ dir: first.dir, secrets: first.secrets, configPath: first.configPath, adminListen: true, nodeArgs, databaseUrl });
  return {
    cp,
    store,
    controlKey,
    async stop() {
      await cp.proc.kill('SIGTERM');
      await stopDb();
    },
  };
}

export function benchConfig(): string {
  return configYaml((cfg) => {
    cfg.trusted_proxies = ['127.0.0.1'];
    cfg.tiers.bench = { rpm: 1_000_000_000_000, tpm: 1_000_000_000_000_000, max_parallel_requests: 1_000_000, monthly_cap_usd: null, free_grant_usd: '1000000000', models: ['demo-chat'] };
  });
}

/** The value of tenant key i: fixed characters, so the run can present it and hash it. */
export const tenantKey = (i: number) => `sk-tollgate-bench${String(i).padStart(38, '0')}`;

/**
 * Seeds `keys` keys in `orgs` organisations (one project each) into a stopped control plane's
 * database, multi-row inserts in one transaction. Key i belongs to organisation i mod orgs.
 */
export async function seedTenants(dbPath: string, pepper: string, keys: number, orgs: number): Promise<void> {
  const db = await SqliteDb.open(dbPath);
  const now = new Date().toISOString();
  const pep = Buffer.from(pepper, 'utf8');
  const orgId = (j: number) => `org_t${String(j).padStart(7, '0')}`;
  const projectId = (j: number) => `proj_t${String(j).padStart(7, '0')}`;
  const keyId = (i: number) => `key_t${String(i).padStart(8, '0')}`;
  const insert = async (sql: string, width: number, n: number, row: (i: number) => (string | number)[]) => {
    const chunk = Math.floor(900 / width);
    for (let i = 0; i < n; i += chunk) {
      const m = Math.min(chunk, n - i);
      const params: (string | number)[] = [];
      for (let j = i; j < i + m; j++) params.push(...row(j));
      await db.run(`${sql} VALUES ${Array.from({ length: m }, () => `(${Array(width).fill('?').join(', ')})`).join(', ')}`, params);
    }
  };
  await db.exec('BEGIN');
  await insert('INSERT INTO orgs (id, name, tier, created_at)', 4, orgs, (j) => [orgId(j), `tenant ${j}`, 'bench', now]);
  await insert('INSERT INTO projects (id, org_id, name, created_at)', 4, orgs, (j) => [projectId(j), orgId(j), 'project', now]);
  await insert(
    "INSERT INTO api_keys (id, project_id, org_id, name, key_prefix, allowed_models, status, rpm_limit, tpm_limit, max_parallel_requests, created_at)",
    11,
    keys,
    (i) => [keyId(i), projectId(i % orgs), orgId(i % orgs), 'tenant', `${tenantKey(i).slice(0, 12)}...${tenantKey(i).slice(-4)}`, '[]', 'active', 1_000_000_000_000, 1_000_000_000_000_000, 1_000_000, now],
  );
  await insert('INSERT INTO credentials (key_hash, key_id)', 2, keys, (i) => [hashKey(pep, tenantKey(i)), keyId(i)]);
  await db.exec('COMMIT');
  await db.close();
}

/** Zipf sampler over ranks 0..n-1 (rank r has weight 1/(r+1)^s): a cumulative table and a binary search. */
export function zipfSampler(n: number, s: number): () => number {
  const cdf = new Float64Array(n);
  let sum = 0;
  for (let r = 0; r < n; r++) {
    sum += 1 / Math.pow(r + 1, s);
    cdf[r] = sum;
  }
  return () => {
    const u = Math.random() * sum;
    let lo = 0;
    let hi = n - 1;
    while (lo < hi) {
      const mid = (lo + hi) >> 1;
      if (cdf[mid] < u) lo = mid + 1;
      else hi = mid;
    }
    return lo;
  };
}

export async function waitForKeys(node: DataPlane, keys: string[]): Promise<void> {
  for (const key of keys) {
    for (let i = 0; ; i++) {
      const r = await fetch(`${node.url}/v1/models`, { headers: { authorization: `Bearer ${key}`, 'x-forwarded-for': '10.0.0.1' } });
      await r.arrayBuffer();
      if (r.status === 200) break;
      if (i > 800) throw new Error(`node ${node.url} never learnt key ${key.slice(0, 20)}…`);
      await sleep(25);
    }
  }
}
