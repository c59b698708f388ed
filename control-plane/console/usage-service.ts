// The console's records (proto/tollgate/v1/console.proto): usage by month or range, request logs,
// and the audit log. A member reads their organisation's usage and logs; owners and admins its audit
// entries; the operator all (docs/design.md#console-roles).
import type { ConsoleServiceServer, GetUsageResponse } from '../../proto/gen/tollgate/v1/console.js';
import { monthOf } from '../../proto/lib/money.js';
import { CpError, invalidArgument, notFound } from '../errors.js';
import type { Role } from '../store/accounts-repo.js';
import { listOrgsOfAccount } from '../store/orgs-repo.js';
import { getKey } from '../store/keys-repo.js';
import { usageInRange, type UsageGroupBy } from '../store/usage-repo.js';
import type { LogFilter } from '../store/log-store/log-store.js';
import { queryAudit } from '../audit/audit-query.js';
import { ConsoleAccess, MAX_LOG_PAGE, parseInstant, RANK, refuseKeyValue } from './console-access.js';

const GROUP_BY: Record<string, UsageGroupBy> = { '': 'key_model', model: 'model', day: 'day', key: 'key' };

function monthStartMs(month: string): number {
  return Date.parse(`${month}-01T00:00:00Z`);
}

function nextMonthStartMs(month: string): number {
  const d = new Date(monthStartMs(month));
  return Date.UTC(d.getUTCFullYear(), d.getUTCMonth() + 1, 1);
}

type UsageCalls = 'getUsage' | 'listRequestLogs' | 'listAuditEntries';

export class UsageService extends ConsoleAccess {
  handlers(): Pick<ConsoleServiceServer, UsageCalls> {
    return {
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
    };
  }
}
