// The console API (proto/tollgate/v1/console.proto): authentication, roles, validation, and the
// operations on accounts, organisations, projects and keys. Roles per docs/design.md#console-roles: admin or above for
// keys, members, projects and caps; the operator for tiers, credits, accounts, organisations, nodes
// and config. A caller who is not a member of an organisation sees nothing of it (NOT_FOUND).
import type { handleUnaryCall, Metadata, sendUnaryData, ServerUnaryCall } from '@grpc/grpc-js';
import { generateKey, generateToken, hashKey, hashToken, keyPattern, maskKey, newId, secretsEqual } from '../../proto/lib/keys.js';
import { monthOf } from '../../proto/lib/money.js';
import type {
  Account,
  ApiKey,
  ConsoleServiceServer,
  GetUsageResponse,
  Member,
  NodeInfo,
  RevokeKeyResponse,
  Org,
  Project,
} from '../../proto/gen/tollgate/v1/console.js';
import { ConfigError } from '../config.js';
import { keyEntryOf, type ControlState } from '../control-state.js';
import { CpError, invalidArgument, notFound, permissionDenied, toServiceError, unauthenticated } from '../errors.js';
import type { Queryable, Tx } from '../store/db.js';
import {
  findAccountByTokenHash,
  getAccount,
  getRole,
  insertAccount,
  listMembers,
  upsertMember,
  ROLES,
  type AccountRow,
  type Role,
} from '../store/accounts-repo.js';
import {
  addCredit,
  getOrg,
  getProject,
  insertOrg,
  claimFreeGrant,
  countOwnedOrgs,
  setOrgFreeGrant,
  insertProject,
  listAllOrgs,
  listOrgsOfAccount,
  listProjects,
  setOrgOwnCap,
  setOrgTier,
  type OrgRow,
  type ProjectRow,
} from '../store/orgs-repo.js';
import { credentialHashOf, deleteCredential, getKey, insertKey, keyIdOfHash, listKeys, markRevoked, type ApiKeyRow } from '../store/keys-repo.js';
import { listNodes as listNodeRows } from '../store/sync-repo.js';
import { usageInRange, type UsageGroupBy } from '../store/usage-repo.js';
import type { LogFilter, LogStore } from '../store/log-store.js';
import { FindKeyLimiter } from './find-key-limiter.js';
import { queryAudit } from '../audit/audit-query.js';
import { auditScope, type AuditRecorder } from '../audit/audit-recorder.js';
import { auditHandlers } from '../audit/audit-actions.js';
import type { WebhookAdmin } from '../webhooks/webhook-admin.js';
import { getKeyPolicy, setKeyPolicy, setKeyExpiry, setRevokedReason } from '../store/key-expiry-repo.js';
import type { WebhookEvents } from '../webhooks/webhook-events.js';
import type { RevokedKeyWatch } from '../webhooks/revoked-key-watch.js';
import { applyKeyLimit, keyLimitFields, keyLimitOf, projectOf, projectViews, setProjectCapCall, withKeySpend } from './limits-service.js';

export type Caller = { kind: 'operator' } | { kind: 'account'; account: AccountRow };

/** What the console needs from the sync side: who is connected, and waiting for their acks. */
export interface NodeFleet {
  connectedCount(): number;
  /** Waits (at most timeoutMs) until every node connected now acks `version`. */
  awaitAcks(version: number, timeoutMs: number): Promise<{ total: number; confirmed: number; unconfirmed: string[] }>;
  liveNodes(): { id: string; address: string; ackedVersion: number; connectedAt: string; lastSeenAt: string; lastReportAt: string; journalDepth: number | null; journalBytes?: number; droppedLogRows?: number }[];
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

const MAX_LOG_PAGE = 1000;

const MAX_NAME = 200;
/** Longer than any key value; a bigger "value" is refused before it is hashed. */
const MAX_KEY_VALUE_CHARS = 512;
const GROUP_BY: Record<string, UsageGroupBy> = { '': 'key_model', model: 'model', day: 'day', key: 'key' };
const RFC3339 = /^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,9})?(Z|[+-]\d{2}:\d{2})$/i;

/** An RFC 3339 timestamp as ms since the epoch, or INVALID_ARGUMENT naming the field. */
function parseInstant(field: string, raw: string): number {
  const text = raw.trim();
  const ms = RFC3339.test(text) ? Date.parse(text) : NaN;
  if (!Number.isFinite(ms)) throw invalidArgument(`${field} must be an RFC 3339 timestamp such as 2025-01-31T00:00:00Z, got ${JSON.stringify(raw.slice(0, 64))}`);
  return ms;
}

function monthStartMs(month: string): number {
  return Date.parse(`${month}-01T00:00:00Z`);
}

function nextMonthStartMs(month: string): number {
  const d = new Date(monthStartMs(month));
  return Date.UTC(d.getUTCFullYear(), d.getUTCMonth() + 1, 1);
}
const MAX_NOTE = 500;
const RANK: Record<Role, number> = { member: 0, admin: 1, owner: 2 };

