// Regenerates proto/gen from proto/tollgate/**/*.proto with buf + ts-proto (no protoc download).
// `--check` generates into a temporary folder and fails when the committed output differs.
import { execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, readdirSync, rmSync, statSync, cpSync, existsSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';

const root = fileURLToPath(new URL('..', import.meta.url));
const committed = join(root, 'proto', 'gen');
const check = parseArgs({ options: { check: { type: 'boolean', default: false } } }).values.check;
const buf = join(root, 'node_modules', '.bin', 'buf');
const out = mkdtempSync(join(tmpdir(), 'tollgate-proto-'));

function listFiles(dir) {
  if (!existsSync(dir)) return [];
  return readdirSync(dir).flatMap((name) => {
    const p = join(dir, name);
    return statSync(p).isDirectory() ? listFiles(p) : [p];
  });
}

try {
  const template = readFileSync(join(root, 'buf.gen.yaml'), 'utf8').replace('out: proto/gen', `out: ${out}`);
  execFileSync(buf, ['generate', '--template', template], { cwd: root, stdio: ['ignore', 'inherit', 'inherit'] });
  if (check) {
    const fresh = listFiles(out).map((f) => relative(out, f)).sort();
    const old = listFiles(committed).map((f) => relative(committed, f)).sort();
    const stale = [];
    for (const f of new Set([...fresh, ...old])) {
      const a = fresh.includes(f) ? readFileSync(join(out, f), 'utf8') : null;
      const b = old.includes(f) ? readFileSync(join(committed, f), 'utf8') : null;
      if (a !== b) stale.push(f);
    }
    if (stale.length > 0) {
      console.error(`proto/gen is stale (${stale.join(', ')}): run npm run proto:gen and commit the result`);
      process.exit(1);
    }
    console.log('proto/gen is up to date');
  } else {
    rmSync(committed, { recursive: true, force: true });
    cpSync(out, committed, { recursive: true });
    console.log(`generated ${listFiles(committed).length} files into proto/gen`);
  }
} finally {
  rmSync(out, { recursive: true, force: true });
}
