// The house's rules, read from every import (docs/design.md#what-may-import-what): the planes never
// import one another, nothing re-exports what another module defines (an `export … from` draws a
// false arrow), no hand-written file is over 450 lines, and no two rooms of a plane import each other
// both ways, except the pairs still listed below as debt. The list can only shrink: a pair that no
// longer imports both ways fails this test until it is taken off, and a new pair fails it at once.
import assert from 'node:assert/strict';
import { readdirSync, readFileSync, statSync } from 'node:fs';
import { dirname, join, normalize, relative } from 'node:path';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';

const ROOT = fileURLToPath(new URL('../..', import.meta.url));

/** Room pairs (sorted) that still import each other both ways: issue 33's remaining knot. */
const BOTH_WAYS_DEBT: Readonly<Record<string, readonly string[]>> = {
  'data-plane': ['endpoints <> http', 'endpoints <> proxy', 'endpoints <> realtime', 'gate <> http', 'http <> request'],
  'control-plane': ['leases <> sync'],
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

test('no forwarding re-exports: a module exports only what it defines', () => {
  const bad = FILES.filter((f) => /^export\s+(?:type\s+)?(?:\*|\{[^}]*\})\s+from\s/m.test(readFileSync(join(ROOT, f), 'utf8')) || /^export\s+\{[^}]*\};/m.test(readFileSync(join(ROOT, f), 'utf8')));
  assert.deepEqual(bad, []);
});

test('no hand-written file is over 450 lines', () => {
  const long = FILES.filter((f) => !LONG_FILES.includes(f) && readFileSync(join(ROOT, f), 'utf8').split('\n').length > 451);
  assert.deepEqual(long, []);
});

test('no two rooms of a plane import each other both ways, but the listed debt (which can only shrink)', () => {
  for (const plane of ['data-plane', 'control-plane']) {
    const arrows = new Set<string>();
    for (const f of FILES.filter((x) => planeOf(x) === plane)) {
      for (const t of importsOf(f)) {
        if (planeOf(t) !== plane) continue;
        const a = roomOf(f);
        const b = roomOf(t);
        if (a !== b) arrows.add(`${a} > ${b}`);
      }
    }
    const both = [...arrows]
      .map((x) => x.split(' > '))
      .filter(([a, b]) => a < b && arrows.has(`${b} > ${a}`))
      .map(([a, b]) => `${a} <> ${b}`)
      .sort();
    assert.deepEqual(both, [...BOTH_WAYS_DEBT[plane]].sort(), `${plane}: the rooms that import each other both ways`);
  }
});
