// One admitted request of a key, from admission to its end: its key-budget ticket and its money
// reservation are settled exactly once, whichever way the request ends (the provider completes, the
// client aborts, a later check refuses it, the response is sent before the upstream finished).
import type { ModelConfig, UsageRecord } from '../../proto/gen/tollgate/v1/sync.js';
import { reportedCostMicros, type ToolCallCounts } from '../../proto/lib/reported-prices.js';
import type { KeyRecord } from '../state/key-table.js';
import type { Clock } from '../limits/clock.js';
import type { Ticket } from '../limits/key-budgets.js';
import type { SpendReservation } from '../leases/lease-money.js';
import type { CallResult } from '../proxy/providers/provider.js';
import { logBug, logRequestError } from '../log.js';
import { estimateTokens } from '../proxy/tokens.js';
import { cleanCount } from '../proxy/usage/usage-readers.js';
import type { LogDraft } from './request-log.js';

export interface ContextDeps {
  clock: Clock;
  reporter: { record(u: UsageRecord): void };
  leases?: { settleSpend(orgId: string, reservation: SpendReservation | undefined, costMicros: number): void };
}

/** The part of Reply a context needs: one callback when the response ends, however it ends. */
export interface FinishSource {
  onFinish(fn: (aborted: boolean) => void): void;
  /** The request's log entry, if it is logged: it waits for this context to settle. */
  logDraft?: LogDraft | null;
  /** Its entry in the registry of what keys have open (open-request.ts): told the request's model. */
  open?: { context: { readonly model: ModelConfig | null } | null } | null;
}

/** The most tokens one request may report (far above any context window); more is clamped. */
export const MAX_TOKENS_PER_REQUEST = 100_000_000;
/** One boundary for every count an upstream reports (usage-readers.ts). */

/**
 * How long a finished response waits for its provider to report before the context settles on its
 * own. Providers complete on every path (provider.ts); this only bounds the damage of a provider bug.
 */
export const PROVIDER_REPORT_GRACE_MS = 120_000;

/** The cost of a finished model call, in micro-dollars. */
export function costOf(m: ModelConfig, r: CallResult): number {
  if (m.kind === 'speech') return Math.ceil(((r.audioUnits ?? 0) * m.audioMicrosPerUnit) / 1000);
  if (m.kind === 'transcription') return (r.audioUnits ?? 0) * m.audioMicrosPerUnit;
  return reportedCostMicros(m, r);
}

/** Tool call counts made safe integers at the boundary, as token counts are. */
function cleanToolCalls(calls: ToolCallCounts | undefined, requestId: string): ToolCallCounts | undefined {
  if (!calls) return undefined;
  const out: ToolCallCounts = {};
  for (const [tool, n] of Object.entries(calls) as Array<[keyof ToolCallCounts, number]>) out[tool] = cleanCount(n, `${tool} calls`, requestId);
  return out;
}

export class RequestContext {
  completed = false;
  /** Set once the request was handed to a provider or backend: from then on it counts. */
  providerStarted = false;
  model: ModelConfig | null = null;
  /** The Responses API: the id of the response this request created or read (for the request log). */
  responseId: string | null = null;
  /**
   * The `service_tier` the request asked for: an ending whose answer reported no tier (a stream cut
   * before its usage, a client gone before the answer) is billed at it, never at the standard prices
   * (docs/billing.md#prices-by-what-the-upstream-reports).
   */
  requestedTier: string | undefined = undefined;
  /** A pooled model: the deployment that served and every attempt (for the request log). */
  upstream: { deployment: string; attempts: string } | null = null;
  /**
   * The chat messages whose tokens are billed when the request ends without a provider report (an
   * abort): counted only then, not on every request.
   */
  promptMessages: unknown = undefined;
  private promptTokens: number | undefined;
  /** Prompt tokens billed when the request ends without a provider report (an abort). */
  get estimatedPromptTokens(): number {
    this.promptTokens ??= this.promptMessages === undefined ? 0 : estimateTokens({ messages: this.promptMessages });
    return this.promptTokens;
  }
  set estimatedPromptTokens(n: number) {
    this.promptTokens = n;
  }
  readonly abortFns: Array<() => void> = [];
  /** The estimated cost reserved from the node's money slice while this request runs. */
  spend: SpendReservation | undefined;
  private logDraft: LogDraft | null = null;
  private graceTimer: NodeJS.Timeout | null = null;
  /** Its work goes on after its answer (a background response): whoever follows it completes it. */
  private deferred = false;

  constructor(
    private readonly deps: ContextDeps,
    readonly requestId: string,
    readonly key: KeyRecord,
    readonly path: string,
    readonly ticket: Ticket,
    readonly minute: number,
  ) {}

