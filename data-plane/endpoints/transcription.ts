// `POST /v1/audio/transcriptions`: a multipart upload, streamed (intake.ts). The parts before `model`
// may be spilled to a temporary file (upload-spill.ts); the model is checked once its field arrived,
// then the provider reads the rest of the upload.
import type { ModelConfig } from '../../proto/gen/tollgate/v1/sync.js';
import { GatewayError } from '../errors.js';
import { checkModelScope } from '../gate/gate.js';
import type { ApiRequest } from '../gate/api-request.js';
import { logBug } from '../log.js';
import type { RequestContext } from '../request/request-context.js';
import { closesConnection, type BodyStream } from '../request/request-body.js';
import type { BodyBudget } from '../limits/body-budget.js';
import { boundaryOf, findModelField } from '../proxy/multipart-model.js';
import type { CallResult } from '../proxy/providers/provider.js';
import { UploadSpill } from '../proxy/upload-spill.js';
import { failCall, refuseAdmitted, type Endpoint, type EndpointDeps } from './intake.js';

export interface TranscriptionDeps extends EndpointDeps {
  /** Where uploads are spilled past their in-memory threshold (upload-spill.ts). */
  spillDir: string;
  /** Node-wide budget for spilled upload bytes (a share per organisation and per account). */
  spillBudget?: BodyBudget;
}

export class Transcription implements Endpoint {
  /** Refused at admission: the rest of the upload is dropped and the socket unpaused before the answer. */
  readonly discardsRefusedStream = true;

  constructor(private readonly deps: TranscriptionDeps) {}

  before(): boolean {
    return true;
  }

  bodyCap(r: ApiRequest): number {
    return r.family.bodyCapBytes;
  }

  serve(r: ApiRequest, body: Buffer | BodyStream | null): void {
    const stream = body as BodyStream;
    const reply = r.reply;
    const ctx = r.ctx!;
    const key = r.key!;
    const boundary = boundaryOf(r.contentType);
    if (!boundary) {
      stream.discard();
      return reply.sendError(new GatewayError('INVALID_REQUEST', 'Content-Type must be multipart/form-data with a boundary.', { param: null }));
    }
    // The parts before `model` may go to a temporary file: deleted however the request ends.
    const spillBudget = this.deps.spillBudget;
    const spill = new UploadSpill(this.deps.spillDir, undefined, spillBudget && { budget: spillBudget, owner: key.orgId, account: key.org.ownerAccountId });
    reply.onFinish(() => spill.remove());
    findModelField(stream, boundary, spill, (err, field) => {
      try {
        if (reply.done) return;
        // Answered before the body was read to its end: the rest is not wanted. A 400 for what the
        // body holds keeps its one request of rpm (docs/design.md#what-counts-as-a-request).
        const refuse = (e: unknown) => {
          stream.discard();
          refuseAdmitted(ctx, reply, e, e instanceof GatewayError && closesConnection(e));
        };
        if (err || !field) return refuse(err ?? new GatewayError('INVALID_REQUEST'));
        const state = this.deps.holder.current;
        const model = state.view.models.get(field.model);
        if (!field.model) return refuse(new GatewayError('INVALID_REQUEST', 'Missing required parameter: model.', { param: 'model' }));
        if (!model) return refuse(new GatewayError('UNKNOWN_MODEL', `The model \`${field.model}\` does not exist.`, { param: 'model' }));
        if (model.kind !== 'transcription') {
          return refuse(new GatewayError('INVALID_REQUEST', `The model \`${model.id}\` is not a transcription model.`, { param: 'model' }));
        }
        const scope = checkModelScope(state, key, model);
        if (scope) return refuse(scope);
        const provider = this.deps.providers[model.provider];
        if (!provider) return refuse(new GatewayError('UPSTREAM_UNREACHABLE', `No provider "${model.provider}" on this node.`));
        ctx.model = model;
        ctx.providerStarted = true;
        reply.upstreamAt = performance.now();
        provider.transcription({
          requestId: ctx.requestId,
          reply,
          model,
          contentType: r.contentType,
          upload: field,
          complete(res: CallResult) {
            ctx.complete(res);
          },
          onAbort(fn: () => void) {
            ctx.abortFns.push(fn);
          },
          fail(e: unknown) {
            failCall(ctx as RequestContext, reply, e);
          },
          served(billAs: ModelConfig, deployment: string, attempts: string) {
            ctx.model = billAs;
            ctx.upstream = { deployment, attempts };
          },
          refuse(e: unknown) {
            refuseAdmitted(ctx as RequestContext, reply, e);
          },
        });
      } catch (e) {
        logBug(e);
        reply.sendError(e);
      }
    });
  }
}