function checkName(what: string, raw: string): string {
  const name = (raw ?? '').trim();
  if (name === '') throw invalidArgument(`${what} name must not be empty`);
  if (name.length > MAX_NAME) throw invalidArgument(`${what} name must be at most ${MAX_NAME} characters`);
  return name;
}

function requireId(field: string, raw: string): string {
  const id = (raw ?? '').trim();
  if (id === '') throw invalidArgument(`${field} is required`);
  refuseKeyValue(field, id);
  return id;
}

/**
 * An API key value pasted where an id belongs (`tollgate key show sk-…`): refused with a fixed message,
 * as "key sk-… not found" would echo the secret back (and into whatever records gRPC errors).
 */
function refuseKeyValue(field: string, id: string): void {
  if (!/^sk-/i.test(id)) return;
  throw invalidArgument(`${field} is a key value, not a key id: never pass a key value as an argument; find its id with \`tollgate key find < FILE\` (it reads standard input), and revoke it if it leaked`);
}

function isRole(s: string): s is Role {
  return (ROLES as readonly string[]).includes(s);
}

function accountOf(a: AccountRow): Account {
  return { id: a.id, name: a.name, createdAt: a.created_at };
}

export function apiKeyOf(k: ApiKeyRow): ApiKey {
  return {
    id: k.id,
    projectId: k.project_id,
    orgId: k.org_id,
    name: k.name,
    keyPrefix: k.key_prefix,
    allowedModels: JSON.parse(k.allowed_models) as string[],
    status: k.status,
    lastUsedAt: k.last_used_at,
    createdAt: k.created_at,
    revokedAt: k.revoked_at,
    rpmLimit: k.rpm_limit,
    tpmLimit: k.tpm_limit,
    maxParallelRequests: k.max_parallel_requests,
    expiresAt: k.expires_at_ms ? new Date(k.expires_at_ms).toISOString() : '',
    revokedReason: k.status === 'revoked' ? k.revoked_reason || 'revoked' : '',
    ...keyLimitFields(k),
  };
}

/** Longest key lifetime accepted (and longest policy): 10 years. */
const MAX_KEY_LIFETIME_SEC = 10 * 366 * 86_400;

/** Seconds as the CLI writes durations: 90d, 12h, 45m, 30s. */
function durationText(sec: number): string {
  for (const [unit, n] of [['d', 86_400], ['h', 3_600], ['m', 60]] as const) if (sec % n === 0) return `${sec / n}${unit}`;
  return `${sec}s`;
}

export class ConsoleService {
  private readonly log: (line: string, fields?: Record<string, unknown>) => void;
  /** Revocations waiting for node acks: a second revoke of the same key joins the first. */
  private readonly revoking = new Map<string, Promise<RevokeKeyResponse>>();
  private readonly findLimiter = new FindKeyLimiter();

  constructor(
    private readonly state: ControlState,
    private readonly fleet: NodeFleet,
    private readonly opts: ConsoleServiceOptions,
  ) {
    this.log = opts.log ?? ((l) => console.error(l));
  }

  // ---- plumbing -------------------------------------------------------------------------------

  private async authenticate(metadata: Metadata): Promise<Caller> {
    const header = metadata.get('authorization')[0];
    const m = typeof header === 'string' ? /^Bearer\s+(\S+)\s*$/i.exec(header) : null;
    if (!m) throw unauthenticated('missing or invalid token');
    const token = m[1];
    if (secretsEqual(token, this.opts.operatorToken)) return { kind: 'operator' };
    const account = await findAccountByTokenHash(this.state.db, hashToken(token));
    if (!account) throw unauthenticated('missing or invalid token');
    return { kind: 'account', account };
  }

