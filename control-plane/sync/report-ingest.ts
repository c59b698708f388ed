// Reports from nodes, written exactly once. A report carries usage summed per key, model, minute and
// lease epoch, last_used_at, and request logs packed in blocks, numbered per (node_id, instance_id).
// Its log blocks go to the log store (their own file, their own cursor), stored as they came; its
// usage and money go to the state database by one insert into report_sink (039-report-sink.ts), a
// transaction by itself unless the write must also read or publish something (then BEGIN … COMMIT):
// the report's cursor moved, the minutes appended to the usage journal (folded later,
// usage-fold.ts), spend per organisation and month and all-time, and last_used_at, all by that one
// insert, and the organisations whose money moved looked at in
// memory (ControlState.refreshSpent; issue 19): a fixed number of statements however many keys and
// organisations a report holds, and nothing per request. Each node instance's cursor is kept in
// memory once read (this process is the database's only writer), so telling a replay costs no
// statement. The reports of several nodes that wait while a transaction runs are written in the next
// one together (group commit). A report at or below a cursor is a replay and changes nothing in that
// store, so a crash between the two writes is repaired by the node sending the report again. Reports
// of older nodes (one UsageRecord per call, one LogColumns) are summed and packed here into the same
// form.
import { clampCount, decodeLogColumns, LogBlocksBuilder } from '../../proto/lib/log-columns.js';
import { UsageTotals } from '../../proto/lib/usage-totals.js';
import { isInstanceId, isNodeId } from '../../proto/lib/node-ids.js';
import { monthOf } from '../../proto/lib/money.js';
import type { LogBlock, Report, StoredResponse, UsageRecord, UsageTotal } from '../../proto/gen/tollgate/v1/sync.js';
import type { ControlState } from '../state/control-state.js';
import type { Tx } from '../store/db.js';
import type { LogStore } from '../store/log-store/log-store.js';
import type { StoredResponsesFanout } from './stored-responses.js';
import { reportCursor, writeReportRows, type UsageMinute } from '../store/usage-repo.js';
import { UsageFold } from './usage-fold.js';
import { KeptCursors } from '../store/kept-cursors.js';
import type { KeySpend } from '../leases/money-pools.js';

export interface ReportSource {
  nodeId: string;
  instanceId: string;
}

export interface IngestResult {
  duplicate: boolean;
  /** Model calls counted (the sum of the report's usage totals). */
  inserted: number;
  /** Request-log rows written. */
  logs: number;
}

export type KeySpendHook = (costs: readonly KeySpend[]) => void;
/** Told each organisation's cost per lease epoch right after COMMIT (money leases). */
export type SpendHook = (orgId: string, costMicros: number, leaseEpoch: number) => void;

type UsageResult = Omit<IngestResult, 'logs'>;

/** What a write learned: each unit's result, whether it committed, which unit's own hooks threw. */
interface WriteOutcome {
  committed: boolean;
  results: UsageResult[];
  hookErrors: Map<number, Error>;
}

/** One node's consecutive reports waiting to be written with others (ReportIngest.writeUsage). */
interface UsageUnit {
  src: ReportSource;
  reports: readonly Report[];
  onSpend?: SpendHook;
  onKeySpend?: KeySpendHook;
  resolve(r: UsageResult): void;
  reject(err: Error): void;
}

/** last_used_at is kept to this resolution (design: a convenience for operators, not money). */
export const LAST_USED_RESOLUTION_MS = 60_000;

export class ReportIngest {
  /** When this process last wrote each key's last_used_at (committed), as ms since the epoch. */
  private readonly lastUsedWritten = new Map<string, number>();
  /** Node instances' report cursors as committed (only this ingest moves them, after COMMIT). */
  private readonly cursors = new KeptCursors();
  /** Folds the usage journal this appends to (started by the process, usage-fold.ts). */
  readonly usageFold: UsageFold;
  /** Units of usage waiting for the next transaction, and whether one is being written (writeUsage). */
  private waiting: UsageUnit[] = [];
  private writing = false;

  constructor(
    private readonly state: ControlState,
    private readonly logs: LogStore | null = null,
    /** Where the responses nodes created are kept and sent on (the Responses API). */
    private readonly storedResponses: StoredResponsesFanout | null = null,
    private readonly log: (line: string) => void = () => undefined,
  ) {
    this.usageFold = new UsageFold(state.db, log);
  }

