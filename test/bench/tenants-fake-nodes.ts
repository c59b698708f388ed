// --fake-nodes: the control plane alone at cluster scale (target 3). Simulated nodes (fake-node.ts)
// connect over the sync protocol and send what real nodes serving RATE req/s in all would send: a
// report a second each (usage summed per key and minute, last-used times, the request logs as one
// block), and the lease traffic. --fake-leases shares (the default) is today's nodes with standing
// shares (docs/leases.md): the slot share and every organisation's money slice asked once, each
// minute's share of every key asked once a minute (and the next minute's before it starts), and what
// was used of each key minute once a second; no per-key want while a key stays within its share.
// --fake-leases per-minute is the protocol before standing shares: a key lease on a key's first
// request in each minute on that node, a slot want on its first request ever, a money want when the
// organisation's slice is low, and what was used every 100 ms. --fake-leases none sends reports only.
// Prints the control plane's share of one core, its CPU per simulated request, its RSS, and whether
// its acknowledgements kept up. --fake-report-every-ms MS: reports that often instead of every second
// (what a longer cadence would save). --warmup SEC: the same traffic first, unmeasured. --bare: then the same
// simulated nodes against a bare SyncService (bare-sync.ts), whose CPU is what the messages alone cost.
// --stores: the control plane on each store in turn (PostgreSQL: its server's CPU per request too).
import { LogBlocksBuilder } from '../../proto/lib/log-columns.js';
import type { KeyLeaseWant, LeaseRequest, LogBlock, SlotWant, UsageTotal } from '../../proto/gen/tollgate/v1/sync.js';
import { startFakeNode, type FakeNode } from '../helpers/fake-node.js';
import { startProcess, stopAll, type ControlPlane } from '../helpers/processes.js';
import { cpuMicros, watchRss } from './procstat.js';
import { DURATION_SEC, IDLE_SEC, KEYS, MB, NODE_COUNTS, opts, ORGS, RATE, sleep, STORES, WARMUP_SEC, ZIPF } from './tenants-options.js';
import { provision, zipfSampler, type Store } from './tenants-provision.js';
import { cpCounters, machineLoad, printFakeTable, writeResults } from './tenants-report.js';

/** --fake-report-every-ms: how often each simulated node sends its report (1000: as nodes do by default). */
const REPORT_EVERY_MS = Number(opts['fake-report-every-ms']);
/** Between the simulated nodes' connecting and the idle window. */
const SETTLE_MS = 10_000;
const DEMO_PROMPT_TOKENS = 20;
const DEMO_COMPLETION_TOKENS = 30;
// demo-chat: 0.50 and 1.50 USD per million tokens.
const DEMO_COST_MICROS = Math.round(DEMO_PROMPT_TOKENS * 0.5 + DEMO_COMPLETION_TOKENS * 1.5);

interface FakeSim {
  node: FakeNode;
  seq: number;
  usedSeq: number;
  sentReports: number;
  /** The first report of the measured run (after a warm-up, acknowledgements of earlier ones do not count). */
  firstSeq: number;
  /** Requests summed in each report sent, by seq (to count what the control plane acknowledged). */
  requestsInReport: Map<number, number>;
  usage: Map<string, UsageTotal>;
  lastUsed: Map<number, number>;
  /** One report's request logs of this node (a second's, or --fake-report-every-ms's), built once and sent with every report (building 100,000 rows a second would cost this process more than the control plane). */
  logBlocks: LogBlock[];
  minute: number;
  seenThisMinute: Set<number>;
  usedThisMinute: Map<number, number>;
  usedThisTick: Set<number>;
  slotted: Set<number>;
  money: Map<number, number>;
  moneyAsked: Set<number>;
  keyWants: KeyLeaseWant[];
  slotWants: SlotWant[];
  orgWants: number[];
  /** --fake-leases shares: whether the standing shares were asked, the last minute asked, the last second used was said. */
  sharesAsked: boolean;
  bulkAsked: number;
  usedSecond: number;
}

