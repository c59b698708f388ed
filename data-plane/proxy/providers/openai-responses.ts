// The Responses API of an OpenAI-compatible upstream: `POST {base_url}/responses` forwarded unchanged
// apart from the model splice, streamed both ways through stream-proxy.ts, its usage read by the
// Responses readers of usage-readers.ts (JSON of any size and SSE, bounded; `usage.cost` written in)
// and billed as chat bills however it ended (billedTokens); the stored-response paths forwarded as
// they are (the gateway has already checked the response is the key's project's own). A background
// response the answer left running is handed to its follower (endpoints/responses/background-responses.ts),
// which reads it here (`retrieve`, `cancel`: off the request path, through the same readers).
// A pooled model's create goes to a deployment chosen with failover (pooled-upstreams.ts), and what it
// creates is recorded with that deployment; a request naming a stored object goes to its deployment
// only (affinity, endpoints/responses/affinity.ts).
import type { ModelConfig } from '../../../proto/gen/tollgate/v1/sync.js';
import type { ForwardCall, ResponsesCall, ResponsesProvider, StoredCall, UpstreamRead } from './responses-provider.js';
import { forwardExchange } from './openai-forward.js';
import { rewriteChatBody } from '../json-splice.js';
import { SafetyFields, withSafetyFields } from '../safety-fields.js';
import { USAGE_GRACE_MS } from '../stream-proxy.js';
import { ItemIdsReader, ResponsesJsonReader, ResponsesSseReader } from '../usage/responses-usage-readers.js';
import type { UsagePricer } from '../usage/usage-readers.js';
import { billedTokens, pricerOf } from './openai.js';
import { requestedTier } from '../../../proto/lib/reported-prices.js';
import { UpstreamTargets, type PoolRegistry, type Target } from './upstream-targets.js';
import { PooledUpstreams, sendToOne, storedObjectUnavailable, type PoolCall, type PooledExchange } from './pooled-upstreams.js';
import { systemClock } from '../../limits/clock.js';

export class OpenAIResponsesProvider implements ResponsesProvider {
  private readonly targets: UpstreamTargets;
  private readonly pooled: PooledUpstreams;
  constructor(
    pools: PoolRegistry,
    private readonly safety: SafetyFields | null = null,
    /** The node's pooled models (shared with the model provider: one health and one count per deployment). */
    pooled?: PooledUpstreams,
  ) {
    this.targets = new UpstreamTargets(pools);
    this.pooled = pooled ?? new PooledUpstreams(this.targets, systemClock);
  }

  /**
   * One exchange: to the model's one upstream, or (a pooled model) to a deployment chosen with
   * failover, or to the one `pin` names when what the request names lives there (affinity).
   */
  private send(model: ModelConfig, call: PoolCall, x: PooledExchange, tokens: number, pin: string | undefined): void {
    if (model.deployments.length === 0) return sendToOne(this.targets, model, x);
    const at = pin === undefined ? -1 : pin === '' ? 0 : model.deployments.findIndex((d) => d.id === pin);
    // Its deployment is gone from the config: what it names is out of reach.
    if (at < 0 && pin !== undefined) return call.fail(storedObjectUnavailable(model));
    this.pooled.send(model, call, x, tokens, false, at);
  }

  /** A deployment's target for a read off the request path ('' or unknown: the first). */
  private targetAt(model: ModelConfig, deployment: string | undefined): Target {
    if (model.deployments.length === 0) return this.targets.of(model);
    const d = model.deployments.find((x) => x.id === deployment) ?? model.deployments[0];
    return this.targets.ofDeployment(model, d);
  }

