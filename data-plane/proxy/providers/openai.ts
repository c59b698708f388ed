// Any OpenAI-compatible HTTP API: base URL and upstream key from the model's config, one undici Pool
// (keep-alive) per origin, requests and responses streamed through stream-proxy.ts. Usage comes from the
// upstream's `usage`, read by usage-readers.ts as the answer goes through; when it gives none, the
// gateway counts tokens with its own tokenizer.
import type { ModelConfig } from '../../../proto/gen/tollgate/v1/sync.js';
import { usageCostMicros } from '../../../proto/lib/money.js';
import { reportedCostMicros, requestedTier, type ReportedFacts, type ToolCallCounts } from '../../../proto/lib/reported-prices.js';
import { rewriteChatBody, setTopLevelStrings } from '../json-splice.js';
import { SafetyFields } from '../safety-fields.js';
import { USAGE_GRACE_MS } from '../stream-proxy.js';
import { estimateOutputTokens, estimateTokens } from '../tokens.js';
import { SseUsageReader } from '../usage/sse-usage-reader.js';
import { JsonUsageReader, type TokenUsage, type UsagePricer } from '../usage/usage-readers.js';
import { AudioDurationProbe } from '../audio-duration.js';
import { boundaryOf } from '../multipart-model.js';
import type { ModelCall, Provider, TranscriptionCall } from './provider.js';
import { UpstreamTargets, type PoolRegistry } from './upstream-targets.js';
import { PooledUpstreams, sendToOne, type PooledExchange } from './pooled-upstreams.js';
import { systemClock, type Clock } from '../../limits/clock.js';

/** Top-level members the readers keep besides `usage`, per endpoint. */
/** A chat answer's: its choices, and the tier it ran on (after its usage, as OpenAI writes it). */
const CHAT_MEMBERS = Object.freeze(['choices', 'service_tier']);
const NO_MEMBERS = Object.freeze([] as string[]);
const DURATION = Object.freeze(['duration']);

/**
 * What an exchange that reached its upstream bills, however it ended (docs/billing-endings.md): the
 * upstream's usage when it reported it (in time, for a client gone), else the estimate of everything
 * sent and everything received (tokens.ts). An upstream that answered an error status, or never
 * answered, did no billable work.
 */
export function billedTokens(
  status: number,
  outcome: 'ok' | 'error' | 'aborted',
  upstreamStatus: number,
  usage: TokenUsage | null,
  estimate: () => { prompt: number; completion: number },
): TokenUsage & { status: number } {
  const st = outcome === 'aborted' ? 499 : status;
  const served = upstreamStatus >= 200 && upstreamStatus < 300;
  // An error status, or (not a client gone) no answer at all: nothing was served.
  if (upstreamStatus !== 0 && !served) return { status: st, promptTokens: 0, completionTokens: 0 };
  if (upstreamStatus === 0 && outcome !== 'aborted') return { status: st, promptTokens: 0, completionTokens: 0 };
  if (usage) return { ...usage, status: st };
  const e = estimate();
  return { status: st, promptTokens: e.prompt, completionTokens: e.completion };
}

/** Completion tokens of a JSON chat answer without usage: its choices' text, or (too large to keep) its bytes / 4. */
function choicesTokens(json: JsonUsageReader): number {
  const choices = json.member('choices');
  if (!Array.isArray(choices)) return Math.ceil((json.memberBytes.get('choices') ?? 0) / 4);
  return estimateOutputTokens({ choices });
}

/**
 * Prices a usage at the model's prices by what the answer reported (tier, tool calls; proto/lib/reported-prices.ts):
 * what the answer shows as `usage.cost` and the ledger records. `requested`: tool calls the request
 * itself makes (a chat search), added to those the answer reports; `tier`: the tier the request asked
 * for, the price of an answer that reports none (as RequestContext.complete bills it).
 */
export function pricerOf(model: ModelConfig, requested?: ToolCallCounts, tier?: string): UsagePricer {
  return (usage, facts) => reportedCostMicros(model, { ...usage, ...withRequested(facts, requested, tier) });
}

/**
 * A pricer at the prices of whichever deployment answers (`priced.model`, set by each attempt). Made by
 * a function, not a named arrow in the caller: under tsx (esbuild keepNames) a named arrow made per
 * request costs a defineProperty of its name.
 */
function deploymentPricer(priced: { model: ModelConfig }, requested: ToolCallCounts | undefined, tier: string | undefined): UsagePricer {
  return (usage, facts) => reportedCostMicros(priced.model, { ...usage, ...withRequested(facts, requested, tier) });
}

function tokenPricer(priced: { model: ModelConfig }): UsagePricer {
  return (usage) => usageCostMicros(usage, priced.model);
}

/** A chat body re-serialised (when it cannot be rewritten in place): the model, the safety fields, the usage asked for. */
function chatCopy(body: Record<string, unknown>, model: string, safety: Record<string, string> | null, addUsageTo: Record<string, unknown> | null | undefined): Record<string, unknown> {
  const copy: Record<string, unknown> = { ...body, model, ...safety };
  if (addUsageTo !== null) copy.stream_options = { ...(addUsageTo ?? {}), include_usage: true };
  return copy;
}

