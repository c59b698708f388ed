// The design lives in the repository (issue 22). Before: 32 comments cited a design document the
// repository did not have. Every `docs/…md#anchor` a source file cites, and every relative link in
// README.md and docs/*.md, must lead to a file that exists and, with an anchor, to a heading in it;
// and the design is named only by links to one of its sections.
import assert from 'node:assert/strict';
import { existsSync, readdirSync, readFileSync, statSync } from 'node:fs';
import { dirname, join, relative, resolve } from 'node:path';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';

const ROOT = fileURLToPath(new URL('../..', import.meta.url));
const SOURCE_ROOTS = ['cli', 'control-plane', 'data-plane', 'proto', 'test'];
const SOURCE_FILES = /\.(ts|mjs|js|proto|ya?ml)$/;
const TOP_LEVEL_SOURCES = ['compose.yaml', 'kubernetes.yaml', 'Dockerfile', 'package.json'];

function walk(dir: string): string[] {
  return readdirSync(dir).flatMap((name) => {
    if (name === 'node_modules' || name.startsWith('.')) return [];
    const p = join(dir, name);
    if (statSync(p).isDirectory()) return walk(p);
    return SOURCE_FILES.test(name) ? [p] : [];
  });
}

/** GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens, repeats numbered. */
export function anchorsOf(markdown: string): Set<string> {
  const anchors = new Set<string>();
  const seen = new Map<string, number>();
  for (const line of withoutCodeBlocks(markdown).split('\n')) {
    const m = /^#{1,6}\s+(.*?)\s*#*\s*$/.exec(line);
    if (!m) continue;
    const base = m[1]
      .toLowerCase()
      .replace(/[^\p{L}\p{N}\s_-]/gu, '')
      .replace(/\s/g, '-');
    const n = seen.get(base) ?? 0;
    seen.set(base, n + 1);
    anchors.add(n === 0 ? base : `${base}-${n}`);
  }
  return anchors;
}

function withoutCodeBlocks(markdown: string): string {
  return markdown.replace(/^(```|~~~)[^\n]*\n[\s\S]*?^\1[^\n]*$/gm, '');
}

const anchorCache = new Map<string, Set<string>>();
function anchorsOfFile(path: string): Set<string> {
  let a = anchorCache.get(path);
  if (!a) anchorCache.set(path, (a = anchorsOf(readFileSync(path, 'utf8'))));
  return a;
}

/** Null when `target` (relative to `fromFile`, optionally with #anchor) resolves; else why not. */
function brokenLink(fromFile: string, target: string): string | null {
  const [pathPart, anchor] = target.split('#', 2) as [string, string | undefined];
  const file = pathPart === '' ? fromFile : resolve(dirname(fromFile), decodeURI(pathPart));
  if (!existsSync(file)) return `no file ${relative(ROOT, file)}`;
  if (anchor === undefined || anchor === '') return null;
  if (!file.endsWith('.md')) return null;
  return anchorsOfFile(file).has(anchor) ? null : `no heading #${anchor} in ${relative(ROOT, file)}`;
}

function markdownFiles(): string[] {
  const docs = join(ROOT, 'docs');
  return [join(ROOT, 'README.md'), ...readdirSync(docs).filter((n) => n.endsWith('.md')).map((n) => join(docs, n))];
}

test('the anchor reader follows GitHub: punctuation dropped, underscores kept, repeats numbered', () => {
  const a = anchorsOf('# Tollgate — design\n## Bad path\n### `bad_path` codes\n## Edge window\n## Edge window\n```\n# not a heading\n```\n');
  assert.deepEqual([...a], ['tollgate--design', 'bad-path', 'bad_path-codes', 'edge-window', 'edge-window-1']);
});

const DESIGN = join(ROOT, 'docs', 'design.md');

test('the design exists and has the sections the code cites most', () => {
  const anchors = anchorsOfFile(DESIGN);
  for (const a of ['architecture', 'code-map', 'decisions-where-the-spec-is-silent', 'order-of-checks', 'money-and-limits-across-nodes']) {
    assert.ok(anchors.has(a), `the design has no #${a}`);
  }
});

test('README.md and docs/*.md name the design only in links to one of its sections', () => {
  const loose: string[] = [];
  for (const file of markdownFiles()) {
    readFileSync(file, 'utf8')
      .split('\n')
      .forEach((line, i) => {
        // A link with an anchor (checked to resolve below), or a code citation of a section.
        const rest = line.replace(/\[[^\]]*\]\((?:docs\/)?design\.md#[\w-]+\)/g, '').replace(/`docs\/design\.md#[\w-]+`/g, '');
        if (/design\.md/.test(rest)) loose.push(`${relative(ROOT, file)}:${i + 1}: ${line.trim()}`);
      });
  }
  assert.deepEqual(loose, []);
});

test('every docs/*.md#anchor cited in the code resolves to a file and a heading', () => {
  const files = [...SOURCE_ROOTS.flatMap((d) => walk(join(ROOT, d))), ...TOP_LEVEL_SOURCES.map((f) => join(ROOT, f)).filter(existsSync)];
  const broken: string[] = [];
  let cited = 0;
  for (const file of files) {
    const text = readFileSync(file, 'utf8');
    for (const m of text.matchAll(/\bdocs\/([\w-]+\.md)(?:#([\w-]+))?/g)) {
      // This file's own examples of broken links are not citations.
      if (file === fileURLToPath(import.meta.url)) continue;
      cited++;
      const why = brokenLink(join(ROOT, 'docs', 'x.md'), m[2] ? `${m[1]}#${m[2]}` : m[1]);
      if (why) broken.push(`${relative(ROOT, file)}: ${m[0]}: ${why}`);
    }
  }
  assert.ok(cited >= 25, `only ${cited} citations found: is the search looking in the right place?`);
  assert.deepEqual(broken, []);
});

test('no source file cites the design other than by a section', () => {
  const loose: string[] = [];
  for (const file of SOURCE_ROOTS.flatMap((d) => walk(join(ROOT, d)))) {
    const rel = relative(ROOT, file);
    if (file === fileURLToPath(import.meta.url)) continue;
    const lines = readFileSync(file, 'utf8').split('\n');
    lines.forEach((line, i) => {
      if (/design\.md/.test(line.replace(/\bdocs\/design\.md#[\w-]+/g, ''))) loose.push(`${rel}:${i + 1}: ${line.trim()}`);
    });
  }
  assert.deepEqual(loose, []);
});

test('every relative link in README.md and docs/*.md resolves to a file and a heading', () => {
  const broken: string[] = [];
  let links = 0;
  for (const file of markdownFiles()) {
    const text = withoutCodeBlocks(readFileSync(file, 'utf8')).replace(/`[^`\n]*`/g, '');
    for (const m of text.matchAll(/\]\(([^)\s]+)(?:\s+"[^"]*")?\)/g)) {
      const target = m[1];
      if (/^[a-z][a-z0-9+.-]*:/i.test(target)) continue; // https:, mailto:
      links++;
      const why = brokenLink(file, target);
      if (why) broken.push(`${relative(ROOT, file)}: (${target}): ${why}`);
    }
  }
  assert.ok(links > 10, `only ${links} relative links found`);
  assert.deepEqual(broken, []);
});
