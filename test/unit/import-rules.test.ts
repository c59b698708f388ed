// The house's rules, read from every import (docs/design.md#what-may-import-what): the planes never
// import one another, nothing re-exports what another module defines (an `export … from` draws a
// false arrow), no hand-written file is over 450 lines, every import of a plane runs down its layers
// (the table below, the same as docs/design.md#what-may-import-what's), and no two rooms of a plane import each other both ways.
import assert from 'node:assert/strict';
import { readdirSync, readFileSync, statSync } from 'node:fs';
import { dirname, join, normalize, relative } from 'node:path';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';

const ROOT = fileURLToPath(new URL('../..', import.meta.url));

/**
 * Each plane's rooms, top layer first (docs/design.md#what-may-import-what). A room is a folder, or a
 * file at the plane's top. A room imports rooms of its own layer or below, never above.
 */
const LAYERS: Readonly<Record<string, readonly (readonly string[])[]>> = {
  'data-plane': [
    ['main.ts'],
    ['http', 'realtime'],
    ['endpoints'],
    ['gate'],
    ['request', 'sync'],
    ['leases'],
    ['proxy', 'state'],
    ['limits', 'metrics.ts'],
    ['routing'],
    ['errors.ts', 'error-shapes.ts', 'log.ts', 'config.ts', 'drain.ts', 'slot-set.ts', 'heap-watch.ts', 'heap-flags.ts'],
  ],
  'control-plane': [
    ['main.ts', 'move-to-postgres.ts'],
    ['grpc', 'admin.ts'],
    ['sync'],
    ['console', 'leases'],
    ['webhooks', 'audit'],
    ['state'],
    ['config.ts', 'gateway-config'],
    ['store'],
    ['errors.ts', 'log.ts', 'metrics.ts'],
  ],
};

/** Hand-written files allowed past 450 lines. */
const LONG_FILES: readonly string[] = ['data-plane/proxy/pdf-guard.ts'];

function sources(dir: string): string[] {
  return readdirSync(join(ROOT, dir)).flatMap((name) => {
    const rel = join(dir, name);
    if (statSync(join(ROOT, rel)).isDirectory()) return rel === 'proto/gen' ? [] : sources(rel);
    return name.endsWith('.ts') ? [rel] : [];
  });
}

const FILES = [...sources('data-plane'), ...sources('control-plane'), ...sources('cli'), ...sources('proto/lib')];

/** The repository paths a file imports by relative specifier (`.js` read as the `.ts` it is). */
function importsOf(file: string): string[] {
  const text = readFileSync(join(ROOT, file), 'utf8');
  const out: string[] = [];
  for (const m of text.matchAll(/(?:from|import)\s*\(?\s*'(\.{1,2}\/[^']+)'/g)) out.push(normalize(join(dirname(file), m[1])).replace(/\.js$/, '.ts'));
  return out;
}

const planeOf = (p: string) => p.split('/')[0] === 'proto' ? 'proto' : p.split('/')[0];

/** A file's room in its plane: its first folder, or the file itself at the plane's top. */
function roomOf(p: string): string {
  const parts = relative(planeOf(p), p).split('/');
  return parts.length > 1 ? parts[0] : parts[0].replace(/\.ts$/, '.ts');
}

test('the planes never import one another (the launchers may read the node heap flags)', () => {
  const bad: string[] = [];
  for (const f of FILES) {
    for (const t of importsOf(f)) {
      const from = planeOf(f);
      const to = planeOf(t);
      if (to === 'proto' || to === from) continue;
      if (from === 'cli' && t === 'data-plane/heap-flags.ts') continue;
      bad.push(`${f} -> ${t}`);
    }
  }
  assert.deepEqual(bad, []);
});

test('only control-plane/store/ imports a database driver (sqlite3, pg)', () => {
  const bad = FILES.filter((f) => !f.startsWith('control-plane/store/') && /(?:from|import)\s*\(?\s*'(?:sqlite3|pg)'/.test(readFileSync(join(ROOT, f), 'utf8')));
  assert.deepEqual(bad, []);
});

test('no forwarding re-exports: a module exports only what it defines', () => {
  const bad = FILES.filter((f) => /^export\s+(?:type\s+)?(?:\*|\{[^}]*\})\s+from\s/m.test(readFileSync(join(ROOT, f), 'utf8')) || /^export\s+\{[^}]*\};/m.test(readFileSync(join(ROOT, f), 'utf8')));
  assert.deepEqual(bad, []);
});

test('no two hand-written files share a basename, but the per-process ones', () => {
  const PER_PROCESS = new Set(['main.ts', 'config.ts', 'errors.ts', 'metrics.ts', 'log.ts', 'admin.ts']);
  const seen = new Map<string, string[]>();
  for (const f of FILES) seen.set(f.split('/').pop()!, [...(seen.get(f.split('/').pop()!) ?? []), f]);
  const clashes = [...seen].filter(([name, paths]) => paths.length > 1 && !PER_PROCESS.has(name)).map(([, paths]) => paths.join(' = '));
  assert.deepEqual(clashes, []);
});

test('no hand-written file is over 450 lines', () => {
  const long = FILES.filter((f) => !LONG_FILES.includes(f) && readFileSync(join(ROOT, f), 'utf8').split('\n').length > 451);
  assert.deepEqual(long, []);
});

/** Every import between two rooms of a plane, as `from > to` with the importing file. */
function roomArrows(plane: string): Map<string, string> {
  const arrows = new Map<string, string>();
  for (const f of FILES.filter((x) => planeOf(x) === plane)) {
    for (const t of importsOf(f)) {
      if (planeOf(t) !== plane) continue;
      const a = roomOf(f);
      const b = roomOf(t);
      if (a !== b && !arrows.has(`${a} > ${b}`)) arrows.set(`${a} > ${b}`, `${f} -> ${t}`);
    }
  }
  return arrows;
}

test('every room of a plane is in its layer table, once', () => {
  for (const plane of ['data-plane', 'control-plane']) {
    const listed = LAYERS[plane].flat();
    assert.equal(new Set(listed).size, listed.length, `${plane}: a room listed twice`);
    const rooms = [...new Set(FILES.filter((f) => planeOf(f) === plane).map(roomOf))].sort();
    assert.deepEqual(rooms, [...listed].sort(), `${plane}: the rooms on disk and in the layer table`);
  }
});

test('no import runs up a layer', () => {
  for (const plane of ['data-plane', 'control-plane']) {
    const layerOf = new Map(LAYERS[plane].flatMap((rooms, i) => rooms.map((r) => [r, i] as const)));
    const up = [...roomArrows(plane)].filter(([arrow]) => {
      const [a, b] = arrow.split(' > ');
      return (layerOf.get(b) ?? -1) < (layerOf.get(a) ?? -1);
    });
    assert.deepEqual(up.map(([, example]) => example), [], `${plane}: imports up a layer`);
  }
});

test('no two rooms of a plane import each other both ways', () => {
  for (const plane of ['data-plane', 'control-plane']) {
    const arrows = roomArrows(plane);
    const both = [...arrows.keys()]
      .map((x) => x.split(' > '))
      .filter(([a, b]) => a < b && arrows.has(`${b} > ${a}`))
      .map(([a, b]) => `${a} <> ${b}: ${arrows.get(`${a} > ${b}`)}, ${arrows.get(`${b} > ${a}`)}`);
    assert.deepEqual(both, [], `${plane}: the rooms that import each other both ways`);
  }
});