/** The answer's facts with the calls the request itself makes added, and (none reported) the tier it asked for. */
export function withRequested(facts: ReportedFacts, requested: ToolCallCounts | undefined, tier?: string): ReportedFacts {
  if (tier !== undefined && facts.serviceTier === undefined) facts = { ...facts, serviceTier: tier };
  if (!requested) return facts;
  const calls: ToolCallCounts = { ...facts.toolCalls };
  for (const [tool, n] of Object.entries(requested) as Array<[keyof ToolCallCounts, number]>) calls[tool] = (calls[tool] ?? 0) + n;
  return { ...facts, toolCalls: calls };
}

/** A chat request with `web_search_options` (a search model) makes one web search. */
function chatToolCalls(body: Record<string, unknown>): ToolCallCounts | undefined {
  return body.web_search_options !== undefined && body.web_search_options !== null ? { web_search: 1 } : undefined;
}

export class OpenAIProvider implements Provider {
  private readonly targets: UpstreamTargets;
  private readonly pooled: PooledUpstreams;
  constructor(
    pools: PoolRegistry,
    clock: Clock = systemClock,
    private readonly safety: SafetyFields | null = null,
    /** The node's pooled models, shared with the Responses provider (one health and one count per deployment). */
    pooled?: PooledUpstreams,
  ) {
    this.targets = new UpstreamTargets(pools);
    this.pooled = pooled ?? new PooledUpstreams(this.targets, clock);
  }

  /** One exchange: to the model's one upstream, or (a pooled model) to its deployments in turn. */
  private send(call: ModelCall | TranscriptionCall, x: PooledExchange, tokens: number, once = false): void {
    const m = call.model;
    if (m.deployments.length > 0) return this.pooled.send(m, call, x, tokens, once);
    sendToOne(this.targets, m, x);
  }

  chat(call: ModelCall): void {
    const body = call.body;
    const stream = body.stream === true;
    const so = body.stream_options as Record<string, unknown> | undefined;
    const clientWantsUsage = !!so && so.include_usage === true;
    const addUsage = stream && !clientWantsUsage;
    let sse: SseUsageReader | null = null;
    let json: JsonUsageReader | null = null;
    // Whose request it is, for the upstream's safety systems (safety-fields.ts).
    const safety = this.safety?.fieldsFor(call.model, call.caller, body) ?? null;
    const requested = chatToolCalls(body);
    // The prices of the deployment answering (a pooled model's may override the model's), by what the answer reported.
    const priced = { model: call.model };
    const pricer = deploymentPricer(priced, requested, requestedTier(body));
    this.send(call, {
      method: 'POST',
      attempt(t, billAs) {
        priced.model = billAs;
        let payload: Buffer | string = call.rawBody;
        const rename = body.model !== t.upstreamModel;
        if (rename || addUsage || safety) {
          // Rewritten in place when it can be (the common case); re-serialised otherwise.
          const spliced = so === undefined || !addUsage ? rewriteChatBody(call.bodyText, rename ? t.upstreamModel : null, addUsage) : null;
          const spliceSafety = spliced !== null && safety ? setTopLevelStrings(spliced, safety, (k) => k in body) : spliced;
          payload = spliceSafety ?? JSON.stringify(chatCopy(body, t.upstreamModel, safety, addUsage ? so : null));
        }
        return { path: `${t.basePath}/chat/completions`, headers: t.jsonHeaders, body: payload };
      },
      reply: call.reply,
      passAllHeaders: false,
      upstreamErrors: true,
      // Methods, not arrow properties: under tsx (esbuild keepNames) a named arrow made per request
      // costs a defineProperty of its name.
      inspect(status, contentType) {
        if (status < 200 || status >= 300) return null;
        if (contentType.startsWith('text/event-stream')) return (sse = new SseUsageReader(!clientWantsUsage, pricer));
        return (json = new JsonUsageReader(CHAT_MEMBERS, pricer));
      },
      onAbort: call.onAbort,
      // A client gone: the upstream is read on for its usage (stream-proxy.ts).
      usageGraceMs: USAGE_GRACE_MS,
      onDone(status, outcome, upstreamStatus) {
        const s = sse as SseUsageReader | null;
        const j = json as JsonUsageReader | null;
        const usage = s?.usage ?? j?.usage ?? null;
        const billed = billedTokens(status, outcome, upstreamStatus, usage, () => ({
          prompt: estimateTokens(body),
          completion: s ? s.countedCompletionTokens() : j ? choicesTokens(j) : 0,
        }));
        // What the answer reported (its tier); a search the request made, once the upstream served it.
        const facts = s ? s.facts() : j ? j.facts() : {};
        call.complete({ ...billed, ...(s || j ? withRequested(facts, requested) : {}) });
      },
    }, call.inputTokens);
  }

