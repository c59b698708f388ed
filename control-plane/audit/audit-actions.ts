// Which console calls are audited, under what action name, and what their target is. A call marked
// `changes` is recorded in the transaction of its change (audit-recorder.ts: none committed, no entry),
// or after it when it wrote nothing; every call is recorded when it is refused for the caller's role
// (PERMISSION_DENIED, or NOT_FOUND answered to a non-member by a role check).
import { status, type handleUnaryCall, type sendUnaryData, type ServerUnaryCall } from '@grpc/grpc-js';
import type { ConsoleServiceServer } from '../../proto/gen/tollgate/v1/console.js';
import { formatUsd } from '../../proto/lib/money.js';
import { isLimitReset } from '../../proto/lib/spend-limits.js';
import { redactedUrl } from '../gateway-config/webhook-url.js';
import { AuditScope, callerAddressOf, runInAuditScope, type AuditRecorder } from './audit-recorder.js';

type Any = Record<string, any>;

interface ActionSpec {
  action: string;
  changes: boolean;
  /** The thing acted on, from the request (and the response when the call succeeded). */
  target?(req: Any, res: Any | undefined): string | undefined;
  /** The organisation, when the role checks did not name it (a created organisation, a key's). */
  org?(req: Any, res: Any | undefined): string | undefined;
  /** What the call set, recorded with it (docs/money-limits.md: a key's limit, a project's cap). */
  detail?(req: Any): string;
}

const orgTarget = (req: Any) => req.orgId;

/** Micro-dollars as decimal USD, for a detail (a value that is not a whole number is not shown: only what was checked is recorded). */
function usd(micros: unknown): string {
  return typeof micros === 'number' && Number.isSafeInteger(micros) ? formatUsd(micros) : 'invalid';
}

function safeDetail(spec: ActionSpec, req: Any): string {
  try {
    return spec.detail?.(req) ?? '';
  } catch {
    return '';
  }
}

export const AUDITED: Record<keyof ConsoleServiceServer, ActionSpec> = {
  createAccount: { action: 'account.create', changes: true, target: (_q, r) => r?.account?.id },
  whoAmI: { action: 'account.whoami', changes: false },
  createOrg: { action: 'org.create', changes: true, target: (_q, r) => r?.id, org: (_q, r) => r?.id },
  listOrgs: { action: 'org.list', changes: false },
  getOrg: { action: 'org.show', changes: false, target: orgTarget },
  setOrgTier: { action: 'org.set_tier', changes: true, target: orgTarget, org: orgTarget },
  creditOrg: { action: 'org.credit', changes: true, target: orgTarget, org: orgTarget },
  setOrgCap: { action: 'org.set_cap', changes: true, target: orgTarget, org: orgTarget },
  addMember: { action: 'member.add', changes: true, target: (q) => q.accountId, org: orgTarget },
  listMembers: { action: 'member.list', changes: false, target: orgTarget },
  createProject: { action: 'project.create', changes: true, target: (_q, r) => r?.id, org: orgTarget },
  listProjects: { action: 'project.list', changes: false, target: orgTarget },
  createKey: { action: 'key.create', changes: true, target: (_q, r) => r?.apiKey?.id, org: (_q, r) => r?.apiKey?.orgId, detail: (q) => (q.limitMicros ? `limit_usd=${usd(q.limitMicros)} limit_reset=${isLimitReset(q.limitReset ?? '') ? q.limitReset : q.limitReset ? 'invalid' : 'never'}` : '') },
  listKeys: { action: 'key.list', changes: false, target: (q) => q.projectId },
  revokeKey: { action: 'key.revoke', changes: true, target: (q) => q.keyId, org: (_q, r) => r?.apiKey?.orgId },
  getUsage: { action: 'usage.show', changes: false, target: (q) => q.projectId || q.orgId },
  listModels: { action: 'models.list', changes: false },
  listNodes: { action: 'nodes.list', changes: false },
  getModelsStatus: { action: 'models.status', changes: false },
  setDeploymentState: { action: 'models.set_deployment_state', changes: true, target: (q) => `${q.model}/${q.deployment}`, detail: (q) => `state=${['enabled', 'drained', 'disabled'].includes(q.state) ? q.state : 'invalid'}` },
  reloadConfig: { action: 'config.reload', changes: true },
  listRequestLogs: { action: 'logs.list', changes: false, target: (q) => q.keyId || q.projectId || q.orgId },
  getKey: { action: 'key.show', changes: false, target: (q) => q.keyId },
  findKey: { action: 'key.find', changes: false },
  resolveSafetyIdentifier: { action: 'safety_id.resolve', changes: false },
  listWebhooks: { action: 'webhooks.list', changes: false },
  testWebhook: { action: 'webhooks.test', changes: true, target: (q) => redactedUrl(q.url) },
  listWebhookDeliveries: { action: 'webhooks.deliveries', changes: false },
  listAuditEntries: { action: 'audit.list', changes: false, target: orgTarget },
  setKeyPolicy: { action: 'org.set_key_policy', changes: true, target: orgTarget, org: orgTarget },
  setProjectCap: { action: 'project.set_cap', changes: true, target: (q) => q.projectId, org: (_q, r) => r?.orgId, detail: (q) => (q.capMicros === undefined ? 'cap cleared' : `cap_usd=${usd(q.capMicros)}`) },
};

/** Wraps every handler: each call runs in its own AuditScope and is recorded as AUDITED says. */
export function auditHandlers(recorder: AuditRecorder | null, handlers: ConsoleServiceServer): ConsoleServiceServer {
  if (!recorder) return handlers;
  const out: Any = {};
  for (const [name, handler] of Object.entries(handlers) as [keyof ConsoleServiceServer, handleUnaryCall<Any, Any>][]) {
    // A call added without an entry here is still recorded when refused (under its method name).
    const spec: ActionSpec = AUDITED[name] ?? { action: name, changes: false };
    out[name] = (call: ServerUnaryCall<Any, Any>, callback: sendUnaryData<Any>) => {
      const scope = new AuditScope(callerAddressOf(safePeer(call)));
      const req = call.request ?? {};
      const entry = (outcome: 'ok' | 'denied', res: Any | undefined) => {
        // The role checks name the organisation of what was touched; a created one comes from the answer or the handler.
        const orgId = scope.orgId || spec.org?.(req, res) || '';
        return {
          atMs: recorder.now(),
          actor: scope.actor,
          action: spec.action,
          targetId: scope.targetId || (spec.target?.(req, res) ?? ''),
          orgId: typeof orgId === 'string' ? orgId : '',
          outcome,
          callerAddress: scope.callerAddress,
          detail: safeDetail(spec, req),
        };
      };
      if (spec.changes) scope.expectChange(() => entry('ok', undefined));
      runInAuditScope(scope, () =>
        handler(call, (err, res) => {
          const written = scope.close();
          const denied = !!err && (err.code === status.PERMISSION_DENIED || (scope.denied && err.code === status.NOT_FOUND));
          // A change's entry was written with it; what wrote nothing (a refusal, a no-op change) is recorded here.
          if (scope.actor && (denied || (!err && spec.changes && !written))) {
            void recorder.recordOrLog(entry(denied ? 'denied' : 'ok', err ? undefined : (res ?? undefined))).then(() => callback(err, res));
          } else callback(err, res);
        }),
      );
    };
  }
  return out as ConsoleServiceServer;
}

function safePeer(call: ServerUnaryCall<Any, Any>): string {
  try {
    return call.getPeer();
  } catch {
    return '';
  }
}
