// The Responses API of an OpenAI-compatible upstream: `POST {base_url}/responses` forwarded unchanged
// apart from the model splice, streamed both ways through stream-proxy.ts, its usage read by the
// Responses readers of usage-readers.ts (JSON of any size and SSE, bounded; `usage.cost` written in)
// and billed as chat bills however it ended (billedTokens); the stored-response paths forwarded as
// they are (the gateway has already checked the response is the key's project's own). A background
// response the answer left running is handed to its follower (endpoints/responses/background-responses.ts),
// which reads it here (`retrieve`, `cancel`: off the request path, through the same readers).
import type { ModelConfig } from '../../../proto/gen/tollgate/v1/sync.js';
import type { ForwardCall, ResponsesCall, ResponsesProvider, StoredCall, UpstreamRead } from './responses-provider.js';
import { forwardOpenAI } from './openai-forward.js';
import { rewriteChatBody } from '../json-splice.js';
import { SafetyFields, withSafetyFields } from '../safety-fields.js';
import { proxyRequest, USAGE_GRACE_MS } from '../stream-proxy.js';
import { ItemIdsReader, ResponsesJsonReader, ResponsesSseReader } from '../usage/responses-usage-readers.js';
import { billedTokens, pricerOf } from './openai.js';
import { requestedTier } from '../../../proto/lib/reported-prices.js';
import { UpstreamTargets, type PoolRegistry, type Target } from './upstream-targets.js';
import { pricedAs } from './pooled-upstreams.js';

export class OpenAIResponsesProvider implements ResponsesProvider {
  private readonly targets: UpstreamTargets;
  constructor(
    pools: PoolRegistry,
    private readonly safety: SafetyFields | null = null,
  ) {
    this.targets = new UpstreamTargets(pools);
  }

  private target(model: ModelConfig): Target {
    return this.targets.of(model);
  }

  create(call: ResponsesCall): void {
    const t = this.target(call.model);
    const body = call.body;
    let payload: Buffer | string = call.rawBody;
    // Whose request it is, for the upstream's safety systems (safety-fields.ts).
    const safety = this.safety?.fieldsFor(call.model, call.caller, body) ?? null;
    if (body.model !== t.upstreamModel || safety) {
      const whole = { ...body, model: t.upstreamModel, ...safety };
      const spliced = body.model !== t.upstreamModel ? rewriteChatBody(call.bodyText, t.upstreamModel, false) : call.bodyText;
      payload = spliced === null ? JSON.stringify(whole) : safety ? withSafetyFields(spliced, body, safety, whole) : spliced;
    }
    let sse: ResponsesSseReader | null = null;
    let json: ResponsesJsonReader | null = null;
    const recordOwner = call.recordOwner;
    const recordItems = call.recordItems;
    // A pooled model's responses live with its first deployment (the model's own base_url is that
    // one's) until a stored response's deployment is recorded with its owner: billed at its prices.
    const first = call.model.deployments[0];
    const billAs = first ? pricedAs(call.model, first) : call.model;
    const pricer = pricerOf(billAs, undefined, requestedTier(body));
    const background = body.background === true;
    proxyRequest({
      pool: t.pool,
      method: 'POST',
      path: `${t.basePath}/responses`,
      headers: t.jsonHeaders,
      body: payload,
      timeoutMs: t.timeoutMs,
      reply: call.reply,
      passAllHeaders: false,
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
        if (first) call.served?.(billAs, first.id, `${first.id}:${upstreamStatus || 'unreachable'}`);
        // Background: the answer (`queued`, or a stream that ended before its final event) left the
        // response running upstream, which bills it whoever reads it: followed to its end, billed then.
        if (background && usage === null && id !== null && upstreamStatus >= 200 && upstreamStatus < 300) return call.follow(id, outcome === 'aborted' ? 499 : status);
        // The upstream's usage, else (a stream cut, a client gone, an upstream reporting none) the
        // input and the output received so far, counted: the same rules as chat (docs/billing-endings.md).
        const billed = billedTokens(status, outcome, upstreamStatus, usage, () => ({
          prompt: call.inputTokens,
          completion: s ? s.countedCompletionTokens() : j ? j.countedOutputTokens() : 0,
        }));
        // What the answer reported besides its tokens: the tier it ran on, the built-in tools it called.
        call.complete({ ...billed, ...(s ? s.facts() : j ? j.facts() : {}) });
      },
    });
  }

  stored(call: StoredCall): void {
    const t = this.target(call.model);
    const suffix = call.action === 'response' ? '' : `/${call.action}`;
    const path = `${t.basePath}/responses/${encodeURIComponent(call.id)}${suffix}${call.query ? `?${call.query}` : ''}`;
    const method = call.method as 'GET' | 'DELETE' | 'POST';
    proxyRequest({
      pool: t.pool,
      method,
      path,
      headers: t.authHeaders,
      body: null,
      timeoutMs: t.timeoutMs,
      reply: call.reply,
      passAllHeaders: false,
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
    });
  }

  forward(call: ForwardCall): void {
    const first = call.model.deployments[0];
    if (!first) return forwardOpenAI(this.target(call.model), call);
    // A pooled model's, like its creates: sent to its first deployment and billed at that one's prices.
    const billAs = pricedAs(call.model, first);
    forwardOpenAI(this.target(call.model), {
      ...call,
      model: billAs,
      complete(r) {
        call.served?.(billAs, first.id, `${first.id}:${r.status}`);
        call.complete(r);
      },
    });
  }

  retrieve(model: ModelConfig, id: string, done: (r: UpstreamRead) => void): void {
    this.read(model, 'GET', id, '', done);
  }

  cancel(model: ModelConfig, id: string, done: (r: UpstreamRead) => void): void {
    this.read(model, 'POST', id, '/cancel', done);
  }

  /** One request about a response, its answer read by the JSON reader (any size, bounded); `done` once. */
  private read(model: ModelConfig, method: 'GET' | 'POST', id: string, suffix: string, done: (r: UpstreamRead) => void): void {
    const t = this.target(model);
    const reader = new ResponsesJsonReader(ignoreId);
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
        finish({ httpStatus, status: reader.status(), usage: reader.usage, outputTokens: reader.countedOutputTokens(), facts: reader.facts() });
      })
      .catch(() => finish({ httpStatus: 0, status: null, usage: null, outputTokens: 0 }));
  }
}

function ignoreId(): void {}
