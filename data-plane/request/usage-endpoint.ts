// GET /v1/usage: the query a caller may send and the JSON it gets back. Pure, no I/O: the project is
// never a parameter (it is the authenticated key's, decided by the control plane from its record of
// the key), and any parameter not listed here is refused, so no spelling of a query reaches another
// project's usage.
//
// Query: start_time and end_time in unix seconds (start inclusive, default the start of the current UTC
// month; end exclusive, default no bound), group_by one of day (default), model, key. Each at most once.
import type { QueryUsageResponse } from '../../proto/gen/tollgate/v1/sync.js';
import { formatUsd, monthOf } from '../../proto/lib/money.js';
import { GatewayError } from '../errors.js';

export type UsageGroupBy = 'day' | 'model' | 'key';

export interface UsageQuery {
  groupBy: UsageGroupBy;
  /** Unix seconds, as asked or defaulted. */
  startTime: number;
  /** Unix seconds; null means no upper bound. */
  endTime: number | null;
}

/** 9999-12-31T23:59:59Z. */
export const MAX_UNIX_SECONDS = 253_402_300_799;
const GROUPS: readonly UsageGroupBy[] = ['day', 'model', 'key'];
const PARAMS = new Set(['start_time', 'end_time', 'group_by']);
/** The name a bucket's group goes under in the JSON. */
const GROUP_FIELD: Record<UsageGroupBy, string> = { day: 'day', model: 'model', key: 'key_id' };

function invalid(message: string, param: string | null): GatewayError {
  return new GatewayError('INVALID_REQUEST', message, { param });
}

/** A parameter name or value quoted in an error message: bounded and printable. */
function quoted(text: string): string {
  return JSON.stringify(text.length > 40 ? `${text.slice(0, 40)}…` : text);
}

function unixSeconds(name: string, raw: string): number | GatewayError {
  if (!/^\d{1,12}$/.test(raw) || Number(raw) > MAX_UNIX_SECONDS) {
    return invalid(`${name} must be a time in unix seconds (a whole number from 0 to ${MAX_UNIX_SECONDS}), got ${quoted(raw)}.`, name);
  }
  return Number(raw);
}

/** Parses the raw query string (without `?`); the 400 to answer when it is not acceptable. */
export function parseUsageQuery(rawQuery: string, nowMs: number): UsageQuery | GatewayError {
  let params: URLSearchParams;
  try {
    params = new URLSearchParams(rawQuery);
  } catch {
    return invalid('Malformed query string.', null);
  }
  const seen = new Map<string, string>();
  for (const [name, value] of params) {
    if (!PARAMS.has(name)) {
      if (name === 'project_id' || name === 'project' || name === 'key_id' || name === 'org_id') {
        return invalid(`Unknown parameter ${quoted(name)}: an API key reads the usage of its own project only, so no project, key or organisation can be named.`, name);
      }
      return invalid(`Unknown parameter ${quoted(name)}; accepted: start_time, end_time, group_by.`, name.length > 40 ? null : name);
    }
    if (seen.has(name)) return invalid(`Parameter ${name} given more than once.`, name);
    seen.set(name, value);
  }
  const g = seen.get('group_by') ?? 'day';
  if (!(GROUPS as readonly string[]).includes(g)) return invalid(`group_by must be one of day, model, key; got ${quoted(g)}.`, 'group_by');
  let startTime = Math.floor(Date.parse(`${monthOf(nowMs)}-01T00:00:00Z`) / 1000);
  const start = seen.get('start_time');
  if (start !== undefined) {
    const s = unixSeconds('start_time', start);
    if (s instanceof GatewayError) return s;
    startTime = s;
  }
  let endTime: number | null = null;
  const end = seen.get('end_time');
  if (end !== undefined) {
    const e = unixSeconds('end_time', end);
    if (e instanceof GatewayError) return e;
    if (e <= startTime) return invalid(`end_time (${e}) must be later than start_time (${startTime}).`, 'end_time');
    endTime = e;
  }
  return { groupBy: g as UsageGroupBy, startTime, endTime };
}

interface Totals {
  requests: number;
  input_tokens: number;
  output_tokens: number;
  cost_micros: number;
  cost_usd: string;
}

/** The 200 body: {"object":"list","project_id",…,"data":[bucket…],"totals":{…}}. */
export function renderUsage(q: UsageQuery, res: QueryUsageResponse): string {
  const field = GROUP_FIELD[q.groupBy];
  const totals: Totals = { requests: 0, input_tokens: 0, output_tokens: 0, cost_micros: 0, cost_usd: '' };
  const data = res.buckets.map((b) => {
    totals.requests += b.requests;
    totals.input_tokens += b.promptTokens;
    totals.output_tokens += b.completionTokens;
    totals.cost_micros += b.costMicros;
    return {
      object: 'usage.bucket',
      [field]: b.group,
      requests: b.requests,
      input_tokens: b.promptTokens,
      output_tokens: b.completionTokens,
      cost_micros: b.costMicros,
      cost_usd: formatUsd(b.costMicros),
    };
  });
  totals.cost_usd = formatUsd(totals.cost_micros);
  return JSON.stringify({
    object: 'list',
    project_id: res.projectId,
    group_by: q.groupBy,
    start_time: q.startTime,
    end_time: q.endTime,
    data,
    totals,
  });
}