export async function fakeNodesBench(): Promise<void> {
  const nodesCount = NODE_COUNTS[0];
  const leases = opts['fake-leases'] as 'shares' | 'per-minute' | 'none';
  if (!['shares', 'per-minute', 'none'].includes(leases)) throw new Error(`--fake-leases must be shares, per-minute or none, got ${JSON.stringify(leases)}`);
  if (!Number.isInteger(REPORT_EVERY_MS) || REPORT_EVERY_MS < 100) throw new Error(`--fake-report-every-ms must be a whole number of milliseconds, at least 100, got ${JSON.stringify(opts['fake-report-every-ms'])}`);
  // The bare server answers no key, slot or money want with a grant: with per-minute leases the
  // simulated nodes would send it other traffic than they send the control plane.
  if (opts.bare && leases === 'per-minute') throw new Error('--bare measures --fake-leases shares or none, not per-minute');
  const withLogs = !opts['no-fake-logs'];
  console.log(
    `tollgate bench:tenants --fake-nodes: ${nodesCount} simulated nodes, ${RATE.toLocaleString('en')} req/s in all, ${KEYS.toLocaleString('en')} keys in ${ORGS.toLocaleString('en')} organisations, Zipf s = ${ZIPF}, ${DURATION_SEC} s; leases: ${leases}; request logs: ${withLogs ? 'yes' : 'no'}; a report every ${REPORT_EVERY_MS} ms`,
  );
  const loadAtStart = machineLoad();
  console.log(`  load average at the start: ${loadAtStart.join(', ')}`);
  const results: FakeResult[] = [];
  let secrets: ControlPlane['secrets'] | undefined;
  for (const storeName of STORES) {
    const { cp, store, stop } = await provision(storeName, KEYS, ORGS, false);
    secrets = cp.secrets;
    results.push(await simulate(`control plane on ${store.name}`, { address: cp.address, secrets: cp.secrets, pid: cp.proc.child.pid!, adminUrl: cp.adminUrl, lastLines: () => cp.proc.output(), store }, leases, withLogs));
    await stop();
  }
  let bareResult: FakeResult | null = null;
  if (opts.bare) {
    // The same simulated nodes against a bare SyncService (bare-sync.ts): what the messages alone cost.
    const bare = startProcess(['test/bench/bare-sync.ts']);
    const address = (await bare.waitFor(/bare sync listening on (\S+)/))[1];
    bareResult = await simulate('bare sync server', { address, secrets: secrets!, pid: bare.child.pid!, adminUrl: undefined, lastLines: () => bare.output(), store: null }, leases, withLogs);
    await bare.kill('SIGTERM');
  }
  printFakeTable(results, bareResult);
  const loadAtEnd = machineLoad();
  console.log(`load average at the start ${loadAtStart.join(', ')}, at the end ${loadAtEnd.join(', ')}`);
  writeResults('tenants-fake', { at: new Date().toISOString(), zipf: ZIPF, durationSec: DURATION_SEC, stores: STORES, loadAtStart, loadAtEnd, results, bare: bareResult });
  await stopAll();
}

export type FakeResult = Awaited<ReturnType<typeof simulate>>;

/** Reports of the measured run the target acknowledged. */
function ackedSince(sim: FakeSim): number {
  let n = 0;
  for (const seq of sim.node.reportAcks) if (seq >= sim.firstSeq) n++;
  return n;
}

/** Where simulated nodes connect: the control plane, or the bare sync server. */
interface Target {
  address: string;
  secrets: ControlPlane['secrets'];
  pid: number;
  adminUrl: string | undefined;
  lastLines(): string;
  /** The control plane's store (its database server's CPU is read too); null: the bare sync server. */
  store: Store | null;
}

