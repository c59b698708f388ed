// Every turn on a socket is a request (docs/design.md#socket-turns): each `response.create` a client
// sends on a realtime or Responses-API WebSocket passes the same admission as an HTTP request (one
// request of rpm, a tpm reservation of its own estimate, the money check, waiting for a lease when
// the node's is short), is checked on exactly the fields the upstream will read, and is billed by
// its own RequestContext (the one bill, request-context.ts `complete`) when its final event passes,
// or at the session's end from what was counted. A refused turn gets an in-band `error` event with
// the code and message the HTTP refusal has (error-shapes.ts `renderErrorEvent`); it is not
// forwarded, and the socket stays open. The socket's own connection holds the key's parallel slot,
// so a turn takes none. A response the upstream began on its own (a realtime response started by
// voice activity, a transcription of input audio) is admitted as a turn that cannot be refused: the
// work is being done, so it is counted and billed.
import type { ModelConfig } from '../../proto/gen/tollgate/v1/sync.js';
import type { TokenCounts } from '../../proto/lib/money.js';
import type { KeyRecord } from '../state/key-table.js';
import { GatewayError } from '../errors.js';
import type { Admission, Admittable } from '../request/admission.js';
import { renderErrorEvent } from '../error-shapes.js';
import { logBug } from '../log.js';
import type { RequestContext } from '../request/request-context.js';
import type { RateHeaders } from '../limits/rate-headers.js';
import type { KeyBudgets } from '../limits/key-budgets.js';
import { requestWorstCase } from '../limits/worst-case.js';
import { requestedTier } from '../../proto/lib/reported-prices.js';
import { refuseAdmitted } from './intake.js';

type Obj = Record<string, unknown>;

/** What differs between the socket endpoints: how a create is estimated, checked and rewritten. */
export interface TurnRules {
  /**
   * How an upstream `error` names the create it refuses: by the client event's `event_id` (realtime;
   * a create without one is given one), or as the one create waiting (the Responses API's one
   * response at a time).
   */
  readonly errorsNameTheirEvent: boolean;
  /**
   * The create as the upstream will get it, or the refusal: checked on exactly the fields the upstream
   * reads (called after admission, as an HTTP body is validated after admission).
   */
  check(ev: Obj, text: string, data: Buffer): GatewayError | Buffer;
  /** `check`, when it may have to wait (for the project's owner records, responses-socket.ts); `then` once. */
  whenChecked?(ev: Obj, text: string, data: Buffer, then: (checked: GatewayError | Buffer) => void): void;
  /**
   * Tokens the turn reserves: its input as far as the node knows it, plus its output ceiling.
   * `pendingInput`: what the client sent into the conversation since the last response began.
   */
  estimate(ev: Obj, pendingInput: number): number;
  /** Tokens billed as its input if it ends without the upstream's usage (its estimate, less the output). */
  inputEstimate(ev: Obj, pendingInput: number): number;
  /** A response ended with the upstream's usage. */
  ended?(responseId: string, usage: TokenCounts): void;
  /** Where the create names its output ceiling (`max_output_tokens`), for its worst case in money. */
  outputFields(ev: Obj): unknown;
}

/** One turn, as admission sees it: its refusals are error events on the socket. */
class SocketTurn implements Admittable {
  rateHeaders: RateHeaders | null = null;
  readonly logDraft = null;
  readonly open = null;
  ctx: RequestContext | null = null;
  /** The upstream's id of the response, once `response.created` named it. */
  responseId: string | null = null;
  /** The client event's id the upstream names in an error about it (realtime). */
  eventId: string | null = null;

  constructor(
    readonly requestId: string,
    private readonly session: TurnSocket,
  ) {}

  get done(): boolean {
    return this.session.closed;
  }

  onFinish(_fn: (aborted: boolean) => void): void {
    // A turn is always settled explicitly (SocketTurns): nothing waits for a response to finish.
  }

  /** A socket's refusals are in-band error events, in Shape A (error-shapes.ts renderErrorEvent). */
  sendError(err: unknown): void {
    this.session.toClient(renderErrorEvent(err));
  }
}

/** What the turns need of their session. */
export interface TurnSocket {
  readonly closed: boolean;
  /** A message of the gateway's own to the client. */
  toClient(data: Buffer): void;
  /** A checked create to the upstream. */
  toUpstream(data: Buffer): void;
  /** The turn's admission finished (admitted or refused): the session goes on with what it held. */
  settled(): void;
}

