// The node's reader of the control plane's durable usage (SyncService.QueryUsage) for GET /v1/usage.
// Only that request waits for it, with a short deadline; nothing else on the node ever does. Failures
// become the catalog error the client sees: the key unknown to the control plane (revoked meanwhile)
// is 401; the control plane unreachable, slow or busy is 503 with retry-after.
import { Metadata, status as GrpcStatus, type ServiceError } from '@grpc/grpc-js';
import { SyncServiceClient, type QueryUsageRequest, type QueryUsageResponse } from '../../proto/gen/tollgate/v1/sync.js';
import { GatewayError } from '../errors.js';
import { clientChannel, type TlsFiles } from '../../proto/lib/tls.js';

export const USAGE_QUERY_TIMEOUT_MS = 5_000;
/** Usage queries one node has waiting on the control plane at most; more answer 503 at once. */
export const MAX_USAGE_QUERIES_IN_FLIGHT = 32;
const RETRY_AFTER_SEC = 5;

export type UsageAnswer = (err: GatewayError | null, res?: QueryUsageResponse) => void;

/** What the HTTP server needs: start a query, get a function that cancels it. */
export interface UsageSource {
  query(req: QueryUsageRequest, done: UsageAnswer): () => void;
}

export interface UsageClientOptions {
  address: string;
  nodeToken: string;
  /** The node's TLS files for the control plane (as for the sync stream); null: plaintext. */
  tls: TlsFiles | null;
  /** Where the sync stream goes now (several control planes: the leader found); default `address`. */
  currentAddress?(): string;
  /** False while the sync stream is down: answer 503 at once instead of waiting out a deadline. */
  connected(): boolean;
  timeoutMs?: number;
}

function unavailable(): GatewayError {
  return new GatewayError('CONTROL_PLANE_UNAVAILABLE', undefined, { param: null, retryAfterSec: RETRY_AFTER_SEC });
}

export class UsageClient implements UsageSource {
  private readonly clients = new Map<string, SyncServiceClient>();
  private inFlight = 0;

  constructor(private readonly opts: UsageClientOptions) {}

  /** The client of the control plane the sync stream uses now. */
  private get client(): SyncServiceClient {
    const address = this.opts.currentAddress?.() ?? this.opts.address;
    let c = this.clients.get(address);
    if (!c) {
      // The same channel security as the sync stream: the node token never goes in plaintext where
      // the stream would not send it.
      const channel = clientChannel(this.opts.tls, address);
      this.clients.set(address, (c = new SyncServiceClient(address, channel.credentials, channel.options)));
    }
    return c;
  }

  query(req: QueryUsageRequest, done: UsageAnswer): () => void {
    if (!this.opts.connected() || this.inFlight >= MAX_USAGE_QUERIES_IN_FLIGHT) {
      done(unavailable());
      return () => {};
    }
    this.inFlight++;
    const md = new Metadata();
    md.set('authorization', `Bearer ${this.opts.nodeToken}`);
    const call = this.client.queryUsage(req, md, { deadline: Date.now() + (this.opts.timeoutMs ?? USAGE_QUERY_TIMEOUT_MS) }, (err: ServiceError | null, res: QueryUsageResponse) => {
      this.inFlight--;
      if (!err) return done(null, res);
      if (err.code === GrpcStatus.NOT_FOUND) return done(new GatewayError('KEY_INVALID'));
      // The node checked the query already: a refusal here is a bug on one side, not the client's fault.
      if (err.code === GrpcStatus.INVALID_ARGUMENT) return done(new GatewayError('INTERNAL'));
      done(unavailable());
    });
    return () => call.cancel();
  }

  close(): void {
    for (const c of this.clients.values()) c.close();
  }
}
