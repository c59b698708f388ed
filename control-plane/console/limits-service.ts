// The console's side of money limits below the organisation (docs/money-limits.md): a key's own
// limit given at creation, a project's monthly cap, and what was spent against each (read from the
// committed usage, so `key show` and `project list` agree with what the nodes were leased).
import { LIMIT_RESETS, isLimitReset, limitResetOf, periodEndMs, periodStartMs, type LimitReset } from '../../proto/lib/spend-limits.js';
import { monthOf } from '../../proto/lib/money.js';
import type { ApiKey, CreateKeyRequest, Project, SetProjectCapRequest } from '../../proto/gen/tollgate/v1/console.js';
import type { ControlState } from '../state/control-state.js';
import { invalidArgument } from '../errors.js';
import type { Queryable, Tx } from '../store/db.js';
import type { ApiKeyRow } from '../store/keys-repo.js';
import { keySpendSince, projectSpendsSince, setKeyLimit, setProjectCap } from '../store/money-limits-repo.js';
import { getProject, type ProjectRow } from '../store/orgs-repo.js';

/** The most a limit or cap may be: 1 billion USD (far below 2^53 micros). */
const MAX_LIMIT_MICROS = 1_000_000_000 * 1_000_000;

export interface KeyLimit {
  micros: number;
  reset: LimitReset;
}

/** A CreateKeyRequest's limit, checked (INVALID_ARGUMENT for bad values); null without one. */
export function keyLimitOf(req: Pick<CreateKeyRequest, 'limitMicros' | 'limitReset'>): KeyLimit | null {
  const micros = req.limitMicros;
  const reset = (req.limitReset ?? '').trim();
  if (micros === undefined) {
    if (reset !== '') throw invalidArgument('limit_reset needs limit_micros (a key limit)');
    return null;
  }
  if (!Number.isSafeInteger(micros) || micros <= 0 || micros > MAX_LIMIT_MICROS) throw invalidArgument('limit_micros must be a positive amount of at most 1000000000 USD');
  if (reset !== '' && !isLimitReset(reset)) throw invalidArgument(`limit_reset must be one of ${LIMIT_RESETS.join(', ')}, got ${JSON.stringify(reset.slice(0, 64))}`);
  return { micros, reset: reset === '' ? 'never' : (reset as LimitReset) };
}

/** Records a new key's limit (inside its creation's transaction, before its entry is emitted). */
export async function applyKeyLimit(tx: Tx, row: ApiKeyRow, limit: KeyLimit | null): Promise<void> {
  if (!limit) return;
  row.limit_micros = limit.micros;
  row.limit_reset = limit.reset;
  await setKeyLimit(tx, row.id, limit.micros, limit.reset);
}

/** A key's view with what it spent of its limit in the current period. */
export async function withKeySpend(q: Queryable, key: ApiKey, row: ApiKeyRow, nowMs: number): Promise<ApiKey> {
  if (!row.limit_micros) return key;
  const reset = limitResetOf(row.limit_reset);
  const end = periodEndMs(reset, nowMs);
  const spent = await keySpendSince(q, row.project_id, row.id, Math.floor(periodStartMs(reset, nowMs) / 60_000), Number.isFinite(end) ? end / 60_000 : undefined);
  return { ...key, limitSpentMicros: spent, limitResetsAt: Number.isFinite(end) ? new Date(end).toISOString() : '' };
}

/** The fields of ApiKey that describe its limit (spend filled by withKeySpend). */
export function keyLimitFields(row: ApiKeyRow): Pick<ApiKey, 'limitMicros' | 'limitReset' | 'limitSpentMicros' | 'limitResetsAt'> {
  return { limitMicros: row.limit_micros ?? 0, limitReset: row.limit_micros ? limitResetOf(row.limit_reset) : '', limitSpentMicros: 0, limitResetsAt: '' };
}

export function projectOf(p: ProjectRow, monthSpendMicros = 0, month = ''): Project {
  return { id: p.id, orgId: p.org_id, name: p.name, createdAt: p.created_at, capMicros: p.cap_micros ?? undefined, monthSpendMicros, month };
}

/** Projects with their spend this UTC month, read by one statement. */
export async function projectViews(q: Queryable, rows: readonly ProjectRow[], nowMs: number): Promise<Project[]> {
  const month = monthOf(nowMs);
  const spends = await projectSpendsSince(q, rows.map((p) => p.id), periodStartMs('monthly', nowMs) / 60_000, periodEndMs('monthly', nowMs) / 60_000);
  return rows.map((p) => projectOf(p, spends.get(p.id) ?? 0, month));
}

/**
 * SetProjectCap: the cap is stored and published to the nodes (a ProjectEntry), which give back what
 * they hold of the project's pool and ask afresh, so a lowered cap binds at once and a cleared one
 * stops costing anything. `projectFor` checks the caller's role (admin or above, as for an
 * organisation's cap).
 */
export async function setProjectCapCall(
  state: ControlState,
  req: SetProjectCapRequest,
  projectFor: (q: Queryable) => Promise<{ project: ProjectRow }>,
  afterSet?: (tx: Tx, project: ProjectRow) => Promise<void>,
): Promise<Project> {
  const cap = req.capMicros ?? null;
  if (cap !== null && (!Number.isSafeInteger(cap) || cap <= 0 || cap > MAX_LIMIT_MICROS)) throw invalidArgument('cap_micros must be a positive amount of at most 1000000000 USD (or absent to clear the cap)');
  return state.db.tx(async (tx) => {
    const { project } = await projectFor(tx);
    await setProjectCap(tx, project.id, cap);
    await state.emit(tx, { projectUpsert: { projectId: project.id, capMicros: cap ?? 0 } });
    const row = (await getProject(tx, project.id))!;
    await afterSet?.(tx, row);
    return (await projectViews(tx, [row], state.now()))[0];
  });
}
