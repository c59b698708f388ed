// `npm start`, the embedded default: on a new database it prints a key once and a curl line that
// returns a chat completion from the demo provider; a second start prints no key; SIGINT stops both
// processes cleanly.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { ROOT, startOnFreePorts, startProcess, stopAll, tempDir, type Proc } from '../helpers/processes.js';
import { bearer, request } from '../helpers/http.js';

after(stopAll);

test('npm start prints a key once with a working curl line, and Ctrl-C stops both processes', async () => {
  const cwd = tempDir('tollgate-start-');
  // The launcher keeps its data under its working directory.
  const { proc, cpPort, dpPort } = await startOnFreePorts((cpPort, dpPort) => startProcessIn(cwd, cpPort, dpPort));
  const out = proc.output();
  const keys = out.match(/sk-tollgate-[0-9A-Za-z]{43}/g) ?? [];
  assert.ok(keys.length >= 1, out);
  const key = keys[0] as string;
  // The key appears in the printed key line and the curl line only.
  assert.equal(out.split(key).length - 1, 2);
  const curl = out.split('\n').find((l) => l.trim().startsWith('curl '));
  assert.ok(curl, 'a curl line is printed');
  assert.match(curl!, new RegExp(`http://127\\.0\\.0\\.1:${dpPort}/v1/chat/completions`));
  // What the curl line does, over HTTP.
  const body = JSON.parse(/-d '([^']+)'/.exec(curl!)![1]);
  const res = await request(`http://127.0.0.1:${dpPort}/v1/chat/completions`, { method: 'POST', headers: bearer(key), json: body });
  assert.equal(res.status, 200, res.text);
  assert.equal(res.body.object, 'chat.completion');
  assert.equal(typeof res.body.choices[0].message.content, 'string');
  assert.ok(res.body.usage.total_tokens > 0);
  // Secrets were generated with mode 0600: the tokens into ./data, the pepper apart from the database.
  for (const f of ['secrets/pepper', 'data/node-token', 'data/operator-token']) {
    const st = statSync(join(cwd, f));
    assert.equal(st.mode & 0o777, 0o600, f);
  }
  assert.equal(existsSync(join(cwd, 'data', 'pepper')), false, 'a backup of ./data does not hold the pepper');
  assert.ok(existsSync(join(cwd, 'data', 'tollgate.db')));
  // Ctrl-C.
  proc.child.kill('SIGINT');
  const code = await new Promise<number | null>((resolve) => proc.child.on('exit', (c) => resolve(c)));
  assert.equal(code, 0);
  // Before the fix the launcher stopped the control plane with the node: the node's drain then waited
  // its whole --drain-seconds (30 s) for acknowledgements of the request's usage that could never come.
  assert.match(proc.output(), /\[data-plane\] .*drained: usage acknowledged by the control plane/);
  assert.doesNotMatch(proc.output(), /usage reports were not acknowledged/);
  const gone = await request(`http://127.0.0.1:${dpPort}/v1/models`).then(
    () => false,
    () => true,
  );
  assert.ok(gone, 'the node stopped with the launcher');

  // A second start on the same data: no new key is printed (keys are shown only at creation).
  const again = startProcessIn(cwd, cpPort, dpPort);
  await again.waitFor(/Tollgate is running/, 60_000);
  assert.doesNotMatch(again.output(), /sk-tollgate-[0-9A-Za-z]{43}/);
  assert.match(again.output(), /Existing database/);
  const still = await request(`http://127.0.0.1:${dpPort}/v1/chat/completions`, { method: 'POST', headers: bearer(key), json: body });
  assert.equal(still.status, 200, 'the key from the first start still works');
  again.child.kill('SIGINT');
  await new Promise((resolve) => again.child.on('exit', resolve));
});

function startProcessIn(cwd: string, cpPort: number, dpPort: number): Proc {
  return startProcess(
    [join(ROOT, 'cli', 'start.ts')],
    {
      TOLLGATE_CONTROL_PLANE_LISTEN: `127.0.0.1:${cpPort}`,
      TOLLGATE_DATA_PLANE_LISTEN: `127.0.0.1:${dpPort}`,
      TOLLGATE_PEPPER: '',
      TOLLGATE_OPERATOR_TOKEN: '',
      TOLLGATE_NODE_TOKEN: '',
    },
    { cwd },
  );
}