  embeddings(call: ModelCall): void {
    const body = call.body;
    let json: JsonUsageReader | null = null;
    const priced = { model: call.model };
    const pricer = tokenPricer(priced);
    this.send(call, {
      method: 'POST',
      attempt(t, billAs) {
        priced.model = billAs;
        const payload = body.model === t.upstreamModel ? call.rawBody : JSON.stringify({ ...body, model: t.upstreamModel });
        return { path: `${t.basePath}/embeddings`, headers: t.jsonHeaders, body: payload };
      },
      reply: call.reply,
      passAllHeaders: false,
      upstreamErrors: true,
      inspect(status) {
        return status >= 200 && status < 300 ? (json = new JsonUsageReader(NO_MEMBERS, pricer)) : null;
      },
      onAbort: call.onAbort,
      usageGraceMs: USAGE_GRACE_MS,
      onDone(status, outcome, upstreamStatus) {
        const usage = (json as JsonUsageReader | null)?.usage ?? null;
        const r = billedTokens(status, outcome, upstreamStatus, usage, () => ({ prompt: estimateTokens(body), completion: 0 }));
        call.complete({ ...r, completionTokens: 0 });
      },
    }, call.inputTokens);
  }

  speech(call: ModelCall): void {
    const body = call.body;
    const chars = typeof body.input === 'string' ? body.input.length : 0;
    this.send(call, {
      method: 'POST',
      attempt(t) {
        const payload = body.model === t.upstreamModel ? call.rawBody : JSON.stringify({ ...body, model: t.upstreamModel });
        return { path: `${t.basePath}/audio/speech`, headers: t.jsonHeaders, body: payload };
      },
      reply: call.reply,
      passAllHeaders: false,
      upstreamErrors: true,
      onAbort: call.onAbort,
      onDone(status, outcome) {
        // An aborted synthesis still ran upstream: its input characters are billed.
        const ok = outcome === 'aborted' || (status >= 200 && status < 300);
        call.complete({ status: outcome === 'aborted' ? 499 : status, promptTokens: 0, completionTokens: 0, audioUnits: ok ? chars : 0 });
      },
    }, 0);
  }

  /** A pooled model's upload goes to one deployment: its body streams once, so it is never retried. */
  transcription(call: TranscriptionCall): void {
    const upload = call.upload;
    const rest = upload.rest;
    // What the upload is billed when the upstream reports no duration: read from the file's container
    // as its bytes go by (audio-duration.ts).
    const probe = new AudioDurationProbe(boundaryOf(call.contentType));
    let json: JsonUsageReader | null = null;
    this.send(call, {
      method: 'POST',
      attempt(t) {
        // The model field's value (in memory) is replaced by the upstream's model name; everything else
        // streams unchanged: the spilled bytes back from disk, then the head, then the rest of the body.
        const head = Buffer.concat([
          upload.head.subarray(0, upload.modelValueStart),
          Buffer.from(t.upstreamModel),
          upload.head.subarray(upload.modelValueEnd),
        ]);
        // An async iterable, which undici pulls one chunk at a time: what the spill's reused read buffers
        // need (upload-spill.ts, `chunks`). A Readable in between would read ahead.
        const body = (async function* () {
          for await (const chunk of upload.spill.chunks()) {
            probe.feed(chunk);
            yield chunk;
          }
          probe.feed(head);
          yield head;
          for await (const chunk of rest) {
            probe.feed(chunk as Buffer);
            yield chunk as Buffer;
          }
          probe.end();
        })();
        return { path: `${t.basePath}/audio/transcriptions`, headers: ['content-type', call.contentType, ...t.authHeaders], body };
      },
      reply: call.reply,
      passAllHeaders: false,
      upstreamErrors: true,
      inspect(status, contentType) {
        return status >= 200 && status < 300 && contentType.includes('json') ? (json = new JsonUsageReader(DURATION)) : null;
      },
      onAbort: call.onAbort,
      onDone(status, outcome, upstreamStatus) {
        const st = outcome === 'aborted' ? 499 : status;
        // An error status, or no answer and the client still there: nothing was transcribed.
        if ((upstreamStatus !== 0 && (upstreamStatus < 200 || upstreamStatus >= 300)) || (upstreamStatus === 0 && outcome !== 'aborted')) {
          return call.complete({ status: st, promptTokens: 0, completionTokens: 0 });
        }
        // The upstream's duration (verbose_json); else the file's, once its parser is done with it.
        const duration = outcome === 'ok' ? (json as JsonUsageReader | null)?.member('duration') : undefined;
        if (typeof duration === 'number' && Number.isFinite(duration) && duration > 0) {
          return call.complete({ status: st, promptTokens: 0, completionTokens: 0, audioUnits: Math.ceil(duration) });
        }
        // However the upload ended, the parser has all it will get.
        probe.end();
        probe.whenSettled((seconds) => call.complete({ status: st, promptTokens: 0, completionTokens: 0, audioUnits: seconds }));
      },
    }, 0, true);
  }
}
