// The console API (proto/tollgate/v1/console.proto), one gRPC service put together from one service
// per resource: accounts, organisations, members and projects (org-service.ts), keys (key-service.ts),
// usage, request logs and audit (usage-service.ts), models, nodes, config and webhooks
// (gateway-service.ts), pooled models' deployments (pool-service.ts). Authentication, roles and validation are shared (console-access.ts). Roles per
// docs/design.md#console-roles: admin or above for keys, members, projects and caps; the operator for
// tiers, credits, accounts, organisations, nodes and config. A caller who is not a member of an
// organisation sees nothing of it (NOT_FOUND).
import type { ConsoleServiceServer, RevokeKeyResponse } from '../../proto/gen/tollgate/v1/console.js';
import type { ControlState } from '../state/control-state.js';
import { auditHandlers } from '../audit/audit-actions.js';
import type { ConsoleServiceOptions, NodeFleet } from './console-access.js';
import { GatewayService } from './gateway-service.js';
import { KeyService } from './key-service.js';
import { OrgService } from './org-service.js';
import { PoolService } from './pool-service.js';
import { SafetyService } from './safety-service.js';
import { UsageService } from './usage-service.js';


export class ConsoleService {
  private readonly orgs: OrgService;
  private readonly keys: KeyService;
  private readonly usage: UsageService;
  private readonly gateway: GatewayService;
  private readonly safety: SafetyService;
  private readonly pools: PoolService;

  constructor(
    state: ControlState,
    fleet: NodeFleet,
    private readonly opts: ConsoleServiceOptions,
  ) {
    this.orgs = new OrgService(state, fleet, opts);
    this.keys = new KeyService(state, fleet, opts);
    this.usage = new UsageService(state, fleet, opts);
    this.gateway = new GatewayService(state, fleet, opts);
    this.safety = new SafetyService(state, fleet, opts);
    this.pools = new PoolService(state, fleet, opts);
  }

  /** The gRPC service implementation. */
  handlers(): ConsoleServiceServer {
    return auditHandlers(this.opts.audit ?? null, {
      ...this.orgs.handlers(),
      ...this.keys.handlers(),
      ...this.usage.handlers(),
      ...this.gateway.handlers(),
      ...this.safety.handlers(),
      ...this.pools.handlers(),
    });
  }

  /** Revokes a key (key-service.ts: in the spec's order, a second revoke of the same key joins the first). */
  revoke(keyId: string, reason: 'revoked' | 'expired' = 'revoked'): Promise<RevokeKeyResponse> {
    return this.keys.revoke(keyId, reason);
  }
}
