// Tool pass-through (files, PDF, skills, MCP, vector stores, sandbox, /v1/route): forwarded to the
// path's configured backend (tool-router.ts) with the caller's headers. Bodies stream through, except
// on `/v1/pdf*`, whose HTML is read whole (within the path's cap and the node's body budget) and
// refused with 400 in the backends' shape ('passthrough', the spec's Shape C) naming the first remote
// reference, before the backend sees a byte.
import { GatewayError } from '../errors.js';
import type { ApiRequest } from '../gate/api-request.js';
import type { BodyStream } from '../request/request-body.js';
import { encodedBodyRefusal, findRemoteInBody } from '../proxy/pdf-guard.js';
import type { ToolBackends } from '../proxy/tool-backends.js';
import { forwardTool } from '../proxy/tool-router.js';
import { refuseAdmitted, type Endpoint } from './intake.js';

export class Tools implements Endpoint {
  readonly discardsRefusedStream = false;

  constructor(private readonly backends: ToolBackends) {}

  before(r: ApiRequest): boolean {
    if (r.route!.backend) return true;
    r.reply.sendError(new GatewayError('UPSTREAM_UNREACHABLE', `No backend is configured for ${r.path}.`));
    return false;
  }

  bodyCap(r: ApiRequest): number {
    return r.family.bodyCapBytes;
  }

  serve(r: ApiRequest, body: Buffer | BodyStream | null): void {
    if (Buffer.isBuffer(body)) {
      // A body read whole: the PDF route's (routing/routes.ts).
      const headers = r.headers ?? [];
      const encoded = encodedBodyRefusal(headers);
      if (encoded) return refuseAdmitted(r.ctx!, r.reply, encoded);
      const found = findRemoteInBody(body, r.contentType);
      if (found) {
        const message = `The HTML references a remote resource (${found.where}: ${JSON.stringify(found.url)}); only local references (data: URIs, fragments, relative paths) are allowed.`;
        return refuseAdmitted(r.ctx!, r.reply, new GatewayError('REMOTE_REFERENCE', message));
      }
    }
    this.forward(r, body);
  }

  private forward(r: ApiRequest, body: BodyStream | Buffer | null): void {
    const route = r.route!;
    const ctx = r.ctx!;
    if (!route.backend) return;
    // From here the request counts against rpm whatever the backend answers.
    ctx.providerStarted = true;
    r.reply.upstreamAt = performance.now();
    forwardTool(this.backends, {
      backend: route.backend,
      method: r.method,
      pathAndQuery: r.pathAndQuery,
      headers: r.headers ?? [],
      body,
      reply: r.reply,
      clientIp: r.ip,
      caller: { requestId: ctx.requestId, keyId: ctx.key.keyId, projectId: ctx.key.projectId, orgId: ctx.key.orgId },
      onAbort(fn) {
        ctx.abortFns.push(fn);
      },
      onDone(status) {
        ctx.complete({ status, promptTokens: 0, completionTokens: 0 });
      },
    });
  }
}
