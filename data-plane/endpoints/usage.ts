// `GET /v1/usage`: the key's own project only (the control plane takes the project from its record of
// the key). The one request that waits for the control plane, bounded by the usage client's deadline;
// the query and the JSON are request/usage-endpoint.ts's.
import { GatewayError } from '../errors.js';
import type { ApiRequest } from '../gate/api-request.js';
import { logBug } from '../log.js';
import { parseUsageQuery, renderUsage } from '../request/usage-endpoint.js';
import type { UsageSource } from '../sync/usage-client.js';
import { refuseAdmitted, PlainEndpoint, type EndpointDeps } from './intake.js';

const JSON_HEADERS = [['content-type', 'application/json']] as const;

export interface UsageDeps extends EndpointDeps {
  /** Reads the control plane's durable usage; absent: 503. */
  usage?: UsageSource;
}

export class Usage extends PlainEndpoint {
  constructor(private readonly deps: UsageDeps) {
    super();
  }

  serve(r: ApiRequest): void {
    const ctx = r.ctx!;
    const reply = r.reply;
    const key = r.key!;
    // Refused or not served: the request is given back, and the rate headers say so.
    const refuse = (err: unknown) => refuseAdmitted(ctx, reply, err, false, this.deps.keyBudgets);
    const q = parseUsageQuery(r.query, this.deps.clock.now());
    if (q instanceof GatewayError) return refuse(q);
    const source = this.deps.usage;
    if (!source) {
      return refuse(new GatewayError('CONTROL_PLANE_UNAVAILABLE', undefined, { param: null, retryAfterSec: 5 }));
    }
    ctx.providerStarted = true;
    const request = { keyId: key.keyId, sinceMs: q.startTime * 1000, untilMs: q.endTime === null ? 0 : q.endTime * 1000, groupBy: q.groupBy };
    const cancel = source.query(request, (err, res) => {
      try {
        if (reply.done) return;
        if (err || !res) return refuse(err);
        ctx.complete({ status: 200, promptTokens: 0, completionTokens: 0 });
        reply.send(200, JSON_HEADERS, renderUsage(q, res));
      } catch (e) {
        logBug(e);
        reply.sendError(e);
      }
    });
    ctx.abortFns.push(cancel);
  }
}
