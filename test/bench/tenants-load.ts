// bench:tenants' load generator: one measured run against real nodes. An open-loop generator (a
// request that is due goes out whatever the latency of the others), each request to a node picked at
// random, the CPU of the control plane, its database server (PostgreSQL) and the nodes read over an
// idle window first and around the run.
import { Pool } from 'undici';
import type { ControlPlane, DataPlane } from '../helpers/processes.js';
import { nextIp } from './load.js';
import { mainThreadCpuMicros, rssBytes, threadCpuMicros } from './procstat.js';
import { ALIGN, DURATION_SEC, IDLE_SEC, RATE, sleep, TAIL_MS } from './tenants-options.js';
import type { Store } from './tenants-provision.js';
import { cpCounters, cpuOf, leaseWaits, machineLoad, printRun, type RunResult } from './tenants-report.js';

const BODY = JSON.stringify({ model: 'demo-chat', messages: [{ role: 'user', content: 'Hello there! In one sentence, what is an API gateway for?' }] });

/** CPU per second of the control plane (all threads and its main thread), its database server and the nodes, while idle. */
export interface IdleRates {
  cp: number | null;
  main: number | null;
  db: number | null;
  nodes: number | null;
}

/**
 * The idle rates of the control plane and the nodes over `ms`, after `settleMs` for them to finish
 * what they were doing (a run's tail, starting up).
 */
export async function measureIdle(cp: ControlPlane, store: Store, nodes: DataPlane[], ms: number, settleMs: number): Promise<IdleRates> {
  await sleep(settleMs);
  const cpPid = cp.proc.child.pid!;
  const nodePids = nodes.map((n) => n.proc.child.pid!);
  const cp0 = cpuOf([cpPid]);
  const main0 = mainThreadCpuMicros(cpPid);
  const db0 = store.dbCpu?.() ?? null;
  const nodes0 = cpuOf(nodePids);
  const t0 = performance.now();
  await sleep(ms);
  const sec = (performance.now() - t0) / 1000;
  return {
    cp: cp0 === null ? null : (cpuOf([cpPid])! - cp0) / sec,
    main: main0 === null ? null : (mainThreadCpuMicros(cpPid)! - main0) / sec,
    db: db0 === null ? null : (store.dbCpu!()! - db0) / sec,
    nodes: nodes0 === null ? null : (cpuOf(nodePids)! - nodes0) / sec,
  };
}

/**
 * One measured run: the idle window, RATE req/s for `durationSec` from `pickKey`, then the tail;
 * printed and returned. `idleGiven`: idle rates measured earlier, used instead of this run's idle
 * window (after a warm-up the processes are still finishing its work, so they are not idle then).
 */
