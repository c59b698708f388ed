// `npm start` as an operator meets it: `--help` prints usage and starts nothing; a port in use is
// named with the flag that changes it; exported TOLLGATE_* secrets that differ from the files are
// ignored with a warning (the files match the database); SIGTERM to the npm process alone stops every
// child, and so does the launcher being SIGKILLed. Before, the control plane and node were orphaned.
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { connect, createServer, type Server } from 'node:net';
import { join } from 'node:path';
import { after, test } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import { pathToFileURL } from 'node:url';
import { bearer, request } from '../helpers/http.js';
import { freePort, ROOT, runProcessAsync, startOnFreePorts, startProcess, stopAll, tempDir, type Proc } from '../helpers/processes.js';

after(stopAll);

const NO_SECRET_ENV = { TOLLGATE_PEPPER: '', TOLLGATE_OPERATOR_TOKEN: '', TOLLGATE_NODE_TOKEN: '', TOLLGATE_CONTROL_PLANE_LISTEN: '', TOLLGATE_DATA_PLANE_LISTEN: '' };

function accepts(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const s = connect({ host: '127.0.0.1', port });
    s.once('connect', () => {
      s.destroy();
      resolve(true);
    });
    s.once('error', () => resolve(false));
  });
}

async function waitClosed(ports: number[], what: string): Promise<void> {
  const deadline = Date.now() + 20_000;
  for (;;) {
    const open = [];
    for (const p of ports) if (await accepts(p)) open.push(p);
    if (open.length === 0) return;
    if (Date.now() > deadline) throw new Error(`${what}: ports ${open.join(', ')} still accept connections`);
    await sleep(100);
  }
}

function startArgs(dir: string, cpPort: number, dpPort: number): string[] {
  return ['--data-dir', join(dir, 'data'), '--secrets-dir', join(dir, 'secrets'), '--control-plane-listen', `127.0.0.1:${cpPort}`, '--listen', `127.0.0.1:${dpPort}`];
}

async function startLauncher(dir: string, env: Record<string, string> = NO_SECRET_ENV): Promise<{ proc: Proc; cpPort: number; dpPort: number }> {
  return startOnFreePorts((cpPort, dpPort) => startProcess([join(ROOT, 'cli', 'start.ts'), ...startArgs(dir, cpPort, dpPort)], env, { cwd: dir }));
}

test('npm start -- --help prints the usage and starts nothing', async () => {
  const dir = tempDir('tollgate-start-help-');
  const r = await runProcessAsync('npm', ['start', '--silent', '--', '--data-dir', join(dir, 'data'), '--help'], { env: { ...process.env, ...NO_SECRET_ENV } });
  assert.equal(r.code, 0, r.stderr);
  assert.match(r.stdout, /Usage: npm start \[-- OPTIONS\]/);
  assert.match(r.stdout, /--listen HOST:PORT/);
  assert.match(r.stdout, /--control-plane-listen HOST:PORT/);
  assert.equal(existsSync(join(dir, 'data')), false);

  const bad = await runProcessAsync(process.execPath, ['--import', pathToFileURL(join(ROOT, 'node_modules', 'tsx', 'dist', 'loader.mjs')).href, join(ROOT, 'cli', 'start.ts'), '--port', '1'], { cwd: dir, env: { ...process.env, ...NO_SECRET_ENV } });
  assert.equal(bad.code, 2);
  assert.match(bad.stderr, /^npm start: Unknown option '--port'/);
  assert.match(bad.stderr, /Usage: npm start/);
});

test('a port in use is named with the flag that changes it', async (t) => {
  const dir = tempDir('tollgate-start-busy-');
  const busy: Server = createServer();
  await new Promise<void>((resolve) => busy.listen(0, '127.0.0.1', resolve));
  t.after(() => busy.close());
  const busyPort = (busy.address() as { port: number }).port;
  const free = await freePort();

  const api = startProcess([join(ROOT, 'cli', 'start.ts'), ...startArgs(dir, free, busyPort)], NO_SECRET_ENV, { cwd: dir });
  await api.waitFor(new RegExp(`npm start failed: 127\\.0\\.0\\.1:${busyPort} \\(the node's API port\\) is already in use; choose another with --listen HOST:PORT`));
  const code = api.child.exitCode ?? (await new Promise<number | null>((resolve) => api.child.once('exit', (c) => resolve(c))));
  assert.equal(code, 1);

  const cp = startProcess([join(ROOT, 'cli', 'start.ts'), ...startArgs(dir, busyPort, free)], NO_SECRET_ENV, { cwd: dir });
  await cp.waitFor(/is already in use; choose another with --control-plane-listen HOST:PORT/);
  assert.equal(await accepts(free), false, 'nothing was started');
});

