// Days written before blocks existed: earlier versions kept one row per request in logs_YYYYMMDD.
// Such a table becomes blocks (with their key index) when the store opens, then is dropped.
import { LogBlocksBuilder, type LogRow } from '../../../proto/lib/log-columns.js';
import { dayOf, type LogDays } from './log-days.js';
import { insertIndex } from './log-index.js';
import { insertBlocks, type LogWriter } from './log-writer.js';

/** The per-row tables of earlier versions, converted to blocks when the store opens. */
const OLD_TABLE_RE = /^logs_(\d{8})$/;

/** Converts every per-row day table among `tables` (the file's tables named log%). */
export async function convertOldDays(days: LogDays, writer: LogWriter, tables: readonly string[]): Promise<void> {
  for (const name of tables) {
    const m = OLD_TABLE_RE.exec(name);
    if (m) await convertOldDay(days, writer, m[1]);
  }
}

/**
 * A day table of row-per-request logs (earlier versions) becomes blocks, in one transaction, read
 * 20,000 rows at a time so a large table never sits in memory whole.
 */
async function convertOldDay(days: LogDays, writer: LogWriter, day: string): Promise<void> {
  const added: string[] = [];
  let converted = 0;
  await writer.inTx(added, async (tx) => {
    const builders = new Map<string, LogBlocksBuilder>();
    const flush = async (node: string, blocks: LogBlocksBuilder) => {
      for (const b of blocks.blocks()) {
        const day = dayOf(b.minAtMs);
        await writer.ensureDay(tx, day, added);
        const entries = await insertBlocks(tx, day, node, [b]);
        await insertIndex(tx, day, entries, entries.reduce((m, e) => Math.max(m, e[2]), 0));
      }
      builders.delete(node);
    };
    let after = 0;
    for (;;) {
      const rows = await tx.all<Record<string, string | number> & { rid: number }>(`SELECT rowid AS rid, * FROM logs_${day} WHERE rowid > ? ORDER BY rowid LIMIT 20000`, [after]);
      if (rows.length === 0) break;
      for (const r of rows) {
        const node = String(r.node_id);
        let blocks = builders.get(node);
        if (!blocks) builders.set(node, (blocks = new LogBlocksBuilder()));
        blocks.add(oldRow(r));
        if (blocks.rows >= 2000) await flush(node, blocks);
      }
      after = rows[rows.length - 1].rid;
      converted += rows.length;
    }
    for (const [node, blocks] of [...builders]) await flush(node, blocks);
    await tx.exec(`DROP TABLE logs_${day}`);
  });
  days.opts.log?.(`request logs: ${converted} rows of ${day} converted to blocks`);
}

function oldRow(r: Record<string, string | number>): LogRow {
  const s = (k: string) => String(r[k] ?? '');
  const n = (k: string) => Number(r[k] ?? 0);
  return {
    requestId: s('request_id'),
    atMs: n('at_ms'),
    keyId: s('key_id'),
    projectId: s('project_id'),
    orgId: s('org_id'),
    clientIp: s('client_ip'),
    userAgent: s('user_agent'),
    method: s('method'),
    path: s('path'),
    status: n('status'),
    latencyUs: n('latency_us'),
    bytesIn: n('bytes_in'),
    bytesOut: n('bytes_out'),
    model: s('model'),
    promptTokens: n('prompt_tokens'),
    completionTokens: n('completion_tokens'),
    costMicros: n('cost_micros'),
    reason: s('reason'),
    keyPrefix: s('key_prefix'),
  };
}
