// The console's view of the gateway (proto/tollgate/v1/console.proto): its models, its nodes, config
// reloads and webhooks. Nodes, config and webhooks are the operator's (docs/design.md#console-roles).
import type { ConsoleServiceServer, NodeInfo } from '../../proto/gen/tollgate/v1/console.js';
import { ConfigError } from '../../proto/lib/process-flags.js';
import { modelPrices } from '../gateway-config/gateway-config.js';
import { CpError, invalidArgument } from '../errors.js';
import { listNodes as listNodeRows } from '../store/sync-repo.js';
import type { WebhookAdmin } from '../webhooks/webhook-admin.js';
import { ConsoleAccess, type NodeFleet } from './console-access.js';

type GatewayCalls = 'listModels' | 'listNodes' | 'reloadConfig' | 'listWebhooks' | 'testWebhook' | 'listWebhookDeliveries';

export class GatewayService extends ConsoleAccess {
  handlers(): Pick<ConsoleServiceServer, GatewayCalls> {
    return {
      listModels: this.unary(async () => {
        const { models, tiers } = this.state.gateway.settings;
        return {
          models: [...models.values()].map((m) => ({
            id: m.id,
            provider: m.provider,
            upstreamModel: m.upstreamModel,
            kind: m.kind,
            ...modelPrices(m),
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
    };
  }

  private webhookAdmin(): WebhookAdmin {
    if (!this.opts.webhooks) throw new CpError('FAILED_PRECONDITION', 'this control plane sends no webhooks');
    return this.opts.webhooks.admin;
  }
}