  /** Ties the context to its response: the single cleanup path of reply.ts rule 8. */
  attach(reply: FinishSource): void {
    this.logDraft = reply.logDraft ?? null;
    this.logDraft?.adoptContext(this.requestId);
    if (reply.open) reply.open.context = this;
    reply.onFinish((aborted) => this.onResponseEnd(aborted));
  }

  private onResponseEnd(aborted: boolean): void {
    if (aborted) {
      // Each abort in its own try: one throwing must not skip the others or the settlement below.
      for (const fn of this.abortFns) {
        try {
          fn();
        } catch (err) {
          logBug(err);
        }
      }
    }
    if (this.completed || this.deferred) return;
    // Ended before any upstream call (refused by a later check, too large, aborted while reading the
    // body): it consumes no request, tokens, slot or money.
    if (!this.providerStarted) return this.refuse();
    // Aborted with no provider to say what the upstream did: the estimate of what was sent.
    if (aborted && this.abortFns.length === 0) {
      this.complete({ status: 499, promptTokens: this.estimatedPromptTokens, completionTokens: 0 });
      return;
    }
    // Aborted, the provider reports how it ended (at once, or after reading its upstream's usage for
    // a short grace: stream-proxy.ts). Or sent in full before the provider reported (a known-length
    // answer finished while the upstream's end is still on its way): the provider reports soon.
    // Either way, settle on our own only if it never does.
    this.graceTimer = setTimeout(() => {
      if (this.completed) return;
      logBug(new Error(`request ${this.requestId}: the provider never reported how it ended`));
      this.complete({ status: 500, promptTokens: this.estimatedPromptTokens, completionTokens: 0 });
    }, PROVIDER_REPORT_GRACE_MS);
    this.graceTimer.unref();
  }

  /**
   * The upstream goes on after the answer (a background response, endpoints/responses/background-responses.ts):
   * the request stays open (its slot, tokens and money held) until its follower completes it, and is
   * never settled by the grace timer below.
   */
  deferSettlement(): void {
    this.deferred = true;
    if (this.graceTimer) clearTimeout(this.graceTimer);
    this.graceTimer = null;
  }

  /** Refused by a check after admission (400, 401 for the model): nothing is counted. */
  refuse(): void {
    if (this.completed) return;
    this.completed = true;
    this.ticket.refund();
    this.deps.leases?.settleSpend(this.key.orgId, this.spend, 0);
    this.logDraft?.settle();
  }

  /** The request ran: tokens settle the ticket, a model call is recorded and paid for. Answers the cost billed. */
  complete(reported: CallResult): number {
    if (this.completed) return 0;
    this.completed = true;
    if (this.graceTimer) clearTimeout(this.graceTimer);
    const r: CallResult = {
      status: reported.status,
      promptTokens: cleanCount(reported.promptTokens, 'usage.prompt_tokens', this.requestId),
      completionTokens: cleanCount(reported.completionTokens, 'usage.completion_tokens', this.requestId),
      audioUnits: reported.audioUnits === undefined ? undefined : cleanCount(reported.audioUnits, 'audio units', this.requestId),
      // Parts of the counts above, priced apart; money.ts cuts each to its whole.
      cachedPromptTokens: reported.cachedPromptTokens,
      cacheWriteTokens: reported.cacheWriteTokens,
      audioPromptTokens: reported.audioPromptTokens,
      cachedAudioPromptTokens: reported.cachedAudioPromptTokens,
      audioCompletionTokens: reported.audioCompletionTokens,
      // What the upstream's answer reported besides its tokens (proto/lib/reported-prices.ts).
      serviceTier: reported.serviceTier ?? this.requestedTier,
      toolCalls: cleanToolCalls(reported.toolCalls, this.requestId),
    };
    this.ticket.settle(r.promptTokens + r.completionTokens);
    if (r.status >= 500) logRequestError({ requestId: this.requestId, keyId: this.key.keyId, path: this.path, status: r.status, model: this.model?.id }, `request ${this.requestId} ended with status ${r.status}`);
    const m = this.model;
    let cost = 0;
    if (m && this.providerStarted) {
      cost = costOf(m, r);
      this.deps.reporter.record({
        requestId: this.requestId,
        keyId: this.key.keyId,
        orgId: this.key.orgId,
        projectId: this.key.projectId,
        model: m.id,
        path: this.path,
        status: r.status,
        promptTokens: r.promptTokens,
        completionTokens: r.completionTokens,
        costMicros: cost,
        atMs: this.deps.clock.now(),
        minute: this.minute,
        leaseEpoch: this.spend?.epoch ?? 0,
      });
    }
    // Every reservation is settled, with or without a model (a tool call costs nothing but held one).
    this.deps.leases?.settleSpend(this.key.orgId, this.spend, cost);
    this.logDraft?.settle(m && this.providerStarted ? { model: m.id, promptTokens: r.promptTokens, completionTokens: r.completionTokens, costMicros: cost } : undefined, this.responseId, this.upstream);
    return cost;
  }
}