  /**
   * Consecutive reports of one node instance (seq ascending), written together: one transaction per
   * store for all of them. Reports at or below a store's cursor are replays and skipped there.
   * `onSpend` runs right after COMMIT for each organisation's cost in them, per lease epoch the costs
   * were reserved under (money leases).
   */
  async ingestMany(source: ReportSource, reports: readonly Report[], onSpend?: SpendHook, onKeySpend?: KeySpendHook): Promise<IngestResult> {
    if (reports.length === 0) return { duplicate: true, inserted: 0, logs: 0 };
    for (let i = 1; i < reports.length; i++) {
      if (reports[i].seq <= reports[i - 1].seq || reports[i].instanceId !== reports[0].instanceId) throw new Error('reports sent together must be consecutive reports of one instance');
    }
    // A node replaying its journal after a restart sends reports numbered by its former instance.
    const src = { nodeId: source.nodeId, instanceId: reports[0].instanceId || source.instanceId };
    // The ids key the cursors (written through JSON, where a NUL would cut them short): plain only.
    if (!isNodeId(src.nodeId) || !isInstanceId(src.instanceId)) throw new Error(`reports refused: node id ${JSON.stringify(src.nodeId)} or instance id ${JSON.stringify(src.instanceId)} is not 1-128 characters of A-Z a-z 0-9 . _ : -`);
    let logs = 0;
    if (this.logs) {
      const parts = reports.map((r) => ({ seq: r.seq, blocks: r.logs ? [...r.logBlocks, ...blocksOfColumns(r)] : r.logBlocks })).filter((p) => p.blocks.length > 0);
      if (parts.length > 0) logs = (await this.logs.writeBlocks(src, parts)).written;
    }
    const r = await this.writeUsage(src, reports, onSpend, onKeySpend);
    return { ...r, logs };
  }

  /**
   * Writes a unit's usage and money with the units of other nodes that wait meanwhile: while one
   * transaction runs, the units that arrive queue, and the next transaction takes all of them (group
   * commit; docs/design.md#reports-of-several-nodes-in-one-transaction). A node sends its next unit only after this one is written, so each node's
   * order is kept (a node that reconnects may have its old stream's unit and its resend in one
   * transaction: their cursor statements run in order, and the resend is a replay). When a shared
   * transaction fails, each of its units is written alone, so one report that cannot be written fails
   * only its own node's stream.
   */
  private writeUsage(src: ReportSource, reports: readonly Report[], onSpend?: SpendHook, onKeySpend?: KeySpendHook): Promise<UsageResult> {
    return new Promise((resolve, reject) => {
      this.waiting.push({ src, reports, onSpend, onKeySpend, resolve, reject });
      this.writeWaiting();
    });
  }

  private writeWaiting(): void {
    if (this.writing || this.waiting.length === 0) return;
    const units = this.waiting;
    this.waiting = [];
    this.writing = true;
    void this.writeUnits(units).finally(() => {
      this.writing = false;
      this.writeWaiting();
    });
  }

  private async writeUnits(units: readonly UsageUnit[]): Promise<void> {
    const failed = await this.writeTogether(units);
    if (!failed) return;
    if (units.length === 1) return units[0].reject(failed);
    this.log(`sync: ${units.length} nodes' reports not written together (${failed.message}); writing each alone`);
    for (const u of units) {
      const e = await this.writeTogether([u]);
      if (e) u.reject(e);
    }
  }

  /**
   * Writes the units in one transaction and, once it committed, settles each: a unit whose own hook
   * (its connection's leases) threw fails its stream (its report is written, so the node's resend is
   * a replay), the others are acknowledged. Returns the error when it did not commit (nothing settled).
   */
  private async writeTogether(units: readonly UsageUnit[]): Promise<Error | null> {
    const done: WriteOutcome = { committed: false, results: [], hookErrors: new Map() };
    try {
      await this.state.db.tx((tx) => this.writeInTx(tx, units, done));
    } catch (err) {
      if (!done.committed) return err as Error;
      // Committed, and a hook that was not a unit's own failed after COMMIT: logged; the units are written.
      this.log(`sync: after reports were written: ${(err as Error).message}`);
    }
    units.forEach((u, i) => {
      const e = done.hookErrors.get(i);
      if (e) u.reject(e);
      else u.resolve(done.results[i]);
    });
    return null;
  }