  private unary<Req, Res>(fn: (req: Req, caller: Caller) => Promise<Res>): handleUnaryCall<Req, Res> {
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

  private requireOperator(caller: Caller): void {
    if (caller.kind !== 'operator') throw permissionDenied('operator token required');
  }

  /**
   * The caller's role in `orgId`, at least `min`. A caller who is not a member gets `hidden` (NOT_FOUND),
   * exactly as if the thing did not exist.
   */
  private async requireRole(q: Queryable, caller: Caller, orgId: string, min: Role, hidden: CpError): Promise<'operator' | Role> {
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

  private async orgFor(q: Queryable, caller: Caller, rawId: string, min: Role): Promise<{ org: OrgRow; role: string }> {
    const orgId = requireId('org_id', rawId);
    const hidden = notFound(`organisation ${orgId} not found`);
    const org = await getOrg(q, orgId);
    if (!org) throw hidden;
    const role = await this.requireRole(q, caller, org.id, min, hidden);
    return { org, role };
  }

  private async projectFor(q: Queryable, caller: Caller, rawId: string, min: Role): Promise<{ project: ProjectRow; role: string }> {
    const projectId = requireId('project_id', rawId);
    const hidden = notFound(`project ${projectId} not found`);
    const project = await getProject(q, projectId);
    if (!project) throw hidden;
    const role = await this.requireRole(q, caller, project.org_id, min, hidden);
    return { project, role };
  }

  /** An account owns at most `max_orgs_per_account` organisations, unless the operator makes it own more. */
  private async checkOwnedOrgs(q: Queryable, accountId: string): Promise<void> {
    const limit = this.state.gateway.settings.maxOrgsPerAccount;
    const owned = await countOwnedOrgs(q, accountId);
    if (owned >= limit) {
      throw new CpError(
        'FAILED_PRECONDITION',
        `account ${accountId} already owns ${owned} organisation${owned === 1 ? '' : 's'}, the most an account may own (max_orgs_per_account ${limit}); ask the operator for more`,
      );
    }
  }

  private checkTier(raw: string): string {
    const tier = raw.trim() || this.state.gateway.settings.defaultTier;
    if (!this.state.tier(tier)) {
      throw invalidArgument(`unknown tier ${JSON.stringify(tier)}; known tiers: ${[...this.state.gateway.settings.tiers.keys()].join(', ')}`);
    }
    return tier;
  }

  /** The gRPC service implementation. */
  handlers(): ConsoleServiceServer {
    return auditHandlers(this.opts.audit ?? null, {
      createAccount: this.unary(async (req, caller) => {
        this.requireOperator(caller);
        const name = checkName('account', req.name);
        const token = generateToken('acct');
        const row: AccountRow = { id: newId('acct'), name, token_hash: hashToken(token), created_at: this.state.nowIso() };
        await this.state.db.tx((tx) => insertAccount(tx, row));
        return { account: accountOf(row), token };
      }),

      whoAmI: this.unary(async (_req, caller) =>
        caller.kind === 'operator' ? { operator: true, account: undefined } : { operator: false, account: accountOf(caller.account) },
      ),

      createOrg: this.unary(async (req, caller) => {
        const name = checkName('organisation', req.name);
        // Every organisation has an owner: the operator names one; an account creating its own
        // becomes its owner, on the default tier (tier changes need the operator).
        let ownerId = req.ownerAccountId.trim();
        if (caller.kind === 'operator') {
          if (!ownerId) throw invalidArgument('owner_account_id is required: name the account that owns the organisation');
        } else {
          if (ownerId && ownerId !== caller.account.id) throw permissionDenied('an account can only create organisations it owns itself');
          if (req.tier.trim() && req.tier.trim() !== this.state.gateway.settings.defaultTier) {
            throw permissionDenied('operator token required to choose a tier other than the default');
          }
          ownerId = caller.account.id;
        }
        const tier = this.checkTier(req.tier);
        const org = { id: newId('org'), name, tier, created_at: this.state.nowIso() };
        return this.state.db.tx(async (tx) => {
          if (!(await getAccount(tx, ownerId))) throw notFound(`account ${ownerId} not found`);
          if (caller.kind !== 'operator') await this.checkOwnedOrgs(tx, ownerId);
          await insertOrg(tx, org);
          // One free grant per owning account: its first organisation on a tier with a grant takes
          // it, later ones start at their credits (the operator credits them).
          const tierHasGrant = (this.state.tier(tier)?.freeGrantMicros ?? 0) > 0;
          const granted = tierHasGrant && (await claimFreeGrant(tx, ownerId, org.id, org.created_at));
          if (!granted) await setOrgFreeGrant(tx, org.id, false);
          await upsertMember(tx, org.id, ownerId, 'owner');
          await this.state.refreshOrgs(tx, [org.id]);
          return this.state.orgView(tx, (await getOrg(tx, org.id))!, caller.kind === 'operator' ? 'operator' : 'owner');
        });
      }),

      listOrgs: this.unary(async (_req, caller) =>
        this.state.db.read(async (q) => {
          const orgs: Org[] = [];
          if (caller.kind === 'operator') for (const o of await listAllOrgs(q)) orgs.push(await this.state.orgView(q, o, 'operator'));
          else for (const o of await listOrgsOfAccount(q, caller.account.id)) orgs.push(await this.state.orgView(q, o, o.role));
          return { orgs };
        }),
      ),

      getOrg: this.unary(async (req, caller) =>
        this.state.db.read(async (q) => {
          const { org, role } = await this.orgFor(q, caller, req.orgId, 'member');
          return this.state.orgView(q, org, role);
        }),
      ),

      setOrgTier: this.unary(async (req, caller) => {
        this.requireOperator(caller);
        if (!req.tier.trim()) throw invalidArgument('tier is required');
        const tier = this.checkTier(req.tier);
        return this.state.db.tx(async (tx) => {
          const { org } = await this.orgFor(tx, caller, req.orgId, 'owner');
          await setOrgTier(tx, org.id, tier);
          await this.state.refreshOrgs(tx, [org.id], { fundsChanged: true });
          return this.state.orgView(tx, (await getOrg(tx, org.id))!, 'operator');
        });
      }),

      creditOrg: this.unary(async (req, caller) => {
        this.requireOperator(caller);
        if (!Number.isSafeInteger(req.amountMicros) || req.amountMicros <= 0) throw invalidArgument('credit amount must be positive');
        const note = (req.note ?? '').trim();
        if (note.length > MAX_NOTE) throw invalidArgument(`note must be at most ${MAX_NOTE} characters`);
        return this.state.db.tx(async (tx) => {
          const { org } = await this.orgFor(tx, caller, req.orgId, 'owner');
          await addCredit(tx, org.id, req.amountMicros, note, this.state.nowIso());
          await this.state.refreshOrgs(tx, [org.id], { fundsChanged: true });
          return this.state.orgView(tx, (await getOrg(tx, org.id))!, 'operator');
        });
      }),

      setOrgCap: this.unary(async (req, caller) => {
        const cap = req.capMicros ?? null;
        if (cap !== null && (!Number.isSafeInteger(cap) || cap < 0)) throw invalidArgument('cap must not be negative');
        return this.state.db.tx(async (tx) => {
          const { org, role } = await this.orgFor(tx, caller, req.orgId, 'admin');
          await setOrgOwnCap(tx, org.id, cap);
          await this.state.refreshOrgs(tx, [org.id], { fundsChanged: true });
          return this.state.orgView(tx, (await getOrg(tx, org.id))!, role);
        });
      }),

      addMember: this.unary(async (req, caller) => {
        const roleWanted = req.role.trim();
        if (!isRole(roleWanted)) throw invalidArgument(`unknown role ${JSON.stringify(req.role)}; expected owner, admin or member`);
        const accountId = requireId('account_id', req.accountId);
        return this.state.db.tx(async (tx): Promise<Member> => {
          const { org, role } = await this.orgFor(tx, caller, req.orgId, 'admin');
          const account = await getAccount(tx, accountId);
          if (!account) throw notFound(`account ${accountId} not found`);
          const existing = await getRole(tx, org.id, accountId);
          // Only an owner (or the operator) makes owners or changes an owner's role.
          if ((roleWanted === 'owner' || existing === 'owner') && role !== 'owner' && role !== 'operator') {
            throw permissionDenied(`owner role required to grant or change the owner role in organisation ${org.id}`);
          }
          if (roleWanted === 'owner' && existing !== 'owner' && role !== 'operator') await this.checkOwnedOrgs(tx, accountId);
          await upsertMember(tx, org.id, accountId, roleWanted);
          return { orgId: org.id, accountId, accountName: account.name, role: roleWanted };
        });
      }),

      listMembers: this.unary(async (req, caller) =>
        this.state.db.read(async (q) => {
          const { org } = await this.orgFor(q, caller, req.orgId, 'member');
          const members = (await listMembers(q, org.id)).map(
            (m): Member => ({ orgId: m.org_id, accountId: m.account_id, accountName: m.account_name, role: m.role }),
          );
          return { members };
        }),
      ),

      createProject: this.unary(async (req, caller) => {
        const name = checkName('project', req.name);
        return this.state.db.tx(async (tx) => {
          const { org } = await this.orgFor(tx, caller, req.orgId, 'admin');
          const row: ProjectRow = { id: newId('proj'), org_id: org.id, name, created_at: this.state.nowIso() };
          await insertProject(tx, row);
          return projectOf(row);
        });
      }),

      listProjects: this.unary(async (req, caller) =>
        this.state.db.read(async (q) => {
          const { org } = await this.orgFor(q, caller, req.orgId, 'member');
          return { projects: await projectViews(q, await listProjects(q, org.id), this.state.now()) };
        }),
      ),

      createKey: this.unary(async (req, caller) => {
        const rawName = req.name ?? '';
        const name = rawName.trim();
        if (rawName !== '' && name === '') throw invalidArgument('key name must not be blank');
        if (name.length > MAX_NAME) throw invalidArgument(`key name must be at most ${MAX_NAME} characters`);
        const models = this.state.gateway.settings.models;
        const allowed: string[] = [];
        for (const raw of req.allowedModels) {
          const id = raw.trim();
          if (!models.has(id)) throw invalidArgument(`unknown model ${JSON.stringify(raw)} in allowed_models`);
          if (!allowed.includes(id)) allowed.push(id);
        }
        const expiresInSec = req.expiresInSec ?? 0;
        const expiresAtText = (req.expiresAt ?? '').trim();
        if (expiresInSec !== 0 && expiresAtText !== '') throw invalidArgument('give at most one of expires_in_sec and expires_at');
        if (!Number.isSafeInteger(expiresInSec) || expiresInSec < 0 || expiresInSec > MAX_KEY_LIFETIME_SEC) throw invalidArgument(`expires_in_sec must be from 1 to ${MAX_KEY_LIFETIME_SEC} seconds`);
        const nowMs = this.state.now();
        let expiresAtMs = expiresInSec > 0 ? nowMs + expiresInSec * 1000 : expiresAtText !== '' ? parseInstant('expires_at', expiresAtText) : 0;
        if (expiresAtText !== '' && expiresAtMs <= nowMs) throw invalidArgument('expires_at must be in the future');
        if (expiresAtMs > nowMs + MAX_KEY_LIFETIME_SEC * 1000) throw invalidArgument('expires_at must be within 10 years');
        const limit = keyLimitOf(req);
        return this.state.db.tx(async (tx) => {
          const { project } = await this.projectFor(tx, caller, req.projectId, 'admin');
          const org = (await getOrg(tx, project.org_id))!;
          // The organisation's policy: no expiry means its maximum; past the maximum is refused.
          const maxLifetimeSec = await getKeyPolicy(tx, org.id);
          if (maxLifetimeSec !== null) {
            if (expiresAtMs === 0) expiresAtMs = nowMs + maxLifetimeSec * 1000;
            else if (expiresAtMs > nowMs + maxLifetimeSec * 1000) {
              throw invalidArgument(`organisation ${org.id} allows keys to live at most ${durationText(maxLifetimeSec)}: ask for an expiry within that, or none (the maximum)`);
            }
          }
          const tier = this.state.tier(org.tier);
          if (!tier) throw new CpError('FAILED_PRECONDITION', `organisation ${org.id} has tier ${JSON.stringify(org.tier)}, which the config does not define`);
          const value = generateKey(this.state.gateway.settings.serviceName);
          const keyHash = hashKey(this.opts.pepper, value);
          const row: ApiKeyRow = {
            id: newId('key'),
            project_id: project.id,
            org_id: org.id,
            name,
            key_prefix: maskKey(value),
            allowed_models: JSON.stringify(allowed),
            status: 'active',
            // Fixed from the organisation's tier now; a later tier change leaves this key as it is.
            rpm_limit: tier.rpm,
            tpm_limit: tier.tpm,
            max_parallel_requests: tier.maxParallelRequests,
            created_at: this.state.nowIso(),
            revoked_at: '',
            last_used_at: '',
          };
          await insertKey(tx, row, keyHash);
          if (expiresAtMs > 0) {
            row.expires_at_ms = expiresAtMs;
            await setKeyExpiry(tx, row.id, expiresAtMs);
          }
          await applyKeyLimit(tx, row, limit);
          await this.state.emit(tx, { keyUpsert: keyEntryOf(row, keyHash) });
          await this.opts.webhooks?.events.keyCreated(tx, { id: row.id, projectId: row.project_id, orgId: row.org_id, name: row.name, keyPrefix: row.key_prefix, createdAt: row.created_at });
          return { apiKey: apiKeyOf(row), key: value };
        });
      }),

      listKeys: this.unary(async (req, caller) =>
        this.state.db.read(async (q) => {
          const { project } = await this.projectFor(q, caller, req.projectId, 'member');
          const within = req.expiringWithinSec ?? 0;
          if (!Number.isSafeInteger(within) || within < 0) throw invalidArgument('expiring_within_sec must not be negative');
          let keys = await listKeys(q, project.id);
          if (within > 0) {
            const until = this.state.now() + within * 1000;
            keys = keys.filter((k) => k.status === 'active' && (k.expires_at_ms ?? 0) > 0 && k.expires_at_ms! <= until);
          }
          return { keys: keys.map(apiKeyOf) };
        }),
      ),

      revokeKey: this.unary(async (req, caller) => {
        const keyId = requireId('key_id', req.keyId);
        const hidden = notFound(`key ${keyId} not found`);
        const key = await this.state.db.read(async (q) => {
          const row = await getKey(q, keyId);
          if (!row) throw hidden;
          await this.requireRole(q, caller, row.org_id, 'admin', hidden);
          return row;
        });
        return this.revoke(key.id);
      }),

      getUsage: this.unary(async (req, caller) => {
        const projectId = req.projectId.trim();
        const orgId = req.orgId.trim();
        if ((projectId === '') === (orgId === '')) throw invalidArgument('give exactly one of project_id or org_id');
        const groupBy = GROUP_BY[req.groupBy.trim()];
        if (groupBy === undefined) throw invalidArgument(`group_by must be one of model, day or key (or empty), got ${JSON.stringify(req.groupBy.slice(0, 64))}`);
        const ranged = req.since.trim() !== '' || req.until.trim() !== '';
        if (ranged && req.month.trim() !== '') throw invalidArgument('give either month or since/until, not both');
        let month = '';
        let sinceMs: number;
        let untilMs: number | null;
        if (ranged) {
          sinceMs = req.since.trim() !== '' ? parseInstant('since', req.since) : monthStartMs(monthOf(this.state.now()));
          untilMs = req.until.trim() !== '' ? parseInstant('until', req.until) : null;
          if (untilMs !== null && untilMs <= sinceMs) throw invalidArgument('until must be later than since');
        } else {
          month = req.month.trim() || monthOf(this.state.now());
          if (!/^\d{4}-(0[1-9]|1[0-2])$/.test(month)) throw invalidArgument(`month must be YYYY-MM, got ${JSON.stringify(req.month)}`);
          sinceMs = monthStartMs(month);
          untilMs = nextMonthStartMs(month);
        }
        // On the read-only connection: usage reads never queue ahead of ingest or leases.
        return this.state.db.readOnly(async (q): Promise<GetUsageResponse> => {
          let scope: { projectId: string } | { orgId: string };
          if (projectId) scope = { projectId: (await this.projectFor(q, caller, projectId, 'member')).project.id };
          else scope = { orgId: (await this.orgFor(q, caller, orgId, 'member')).org.id };
          const rows = (await usageInRange(q, scope, { sinceMs, untilMs }, groupBy)).map((r) => ({
            keyId: r.key_id,
            model: r.model,
            day: r.day,
            requests: r.requests,
            promptTokens: r.prompt_tokens ?? 0,
            completionTokens: r.completion_tokens ?? 0,
            costMicros: r.cost_micros ?? 0,
          }));
          return {
            month,
            rows,
            totalCostMicros: rows.reduce((s, r) => s + r.costMicros, 0),
            totalRequests: rows.reduce((s, r) => s + r.requests, 0),
            totalPromptTokens: rows.reduce((s, r) => s + r.promptTokens, 0),
            totalCompletionTokens: rows.reduce((s, r) => s + r.completionTokens, 0),
            since: new Date(sinceMs).toISOString(),
            until: untilMs === null ? '' : new Date(untilMs).toISOString(),
            groupBy: req.groupBy.trim(),
          };
        });
      }),

      listModels: this.unary(async () => {
        const { models, tiers } = this.state.gateway.settings;
        return {
          models: [...models.values()].map((m) => ({
            id: m.id,
            provider: m.provider,
            upstreamModel: m.upstreamModel,
            kind: m.kind,
            inputMicrosPerMtok: m.inputMicrosPerMtok,
            outputMicrosPerMtok: m.outputMicrosPerMtok,
            audioMicrosPerUnit: m.audioMicrosPerUnit,
            cachedInputMicrosPerMtok: m.cachedInputMicrosPerMtok,
            cacheWriteMicrosPerMtok: m.cacheWriteMicrosPerMtok,
            inputAudioMicrosPerMtok: m.inputAudioMicrosPerMtok,
            outputAudioMicrosPerMtok: m.outputAudioMicrosPerMtok,
            tiers: [...tiers.values()].filter((t) => t.models.includes(m.id)).map((t) => t.name),
          })),
        };
      }),

      listNodes: this.unary(async (_req, caller) => {
        this.requireOperator(caller);
        const rows = await listNodeRows(this.state.db);
        const live = new Map<string, ReturnType<NodeFleet['liveNodes']>[number]>();
        for (const n of this.fleet.liveNodes()) {
          const seen = live.get(n.id);
          if (!seen || n.ackedVersion > seen.ackedVersion) live.set(n.id, n);
        }
        const current = this.state.snapshots.version;
        const info = (id: string, r: (typeof rows)[number] | undefined, l: ReturnType<NodeFleet['liveNodes']>[number] | undefined): NodeInfo => {
          const ackedVersion = Math.max(l?.ackedVersion ?? 0, r?.acked_version ?? 0);
          return {
            id,
            address: l?.address ?? r?.address ?? '',
            connected: l !== undefined,
            ackedVersion,
            lastSeenAt: l?.lastSeenAt ?? r?.last_seen_at ?? '',
            connectedAt: l?.connectedAt ?? r?.connected_at ?? '',
            lag: Math.max(0, current - ackedVersion),
            lastReportAt: l?.lastReportAt ?? '',
            journalDepth: l?.journalDepth ?? undefined,
            journalBytes: l?.journalBytes ?? 0,
            droppedLogRows: l?.droppedLogRows ?? 0,
          };
        };
        const nodes: NodeInfo[] = rows.map((r) => info(r.id, r, live.get(r.id)));
        for (const [id, l] of live) if (!rows.some((r) => r.id === id)) nodes.push(info(id, undefined, l));
        return { nodes, currentVersion: current };
      }),

      listRequestLogs: this.unary(async (req, caller) => {
        const logs = this.opts.logs;
        if (!logs) throw new CpError('FAILED_PRECONDITION', 'this control plane keeps no request logs');
        const filter: LogFilter = {};
        const keyId = req.keyId.trim();
        const projectId = req.projectId.trim();
        const orgId = req.orgId.trim();
        refuseKeyValue('key_id', keyId);
        refuseKeyValue('project_id', projectId);
        refuseKeyValue('org_id', orgId);
        if (req.unknownKeys) {
          this.requireOperator(caller);
          if (keyId) throw invalidArgument('unknown_keys lists 401s of keys that do not exist: give no key_id with it');
          filter.unknownKeys = true;
        }
        if (!keyId && !projectId && !orgId && caller.kind !== 'operator') throw invalidArgument('give a key, a project or an organisation');
        if (!Number.isSafeInteger(req.sinceMs) || req.sinceMs < 0 || !Number.isSafeInteger(req.untilMs) || req.untilMs < 0) throw invalidArgument('since and until must be times after 1970');
        if (req.sinceMs > 0 && req.untilMs > 0 && req.sinceMs >= req.untilMs) throw invalidArgument('since must be before until');
        if (req.status !== 0 && (req.status < 100 || req.status > 599)) throw invalidArgument(`status must be an HTTP status (100-599), got ${req.status}`);
        if (req.limit < 0) throw invalidArgument('limit must not be negative');
        if (req.pageToken && !logs.isPageToken(req.pageToken)) throw invalidArgument('page_token is not one this server gave');
        await this.state.db.read(async (q) => {
          if (keyId) {
            const hidden = notFound(`key ${keyId} not found`);
            const key = await getKey(q, keyId);
            if (!key) throw hidden;
            await this.requireRole(q, caller, key.org_id, 'member', hidden);
            filter.keyId = key.id;
          }
          if (projectId) {
            const { project } = await this.projectFor(q, caller, projectId, 'member');
            filter.projectId = project.id;
            filter.orgId = project.org_id;
          }
          if (orgId) {
            const { org } = await this.orgFor(q, caller, orgId, 'member');
            if (filter.orgId !== undefined && filter.orgId !== org.id) throw invalidArgument(`project ${projectId} is not in organisation ${org.id}`);
            filter.orgId = org.id;
          }
        });
        if (req.sinceMs > 0) filter.sinceMs = req.sinceMs;
        if (req.untilMs > 0) filter.untilMs = req.untilMs;
        if (req.clientIp.trim()) filter.clientIp = req.clientIp.trim();
        if (req.status) filter.status = req.status;
        const limit = Math.min(MAX_LOG_PAGE, req.limit || 100);
        const page = await logs.query(filter, limit, req.pageToken);
        return { logs: page.logs, nextPageToken: page.next };
      }),

      reloadConfig: this.unary(async (_req, caller) => {
        this.requireOperator(caller);
        try {
          const version = await this.state.reloadConfig();
          this.log(`config reloaded from ${this.state.configPath}: version ${version}`);
          return { version, nodesTotal: this.fleet.connectedCount() };
        } catch (err) {
          if (err instanceof ConfigError) throw new CpError('CONFIG_INVALID', `config not reloaded, old config kept: ${err.message}`);
          throw err;
        }
      }),

      getKey: this.unary(async (req, caller) => {
        const keyId = requireId('key_id', req.keyId);
        const hidden = notFound(`key ${keyId} not found`);
        return this.state.db.read(async (q) => {
          const row = await getKey(q, keyId);
          if (!row) throw hidden;
          await this.requireRole(q, caller, row.org_id, 'member', hidden);
          return withKeySpend(q, apiKeyOf(row), row, this.state.now());
        });
      }),

      findKey: this.unary(async (req, caller) => {
        // Never echo the value: every message below is fixed text.
        const value = (req.key ?? '').trim();
        if (value === '') throw invalidArgument('key is required');
        if (value.length > MAX_KEY_VALUE_CHARS || /[\s\x00-\x1f]/.test(value)) throw invalidArgument('that is not a key value: one line of at most 512 characters, no spaces');
        this.findLimiter.take(caller.kind === 'operator' ? 'operator' : caller.account.id, this.state.now());
        // Values are 256-bit random: guessing is hopeless, and a non-member learns nothing (the same answer
        // as for an unknown value, after the same work).
        const unknown = notFound(
          keyPattern(this.state.gateway.settings.serviceName).test(value)
            ? 'no key you can see matches this value'
            : `no key you can see matches this value (keys of this gateway look like sk-${this.state.gateway.settings.serviceName}-…)`,
        );
        const keyHash = hashKey(this.opts.pepper, value);
        return this.state.db.read(async (q) => {
          const hit = await keyIdOfHash(q, keyHash);
          const matched = hit !== undefined && secretsEqual(hit.key_hash, keyHash);
          // The same three lookups whether or not the value matched, so that timing does not tell a
          // non-member "a key of some other organisation" from "no key".
          const row = await getKey(q, matched ? hit.key_id : '');
          const role = caller.kind === 'operator' ? 'operator' : await getRole(q, row?.org_id ?? '', caller.account.id);
          if (!matched || !row || !role) throw unknown;
          return apiKeyOf(row);
        });
      }),

      setKeyPolicy: this.unary(async (req, caller) => {
        const max = req.maxLifetimeSec ?? 0;
        if (req.clear ? max !== 0 : !Number.isSafeInteger(max) || max < 60 || max > MAX_KEY_LIFETIME_SEC) {
          throw invalidArgument(req.clear ? 'give either a maximum lifetime or clear, not both' : `max_lifetime_sec must be from 60 to ${MAX_KEY_LIFETIME_SEC} seconds (or clear)`);
        }
        return this.state.db.tx(async (tx) => {
          const { org } = await this.orgFor(tx, caller, req.orgId, 'admin');
          await setKeyPolicy(tx, org.id, req.clear ? null : max);
          return { orgId: org.id, maxLifetimeSec: req.clear ? 0 : max };
        });
      }),

      setProjectCap: this.unary((req, caller) => setProjectCapCall(this.state, req, (q) => this.projectFor(q, caller, req.projectId, 'admin'), this.opts.onProjectCapSet)),

      listWebhooks: this.unary(async (_req, caller) => {
        this.requireOperator(caller);
        return this.webhookAdmin().list();
      }),

      testWebhook: this.unary(async (req, caller) => {
        this.requireOperator(caller);
        if (!req.url.trim()) throw invalidArgument('url is required');
        return this.webhookAdmin().test(req.url);
      }),

      listWebhookDeliveries: this.unary(async (req, caller) => {
        this.requireOperator(caller);
        if (req.limit < 0) throw invalidArgument('limit must not be negative');
        return this.webhookAdmin().deliveries(req.failed, req.limit);
      }),

      listAuditEntries: this.unary(async (req, caller) => {
        if (!this.opts.audit) throw new CpError('FAILED_PRECONDITION', 'this control plane keeps no audit log');
        if (!Number.isSafeInteger(req.sinceMs) || req.sinceMs < 0) throw invalidArgument('since must be a time after 1970');
        if (req.limit < 0) throw invalidArgument('limit must not be negative');
        const action = req.action.trim();
        if (action.length > 64) throw invalidArgument('action must be at most 64 characters');
        const limit = Math.min(MAX_LOG_PAGE, req.limit || 100);
        return this.state.db.read(async (q) => {
          let orgId = '';
          if (req.orgId.trim()) orgId = (await this.orgFor(q, caller, req.orgId, 'admin')).org.id;
          // Owners and admins read their organisations' entries; members none; the operator all.
          const visibleOrgs =
            caller.kind === 'operator' ? ('all' as const) : (await listOrgsOfAccount(q, caller.account.id)).filter((o) => RANK[o.role as Role] >= RANK.admin).map((o) => o.id);
          const rows = await queryAudit(q, { visibleOrgs, orgId, sinceMs: req.sinceMs, action, limit });
          return {
            entries: rows.map((r) => ({
              id: r.id,
              at: new Date(r.at_ms).toISOString(),
              actor: r.actor,
              action: r.action,
              targetId: r.target_id,
              orgId: r.org_id,
              outcome: r.outcome,
              callerAddress: r.caller_address,
              detail: r.detail ?? '',
            })),
          };
        });
      }),
    });
  }

  private webhookAdmin(): WebhookAdmin {
    if (!this.opts.webhooks) throw new CpError('FAILED_PRECONDITION', 'this control plane sends no webhooks');
    return this.opts.webhooks.admin;
  }

  /**
   * Revocation in the spec's order: (1) delete the credential and record the change in one
   * transaction, (2) the change is pushed to every connected node, (3) wait (bounded) for their acks,
   * (4) only then set the console record to revoked. Never moves a key out of revoked.
   */
  revoke(keyId: string, reason: 'revoked' | 'expired' = 'revoked'): Promise<RevokeKeyResponse> {
    const running = this.revoking.get(keyId);
    if (running) return running;
    const work = (async () => {
      const step1 = await this.state.db.tx(async (tx) => {
        const row = (await getKey(tx, keyId))!;
        if (row.status === 'revoked') return { row, version: null };
        const keyHash = await credentialHashOf(tx, keyId);
        if (keyHash === undefined) return { row, version: null };
        const at = this.state.nowIso();
        await deleteCredential(tx, keyHash, at);
        const version = await this.state.emit(tx, { keyRemoved: keyHash });
        const watch = this.opts.webhooks?.revokedKeys;
        if (watch) tx.afterCommit(() => watch.keyRevoked(keyId, Date.parse(at)));
        return { row, version };
      });
      if (step1.row.status === 'revoked') return { apiKey: apiKeyOf(step1.row), nodesTotal: 0, nodesConfirmed: 0, nodesUnconfirmed: [], nodesDisconnected: [] };
      const acks = step1.version === null ? { total: 0, confirmed: 0, unconfirmed: [] } : await this.fleet.awaitAcks(step1.version, this.opts.revokeAckTimeoutMs);
      if (step1.version !== null) this.log(`key ${keyId} revoked at version ${step1.version}: ${acks.confirmed} of ${acks.total} connected nodes confirmed`, { event: 'key_revoked', keyId, version: step1.version, nodesTotal: acks.total, nodesConfirmed: acks.confirmed, nodesUnconfirmed: acks.unconfirmed });
      const row = await this.state.db.tx(async (tx) => {
        await markRevoked(tx, keyId, this.state.nowIso());
        await setRevokedReason(tx, keyId, reason);
        const revoked = (await getKey(tx, keyId))!;
        await this.opts.webhooks?.events.keyRevoked(tx, { id: revoked.id, projectId: revoked.project_id, orgId: revoked.org_id, keyPrefix: revoked.key_prefix, revokedAt: revoked.revoked_at }, revoked.revoked_reason || reason);
        return revoked;
      });
      // Nodes seen before but not connected now may still be serving the key from their last state.
      const connected = new Set(this.fleet.liveNodes().map((n) => n.id));
      const nodesDisconnected = (await listNodeRows(this.state.db)).filter((n) => !connected.has(n.id)).map((n) => ({ id: n.id, lastSeenAt: n.last_seen_at }));
      return { apiKey: apiKeyOf(row), nodesTotal: acks.total, nodesConfirmed: acks.confirmed, nodesUnconfirmed: acks.unconfirmed, nodesDisconnected };
    })();
    this.revoking.set(keyId, work);
    const forget = () => void this.revoking.delete(keyId);
    work.then(forget, forget);
    return work;
  }
}