/** Simulated nodes against `target`: RATE req/s for DURATION_SEC, then the tail; printed and returned. */
async function simulate(label: string, target: Target, leases: 'shares' | 'per-minute' | 'none', withLogs: boolean) {
  const nodesCount = NODE_COUNTS[0];
  const cpPid = target.pid;
  const dbCpu = () => target.store?.dbCpu?.() ?? null;
  const orgIdOf = (r: number) => `org_t${String(r % ORGS).padStart(7, '0')}`;
  const projectIdOf = (r: number) => `proj_t${String(r % ORGS).padStart(7, '0')}`;
  const keyIdOf = (r: number) => `key_t${String(r).padStart(8, '0')}`;
  const sims: FakeSim[] = [];
  for (let i = 0; i < nodesCount; i++) {
    const sim = { seq: 0, usedSeq: 0, sentReports: 0, firstSeq: 1, requestsInReport: new Map(), usage: new Map(), lastUsed: new Map(), logBlocks: [], minute: 0, seenThisMinute: new Set(), usedThisMinute: new Map(), usedThisTick: new Set(), slotted: new Set(), money: new Map(), moneyAsked: new Set(), keyWants: [], slotWants: [], orgWants: [], sharesAsked: false, bulkAsked: 0, usedSecond: 0 } as unknown as FakeSim;
    sim.node = await startFakeNode(
      target,
      {
        nodeId: `fake-${i}`,
        holdAcks: false,
        onMessage: (msg) => {
          if (msg.leaseGrant) {
            for (const o of msg.leaseGrant.orgs) {
              const r = Number(o.orgId.slice(5));
              sim.money.set(r, (sim.money.get(r) ?? 0) + o.micros);
              sim.moneyAsked.delete(r);
            }
          }
          // A reclaim is answered at once: a simulated node holds nothing it could give back.
          if (msg.leaseReclaim) sim.node.write({ leaseRequest: leaseRequest({ reclaimId: msg.leaseReclaim.id }) });
        },
      },
      120_000,
    );
    sims.push(sim);
  }
  console.log(`  ${nodesCount} simulated nodes connected and hold the snapshot`);

  const zipf = zipfSampler(KEYS, ZIPF);
  const perNodeTick = RATE / nodesCount / 10;
  if (withLogs) {
    const at = Date.now();
    for (const sim of sims) {
      const b = new LogBlocksBuilder();
      // One report's worth: a node's requests of REPORT_EVERY_MS.
      const rows = Math.round(((RATE / nodesCount) * REPORT_EVERY_MS) / 1000);
      for (let n = 0; n < rows; n++) {
        const r = zipf();
        b.add({
          requestId: `req_${sim.node.nodeId}_${n}`, atMs: at + Math.floor((n * REPORT_EVERY_MS) / rows), keyId: keyIdOf(r), projectId: projectIdOf(r), orgId: orgIdOf(r), clientIp: '10.1.2.3', userAgent: 'bench', method: 'POST',
          path: '/v1/chat/completions', status: 200, latencyUs: 400, bytesIn: 190, bytesOut: 400, model: 'demo-chat', promptTokens: DEMO_PROMPT_TOKENS, completionTokens: DEMO_COMPLETION_TOKENS, costMicros: DEMO_COST_MICROS, reason: '', keyPrefix: 'sk-tollgate-...0000',
        });
      }
      sim.logBlocks = b.blocks();
    }
  }
  const tick = (sim: FakeSim, count: number, nowMs: number) => {
    const minute = Math.floor(nowMs / 60_000);
    if (minute !== sim.minute) {
      sim.minute = minute;
      sim.seenThisMinute.clear();
      sim.usedThisMinute.clear();
    }
    for (let n = 0; n < count; n++) {
      const r = zipf();
      const org = r % ORGS;
      const id = `${r}:${minute}`;
      let t = sim.usage.get(id);
      if (!t) {
        t = { keyId: keyIdOf(r), orgId: orgIdOf(r), projectId: projectIdOf(r), model: 'demo-chat', minute, leaseEpoch: 1, requests: 0, promptTokens: 0, completionTokens: 0, costMicros: 0 };
        sim.usage.set(id, t);
      }
      t.requests++;
      t.promptTokens += DEMO_PROMPT_TOKENS;
      t.completionTokens += DEMO_COMPLETION_TOKENS;
      t.costMicros += DEMO_COST_MICROS;
      sim.lastUsed.set(r, nowMs);
      if (leases === 'none') continue;
      if (leases === 'shares') {
        sim.usedThisMinute.set(r, (sim.usedThisMinute.get(r) ?? 0) + 1);
        sim.usedThisTick.add(r);
        continue;
      }
      if (!sim.seenThisMinute.has(r)) {
        sim.seenThisMinute.add(r);
        sim.keyWants.push({ keyId: t.keyId, minute, requests: 1000, tokens: 1_000_000, heldRequests: 0, heldTokens: 0, needRequests: 1, needTokens: 0 });
      }
      if (!sim.slotted.has(r)) {
        sim.slotted.add(r);
        sim.slotWants.push({ keyId: t.keyId, held: 0, want: 10, need: 1 });
      }
      const money = (sim.money.get(org) ?? 0) - DEMO_COST_MICROS;
      sim.money.set(org, money);
      if (money < 100_000 && !sim.moneyAsked.has(org)) {
        sim.moneyAsked.add(org);
        sim.orgWants.push(org);
      }
      sim.usedThisMinute.set(r, (sim.usedThisMinute.get(r) ?? 0) + 1);
      sim.usedThisTick.add(r);
    }
    if (leases === 'none') return;
    if (leases === 'shares') {
      // Asked once per connection, then once a minute (the next minute's in its last ten seconds).
      const first = !sim.sharesAsked;
      sim.sharesAsked = true;
      const bulk = minute !== sim.bulkAsked ? minute : nowMs % 60_000 >= 50_000 && sim.bulkAsked !== minute + 1 ? minute + 1 : 0;
      if (bulk) sim.bulkAsked = bulk;
      // What was used within the standing shares is said once a whole second.
      const second = Math.floor(nowMs / 1000);
      const said = second !== sim.usedSecond;
      sim.usedSecond = second;
      const used = said ? [...sim.usedThisTick].map((r) => ({ keyId: keyIdOf(r), minute, requests: sim.usedThisMinute.get(r) ?? 0, tokens: (sim.usedThisMinute.get(r) ?? 0) * (DEMO_PROMPT_TOKENS + DEMO_COMPLETION_TOKENS) })) : [];
      if (said) sim.usedThisTick.clear();
      if (first || bulk || used.length > 0) {
        sim.node.write({ leaseRequest: leaseRequest({ wantSlotShare: first, wantOrgSlices: first, bulkMinute: bulk, used, usedSeq: used.length > 0 ? ++sim.usedSeq : 0 }) });
      }
      return;
    }
    const used = [...sim.usedThisTick].map((r) => ({ keyId: keyIdOf(r), minute, requests: sim.usedThisMinute.get(r) ?? 0, tokens: (sim.usedThisMinute.get(r) ?? 0) * (DEMO_PROMPT_TOKENS + DEMO_COMPLETION_TOKENS) }));
    sim.usedThisTick.clear();
    const req = leaseRequest({
      keys: sim.keyWants.splice(0),
      orgs: sim.orgWants.splice(0).map((o) => ({ orgId: orgIdOf(o), micros: 100_000 })),
      slotWants: sim.slotWants.splice(0),
      used,
      usedSeq: used.length > 0 ? ++sim.usedSeq : 0,
    });
    if (req.keys.length + req.orgs.length + req.slotWants.length + req.used.length > 0) sim.node.write({ leaseRequest: req });
  };
  const report = (sim: FakeSim) => {
    const usageTotals = [...sim.usage.values()];
    sim.usage.clear();
    const lastUsed = [...sim.lastUsed].map(([r, atMs]) => ({ keyId: keyIdOf(r), atMs }));
    sim.lastUsed.clear();
    const logBlocks = withLogs ? sim.logBlocks : [];
    if (usageTotals.length === 0) return;
    sim.node.write({ reports: { reports: [{ seq: ++sim.seq, usage: [], lastUsed, logs: undefined, instanceId: '', usageTotals, logBlocks }] } });
    sim.sentReports++;
    sim.requestsInReport.set(sim.seq, usageTotals.reduce((n, t) => n + t.requests, 0));
  };

  // RATE req/s from the simulated nodes for `seconds`, a report from each every REPORT_EVERY_MS; returns the requests simulated.
  const drive = async (seconds: number): Promise<number> => {
    const t0 = performance.now();
    let simulated = 0;
    let lastReportAt = t0;
    let carry = 0;
    let ticks = 0;
    while (performance.now() - t0 < seconds * 1000) {
      ticks++;
      const due = ((performance.now() - t0) / 1000) * RATE;
      const count = Math.max(0, due - simulated);
      const per = (count + carry) / nodesCount;
      const whole = Math.floor(per);
      carry = (per - whole) * nodesCount;
      const now = Date.now();
      for (const sim of sims) tick(sim, whole, now);
      simulated += whole * nodesCount;
      if (performance.now() - lastReportAt >= REPORT_EVERY_MS) {
        lastReportAt = performance.now();
        for (const sim of sims) report(sim);
      }
      await sleep(Math.max(0, t0 + ticks * 100 - performance.now()));
    }
    for (const sim of sims) report(sim);
    return simulated;
  };
  // Settle, then idle (before any load: a process catching up on a warm-up is not idle), then the
  // warm-up, then the load, then a tail for the last reports. A process just started, or that just
  // sent its snapshots, keeps compiling and collecting for several seconds: not its idle cost.
  await sleep(SETTLE_MS);
  const idle0 = cpuMicros(cpPid);
  const dbIdle0 = dbCpu();
  const idleT0 = performance.now();
  await sleep(IDLE_SEC * 1000);
  const idleSec = (performance.now() - idleT0) / 1000;
  const idleRate = idle0 === null ? null : (cpuMicros(cpPid)! - idle0) / idleSec;
  const dbIdleRate = dbIdle0 === null ? null : (dbCpu()! - dbIdle0) / idleSec;
  // --warmup: the same load first, not counted (the steady state of a process that has run a while).
  if (WARMUP_SEC > 0) {
    await drive(WARMUP_SEC);
    const until = performance.now() + 60_000;
    while (sims.some((x) => ackedSince(x) < x.sentReports) && performance.now() < until) await sleep(100);
    if (sims.some((x) => ackedSince(x) < x.sentReports)) console.log(`  ${label}: warning: the warm-up's reports were not all acknowledged within 60 s; the measured run starts behind`);
    // Only the measured run's reports count from here (a late acknowledgement of a warm-up report is not one of them).
    for (const sim of sims) {
      sim.firstSeq = sim.seq + 1;
      sim.requestsInReport.clear();
      sim.sentReports = 0;
    }
  }
  const stopRss = watchRss(cpPid, 200);
  const cpu0 = cpuMicros(cpPid);
  const db0 = dbCpu();
  const t0 = performance.now();
  const wall0 = Date.now();
  const simulated = await drive(DURATION_SEC);
  const loadSec = (performance.now() - t0) / 1000;
  const wall1 = Date.now();
  // The tail: until every report is acknowledged (the control plane kept up) or 60 s.
  const tail0 = performance.now();
  while (sims.some((x) => ackedSince(x) < x.sentReports) && performance.now() - tail0 < 60_000) await sleep(100);
  const tailSec = (performance.now() - tail0) / 1000;
  const cpu1 = cpuMicros(cpPid);
  const db1 = dbCpu();
  const peakRss = stopRss();
  if (target.adminUrl) console.log(`  control plane's counters: ${JSON.stringify(await cpCounters(target.adminUrl))}`);
  const measuredSec = loadSec + tailSec;
  const used = cpu0 === null || cpu1 === null || idleRate === null ? null : Math.max(0, cpu1 - cpu0 - idleRate * measuredSec);
  const dbUsed = db0 === null || db1 === null || dbIdleRate === null ? null : Math.max(0, db1 - db0 - dbIdleRate * measuredSec);
  const acked = sims.reduce((s, x) => s + ackedSince(x), 0);
  // What the control plane wrote and acknowledged (when it could not keep up, less than was sent).
  const ackedRequests = sims.reduce((n, x) => n + x.node.reportAcks.reduce((m, seq) => m + (x.requestsInReport.get(seq) ?? 0), 0), 0);
  const sentReports = sims.reduce((s, x) => s + x.sentReports, 0);
  const result = {
    mode: 'fake-nodes',
    target: target.store?.name ?? 'bare',
    nodes: nodesCount,
    keys: KEYS,
    orgs: ORGS,
    rate: RATE,
    leases,
    logs: withLogs,
    simulatedRequests: simulated,
    simulatedRate: simulated / loadSec,
    loadSec,
    tailSec,
    crossedMinute: Math.floor(wall0 / 60_000) !== Math.floor(wall1 / 60_000),
    coreShare: used === null ? null : used / 1e6 / measuredSec,
    cpUsPerRequest: used === null ? null : used / simulated,
    ackedRequests,
    /** CPU per request the control plane acknowledged: a fair figure also when it fell behind (CPU-starved). */
    cpUsPerAckedRequest: used === null || ackedRequests === 0 ? null : used / ackedRequests,
    cpPeakRssBytes: peakRss,
    /** The database server (PostgreSQL; null for SQLite, in process, and the bare server): its share of a core, per simulated and per acknowledged request. */
    dbCoreShare: dbUsed === null ? null : dbUsed / 1e6 / measuredSec,
    dbUsPerRequest: dbUsed === null ? null : dbUsed / simulated,
    dbUsPerAckedRequest: dbUsed === null || ackedRequests === 0 ? null : dbUsed / ackedRequests,
    reportsSent: sentReports,
    reportsAcked: acked,
    perTickPerNode: perNodeTick,
    loadAverage: machineLoad(),
  };
  console.log(
    `  ${label}: simulated ${simulated.toLocaleString('en')} requests in ${loadSec.toFixed(1)} s (${result.simulatedRate.toFixed(0)}/s${result.crossedMinute ? ', crossed a minute' : ''}); ` +
      `${acked}/${sentReports} reports acknowledged, the last ${tailSec.toFixed(1)} s after the load; ` +
      `control plane: ${result.coreShare === null ? 'n/a' : `${(result.coreShare * 100).toFixed(1)}% of one core`}, ${result.cpUsPerRequest === null ? 'n/a' : result.cpUsPerRequest.toFixed(2)} µs per simulated request, ` +
      `${result.cpUsPerAckedRequest === null ? 'n/a' : result.cpUsPerAckedRequest.toFixed(2)} µs per acknowledged request (${ackedRequests.toLocaleString('en')}; at ${RATE.toLocaleString('en')} req/s that is ${result.cpUsPerAckedRequest === null ? 'n/a' : ((result.cpUsPerAckedRequest * RATE) / 1e4).toFixed(0)}% of a core), peak RSS ${peakRss === null ? 'n/a' : (peakRss / MB).toFixed(0)} MB, load average ${result.loadAverage.join(', ')}` +
      (target.store?.name === 'postgres' ? `; database server: ${result.dbCoreShare === null ? 'n/a' : `${(result.dbCoreShare * 100).toFixed(1)}% of one core`}, ${result.dbUsPerAckedRequest === null ? 'n/a' : result.dbUsPerAckedRequest.toFixed(2)} µs per acknowledged request` : ''),
  );
  for (const sim of sims) {
    const err = sim.node.streamError();
    if (err) console.log(`  ${sim.node.nodeId}: its stream failed: ${err.message}`);
    sim.node.close();
  }
  if (acked < sentReports) console.log(`  ${label}: its last lines:\n${target.lastLines().split('\n').slice(-8).join('\n')}`);
  return result;
}

function leaseRequest(p: Partial<LeaseRequest>): LeaseRequest {
  return { keys: [], orgs: [], reclaimId: 0, keyReturns: [], orgReturns: [], leaseEpoch: 1, leaving: false, used: [], usedSeq: 0, slotWants: [], slotReturns: [], taken: [], bulkMinute: 0, wantSlotShare: false, wantOrgSlices: false, ...p };
}
