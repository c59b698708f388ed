// Owner records bounded per organisation (data-plane/state/response-owners.ts): an organisation past
// its bound loses its own records, however many projects it spreads them over, and the node's cap
// takes from the organisation holding the most, so an organisation holding no more than its share
// of the cap never loses a record to another's flood (docs/design.md#owner-records).
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { ResponseOwners } from '../../data-plane/state/response-owners.js';
import { OldestFirst } from '../../data-plane/state/oldest-first.js';

/** Adds `count` records of `projectId` (of `orgId`) named `prefix0…`, created from `at` on. */
function fill(o: ResponseOwners, orgId: string | undefined, projectId: string, prefix: string, count: number, at: number): string[] {
  const ids: string[] = [];
  for (let i = 0; i < count; i++) {
    const id = `${prefix}${i}`;
    o.add(id, { projectId, orgId, model: 'chat', createdAtMs: at + i });
    ids.push(id);
  }
  return ids;
}

const held = (o: ResponseOwners, ids: string[]) => ids.filter((id) => o.get(id, 1_000_000) !== undefined).length;

test("an organisation with many projects filling the node cannot evict another organisation's records", () => {
  // Before the fix the node's cap took from the project holding the most, whoever's: an organisation
  // with many projects, each within its bound, filled the node and evicted another organisation's
  // records (issue 34's finding).
  const o = new ResponseOwners({ maxEntries: 100, perProject: () => 10, perOrg: () => 40 });
  const victim = [0, 1, 2].flatMap((p) => fill(o, 'org_b', `proj_b${p}`, `b${p}_`, 10, 1));
  const flood: string[] = [];
  for (let p = 0; p < 30; p++) flood.push(...fill(o, 'org_a', `proj_a${p}`, `a${p}_`, 10, 100 + p * 10));
  assert.equal(held(o, victim), 30, "every record of the other organisation is kept");
  assert.equal(held(o, flood), 40, 'the flooding organisation keeps its bound');
  // Taken from its projects holding the most: each keeps its newest.
  for (let p = 0; p < 30; p++) assert.equal(held(o, [`a${p}_9`]), 1, `project ${p}'s newest`);
  assert.ok(o.size <= 100);
});

test('past its bound an organisation loses its own records, from its project holding the most', () => {
  const o = new ResponseOwners({ maxEntries: 1_000, perProject: () => 100, perOrg: () => 30 });
  const other = fill(o, 'org_b', 'proj_b', 'b', 30, 1);
  const big = fill(o, 'org_a', 'proj_a1', 'x', 30, 10);
  const small = fill(o, 'org_a', 'proj_a2', 'y', 5, 100);
  assert.equal(held(o, other), 30);
  assert.equal(held(o, small), 5, 'the new project keeps what it made');
  assert.equal(held(o, big), 25, 'the largest project gave up its oldest');
  assert.equal(held(o, big.slice(0, 5)), 0);
});

test("at the node's cap an organisation within its share is never evicted, however many organisations flood", () => {
  // Many organisations (a free account can make many), each spreading small projects: the cap takes
  // from the organisation holding the most, never from one holding no more than cap / organisations.
  const o = new ResponseOwners({ maxEntries: 100, perProject: () => 100, perOrg: () => 40 });
  const victim = fill(o, 'org_b', 'proj_b', 'b', 8, 1);
  for (let org = 0; org < 10; org++) {
    for (let p = 0; p < 10; p++) fill(o, `org_a${org}`, `proj_a${org}_${p}`, `a${org}_${p}_`, 4, 100 + org * 100 + p * 4);
  }
  assert.ok(o.size <= 100, `${o.size} records`);
  assert.equal(held(o, victim), 8, 'an organisation within its share keeps every record');
});

