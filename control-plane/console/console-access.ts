// The console's plumbing, shared by its services (org-service.ts, key-service.ts, usage-service.ts,
// gateway-service.ts; console-service.ts puts them together): authentication, roles and the checks
// of ids and names. Roles per docs/design.md#console-roles: a caller who is not a member of an
// organisation sees nothing of it (NOT_FOUND).
import type { handleUnaryCall, Metadata, sendUnaryData, ServerUnaryCall } from '@grpc/grpc-js';
import type { DeploymentHealth } from '../../proto/gen/tollgate/v1/sync.js';
import { hashToken, secretsEqual } from '../../proto/lib/keys.js';
import type { ControlState } from '../state/control-state.js';
import { CpError, invalidArgument, notFound, permissionDenied, toServiceError, unauthenticated } from '../errors.js';
import type { Queryable, Tx } from '../store/db.js';
import { findAccountByTokenHash, getRole, ROLES, type AccountRow, type Role } from '../store/accounts-repo.js';
import { getOrg, getProject, type OrgRow, type ProjectRow } from '../store/orgs-repo.js';
import type { LogStore } from '../store/log-store/log-store.js';
import { auditScope, type AuditRecorder } from '../audit/audit-recorder.js';
import type { WebhookAdmin } from '../webhooks/webhook-admin.js';
import type { WebhookEvents } from '../webhooks/webhook-events.js';
import type { RevokedKeyWatch } from '../webhooks/revoked-key-watch.js';

export type Caller = { kind: 'operator' } | { kind: 'account'; account: AccountRow };

/** What the console needs from the sync side: who is connected, and waiting for their acks. */
export interface NodeFleet {
  connectedCount(): number;
  /** Waits (at most timeoutMs) until every node connected now acks `version`. */
  awaitAcks(version: number, timeoutMs: number): Promise<{ total: number; confirmed: number; unconfirmed: string[] }>;
  liveNodes(): { id: string; address: string; ackedVersion: number; connectedAt: string; lastSeenAt: string; lastReportAt: string; journalDepth: number | null; journalBytes?: number; droppedLogRows?: number; deployments?: DeploymentHealth[] | null }[];
}

export interface ConsoleServiceOptions {
  operatorToken: string;
  pepper: Buffer;
  revokeAckTimeoutMs: number;
  log?: (line: string, fields?: Record<string, unknown>) => void;
  /** Where request logs are read from (ListRequestLogs). */
  logs?: LogStore;
  /** The audit log: changes and role refusals are recorded there. */
  audit?: AuditRecorder;
  /** Webhook events of key changes, and the console's webhook commands. */
  webhooks?: { events: WebhookEvents; admin: WebhookAdmin; revokedKeys: RevokedKeyWatch };
  /** Told of a project's new cap inside its transaction (the money pools and webhooks follow it). */
  onProjectCapSet?: (tx: Tx, project: ProjectRow) => Promise<void>;
}

export const MAX_LOG_PAGE = 1000;

export const MAX_NAME = 200;
const RFC3339 = /^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,9})?(Z|[+-]\d{2}:\d{2})$/i;

/** An RFC 3339 timestamp as ms since the epoch, or INVALID_ARGUMENT naming the field. */
export function parseInstant(field: string, raw: string): number {
  const text = raw.trim();
  const ms = RFC3339.test(text) ? Date.parse(text) : NaN;
  if (!Number.isFinite(ms)) throw invalidArgument(`${field} must be an RFC 3339 timestamp such as 2025-01-31T00:00:00Z, got ${JSON.stringify(raw.slice(0, 64))}`);
  return ms;
}

export const RANK: Record<Role, number> = { member: 0, admin: 1, owner: 2 };

export function checkName(what: string, raw: string): string {
  const name = (raw ?? '').trim();
  if (name === '') throw invalidArgument(`${what} name must not be empty`);
  if (name.length > MAX_NAME) throw invalidArgument(`${what} name must be at most ${MAX_NAME} characters`);
  return name;
}

export function requireId(field: string, raw: string): string {
  const id = (raw ?? '').trim();
  if (id === '') throw invalidArgument(`${field} is required`);
  refuseKeyValue(field, id);
  return id;
}

