// Where an OpenAI-compatible model's requests go: one undici Pool (keep-alive) per upstream origin,
// and per model (or per deployment of a pooled model, issue 36) the constants of its requests,
// computed once per config version.
import { Pool } from 'undici';
import type { ModelConfig, ModelDeployment } from '../../../proto/gen/tollgate/v1/sync.js';
import { UPSTREAM_KEEP_ALIVE_MS } from '../upstream-keep-alive.js';

const DEFAULT_TIMEOUT_MS = 60_000;

/** Per-model constants, computed once per config version (ModelConfig objects change with it). */
export interface Target {
  pool: Pool;
  basePath: string;
  jsonHeaders: string[];
  /** The upstream's credential header (empty without one): a request with a body of another type, or none. */
  authHeaders: string[];
  upstreamModel: string;
  timeoutMs: number;
}

/** Each model's upstream target, for every provider speaking to an OpenAI-compatible upstream. */
export class UpstreamTargets {
  private readonly targets = new WeakMap<ModelConfig, Target>();
  private readonly deploymentTargets = new WeakMap<ModelDeployment, Target>();
  constructor(private readonly pools: PoolRegistry) {}

  of(model: ModelConfig): Target {
    let t = this.targets.get(model);
    if (!t) {
      t = this.target(model, model.baseUrl, model.upstreamApiKey, model.upstreamModel);
      this.targets.set(model, t);
    }
    return t;
  }

  /** A pooled model's deployment (ModelDeployment objects change with the config version too). */
  ofDeployment(model: ModelConfig, d: ModelDeployment): Target {
    let t = this.deploymentTargets.get(d);
    if (!t) {
      t = this.target(model, d.baseUrl, d.upstreamApiKey, d.upstreamModel);
      this.deploymentTargets.set(d, t);
    }
    return t;
  }

  private target(model: ModelConfig, baseUrl: string, apiKey: string, upstreamModel: string): Target {
    const url = new URL(baseUrl);
    const authHeaders = apiKey ? ['authorization', `Bearer ${apiKey}`] : [];
    return {
      pool: this.pools.get(url.origin),
      basePath: url.pathname.replace(/\/+$/, ''),
      jsonHeaders: ['content-type', 'application/json', ...authHeaders],
      authHeaders,
      upstreamModel: upstreamModel || model.id,
      timeoutMs: model.timeoutMs > 0 ? model.timeoutMs : DEFAULT_TIMEOUT_MS,
    };
  }
}

export class PoolRegistry {
  private readonly pools = new Map<string, Pool>();

  get(origin: string): Pool {
    let p = this.pools.get(origin);
    if (!p) {
      // No cap on connections: a stream holds its connection for as long as it lasts (minutes), so a
      // cap would make the next stream wait for another to end. What bounds them is what bounds the
      // requests in flight (the keys' parallel limits, the node's descriptors).
      p = new Pool(origin, { connections: null, pipelining: 1, keepAliveTimeout: UPSTREAM_KEEP_ALIVE_MS, connectTimeout: 10_000 });
      this.pools.set(origin, p);
    }
    return p;
  }

  async close(): Promise<void> {
    await Promise.allSettled([...this.pools.values()].map((p) => p.destroy()));
    this.pools.clear();
  }
}

