// SyncService.QueryUsage: a node's `GET /v1/usage` answered from the durable usage table. The node
// sends the id of the key it authenticated; the project comes from the control plane's own record of
// that key, so no node input can name another project. A key whose credential is gone (revoked) gets
// NOT_FOUND. Queries run on the database's read-only connection (Db.readOnly), so a burst of them never
// queues ahead of report ingest or money leases. At most MAX_IN_FLIGHT queries run at once, and at most
// MAX_IN_FLIGHT_PER_KEY of one key, so one key cannot take every slot; beyond either,
// RESOURCE_EXHAUSTED, which the node answers as 503 with retry-after.
import { status, type sendUnaryData, type ServerUnaryCall } from '@grpc/grpc-js';
import { secretsEqual } from '../../proto/lib/keys.js';
import type { QueryUsageRequest, QueryUsageResponse } from '../../proto/gen/tollgate/v1/sync.js';
import type { ControlState } from '../state/control-state.js';
import { credentialHashOf, getKey } from '../store/keys-repo.js';
import { usageInRange, type UsageGroupBy } from '../store/usage-repo.js';

export const MAX_IN_FLIGHT = 8;
export const MAX_IN_FLIGHT_PER_KEY = 2;
const GROUPS: ReadonlySet<string> = new Set<UsageGroupBy>(['model', 'day', 'key']);
/** 9999-12-31T23:59:59.999Z: later bounds are refused. */
const MAX_MS = 253_402_300_799_999;

type Callback = sendUnaryData<QueryUsageResponse>;

export function queryUsageHandler(state: ControlState, nodeToken: string, log: (line: string) => void) {
  let inFlight = 0;
  const perKey = new Map<string, number>();
  return (call: ServerUnaryCall<QueryUsageRequest, QueryUsageResponse>, callback: Callback): void => {
    const header = call.metadata.get('authorization')[0];
    const m = typeof header === 'string' ? /^Bearer\s+(\S+)\s*$/i.exec(header) : null;
    if (!m || !secretsEqual(m[1], nodeToken)) return callback({ code: status.UNAUTHENTICATED, details: 'missing or invalid node token' });
    const req = call.request;
    const bad = (details: string) => callback({ code: status.INVALID_ARGUMENT, details });
    if (!req.keyId) return bad('key_id is required');
    if (!GROUPS.has(req.groupBy)) return bad('group_by must be model, day or key');
    const sinceMs = req.sinceMs;
    const untilMs = req.untilMs === 0 ? null : req.untilMs;
    if (!Number.isSafeInteger(sinceMs) || sinceMs < 0 || sinceMs > MAX_MS) return bad('since_ms out of range');
    if (untilMs !== null && (!Number.isSafeInteger(untilMs) || untilMs <= sinceMs || untilMs > MAX_MS)) return bad('until_ms must be later than since_ms');
    if (inFlight >= MAX_IN_FLIGHT) return callback({ code: status.RESOURCE_EXHAUSTED, details: 'too many usage queries at once' });
    const mine = perKey.get(req.keyId) ?? 0;
    if (mine >= MAX_IN_FLIGHT_PER_KEY) return callback({ code: status.RESOURCE_EXHAUSTED, details: 'too many usage queries of this key at once' });
    inFlight++;
    perKey.set(req.keyId, mine + 1);
    state.db
      .readOnly(async (q): Promise<QueryUsageResponse | null> => {
        const key = await getKey(q, req.keyId);
        if (!key || (await credentialHashOf(q, key.id)) === undefined) return null;
        const rows = await usageInRange(q, { projectId: key.project_id }, { sinceMs, untilMs }, req.groupBy as UsageGroupBy);
        const groupOf = (r: (typeof rows)[number]) => (req.groupBy === 'model' ? r.model : req.groupBy === 'day' ? r.day : r.key_id);
        return {
          projectId: key.project_id,
          buckets: rows.map((r) => ({
            group: groupOf(r),
            requests: r.requests,
            promptTokens: r.prompt_tokens ?? 0,
            completionTokens: r.completion_tokens ?? 0,
            costMicros: r.cost_micros ?? 0,
          })),
        };
      })
      .then(
        (res) => callback(res ? null : { code: status.NOT_FOUND, details: 'no such key' }, res ?? undefined),
        (err: Error) => {
          log(`sync: usage query failed: ${err.message}`);
          callback({ code: status.INTERNAL, details: 'internal error' });
        },
      )
      .finally(() => {
        inFlight--;
        const left = (perKey.get(req.keyId) ?? 1) - 1;
        if (left > 0) perKey.set(req.keyId, left);
        else perKey.delete(req.keyId);
      });
  };
}
