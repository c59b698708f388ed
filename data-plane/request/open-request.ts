// An HTTP request of a known key, open in the node's one registry (state/open-streams.ts, which holds
// the policy) from its credential check until its answer ends, and how the registry ends it.
import type { ModelConfig } from '../../proto/gen/tollgate/v1/sync.js';
import type { KeyRecord } from '../state/key-table.js';
import type { EndReason, OpenEntry, OpenStreams } from '../state/open-streams.js';
import type { GatewayError } from '../errors.js';
import { cancelUpstreamAtOnce } from '../proxy/stream-proxy.js';
import { errorShape, renderError } from '../error-shapes.js';
import type { Reply } from './reply.js';

export class OpenRequest implements OpenEntry {
  readonly keyHash: string;
  readonly orgId: string;
  /** Its key's expiry (0: none), so the registry need not look the key up again. */
  readonly expiresAtMs: number;
  /** Its slot in the registry (slot-set.ts). */
  slot = -1;
  /** The admitted request (request-context.ts `attach` sets it): its model, once the body named one. */
  context: { readonly model: ModelConfig | null } | null = null;

  constructor(
    key: KeyRecord,
    private readonly reply: Reply,
  ) {
    this.keyHash = key.keyHash;
    this.orgId = key.orgId;
    this.expiresAtMs = key.expiresAtMs ?? 0;
  }

  get modelId(): string {
    return this.context?.model?.id ?? '';
  }

  /**
   * Not yet answered: the error (401) in the path's shape. A model event stream (SSE chat): one
   * terminal error event. Any other stream (tool downloads, tool event streams, which speak their
   * backend's protocol): closed. Every way runs the request's abort path: the upstream is cancelled at
   * once, as the client's answer is, and what it did is billed.
   */
  end(_why: EndReason, err: GatewayError): void {
    const reply = this.reply;
    if (reply.done) return;
    cancelUpstreamAtOnce(reply);
    if (!reply.headersSent) {
      // Ended as an abort: the request's cleanups stop its upstream and bill it (not a normal answer
      // that waits for the provider to report).
      reply.aborted = true;
      return reply.sendError(err, true);
    }
    if (reply.shape === 'openai' && reply.isEventStream) return reply.endEarly(`data: ${renderError(err, errorShape(err, reply.shape)).body}\n\n`);
    reply.close();
  }
}

/** Registers `reply`'s request in `streams` until its answer ends. */
export function registerOpenRequest(streams: OpenStreams, reply: Reply, key: KeyRecord): void {
  const open = new OpenRequest(key, reply);
  streams.add(open);
  reply.open = open;
  reply.onFinish(() => streams.remove(open));
}
