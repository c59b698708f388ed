// The Responses API of an OpenAI-compatible upstream: `POST {base_url}/responses` forwarded unchanged
// apart from the model splice, streamed both ways through stream-proxy.ts, its usage read by the
// Responses readers of usage-readers.ts (JSON of any size and SSE, bounded; `usage.cost` written in)
// and billed as chat bills however it ended (billedTokens); the stored-response paths forwarded as
// they are (the gateway has already checked the response is the key's project's own).
import type { ModelConfig } from '../../../proto/gen/tollgate/v1/sync.js';
import type { ResponsesCall, ResponsesProvider, StoredCall } from '../../endpoints/responses.js';
import { rewriteChatBody } from '../json-splice.js';
import { estimateTokens } from '../tokens.js';
import { proxyRequest, USAGE_GRACE_MS } from '../stream-proxy.js';
import { ResponsesJsonReader, ResponsesSseReader } from '../responses-usage-readers.js';
import { billedTokens, pricerOf, UpstreamTargets, type PoolRegistry, type Target } from './openai.js';

export class OpenAIResponsesProvider implements ResponsesProvider {
  private readonly targets: UpstreamTargets;
  constructor(pools: PoolRegistry) {
    this.targets = new UpstreamTargets(pools);
  }

  private target(model: ModelConfig): Target {
    return this.targets.of(model);
  }

  create(call: ResponsesCall): void {
    const t = this.target(call.model);
    const body = call.body;
    let payload: Buffer | string = call.rawBody;
    if (body.model !== t.upstreamModel) payload = rewriteChatBody(call.bodyText, t.upstreamModel, false) ?? JSON.stringify({ ...body, model: t.upstreamModel });
    let sse: ResponsesSseReader | null = null;
    let json: ResponsesJsonReader | null = null;
    const recordOwner = call.recordOwner;
    const pricer = pricerOf(call.model);
    proxyRequest({
      pool: t.pool,
      method: 'POST',
      path: `${t.basePath}/responses`,
      headers: t.jsonHeaders,
      body: payload,
      timeoutMs: t.timeoutMs,
      reply: call.reply,
      shape: 'openai',
      passAllHeaders: false,
      inspect(status, contentType) {
        if (status < 200 || status >= 300) return null;
        if (contentType.startsWith('text/event-stream')) return (sse = new ResponsesSseReader(recordOwner, pricer));
        return (json = new ResponsesJsonReader(recordOwner, pricer));
      },
      onAbort: call.onAbort,
      // A client gone: the upstream is read on for its usage, as for chat (stream-proxy.ts).
      usageGraceMs: USAGE_GRACE_MS,
      onDone(status, outcome, upstreamStatus) {
        const s = sse as ResponsesSseReader | null;
        const j = json as ResponsesJsonReader | null;
        // The upstream's usage, else (a stream cut, a client gone, an upstream reporting none) the
        // input and the output received so far, counted: the same rules as chat (docs/billing-endings.md).
        call.complete(
          billedTokens(status, outcome, upstreamStatus, s?.usage ?? j?.usage ?? null, () => ({
            prompt: estimateTokens(body),
            completion: s ? s.countedCompletionTokens() : j ? j.countedOutputTokens() : 0,
          })),
        );
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
      shape: 'openai',
      passAllHeaders: false,
      onAbort: call.onAbort,
      onDone(status, outcome) {
        if (method === 'DELETE' && status >= 200 && status < 300) call.forget();
        call.complete({ status: outcome === 'aborted' ? 499 : status, promptTokens: 0, completionTokens: 0 });
      },
    });
  }
}
