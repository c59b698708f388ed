// Helpers for the CLI's end-to-end tests: build an account/organisation/project through the CLI
// process, and assert on the CLI's one-line failures.
import assert from 'node:assert/strict';
import { cliJsonAsync, runCliAsync, type CliResult } from './processes.js';

type Cp = { address: string };

export interface CliAccount {
  id: string;
  name: string;
  token: string;
}

export interface CliOrgSetup {
  owner: CliAccount;
  orgId: string;
  projectId: string;
}

/** Creates an account through the CLI process without blocking the event loop. */
export async function createAccountAsync(cp: Cp, operatorToken: string, name: string): Promise<CliAccount> {
  const a = await cliJsonAsync(cp, operatorToken, ['account', 'create', '--name', name]);
  assert.equal(typeof a.token, 'string');
  return { id: a.id, name: a.name, token: a.token };
}

/** An account that owns a new organisation (on `tier`) with one project, without blocking the event loop. */
export async function createOrgWithProjectAsync(cp: Cp, operatorToken: string, label: string, tier = 'free'): Promise<CliOrgSetup> {
  const owner = await createAccountAsync(cp, operatorToken, `${label}-owner`);
  const org = await cliJsonAsync(cp, operatorToken, ['org', 'create', '--name', label, '--owner', owner.id, '--tier', tier]);
  const project = await cliJsonAsync(cp, owner.token, ['project', 'create', '--org', org.id, '--name', `${label}-project`]);
  return { owner, orgId: org.id, projectId: project.id };
}

/**
 * A failed call: non-zero exit, the first stderr line starts with `status`, nothing on stdout,
 * and no stack trace anywhere.
 */
export function assertFails(r: CliResult, status: number, what: string, opts: { exitCode?: number; message?: RegExp } = {}): string {
  const first = r.stderr.split('\n')[0];
  assert.notEqual(r.code, 0, `${what}: expected failure, got exit 0 with ${r.stdout}`);
  if (opts.exitCode !== undefined) assert.equal(r.code, opts.exitCode, `${what}: exit code; stderr: ${r.stderr}`);
  assert.match(first, new RegExp(`^${status} \\S`), `${what}: stderr should start with ${status}; got: ${r.stderr}`);
  if (opts.message) assert.match(first, opts.message, `${what}: message`);
  assertNoStackTrace(r, what);
  assert.equal(r.stdout, '', `${what}: nothing on stdout`);
  return first;
}

export function assertNoStackTrace(r: CliResult, what: string): void {
  const all = `${r.stdout}\n${r.stderr}`;
  assert.doesNotMatch(all, /^\s+at /m, `${what}: a stack trace was printed:\n${all}`);
  assert.doesNotMatch(all, /\.ts:\d+:\d+/, `${what}: a source location was printed:\n${all}`);
}

/** A usage error: exit 2, `400 …`, then the usage of the command. */
export function assertUsageError(r: CliResult, what: string, message?: RegExp): void {
  assertFails(r, 400, what, { exitCode: 2, message });
  assert.match(r.stderr, /Usage: tollgate/, `${what}: usage printed; got ${r.stderr}`);
}

/**
 * Runs independent CLI calls a few at a time (each is a process start of about half a second) and
 * returns their results in order. Only for calls whose order does not matter.
 */
export async function runMany(cp: Cp, calls: [token: string | undefined, args: string[]][], concurrency = 4): Promise<CliResult[]> {
  const results: CliResult[] = new Array(calls.length);
  let next = 0;
  const worker = async () => {
    while (next < calls.length) {
      const i = next++;
      results[i] = await runCliAsync(cp, calls[i][0], calls[i][1]);
    }
  };
  await Promise.all(Array.from({ length: Math.min(concurrency, calls.length) }, worker));
  return results;
}