test('the secret files win over a differing environment, with a warning naming the variable', async () => {
  const dir = tempDir('tollgate-start-env-');
  const { proc: first, cpPort, dpPort } = await startLauncher(dir);
  const key = /sk-tollgate-[0-9A-Za-z]{43}/.exec(first.output())![0];
  first.child.kill('SIGINT');
  await new Promise((resolve) => first.child.once('exit', resolve));

  // As the multi-node section once said: secrets exported in the shell.
  const env = { ...NO_SECRET_ENV, TOLLGATE_PEPPER: 'e'.repeat(64), TOLLGATE_OPERATOR_TOKEN: `op_${'x'.repeat(40)}` };
  const second = startProcess([join(ROOT, 'cli', 'start.ts'), ...startArgs(dir, cpPort, dpPort)], env, { cwd: dir });
  await second.waitFor(/Tollgate is running/, 60_000);
  const out = second.output();
  assert.match(out, /warning: TOLLGATE_PEPPER is set but differs from \S*secrets\/pepper; the file is used/);
  assert.match(out, /warning: TOLLGATE_OPERATOR_TOKEN is set but differs from \S*data\/operator-token; the file is used/);
  assert.doesNotMatch(out, /TOLLGATE_NODE_TOKEN is set/);
  // The key made on the first start still authenticates: the file's pepper was used.
  const r = await request(`http://127.0.0.1:${dpPort}/v1/models`, { headers: bearer(key) });
  assert.equal(r.status, 200);
  assert.ok(!out.includes('e'.repeat(64)), 'the pepper is never printed');
  second.child.kill('SIGINT');
  await new Promise((resolve) => second.child.once('exit', resolve));
});

test('a pepper left in ./data by an older npm start is moved out of it', async () => {
  const dir = tempDir('tollgate-start-move-');
  mkdirSync(join(dir, 'data'));
  writeFileSync(join(dir, 'data', 'pepper'), `${'a'.repeat(64)}\n`, { mode: 0o600 });
  const { proc: p } = await startLauncher(dir);
  assert.match(p.output(), /moved the key pepper from \S*data\/pepper to \S*secrets\/pepper/);
  assert.equal(existsSync(join(dir, 'data', 'pepper')), false);
  assert.equal(readFileSync(join(dir, 'secrets', 'pepper'), 'utf8').trim(), 'a'.repeat(64));
  p.child.kill('SIGINT');
  await new Promise((resolve) => p.child.once('exit', resolve));
});

test('SIGTERM to the npm process alone stops the control plane and the node', async () => {
  const dir = tempDir('tollgate-start-term-');
  // npm itself is the process signalled here, so startOnFreePorts (which starts the launcher) does not
  // fit: the same retry on a port taken between finding it free and binding it, by hand.
  let started: { npm: ReturnType<typeof spawn>; exited: Promise<void>; cpPort: number; dpPort: number } | null = null;
  for (let attempt = 1; !started; attempt++) {
    const [cpPort, dpPort] = [await freePort(), await freePort()];
    const npm = spawn('npm', ['start', '--', ...startArgs(dir, cpPort, dpPort)], { cwd: ROOT, env: { ...process.env, ...NO_SECRET_ENV }, stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    npm.stdout!.on('data', (c) => (out += c));
    npm.stderr!.on('data', (c) => (out += c));
    const exited = new Promise<void>((resolve) => npm.once('exit', () => resolve()));
    const deadline = Date.now() + 60_000;
    while (!out.includes('Tollgate is running') && !(out.includes('already in use') && npm.exitCode !== null)) {
      if (Date.now() > deadline || (npm.exitCode !== null && !out.includes('already in use'))) throw new Error(`npm start did not come up:\n${out}`);
      await sleep(100);
    }
    if (out.includes('Tollgate is running')) started = { npm, exited, cpPort, dpPort };
    else if (attempt === 3) throw new Error(`no free ports after 3 tries:\n${out}`);
  }
  const { npm, exited, cpPort, dpPort } = started;
  assert.ok(await accepts(cpPort));
  assert.ok(await accepts(dpPort));
  npm.kill('SIGTERM');
  await exited;
  await waitClosed([cpPort, dpPort], 'after SIGTERM to npm');
});

test('a launcher killed with SIGKILL takes its children with it', async () => {
  const dir = tempDir('tollgate-start-kill-');
  const { proc: p, cpPort, dpPort } = await startLauncher(dir);
  await p.kill('SIGKILL');
  await waitClosed([cpPort, dpPort], 'after SIGKILL of the launcher');
});