test("records the sync brings name no organisation: the project's is the one of the key that asked for them", () => {
  const o = new ResponseOwners({ maxEntries: 1_000, perProject: () => 100, perOrg: () => 10, placed: true });
  o.whenHeld({ projectId: 'proj_a1', orgId: 'org_a' }, 10_000, () => {});
  o.whenHeld({ projectId: 'proj_a2', orgId: 'org_a' }, 10_000, () => {});
  o.whenHeld({ projectId: 'proj_b', orgId: 'org_b' }, 10_000, () => {});
  o.caughtUp(['proj_a1', 'proj_a2', 'proj_b']);
  const b = fill(o, undefined, 'proj_b', 'b', 10, 1);
  const a1 = fill(o, undefined, 'proj_a1', 'x', 10, 10);
  const a2 = fill(o, undefined, 'proj_a2', 'y', 10, 20);
  assert.equal(held(o, b), 10);
  assert.equal(held(o, a1) + held(o, a2), 10, 'the two projects of one organisation share its bound');
  assert.deepEqual([held(o, a1.slice(-5)), held(o, a2.slice(-5))], [5, 5], 'from the project holding the most: each keeps its newest');
  // Unplaced, a project whose organisation is unknown is bounded as an organisation of its own.
  const u = new ResponseOwners({ maxEntries: 1_000, perProject: () => 100, perOrg: () => 10 });
  assert.equal(held(u, fill(u, undefined, 'proj_u', 'u', 20, 1)), 10);
  // Its records move to its organisation once a request of it names it.
  u.add('u_new', { projectId: 'proj_u', orgId: 'org_u', model: 'chat', createdAtMs: 50 });
  fill(u, 'org_u', 'proj_u2', 'v', 5, 60);
  assert.equal(u.countOf('proj_u') + u.countOf('proj_u2'), 10);
});

test('a project or an organisation at its bound records each new id in constant time', () => {
  // Before, the oldest record went by reading the first entry of a Set whose front had been deleted
  // again and again, and V8 steps over deleted entries one by one: past a bound of 100,000 each new
  // record cost ~170 µs (a project's catch-up of 100,000 records held the node's event loop ~17 s).
  for (const [what, opts, projects] of [
    ['a project', { perProject: () => 100_000 }, 1],
    ['an organisation', { perProject: () => 1_000_000, perOrg: () => 100_000 }, 10],
  ] as const) {
    const o = new ResponseOwners(opts);
    for (let i = 0; i < 100_000; i++) o.add(`r${i}`, { projectId: `p${i % projects}`, orgId: 'org', model: 'chat', createdAtMs: 1 + i });
    const started = process.hrtime.bigint();
    for (let i = 100_000; i < 200_000; i++) o.add(`r${i}`, { projectId: `p${i % projects}`, orgId: 'org', model: 'chat', createdAtMs: 1 + i });
    const ms = Number(process.hrtime.bigint() - started) / 1e6;
    // An organisation past its bound gives up a hundredth of it at once.
    assert.ok(o.size <= 100_000 && o.size >= 99_000, `${what}: ${o.size} records`);
    assert.equal(o.get('r199999', 1_000_000)?.projectId, `p${199_999 % projects}`);
    assert.equal(o.get('r0', 1_000_000), undefined);
    assert.ok(ms < 3_000, `${what}: 100,000 records past its bound took ${Math.round(ms)} ms`);
  }
});

test('the queue of a project\'s records gives its oldest left, whichever records left from wherever', () => {
  // Against a plain list, over 20,000 steps of a fixed pseudo-random sequence: push, leave from anywhere, leave the oldest.
  const q = new OldestFirst<{ n: number; gone: boolean }>();
  const model: Array<{ n: number; gone: boolean }> = [];
  let seed = 42;
  const rand = (m: number) => ((seed = (seed * 1103515245 + 12345) % 2 ** 31) % m);
  for (let step = 0, n = 0; step < 20_000; step++) {
    const r = rand(10);
    if (r < 5 || model.length === 0) {
      const item = { n: n++, gone: false };
      q.push(item);
      model.push(item);
    } else {
      const i = r < 8 ? rand(model.length) : 0;
      model[i].gone = true;
      model.splice(i, 1);
      q.left();
    }
    assert.equal(q.size, model.length);
    assert.equal(q.oldest()?.n, model[0]?.n, `step ${step}`);
  }
});
