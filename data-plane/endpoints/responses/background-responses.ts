// Background responses (`POST /v1/responses` with `background: true`), followed to their end by the
// node that created them and billed once, from the upstream's final usage (docs/billing-endings.md#background-responses).
//
// The create is answered `queued`, with no usage; the upstream runs on whether or not anyone reads it.
// Its request stays open (RequestContext.deferSettlement: its parallel slot, tpm reservation and money
// held) and the node polls the upstream (`GET /responses/{id}`, off the request path) with backoff
// until a terminal status, then completes the create's context with that status's usage: the one bill.
// Reads of the response (GET, GET ?stream=true, a resumed stream, cancel), on any node, bill nothing,
// and only the creating node follows, so the bill is made once across the cluster by construction.
//
// A follower is in the node's one registry of what keys have open (state/open-streams.ts): a key
// revoked, an organisation blocked, a model no longer allowed, a node past its staleness end it as
// they end a stream: it cancels the response upstream and bills the cancelled response's usage.
//
// Bounds: followed at most FOLLOW_MAX_MS; a response still running then, one the upstream no longer
// has (404: its retention passed), or one a draining node still follows at its deadline, is billed
// safely above what it could have used (`safeAbove`).
import { hasToolCalls, requestedTier, requestedToolCalls } from '../../../proto/lib/reported-prices.js';
import type { ModelConfig } from '../../../proto/gen/tollgate/v1/sync.js';
import type { ResponseOwners } from '../../state/response-owners.js';
import type { Clock } from '../../limits/clock.js';
import type { StateHolder } from '../../state/key-table.js';
import { endReasonFor, type EndReason, type OpenEntry, type OpenStreams } from '../../state/open-streams.js';
import { endError, type GatewayError } from '../../errors.js';
import { logBug } from '../../log.js';
import type { RequestContext } from '../../request/request-context.js';
import type { CallResult } from '../../proxy/providers/provider.js';
import { estimateTokens } from '../../proxy/tokens.js';
import { SlotSet, type Slotted } from '../../slot-set.js';
import type { ResponsesProvider, UpstreamRead } from '../../proxy/providers/responses-provider.js';

/** The longest a background response is followed: background mode exists for runs of minutes. */
export const FOLLOW_MAX_MS = 60 * 60_000;
/** The output billed past the bound when the request named no `max_output_tokens` (the most today's models produce). */
export const BACKGROUND_OUTPUT_CEILING_TOKENS = 128_000;
/** Polls start this soon after the create and double up to POLL_CAP_MS (POLL_CAP_LATE_MS after its first minute). */
const FIRST_POLL_MS = 250;
const POLL_CAP_MS = 2000;
const POLL_CAP_LATE_MS = 10_000;
const LATE_AFTER_MS = 60_000;

/** The statuses a response ends in. */
const TERMINAL: ReadonlySet<string> = new Set(['completed', 'failed', 'cancelled', 'incomplete', 'expired']);

/**
 * What a background response is billed when its end cannot be read: the input estimate (the one
 * estimator, tokens.ts) plus all the output it allowed (`max_output_tokens`, else the ceiling).
 */
export function safeAbove(body: Record<string, unknown>, status: number, inputTokens = estimateTokens(body)): CallResult {
  const max = body.max_output_tokens;
  const out = typeof max === 'number' && Number.isSafeInteger(max) && max > 0 ? max : BACKGROUND_OUTPUT_CEILING_TOKENS;
  const bound: CallResult = { status, promptTokens: inputTokens, completionTokens: out };
  // At the tier it asked for, with every built-in tool call it allows (proto/lib/reported-prices.ts).
  const tier = requestedTier(body);
  if (tier !== undefined) bound.serviceTier = tier;
  const calls = requestedToolCalls(body);
  if (hasToolCalls(calls)) bound.toolCalls = calls;
  return bound;
}

export interface FollowerDeps {
  holder: StateHolder;
  clock: Clock;
  /** Who owns each stored response: a chain from a followed response re-reads what it ended with. */
  owners?: ResponseOwners;
  /** The node's registry of what keys have open; absent: nothing ends a follower but its response. */
  openStreams?: OpenStreams;
  isStale(): boolean;
}

/** Every background response this node follows; a Drainable (drain.ts) for the node's drain. */
export class BackgroundFollowers {
  private readonly following = new SlotSet<Membership>();

  constructor(private readonly deps: FollowerDeps) {}

  /**
   * Follows the response `id` that the request `ctx` created with `body`, on `provider`, to its end;
   * `status` is the create's (billed with the usage); `onItems` records its output items when it ends.
   */
  follow(ctx: RequestContext, provider: ResponsesProvider, model: ModelConfig, id: string, body: Record<string, unknown>, status: number, deployment = '', onItems: ((ids: string[], deployment: string) => void) | null = null): void {
    ctx.deferSettlement();
    const f = new Follower(this, ctx, provider, model, id, body, status, deployment, onItems);
    this.following.add(f.membership);
    const streams = this.deps.openStreams;
    if (streams) {
      streams.add(f);
      // Ended already (a key revoked while its create was answered): at once, as the registry would.
      const why = endReasonFor(this.deps.holder.current, f, this.deps.isStale(), this.deps.clock.now());
      if (why && streams.remove(f)) return f.end(why, endError(why, { modelId: f.modelId }));
    }
    f.start();
  }