export interface SocketTurnsDeps {
  admission: Admission;
  keyBudgets: KeyBudgets;
}

export class SocketTurns {
  /** Admitted and forwarded, their response not yet begun upstream (oldest first). */
  private readonly waiting: SocketTurn[] = [];
  /** Begun upstream, by the response's id. */
  private readonly running = new Map<string, SocketTurn>();
  private n = 0;
  /** A create is being admitted (waiting for a lease): later client messages wait behind it. */
  admitting = false;

  constructor(
    private readonly deps: SocketTurnsDeps,
    private readonly socket: TurnSocket,
    private readonly rules: TurnRules,
    private readonly key: KeyRecord,
    private readonly model: ModelConfig,
    private readonly path: string,
    private readonly sessionRequestId: string,
  ) {}

  /** Turns begun or forwarded and not finished. */
  get inFlight(): number {
    return this.waiting.length + this.running.size;
  }

  /** A client's `response.create`: admitted, checked and forwarded, or refused in-band. */
  create(ev: Obj, data: Buffer, pendingInput: number): void {
    const turn = new SocketTurn(this.nextId(), this.socket);
    const estimate = this.rules.estimate(ev, pendingInput);
    this.admitting = true;
    let sync = true;
    // Admission, the check and the money's worst case may each wait: the client's later messages
    // wait behind the turn until it is forwarded or refused.
    const done = () => {
      this.admitting = false;
      if (!sync) this.socket.settled();
    };
    this.deps.admission.admitOrWait(
      turn,
      this.key,
      this.path,
      estimate,
      (ctx) => {
        if (!ctx) return done();
        try {
          this.admitted(turn, ctx, ev, data, pendingInput, done);
        } catch (e) {
          logBug(e);
          if (!ctx.completed) ctx.refuse();
          done();
        }
      },
      undefined,
      { slot: false },
    );
    sync = false;
  }

  private admitted(turn: SocketTurn, ctx: RequestContext, ev: Obj, data: Buffer, pendingInput: number, done: () => void): void {
    turn.ctx = ctx;
    if (this.socket.closed) {
      ctx.refuse();
      return done();
    }
    const text = data.toString('utf8');
    const go = (checked: GatewayError | Buffer) => {
      try {
        this.checked(turn, ctx, ev, pendingInput, done, checked);
      } catch (e) {
        logBug(e);
        if (!ctx.completed) ctx.refuse();
        done();
      }
    };
    if (this.rules.whenChecked) this.rules.whenChecked(ev, text, data, go);
    else go(this.rules.check(ev, text, data));
  }

  private checked(turn: SocketTurn, ctx: RequestContext, ev: Obj, pendingInput: number, done: () => void, checked: GatewayError | Buffer): void {
    // Closed while the check waited.
    if (this.socket.closed) {
      ctx.refuse();
      return done();
    }
    if (checked instanceof GatewayError) {
      refuseAdmitted(ctx, turn, checked, false, this.deps.keyBudgets);
      return done();
    }
    const input = this.rules.inputEstimate(ev, pendingInput);
    // Near a money limit the turn runs only if its worst case fits (docs/money-limits.md#the-last-request).
    const worst = requestWorstCase(this.model, 'responses', this.rules.outputFields(ev), input);
    this.deps.admission.reserveWorstCaseOrWait(this.key, ctx.spend, worst, () => this.socket.closed, (refusal) => {
      try {
        if (refusal === 'gone') ctx.refuse();
        else if (refusal) refuseAdmitted(ctx, turn, refusal, false, this.deps.keyBudgets);
        else {
          ctx.model = this.model;
          ctx.providerStarted = true;
          ctx.estimatedPromptTokens = input;
          // A turn cut before its final event is billed at the tier it asked for (request-context.ts).
          ctx.requestedTier = requestedTier(ev);
          this.waiting.push(turn);
          this.socket.toUpstream(this.tagged(turn, ev, checked));
        }
      } catch (e) {
        logBug(e);
        if (!ctx.completed) ctx.refuse();
      }
      done();
    });
  }