export async function runLoad(label: string, cp: ControlPlane, store: Store, nodes: DataPlane[], pickKey: () => string, keys: number, orgs: number, durationSec = DURATION_SEC, align = ALIGN, idleGiven?: IdleRates): Promise<RunResult> {
  const cpPid = cp.proc.child.pid!;
  const nodePids = nodes.map((n) => n.proc.child.pid!);
  const durationMs = durationSec * 1000;
  // Idle window: at least IDLE_SEC; when aligning, until the run's middle is the top of a minute.
  let waitMs = IDLE_SEC * 1000;
  if (align) {
    const now = Date.now();
    let top = Math.ceil(now / 60_000) * 60_000;
    while (top - durationMs / 2 - now < IDLE_SEC * 1000) top += 60_000;
    waitMs = top - durationMs / 2 - now;
    console.log(`  waiting ${(waitMs / 1000).toFixed(0)} s (idle measurement) so that the run crosses ${new Date(top).toISOString().slice(11, 19)} UTC`);
  }
  const measured = await measureIdle(cp, store, nodes, waitMs, 0);
  const { cp: idleCp, main: idleMain, db: idleDb, nodes: idleNodes } = idleGiven ?? measured;

  for (const n of nodes) await leaseWaits(n.adminUrl!, true);
  const counters0 = await cpCounters(cp.adminUrl);
  const pools = nodes.map((n) => new Pool(n.url, { connections: 64, pipelining: 1 }));
  const latencies: number[] = [];
  const refusals: Record<string, number> = {};
  let firstRefusal = '';
  let ok = 0;
  let sent = 0;
  const total = Math.round(RATE * durationSec);
  const cp0 = cpuOf([cpPid]);
  const main0 = mainThreadCpuMicros(cpPid);
  const threads0 = threadCpuMicros(cpPid);
  const db0 = store.dbCpu?.() ?? null;
  const nodes0 = cpuOf(nodePids);
  const wall0 = Date.now();
  const t0 = performance.now();
  const inFlight = new Set<Promise<void>>();
  const one = async () => {
    const pool = pools[Math.floor(Math.random() * pools.length)];
    const start = performance.now();
    try {
      const res = await pool.request({
        method: 'POST',
        path: '/v1/chat/completions',
        headers: { authorization: `Bearer ${pickKey()}`, 'content-type': 'application/json', 'x-forwarded-for': nextIp() },
        body: BODY,
      });
      const text = res.statusCode === 200 ? (await res.body.dump(), '') : await res.body.text();
      latencies.push(performance.now() - start);
      if (res.statusCode === 200) ok++;
      else {
        refusals[res.statusCode] = (refusals[res.statusCode] ?? 0) + 1;
        firstRefusal ||= `${res.statusCode} ${text.slice(0, 300)}`;
      }
    } catch (err) {
      refusals.error = (refusals.error ?? 0) + 1;
      firstRefusal ||= String(err);
    }
  };
  while (sent < total) {
    const due = Math.min(total, Math.floor(((performance.now() - t0) / 1000) * RATE) + 1);
    while (sent < due && inFlight.size < 4096) {
      sent++;
      const p = one().finally(() => inFlight.delete(p));
      inFlight.add(p);
    }
    const nextAt = t0 + (sent / RATE) * 1000;
    await sleep(Math.max(0, nextAt - performance.now()));
  }
  await Promise.all(inFlight);
  const wall1 = Date.now();
  const loadSec = (performance.now() - t0) / 1000;
  await sleep(TAIL_MS);
  const measuredSec = loadSec + TAIL_MS / 1000;
  const cp1 = cpuOf([cpPid]);
  const main1 = mainThreadCpuMicros(cpPid);
  const threads1 = threadCpuMicros(cpPid);
  const db1 = store.dbCpu?.() ?? null;
  const nodes1 = cpuOf(nodePids);
  await Promise.all(pools.map((p) => p.close()));
  const waits = await Promise.all(nodes.map((n) => leaseWaits(n.adminUrl!)));
  const counters1 = await cpCounters(cp.adminUrl);
  const cpWork: Record<string, number> = {};
  for (const [k, v] of Object.entries(counters1)) if (v - (counters0[k] ?? 0) > 0) cpWork[k.replace('tollgate_cp_', '')] = v - (counters0[k] ?? 0);

  latencies.sort((a, b) => a - b);
  const at = (q: number) => (latencies.length === 0 ? 0 : latencies[Math.min(latencies.length - 1, Math.floor(q * latencies.length))]);
  const perReq = (c0: number | null, c1: number | null, idle: number | null) => (c0 === null || c1 === null || idle === null ? null : Math.max(0, c1 - c0 - idle * measuredSec) / sent);
  const waited = waits.reduce((s, w) => s + w.waited, 0);
  const r: RunResult = {
    run: label,
    store: store.name,
    nodes: nodes.length,
    keys,
    orgs,
    rate: RATE,
    durationSec: loadSec,
    sent,
    ok,
    refusals,
    firstRefusal,
    crossedMinute: Math.floor(wall0 / 60_000) !== Math.floor(wall1 / 60_000),
    cpUsPerRequest: perReq(cp0, cp1, idleCp),
    cpMainThreadUsPerRequest: perReq(main0, main1, idleMain),
    dbUsPerRequest: perReq(db0, db1, idleDb),
    nodesUsPerRequest: perReq(nodes0, nodes1, idleNodes),
    cpIdleUsPerSec: idleCp,
    cpMainIdleUsPerSec: idleMain,
    dbIdleUsPerSec: idleDb,
    nodesIdleUsPerSec: idleNodes,
    latencyMs: { p50: at(0.5), p90: at(0.9), p99: at(0.99), max: latencies[latencies.length - 1] ?? 0 },
    waited,
    waitedShare: waited / Math.max(1, sent),
    waitMs: {
      mean: waited === 0 ? 0 : waits.reduce((s, w) => s + w.mean_ms * w.waited, 0) / waited,
      p99max: Math.max(0, ...waits.map((w) => w.p99_ms)),
      max: Math.max(0, ...waits.map((w) => w.max_ms)),
    },
    cpRssBytes: rssBytes(cpPid),
    cpWork,
    loadAverage: machineLoad(),
  };
  printRun(r, threads0, threads1);
  return r;
}