/**
 * An API key value pasted where an id belongs (`tollgate key show sk-…`): refused with a fixed message,
 * as "key sk-… not found" would echo the secret back (and into whatever records gRPC errors).
 */
export function refuseKeyValue(field: string, id: string): void {
  if (!/^sk-/i.test(id)) return;
  throw invalidArgument(`${field} is a key value, not a key id: never pass a key value as an argument; find its id with \`tollgate key find < FILE\` (it reads standard input), and revoke it if it leaked`);
}

export function isRole(s: string): s is Role {
  return (ROLES as readonly string[]).includes(s);
}

/** What every console service stands on: the state, the fleet, the options, and the plumbing. */
export abstract class ConsoleAccess {
  protected readonly log: (line: string, fields?: Record<string, unknown>) => void;

  constructor(
    protected readonly state: ControlState,
    protected readonly fleet: NodeFleet,
    protected readonly opts: ConsoleServiceOptions,
  ) {
    this.log = opts.log ?? ((l) => console.error(l));
  }

  // ---- plumbing -------------------------------------------------------------------------------

  protected async authenticate(metadata: Metadata): Promise<Caller> {
    const header = metadata.get('authorization')[0];
    const m = typeof header === 'string' ? /^Bearer\s+(\S+)\s*$/i.exec(header) : null;
    if (!m) throw unauthenticated('missing or invalid token');
    const token = m[1];
    if (secretsEqual(token, this.opts.operatorToken)) return { kind: 'operator' };
    const account = await findAccountByTokenHash(this.state.db, hashToken(token));
    if (!account) throw unauthenticated('missing or invalid token');
    return { kind: 'account', account };
  }

  protected unary<Req, Res>(fn: (req: Req, caller: Caller) => Promise<Res>): handleUnaryCall<Req, Res> {
    return (call: ServerUnaryCall<Req, Res>, callback: sendUnaryData<Res>) => {
      let answered = false;
      const answer = (err: Parameters<sendUnaryData<Res>>[0], res?: Res) => {
        if (answered) return;
        answered = true;
        if (err) callback(err);
        else callback(null, res);
      };
      this.authenticate(call.metadata)
        .then((caller) => {
          const scope = auditScope();
          if (scope) scope.actor = caller.kind === 'operator' ? 'operator' : caller.account.id;
          return fn(call.request, caller);
        })
        .then(
          (res) => answer(null, res),
          (err) => answer(toServiceError(err, this.log)),
        );
    };
  }

  protected requireOperator(caller: Caller): void {
    if (caller.kind !== 'operator') throw permissionDenied('operator token required');
  }

  /**
   * The caller's role in `orgId`, at least `min`. A caller who is not a member gets `hidden` (NOT_FOUND),
   * exactly as if the thing did not exist.
   */
  protected async requireRole(q: Queryable, caller: Caller, orgId: string, min: Role, hidden: CpError): Promise<'operator' | Role> {
    const scope = auditScope();
    if (scope && !scope.orgId) scope.orgId = orgId;
    if (caller.kind === 'operator') return 'operator';
    const role = await getRole(q, orgId, caller.account.id);
    if (!role || RANK[role] < RANK[min]) {
      if (scope) scope.denied = true;
      if (!role) throw hidden;
      throw permissionDenied(`${min} role or above required in organisation ${orgId}`);
    }
    return role;
  }

  protected async orgFor(q: Queryable, caller: Caller, rawId: string, min: Role): Promise<{ org: OrgRow; role: string }> {
    const orgId = requireId('org_id', rawId);
    const hidden = notFound(`organisation ${orgId} not found`);
    const org = await getOrg(q, orgId);
    if (!org) throw hidden;
    const role = await this.requireRole(q, caller, org.id, min, hidden);
    return { org, role };
  }

  protected async projectFor(q: Queryable, caller: Caller, rawId: string, min: Role): Promise<{ project: ProjectRow; role: string }> {
    const projectId = requireId('project_id', rawId);
    const hidden = notFound(`project ${projectId} not found`);
    const project = await getProject(q, projectId);
    if (!project) throw hidden;
    const role = await this.requireRole(q, caller, project.org_id, min, hidden);
    return { project, role };
  }
}