  /** The create as it goes upstream, with an `event_id` an error about it will name (realtime). */
  private tagged(turn: SocketTurn, ev: Obj, checked: Buffer): Buffer {
    if (!this.rules.errorsNameTheirEvent) return checked;
    if (typeof ev.event_id === 'string') {
      turn.eventId = ev.event_id;
      return checked;
    }
    turn.eventId = `event_gw_${turn.requestId}`;
    const text = checked.toString('utf8');
    const open = text.indexOf('{');
    return Buffer.from(`${text.slice(0, open + 1)}"event_id":${JSON.stringify(turn.eventId)},${text.slice(open + 1)}`);
  }

  /**
   * An upstream `error`: if it refuses a create that has not begun (the client event it names, or the
   * one create waiting), that turn ends at once, billed nothing: the upstream did no work.
   */
  upstreamError(ev: Obj | null): void {
    let i = -1;
    if (this.rules.errorsNameTheirEvent) {
      const id = (ev?.error as Obj | undefined)?.event_id;
      if (typeof id === 'string') i = this.waiting.findIndex((t) => t.eventId === id);
    } else if (this.waiting.length > 0) i = 0;
    if (i < 0) return;
    const [turn] = this.waiting.splice(i, 1);
    this.settle(turn, 400, { promptTokens: 0, completionTokens: 0 });
  }

  /** A response began upstream: the oldest forwarded turn is its, else the upstream began it on its own. */
  began(responseId: string): void {
    if (this.running.has(responseId)) return;
    const turn = this.waiting.shift() ?? this.forced();
    turn.responseId = responseId;
    this.running.set(responseId, turn);
  }

  /**
   * A response ended: billed the upstream's usage, else `counted` (what passed for it). Answers the
   * cost billed, in micro-dollars.
   */
  ended(responseId: string | undefined, usage: TokenCounts | null, counted: TokenCounts): number {
    let turn = responseId !== undefined ? this.running.get(responseId) : undefined;
    if (turn) this.running.delete(turn.responseId!);
    else turn = this.waiting.shift() ?? this.firstRunning() ?? this.forced();
    if (usage && responseId !== undefined) this.rules.ended?.(responseId, usage);
    return this.settle(turn, 200, usage ?? atLeastEstimate(turn, counted));
  }

  /** Usage the upstream reports for work of its own outside a response (a transcription of input audio). */
  extra(usage: TokenCounts): number {
    return this.settle(this.forced(), 200, usage);
  }

  /**
   * The session ends: a response begun upstream is billed what was counted for it (`counted`, by its
   * id); one forwarded and not begun is billed its input estimate (the upstream may have begun it).
   * Answers what each cost, with the counts billed.
   */
  endAll(counted: (responseId: string) => TokenCounts | undefined): Array<{ counts: TokenCounts; cost: number }> {
    const out: Array<{ counts: TokenCounts; cost: number }> = [];
    for (const [id, turn] of this.running) {
      const c = atLeastEstimate(turn, counted(id) ?? { promptTokens: 0, completionTokens: 0 });
      out.push({ counts: c, cost: this.settle(turn, 499, c) });
    }
    this.running.clear();
    for (const turn of this.waiting) {
      const c = { promptTokens: turn.ctx?.estimatedPromptTokens ?? 0, completionTokens: 0 };
      out.push({ counts: c, cost: this.settle(turn, 499, c) });
    }
    this.waiting.length = 0;
    return out;
  }

  private settle(turn: SocketTurn, status: number, counts: TokenCounts): number {
    const ctx = turn.ctx;
    if (!ctx) return 0;
    return ctx.complete({ status, ...counts });
  }

  private firstRunning(): SocketTurn | undefined {
    for (const [id, turn] of this.running) {
      this.running.delete(id);
      return turn;
    }
    return undefined;
  }

  /** A turn the upstream began on its own: counted whatever the limits say, never refused. */
  private forced(): SocketTurn {
    const turn = new SocketTurn(this.nextId(), this.socket);
    const ctx = this.deps.admission.admitNow(turn, this.key, this.path, 0, { slot: false, force: true });
    ctx.model = this.model;
    ctx.providerStarted = true;
    turn.ctx = ctx;
    return turn;
  }

  private nextId(): string {
    return `${this.sessionRequestId}.${++this.n}`;
  }
}

/** What passed for a turn without the upstream's usage, its input never below the turn's own estimate (which knows a chain's context). */
function atLeastEstimate(turn: SocketTurn, seen: TokenCounts): TokenCounts {
  const estimate = turn.ctx?.estimatedPromptTokens ?? 0;
  return seen.promptTokens >= estimate ? seen : { ...seen, promptTokens: estimate };
}
