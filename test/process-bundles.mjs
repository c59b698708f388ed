// The processes the end-to-end tests start most (the control plane, the data-plane node, the CLI),
// bundled once per test run into one file each. Started through tsx, each such process resolves and
// loads every module of the program through tsx's loader, which Node 20 runs on a thread of its own
// and asks once per module: a control plane or a node cost about 0.7 s of CPU more to start than from
// its bundle, a CLI run 0.52 s instead of 0.16 s, and a full run starts about 130 control planes,
// 160 nodes and 410 CLI runs. test/run.mjs builds the bundles and hands their paths to the tests in
// TOLLGATE_TEST_BUNDLES; test/helpers/processes.ts starts a script's bundle when there is one, else
// the script through tsx (a test file run without run.mjs, the benchmarks; and what an operator
// starts, `npm start`, `npm run cluster`, `npx tollgate`, is started as the operator would).
//
// A bundle is the same source through the same compiler (esbuild, the one tsx runs, reading the same
// tsconfig.json), with the pure JavaScript packages it imports: resolving and loading them one module
// at a time (and Node's scan of each CommonJS module's exports for an ES import) was a node's largest
// start-up cost, 0.44 -> 0.25 s of CPU per node start, 0.50 -> 0.40 per control plane, 0.16 -> 0.12
// per CLI run. Packages with native code, or that read files beside their own modules, load from
// node_modules as before (EXTERNAL). `import.meta.url` is
// written into each module as its own source file's URL, so that paths computed from it (the proto
// files, the demo config) are the source tree's.
import { createRequire } from 'node:module';
import { mkdirSync, readdirSync, readFileSync, realpathSync, renameSync, writeFileSync } from 'node:fs';
import { dirname, join, relative, resolve } from 'node:path';
import { pathToFileURL } from 'node:url';

/**
 * Left out of the bundles: native addons (uWebSockets.js, sqlite3 and the optional ones), and
 * packages that load files found from their own folder (.proto files, pino's worker transports).
 */
const EXTERNAL = ['uWebSockets.js', 'sqlite3', 'pg-native', 'bufferutil', 'utf-8-validate', '@grpc/proto-loader', '@grpc/reflection', 'protobufjs', 'pino', 'thread-stream'];

/** `import.meta.url` written into each source module as its own file's URL (paths computed from it stay the source tree's). */
const ownImportMetaUrl = {
  name: 'own-import-meta-url',
  setup(build) {
    build.onLoad({ filter: /\.ts$/ }, (args) => {
      const text = readFileSync(args.path, 'utf8');
      if (!text.includes('import.meta.url')) return undefined;
      return { contents: text.replaceAll('import.meta.url', JSON.stringify(pathToFileURL(args.path).href)), loader: 'ts', resolveDir: dirname(args.path) };
    });
  },
};

/** esbuild as tsx has it (a dependency of tsx's, not of this package's). */
const esbuildOf = (root) => createRequire(join(root, 'node_modules', 'tsx', 'package.json'))('esbuild');

/** The scripts bundled, as the tests name them: relative to the repository's root. */
export const BUNDLED_SCRIPTS = ['control-plane/main.ts', 'data-plane/main.ts', 'cli/main.ts'];

/**
 * Builds every bundle into `outDir` (`control-plane/main.ts` → `control-plane.main.mjs`) and returns
 * script → bundle path. Each file is written under a temporary name and renamed into place, so that a
 * run that starts a process meanwhile (another run in the same checkout) reads a whole file.
 */
export async function buildBundles(root, outDir) {
  const esbuild = esbuildOf(root);
  mkdirSync(outDir, { recursive: true });
  const built = await Promise.all(
    BUNDLED_SCRIPTS.map(async (script) => {
      const out = join(outDir, `${script.replace(/\.ts$/, '').replaceAll('/', '.')}.mjs`);
      const result = await esbuild.build({
        entryPoints: [join(root, script)],
        outfile: out,
        write: false,
        bundle: true,
        platform: 'node',
        format: 'esm',
        target: 'node20',
        external: EXTERNAL,
        // Bundled CommonJS packages call require() for Node's own modules and the packages left out.
        banner: { js: "import { createRequire as __bundleRequire } from 'node:module'; const require = __bundleRequire(import.meta.url);" },
        plugins: [ownImportMetaUrl],
        logLevel: 'silent',
      });
      const tmp = `${out}.${process.pid}.tmp`;
      writeFileSync(tmp, result.outputFiles[0].contents);
      renameSync(tmp, out);
      return [script, out];
    }),
  );
  return Object.fromEntries(built);
}

/**
 * The test files themselves, bundled into `outDir` (one build, the modules they share in common
 * chunks, source maps beside them): run through tsx's loader, each test file's process paid about
 * 0.25 s of CPU to load tsx and resolve its modules through it (200 files). Returns bundle → source
 * file; test/run-files.mjs reports every test under its source file and line.
 */
export async function buildTestBundles(root, outDir, files) {
  const entries = Object.fromEntries(files.map((f) => [relative(root, f).replace(/\.ts$/, ''), f]));
  await esbuildOf(root).build({
    entryPoints: entries,
    outdir: outDir,
    outExtension: { '.js': '.mjs' },
    bundle: true,
    splitting: true,
    sourcemap: true,
    platform: 'node',
    format: 'esm',
    target: 'node20',
    packages: 'external',
    plugins: [ownImportMetaUrl],
    logLevel: 'silent',
  });
  // The maps name their sources relative to the bundle, which Node reads through its real path: in a git
  // worktree whose node_modules is a link to another checkout's, they named the other checkout's files.
  // Written as absolute paths, they name this checkout's.
  for (const name of readdirSync(outDir, { recursive: true })) {
    if (!name.endsWith('.map')) continue;
    const file = join(outDir, name);
    const map = JSON.parse(readFileSync(file, 'utf8'));
    map.sources = map.sources.map((src) => pathToFileURL(resolve(dirname(file), src)).href);
    writeFileSync(file, JSON.stringify(map));
  }
  // By real path: the runner names each file so.
  return Object.fromEntries(Object.entries(entries).map(([name, source]) => [realpathSync(join(outDir, `${name}.mjs`)), source]));
}
