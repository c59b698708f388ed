// `npm run bench:tenants [-- --keys 5000 --orgs 500 --rate 400 --zipf 1.0 --duration 30
// --stores sqlite,postgres]`: many customers through one control plane (issue 19), on each store in
// turn (issue 35). A script that prints figures, not a test.
//
// Set-up: a control plane whose tier `bench` has limits far away (10^12 rpm, no cap, a large grant)
// and the demo provider; one key in its own organisation (the control), then K keys in O organisations
// seeded straight into its SQLite database (real key values, hashed with the run's pepper, so they
// authenticate), and the control plane restarted so it loads them; for PostgreSQL, a real server
// (test/helpers/postgres-server.ts) started, the SQLite file moved into one database of it with the
// tested move (what `npm run move-to-postgres` runs), and the control plane restarted on it with
// --database-url. Then, for 1 node and then for 3
// nodes (fresh processes): the one key, then the K keys, each at the same constant rate (an open-loop
// generator: a request that is due goes out whatever the latency of the others), each request sent to
// a node picked at random, the K keys' requests picking a key by a Zipf law (rank r with probability
// ∝ 1/r^s; key r belongs to organisation r mod O, so hot keys are spread over organisations).
//
// Each run covers a minute boundary: with --duration under 60 s the run starts so that the top of a
// clock minute falls in its middle (the wait before it is the idle measurement); --no-align skips
// that (quick runs while developing). Before the load the CPU of the control plane, of the database
// server (PostgreSQL: the postmaster and all its children, those ended meanwhile too) and of the nodes
// is read over an idle window; the idle rate times the run's length is subtracted from what they used during
// the run (plus a 2 s tail for the last reports), divided by the requests sent.
//
// Printed per run: control-plane, database-server (SQLite: in process) and nodes' CPU per request (µs), latency p50/p90/p99/max of every
// answer, the share of requests that waited for the control plane (a key lease or a money slice: the
// nodes' GET /stats/lease-waits) and how long, and refusals by status. Results go to
// test/bench/out/tenants-<time>.json.
//
// The parts: tenants-options.ts (flags), tenants-provision.ts (config, seeded keys, the store, the Zipf law),
// tenants-load.ts (one measured run), tenants-report.ts (CPU accounting, printing, the JSON file),
// tenants-fake-nodes.ts (--fake-nodes: the control plane alone with simulated nodes).
import { startDataPlane, stopAll, type DataPlane } from '../helpers/processes.js';
import { ALIGN, DURATION_SEC, FAKE, KEYS, NODE_COUNTS, opts, ORGS, RATE, STORES, WARMUP_SEC, ZIPF } from './tenants-options.js';
import { fakeNodesBench } from './tenants-fake-nodes.js';
import { measureIdle, runLoad } from './tenants-load.js';
import { provision, tenantKey, waitForKeys, zipfSampler } from './tenants-provision.js';
import { machineLoad, printTable, writeResults, type RunResult } from './tenants-report.js';

async function main(): Promise<void> {
  if (FAKE) return fakeNodesBench();
  console.log(`tollgate bench:tenants: ${KEYS.toLocaleString('en')} keys in ${ORGS.toLocaleString('en')} organisations, Zipf s = ${ZIPF}, ${RATE} req/s for ${DURATION_SEC} s per run, nodes ${NODE_COUNTS.join(' then ')}, stores ${STORES.join(' then ')}${opts['report-every-ms'] ? `, nodes sending reports every ${opts['report-every-ms']} ms` : ''}`);
  const loadAtStart = machineLoad();
  console.log(`  load average at the start: ${loadAtStart.join(', ')}`);
  const zipf = zipfSampler(KEYS, ZIPF);
  const tenantKeys = Array.from({ length: KEYS }, (_, i) => tenantKey(i));
  const results: RunResult[] = [];
  for (const storeName of STORES) {
    const { cp, store, controlKey, stop } = await provision(storeName, KEYS, ORGS, true);
    for (const n of NODE_COUNTS) {
      const nodes: DataPlane[] = [];
      for (let i = 0; i < n; i++) nodes.push(await startDataPlane(cp, { adminListen: true, nodeId: `bench-${n}-${i}`, extraArgs: opts['report-every-ms'] ? ['--report-every-ms', opts['report-every-ms']] : [] }));
      for (const node of nodes) await waitForKeys(node, [controlKey!, tenantKeys[0], tenantKeys[KEYS - 1]]);
      console.log(`\n${n} node${n > 1 ? 's' : ''}, ${store.name}:`);
      if (!opts['no-control']) results.push(await runLoad(`${n} node${n > 1 ? 's' : ''}, one key`, cp, store, nodes, () => controlKey!, 1, 1));
      // With a warm-up, the measured run's idle rates are read before it (10 s to settle, 10 s idle):
      // right after the warm-up the processes are still finishing its work.
      const idle = WARMUP_SEC > 0 ? await measureIdle(cp, store, nodes, 10_000, 10_000) : undefined;
      if (WARMUP_SEC > 0) await runLoad(`warm-up (not counted), ${WARMUP_SEC} s`, cp, store, nodes, () => tenantKeys[zipf()], KEYS, ORGS, WARMUP_SEC, false);
      results.push(await runLoad(`${n} node${n > 1 ? 's' : ''}, ${KEYS.toLocaleString('en')} keys / ${ORGS.toLocaleString('en')} orgs${WARMUP_SEC > 0 ? ` after ${WARMUP_SEC} s of warm-up` : ''}`, cp, store, nodes, () => tenantKeys[zipf()], KEYS, ORGS, DURATION_SEC, ALIGN, idle));
      for (const node of nodes) await node.proc.kill('SIGTERM');
    }
    await stop();
  }

  printTable(results);
  const loadAtEnd = machineLoad();
  console.log(`load average at the start ${loadAtStart.join(', ')}, at the end ${loadAtEnd.join(', ')}`);
  writeResults('tenants', { at: new Date().toISOString(), keys: KEYS, orgs: ORGS, rate: RATE, zipf: ZIPF, durationSec: DURATION_SEC, stores: STORES, loadAtStart, loadAtEnd, results });
  await stopAll();
}

main().catch(async (err) => {
  console.error(err);
  await stopAll();
  process.exit(1);
});
