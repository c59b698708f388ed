// A node's heap settings: the flags every launcher uses are the ones package.json's `data-plane`
// script uses, this Node accepts them and sets the limit they name, and a node nearing that limit
// warns once per crossing.
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { test } from 'node:test';
import { NODE_HEAP_FLAGS, NODE_MEMORY_ENV } from '../../data-plane/heap-flags.js';
import { heapWatch } from '../../data-plane/heap-watch.js';
import { ROOT } from '../helpers/processes.js';

test("package.json's data-plane script starts the node with exactly NODE_HEAP_FLAGS and NODE_MEMORY_ENV's defaults", () => {
  const script: string = JSON.parse(readFileSync(`${ROOT}/package.json`, 'utf8')).scripts['data-plane'];
  const env = Object.entries(NODE_MEMORY_ENV).map(([k, v]) => `${k}=\${${k}:-${v}} `).join('');
  assert.equal(script, `${env}tsx ${NODE_HEAP_FLAGS.join(' ')} data-plane/main.ts`);
  for (const launcher of ['cli/start.ts', 'cli/cluster.ts']) {
    assert.match(readFileSync(`${ROOT}/${launcher}`, 'utf8'), /nodeArgs: NODE_HEAP_FLAGS, envDefaults: NODE_MEMORY_ENV/, launcher);
  }
});

test("the script's shell gives MALLOC_ARENA_MAX its default and keeps the operator's value", () => {
  const script: string = JSON.parse(readFileSync(`${ROOT}/package.json`, 'utf8')).scripts['data-plane'];
  const asRun = (env: Record<string, string>) =>
    spawnSync('sh', ['-c', script.replace(/ tsx .*$/, ' sh -c \'echo $MALLOC_ARENA_MAX\'')], { encoding: 'utf8', env: { PATH: process.env.PATH ?? '', ...env } }).stdout.trim();
  assert.equal(asRun({}), NODE_MEMORY_ENV.MALLOC_ARENA_MAX);
  assert.equal(asRun({ MALLOC_ARENA_MAX: '4' }), '4');
});

test('this Node takes the flags: the heap limit is the one they set', () => {
  const r = spawnSync(process.execPath, [...NODE_HEAP_FLAGS, '-e', 'console.log(require("v8").getHeapStatistics().heap_size_limit)'], { encoding: 'utf8' });
  assert.equal(r.status, 0, r.stderr);
  const mb = Number(r.stdout.trim()) / 1048576;
  const oldSpace = Number(NODE_HEAP_FLAGS.find((f) => f.startsWith('--max-old-space-size='))!.split('=')[1]);
  // The limit is the old generation's plus the young generation's share.
  assert.ok(mb >= oldSpace && mb < oldSpace + 64, `heap limit ${mb} MB for --max-old-space-size=${oldSpace}`);
});

test('heapWatch warns once above 70% of the limit and again only after falling below 60%', () => {
  let used = 0;
  const lines: string[] = [];
  const check = heapWatch((l) => lines.push(l), () => ({ used_heap_size: used * 1048576, heap_size_limit: 1000 * 1048576 }));
  used = 690;
  check();
  assert.deepEqual(lines, []);
  used = 710;
  check();
  check();
  assert.equal(lines.length, 1);
  assert.match(lines[0], /heap 710 MB used of its 1000 MB limit: start the node with a larger --max-old-space-size/);
  used = 650;
  check();
  used = 720;
  check();
  assert.equal(lines.length, 1, 'not re-armed above 60%');
  used = 590;
  check();
  used = 750;
  check();
  assert.equal(lines.length, 2);
});