  /**
   * The units' usage and money in `tx`: one statement however many units, keys and organisations,
   * plus a cursor read for a node instance this process has not seen report yet.
   * `done` learns each unit's result, whether COMMIT happened, and which unit's own hooks threw.
   */
  private async writeInTx(tx: Tx, units: readonly UsageUnit[], done: WriteOutcome): Promise<void> {
    const now = this.state.now();
    const at = new Date(now).toISOString();
    const results = done.results;
    // First of this transaction's hooks: from here on it is committed, whatever a later hook does.
    tx.afterCommit(() => (done.committed = true));
    // Rows are found by key, then among that key's few rows by minute, model and project: no string is
    // built per total (at cluster scale a write holds tens of thousands of them).
    const minutes = new Map<string, Map<number, UsageMinute[]>>();
    const monthly = new Map<string, { orgId: string; month: string; micros: number }[]>();
    const lastUsed = new Map<string, number>();
    const stored: StoredResponse[] = [];
    const hooks: (() => void)[] = [];
    // A report's totals fall in a minute or two: the month of each is computed once.
    const monthOfMinute = new Map<number, string>();
    // Cursors this transaction moves (a node's resent unit may follow its first in the same one).
    const moved = new Map<string, { nodeId: string; instanceId: string; lastSeq: number; at: string }>();
    for (const [unitIndex, { src, reports, onSpend, onKeySpend }] of units.entries()) {
      const id = KeptCursors.id(src.nodeId, src.instanceId);
      const cursor = moved.get(id)?.lastSeq ?? (await this.cursors.get(id, () => reportCursor(tx, src.nodeId, src.instanceId)));
      // Normally all are new. Else only those past the cursor count (a resend after a lost ack). An
      // instance without a cursor has written nothing: every report of it is new, whatever its seq.
      const fresh = cursor === null || reports[0].seq > cursor ? reports : reports.filter((r) => r.seq > cursor);
      if (fresh.length === 0) {
        results.push({ duplicate: true, inserted: 0 });
        continue;
      }
      moved.set(id, { nodeId: src.nodeId, instanceId: src.instanceId, lastSeq: reports[reports.length - 1].seq, at });
      const totals: UsageTotal[] = [];
      for (const r of fresh) totals.push(...r.usageTotals, ...(r.usage.length > 0 ? totalsOfRecords(r.usage, now) : []));
      // What this unit's node reserved its costs under: told to its own connection's leases.
      // By organisation for finding, and in the order first met for telling (as before batching).
      const spent = new Map<string, { orgId: string; epoch: number; cost: number }[]>();
      const spentInOrder: { orgId: string; epoch: number; cost: number }[] = [];
      const keyCosts: KeySpend[] = [];
      let calls = 0;
      for (const t of totals) {
        const requests = clampCount(t.requests);
        if (requests === 0 || !t.keyId) continue;
        const minute = clampCount(t.minute);
        const cost = clampCount(t.costMicros);
        calls += requests;
        // Totals of one key, model and minute under two lease epochs (or from two nodes) are one row of usage.
        let byMinute = minutes.get(t.keyId);
        if (!byMinute) minutes.set(t.keyId, (byMinute = new Map()));
        const rows = byMinute.get(minute);
        const m = rows?.find((x) => x.model === t.model && x.projectId === t.projectId);
        if (m) {
          m.requests += requests;
          m.promptTokens += clampCount(t.promptTokens);
          m.completionTokens += clampCount(t.completionTokens);
          m.costMicros += cost;
        } else {
          const row = {
            projectId: t.projectId,
            minute,
            keyId: t.keyId,
            model: t.model,
            orgId: t.orgId,
            requests,
            promptTokens: clampCount(t.promptTokens),
            completionTokens: clampCount(t.completionTokens),
            costMicros: cost,
          };
          if (rows) rows.push(row);
          else byMinute.set(minute, [row]);
        }
        if (cost > 0 && t.orgId) {
          let month = monthOfMinute.get(minute);
          if (month === undefined) monthOfMinute.set(minute, (month = monthOf(minute * 60_000)));
          const months = monthly.get(t.orgId);
          const mo = months?.find((x) => x.month === month);
          if (mo) mo.micros += cost;
          else if (months) months.push({ orgId: t.orgId, month, micros: cost });
          else monthly.set(t.orgId, [{ orgId: t.orgId, month, micros: cost }]);
          const epoch = clampCount(t.leaseEpoch);
          if (onKeySpend) keyCosts.push({ keyId: t.keyId, projectId: t.projectId, orgId: t.orgId, minute, costMicros: cost, leaseEpoch: epoch });
          const epochs = spent.get(t.orgId);
          const entry = epochs?.find((x) => x.epoch === epoch);
          if (entry) entry.cost += cost;
          else {
            const e = { orgId: t.orgId, epoch, cost };
            spentInOrder.push(e);
            if (epochs) epochs.push(e);
            else spent.set(t.orgId, [e]);
          }
        }
      }
      for (const r of fresh) {
        for (const list of [r.lastUsed, r.usage]) {
          for (const l of list) if (l.keyId && Number.isSafeInteger(l.atMs) && l.atMs > 0) lastUsed.set(l.keyId, Math.max(lastUsed.get(l.keyId) ?? 0, l.atMs));
        }
      }
      for (const r of fresh) stored.push(...(r.storedResponses?.responses ?? []));
      // The unit's own hooks (its connection's leases, the money limits below the organisation, which
      // follow in memory: no statement): one that throws fails this unit alone.
      hooks.push(() => {
        try {
          if (onSpend) for (const e of spentInOrder) onSpend(e.orgId, e.cost, e.epoch);
          if (onKeySpend && keyCosts.length > 0) onKeySpend(keyCosts);
        } catch (err) {
          done.hookErrors.set(unitIndex, err as Error);
        }
      });
      results.push({ duplicate: false, inserted: calls });
    }
    // Usage appended to the journal (folded into usage_folded later, counted in usage_minutes now),
    // money aggregated per organisation and month, and last_used_at: one statement for all of them.
    const rows = [...minutes.values()].flatMap((byMinute) => [...byMinute.values()].flat());
    const spends = [...monthly.values()].flat();
    // A key's last_used_at is written when it moves by LAST_USED_RESOLUTION_MS or more since this
    // process last wrote it: a busy key costs one row update a minute, not one per report (issue
    // 19: updating rows scattered over api_keys was most of a large report's cost).
    const touched: [string, string][] = [];
    for (const [keyId, atMs] of lastUsed) {
      const written = this.lastUsedWritten.get(keyId);
      if (written === undefined || atMs - written >= LAST_USED_RESOLUTION_MS) touched.push([keyId, new Date(atMs).toISOString()]);
    }
    if (moved.size === 0) return;
    const reportRows = { cursors: [...moved.values()], usage: rows, spend: spends, lastUsed: touched };
    tx.afterCommit(() => {
      for (const [id, c] of moved) this.cursors.keep(id, c.lastSeq);
      this.usageFold.journaled(rows.length);
      for (const [keyId, at] of touched) this.lastUsedWritten.set(keyId, Date.parse(at));
    });
    // The organisations charged, from their committed money in memory plus this write's: no read.
    // Decided from memory, they are looked at first and the report's rows written last, so that a
    // report that changes nothing nodes enforce is that one statement alone, without BEGIN and
    // COMMIT. One that must read an organisation, or keeps stored responses, writes its rows first.
    const month = stored.length === 0 ? this.state.spentFromMemory(spends) : null;
    if (month !== null) {
      // The month checked is the month decided for, whatever the clock says by then: nothing is read.
      if (spends.length > 0) await this.state.refreshSpent(tx, spends, month);
      // (Each unit's hooks come after refreshSpent's: a connection's leases see the committed money.)
      for (const h of hooks) tx.afterCommit(h);
      await writeReportRows(tx, reportRows, { last: true });
      return;
    }
    await writeReportRows(tx, reportRows);
    if (this.storedResponses && stored.length > 0) await this.storedResponses.write(tx, stored);
    if (spends.length > 0) await this.state.refreshSpent(tx, spends);
    for (const h of hooks) tx.afterCommit(h);
  }
}

/** An older node's per-call records, summed as a node sums them now. */
function totalsOfRecords(records: readonly UsageRecord[], now: number): UsageTotal[] {
  const totals = new UsageTotals();
  for (const u of records) {
    if (u.requestId && u.keyId) totals.add(Number.isSafeInteger(u.atMs) && u.atMs > 0 ? u : { ...u, atMs: now });
  }
  return totals.totals();
}

/** An older node's LogColumns, packed into blocks as a node packs them now. */
function blocksOfColumns(report: Report): LogBlock[] {
  const blocks = new LogBlocksBuilder();
  for (const row of decodeLogColumns(report.logs).rows) blocks.add(row);
  return blocks.blocks();
}
