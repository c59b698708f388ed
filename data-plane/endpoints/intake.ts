// Admission and body reading, joined in one place: after the gate (gate/gate.ts) has found the route,
// the route's bodyMode (routing/routes.ts) says how the body is read while admission (key budgets, the
// money slice; request/admission.ts) decides, and the endpoint is called once both are done. uWS wants
// onData attached before the handler returns (rule 2 of docs/design.md#the-uws-contract), so a body is
// read while admission waits for a lease, still within the node-wide body budget; a refused request's
// body is not wanted.
import type { StateHolder } from '../state/key-table.js';
import { GatewayError, keepsRequest } from '../errors.js';
import type { ApiRequest } from '../gate/api-request.js';
import type { Admission, Admittable } from '../request/admission.js';
import { type Reply } from '../request/reply.js';
import { logBug } from '../log.js';
import type { RequestContext } from '../request/request-context.js';
import { closesConnection, collectBody, streamBody, type BodyStream, type BodyWatch } from '../request/request-body.js';
import type { BodyBudget } from '../limits/body-budget.js';
import type { Clock } from '../limits/clock.js';
import type { KeyBudgets } from '../limits/key-budgets.js';
import type { Provider } from '../proxy/providers/provider.js';

/** What the endpoint families need of the node (a part of the NodeDeps main.ts builds them from). */
export interface EndpointDeps {
  holder: StateHolder;
  clock: Clock;
  keyBudgets: KeyBudgets;
  providers: Readonly<Record<string, Provider>>;
  /** Node-wide budget for request bodies held in memory. */
  bodyBudget?: BodyBudget;
  /** The least pace of a body read whole (408 below it). */
  bodyWatch?: BodyWatch;
}

/** One endpoint family (endpoints/*.ts): what it checks first, its body cap, and the admitted request. */
export interface Endpoint {
  /** Checks answered before admission and before a byte of the body is read; false when it answered. */
  before(r: ApiRequest): boolean;
  /** The cap of a body read whole or streamed (at most the path family's, which the gate checked). */
  bodyCap(r: ApiRequest): number;
  /**
   * A streamed body refused at admission is discarded (the rest dropped, the socket unpaused before
   * the answer goes out), or left as it is for the reply to linger on.
   */
  readonly discardsRefusedStream: boolean;
  /** Admitted (`r.ctx` is set), with the body as the route's bodyMode read it. */
  serve(r: ApiRequest, body: Buffer | BodyStream | null): void;
}

/**
 * An endpoint with nothing to check before admission, the path family's body cap, and no streamed
 * body to discard: listings, stored responses, usage.
 */
export abstract class PlainEndpoint implements Endpoint {
  readonly discardsRefusedStream = false;

  before(_r: ApiRequest): boolean {
    return true;
  }

  bodyCap(r: ApiRequest): number {
    return r.family.bodyCapBytes;
  }

  abstract serve(r: ApiRequest, body: Buffer | BodyStream | null): void;
}

export class Intake {
  constructor(
    private readonly deps: EndpointDeps,
    private readonly admission: Admission,
  ) {}

  /** Runs an endpoint for a request the gate passed and routed. */
  run(r: ApiRequest, e: Endpoint): void {
    if (!e.before(r)) return;
    // A GET or HEAD carries no body, whatever its route reads for the other methods.
    const mode = r.method === 'GET' || r.method === 'HEAD' ? 'none' : r.route!.bodyMode;
    if (mode === 'whole') return this.whole(r, e);
    if (mode === 'stream') return this.stream(r, e);
    this.admission.admitOrWait(
      r.reply,
      r.key!,
      r.path,
      0,
      (ctx) => {
        if (!ctx) return;
        r.ctx = ctx;
        e.serve(r, null);
      },
    );
  }

  /**
   * The body streamed to the endpoint: the stream exists before any check answers (onData attached);
   * while admission waits for a lease, the upload waits in the stream (its buffer pauses the socket).
   */
  private stream(r: ApiRequest, e: Endpoint): void {
    const stream = streamBody(r.res, r.reply, e.bodyCap(r));
    stream.on('error', () => {});
    this.admission.admitOrWait(
      r.reply,
      r.key!,
      r.path,
      0,
      (ctx) => {
        if (!ctx) return;
        r.ctx = ctx;
        e.serve(r, stream);
      },
      e.discardsRefusedStream ? () => discard(stream) : undefined,
    );
  }

  /**
   * The body read whole. The request and its parallel slot are taken before the body is buffered, so
   * a key's parallel limit also bounds the memory its bodies hold. Whichever of the two comes last
   * calls the endpoint. Refused while the body is still arriving: the connection closes.
   */
  private whole(r: ApiRequest, e: Endpoint): void {
    const deps = this.deps;
    const key = r.key!;
    let admitted: RequestContext | null | undefined;
    let bodyDone = false;
    let bodyErr: GatewayError | null = null;
    let bodyRaw: Buffer | undefined;
    this.admission.admitOrWait(
      r.reply,
      key,
      r.path,
      0,
      (c) => {
        admitted = c;
        if (!c) return;
        r.ctx = c;
        if (bodyDone) serveWithBody(r, e, bodyErr, bodyRaw!);
      },
      () => !bodyDone,
    );
    if (admitted === null) return;
    collectBody(
      r.res,
      r.reply,
      e.bodyCap(r),
      r.contentLength,
      (err, raw) => {
        bodyDone = true;
        bodyErr = err;
        bodyRaw = raw;
        if (admitted) serveWithBody(r, e, err, raw);
      },
      deps.bodyBudget && { budget: deps.bodyBudget, owner: key.orgId, account: key.org.ownerAccountId },
      deps.bodyWatch,
    );
  }
}

function discard(stream: BodyStream): boolean {
  stream.discard();
  return false;
}

/** Admitted and the body read whole: the body's own refusal (413, 408, 503) or the endpoint. */
function serveWithBody(r: ApiRequest, e: Endpoint, err: GatewayError | null, raw: Buffer): void {
  const reply = r.reply;
  try {
    if (reply.done) return;
    if (err) return reply.sendError(err, closesConnection(err));
    e.serve(r, raw);
  } catch (x) {
    logBug(x);
    reply.sendError(x);
  }
}

/** A provider's `fail`: the error if nothing was sent yet, else the stream closed. */
export function failCall(ctx: RequestContext, reply: Reply, err: unknown): void {
  if (!reply.headersSent) reply.sendError(err, isTooLarge(err));
  else reply.close();
  ctx.complete({ status: 502, promptTokens: 0, completionTokens: 0 });
}

/**
 * Refuses an admitted request or socket turn with `err`: it keeps its one request of rpm or is given
 * back whole as the one rule says (errors.ts `keepsRequest`), then the refusal is answered, with the
 * key's rate headers as they are after it when `budgets` is given.
 */
export function refuseAdmitted(ctx: RequestContext, reply: Admittable, err: unknown, closeConnection = false, budgets?: KeyBudgets): void {
  if (keepsRequest(err)) ctx.complete({ status: 400, promptTokens: 0, completionTokens: 0 });
  else ctx.refuse();
  if (budgets) reply.rateHeaders = budgets.headers(ctx.key.limits);
  reply.sendError(err, closeConnection);
}

function isTooLarge(err: unknown): boolean {
  return err instanceof GatewayError && err.code === 'BODY_TOO_LARGE';
}