  /** A followed response ended with `tokens` of context (its input and output as billed). */
  noteContext(id: string, tokens: number): void {
    this.deps.owners?.noteContext(id, tokens);
  }

  /** Drops a follower that billed. */
  forget(f: Follower): void {
    this.following.delete(f.membership);
    this.deps.openStreams?.remove(f);
  }

  /** How many are followed now (the drain waits for them). */
  open(): number {
    return this.following.size;
  }

  /** The drain's deadline: each still running is billed safely above (the node stops following); returns how many. */
  closeAll(): number {
    const all = this.following.values();
    for (const m of all) m.follower.billSafeAbove();
    return all.length;
  }
}

/** A follower's place in BackgroundFollowers (its own `slot` is the open-streams registry's). */
interface Membership extends Slotted {
  readonly follower: Follower;
}

class Follower implements OpenEntry {
  slot = -1;
  readonly keyHash: string;
  readonly orgId: string;
  readonly modelId: string;
  readonly membership: Membership;
  private readonly startedAt = performance.now();
  private delayMs = FIRST_POLL_MS;
  private timer: NodeJS.Timeout | null = null;
  private settled = false;
  /** Ended by the registry: cancelling upstream, polls stop. */
  private cancelling = false;
  /** The create's input estimate, a chain's context included as far as the node knew it. */
  private readonly input: number;
  /** What it is billed when its end cannot be read (safeAbove). */
  private readonly bound: CallResult;

  constructor(
    private readonly set: BackgroundFollowers,
    private readonly ctx: RequestContext,
    private readonly provider: ResponsesProvider,
    private readonly model: ModelConfig,
    readonly id: string,
    body: Record<string, unknown>,
    private readonly status: number,
    /** The deployment of a pooled model that holds it: every read goes there (affinity). */
    private readonly deployment = '',
    /** Records its output items as the project's when it ends (absent: not stored upstream). */
    private readonly onItems: ((ids: string[], deployment: string) => void) | null = null,
  ) {
    // What is billed without the upstream's usage, worked out now: the body is not kept for the
    // follow's length (up to an hour, outside the node's body budget).
    this.input = Math.max(ctx.estimatedPromptTokens, estimateTokens(body));
    this.bound = safeAbove(body, status, this.input);
    this.keyHash = ctx.key.keyHash;
    this.orgId = ctx.key.orgId;
    this.modelId = model.id;
    this.membership = { slot: -1, follower: this };
  }

  start(): void {
    this.schedule();
  }

  /** The registry's end (revoked, blocked, model no longer allowed, node stale): cancel upstream, bill what it used. */
  end(_why: EndReason, _err: GatewayError): void {
    if (this.settled || this.cancelling) return;
    this.cancelling = true;
    if (this.timer) clearTimeout(this.timer);
    this.timer = null;
    this.provider.cancel(this.model, this.id, (r) => {
      if (this.settled) return;
      if (isTerminal(r)) return this.billEnded(r);
      // The cancel said nothing billable (refused, unreachable): one last read, else the bound.
      this.provider.retrieve(this.model, this.id, (again) => (isTerminal(again) ? this.billEnded(again) : this.bill(this.bound)), this.deployment);
    }, this.deployment);
  }

  billSafeAbove(): void {
    this.bill(this.bound);
  }

  private schedule(): void {
    const age = performance.now() - this.startedAt;
    if (age >= FOLLOW_MAX_MS) return this.billSafeAbove();
    this.timer = setTimeout(() => this.poll(), Math.min(this.delayMs, FOLLOW_MAX_MS - age));
    this.timer.unref();
    this.delayMs = Math.min(this.delayMs * 2, age >= LATE_AFTER_MS ? POLL_CAP_LATE_MS : POLL_CAP_MS);
  }

  private poll(): void {
    this.timer = null;
    if (this.settled || this.cancelling) return;
    this.provider.retrieve(this.model, this.id, (r) => {
      if (this.settled || this.cancelling) return;
      if (isTerminal(r)) return this.billEnded(r);
      // Gone upstream (its retention passed before its end was seen): the bound.
      if (r.httpStatus === 404) return this.billSafeAbove();
      this.schedule();
    }, this.deployment);
  }

  /** A terminal response: its output items become the project's (an item_reference may name them), then the bill. */
  private billEnded(r: UpstreamRead): void {
    if (r.itemIds && r.itemIds.length > 0 && this.onItems) {
      try {
        this.onItems(r.itemIds, this.deployment);
      } catch (err) {
        logBug(err);
      }
    }
    this.bill(this.billOf(r));
  }

  /** A terminal response's usage, else (an upstream reporting none) the input estimate and its output counted. */
  private billOf(r: UpstreamRead): CallResult {
    if (r.usage) return { ...r.usage, ...r.facts, status: this.status };
    return { ...r.facts, status: this.status, promptTokens: this.input, completionTokens: r.outputTokens };
  }

  /** The one bill: completes the create's context (idempotent there too) and stops following. */
  private bill(result: CallResult): void {
    if (this.settled) return;
    this.settled = true;
    if (this.timer) clearTimeout(this.timer);
    this.timer = null;
    this.set.forget(this);
    this.set.noteContext(this.id, result.promptTokens + result.completionTokens);
    try {
      this.ctx.complete(result);
    } catch (err) {
      logBug(err);
    }
  }
}

function isTerminal(r: UpstreamRead): boolean {
  return r.httpStatus >= 200 && r.httpStatus < 300 && r.status !== null && TERMINAL.has(r.status);
}