  create(call: ResponsesCall): void {
    const body = call.body;
    // Whose request it is, for the upstream's safety systems (safety-fields.ts).
    const safety = this.safety?.fieldsFor(call.model, call.caller, body) ?? null;
    const payloadFor = (t: Target): Buffer | string => {
      if (body.model === t.upstreamModel && !safety) return call.rawBody;
      const whole = { ...body, model: t.upstreamModel, ...safety };
      const spliced = body.model !== t.upstreamModel ? rewriteChatBody(call.bodyText, t.upstreamModel, false) : call.bodyText;
      return spliced === null ? JSON.stringify(whole) : safety ? withSafetyFields(spliced, body, safety, whole) : spliced;
    };
    let sse: ResponsesSseReader | null = null;
    let json: ResponsesJsonReader | null = null;
    // The deployment of the attempt under way, and its prices: what it creates lives there. The tier
    // the request asked for is billed when its answer reports none (proto/lib/reported-prices.ts).
    let deployment = '';
    const tier = requestedTier(body);
    let pricer: UsagePricer = pricerOf(call.model, undefined, tier);
    const recordOwner = (id: string) => call.recordOwner(id, deployment);
    const recordItems = (ids: string[]) => call.recordItems(ids, deployment);
    const background = body.background === true;
    this.send(
      call.model,
      call,
      {
        method: 'POST',
        reply: call.reply,
        passAllHeaders: false,
        attempt(t, billAs, d) {
          deployment = d;
          pricer = pricerOf(billAs, undefined, tier);
          return { path: `${t.basePath}/responses`, headers: t.jsonHeaders, body: payloadFor(t) };
        },
        inspect(status, contentType) {
          if (status < 200 || status >= 300) return null;
          if (contentType.startsWith('text/event-stream')) return (sse = new ResponsesSseReader(recordOwner, pricer, recordItems));
          return (json = new ResponsesJsonReader(recordOwner, pricer, recordItems));
        },
        onAbort: call.onAbort,
        // A client gone: the upstream is read on for its usage, as for chat (stream-proxy.ts).
        usageGraceMs: USAGE_GRACE_MS,
        onDone(status, outcome, upstreamStatus) {
          const s = sse as ResponsesSseReader | null;
          const j = json as ResponsesJsonReader | null;
          const usage = s?.usage ?? j?.usage ?? null;
          const id = s?.id ?? j?.id ?? null;
          // Background: the answer (`queued`, or a stream that ended before its final event) left the
          // response running upstream, which bills it whoever reads it: followed to its end, billed then.
          if (background && usage === null && id !== null && upstreamStatus >= 200 && upstreamStatus < 300) return call.follow(id, outcome === 'aborted' ? 499 : status, deployment);
          // The upstream's usage, else (a stream cut, a client gone, an upstream reporting none) the
          // input and the output received so far, counted: the same rules as chat (docs/billing-endings.md).
          const billed = billedTokens(status, outcome, upstreamStatus, usage, () => ({
            prompt: call.inputTokens,
            completion: s ? s.countedCompletionTokens() : j ? j.countedOutputTokens() : 0,
          }));
          // What the answer reported besides its tokens: the tier it ran on, the built-in tools it called.
          call.complete({ ...billed, ...(s ? s.facts() : j ? j.facts() : {}) });
        },
      },
      call.inputTokens,
      call.deployment,
    );
  }

  stored(call: StoredCall): void {
    const suffix = call.action === 'response' ? '' : `/${call.action}`;
    const method = call.method as 'GET' | 'DELETE' | 'POST';
    this.send(
      call.model,
      call,
      {
        method,
        reply: call.reply,
        passAllHeaders: false,
        attempt: (t) => ({ path: `${t.basePath}/responses/${encodeURIComponent(call.id)}${suffix}${call.query ? `?${call.query}` : ''}`, headers: t.authHeaders, body: null }),
        // A response's input items, listed: recorded as the project's before the answer naming them goes on.
        inspect(status, contentType) {
          if (call.action !== 'input_items' || status < 200 || status >= 300 || !contentType.startsWith('application/json')) return null;
          return new ItemIdsReader('data', (ids) => call.recordOwned(ids));
        },
        // Deleted upstream: forgotten before the answer goes on, so a read right after is refused here.
        onResponseHead(status) {
          if (method === 'DELETE' && status >= 200 && status < 300) call.forget();
        },
        onAbort: call.onAbort,
        onDone(status, outcome) {
          call.complete({ status: outcome === 'aborted' ? 499 : status, promptTokens: 0, completionTokens: 0 });
        },
      },
      0,
      call.deployment ?? '',
    );
  }

  forward(call: ForwardCall): void {
    this.send(call.model, call, forwardExchange(call), call.inputTokens, call.deployment);
  }

  retrieve(model: ModelConfig, id: string, done: (r: UpstreamRead) => void, deployment?: string): void {
    this.read(this.targetAt(model, deployment), 'GET', id, '', done);
  }

  cancel(model: ModelConfig, id: string, done: (r: UpstreamRead) => void, deployment?: string): void {
    this.read(this.targetAt(model, deployment), 'POST', id, '/cancel', done);
  }

  /** One request about a response, its answer read by the JSON reader (any size, bounded); `done` once. */
  private read(t: Target, method: 'GET' | 'POST', id: string, suffix: string, done: (r: UpstreamRead) => void): void {
    let itemIds: string[] | undefined;
    const reader = new ResponsesJsonReader(ignoreId, null, (ids) => (itemIds = ids));
    let httpStatus = 0;
    let called = false;
    const finish = (r: UpstreamRead) => {
      if (called) return;
      called = true;
      done(r);
    };
    t.pool
      .request({ path: `${t.basePath}/responses/${encodeURIComponent(id)}${suffix}`, method, headers: t.authHeaders, headersTimeout: t.timeoutMs, bodyTimeout: t.timeoutMs })
      .then(async (res) => {
        httpStatus = res.statusCode;
        if (httpStatus < 200 || httpStatus >= 300) {
          await res.body.dump();
          return finish({ httpStatus, status: null, usage: null, outputTokens: 0 });
        }
        for await (const chunk of res.body) reader.transform(chunk as Buffer);
        reader.flush();
        finish({ httpStatus, status: reader.status(), usage: reader.usage, outputTokens: reader.countedOutputTokens(), facts: reader.facts(), itemIds });
      })
      .catch(() => finish({ httpStatus: 0, status: null, usage: null, outputTokens: 0 }));
  }
}

function ignoreId(): void {}
