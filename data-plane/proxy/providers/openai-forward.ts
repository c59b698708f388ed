// The Responses API of an OpenAI-compatible upstream beyond creating and reading responses:
// `POST {base_url}/responses/compact` (billed from the usage its answer reports, `usage.cost` written
// in, as a create), `POST {base_url}/responses/input_tokens` (a count: no tokens billed) and the
// Conversations API (`{base_url}/conversations…`: no tokens billed). The gateway has checked every id
// the request names; the ids an answer names (a new conversation, items listed or added, a
// compaction's output) are recorded as the project's, with the deployment holding them, before they
// reach the client. A compaction is priced at the serving deployment's prices.
import type { ForwardCall } from './responses-provider.js';
import { USAGE_GRACE_MS } from '../stream-proxy.js';
import { ItemIdsReader, ResponsesJsonReader } from '../usage/responses-usage-readers.js';
import { rewriteChatBody } from '../json-splice.js';
import { billedTokens, pricerOf } from './openai.js';
import { requestedTier } from '../../../proto/lib/reported-prices.js';
import type { Target } from './upstream-targets.js';
import type { PooledExchange } from './pooled-upstreams.js';
import type { UsagePricer } from '../usage/usage-readers.js';

/** The upstream path of a forwarded request, its query kept. */
function pathOf(t: Target, call: ForwardCall): string {
  const q = call.query ? `?${call.query}` : '';
  if (call.op === 'compact') return `${t.basePath}/responses/compact`;
  if (call.op === 'input_tokens') return `${t.basePath}/responses/input_tokens`;
  const c = call.conversation!;
  let p = `${t.basePath}/conversations`;
  if (c.id) p += `/${encodeURIComponent(c.id)}`;
  if (c.action === 'items' || c.action === 'item') p += '/items';
  if (c.itemId) p += `/${encodeURIComponent(c.itemId)}`;
  return p + q;
}

/** The body with the model as the upstream names it (a count or compaction may have named none). */
function payloadOf(t: Target, call: ForwardCall): string | null {
  const body = call.body;
  if (body === null) return null;
  if (call.op === 'conversation' || body.model === t.upstreamModel) return call.bodyText;
  if (typeof body.model === 'string') return rewriteChatBody(call.bodyText, t.upstreamModel, false) ?? JSON.stringify({ ...body, model: t.upstreamModel });
  return JSON.stringify({ ...body, model: t.upstreamModel });
}

/** The exchange of a forwarded request, for whichever deployment (or one upstream) serves it. */
export function forwardExchange(call: ForwardCall): PooledExchange {
  const conv = call.conversation;
  let compact: ResponsesJsonReader | null = null;
  // The deployment of the attempt under way and its prices: what the answer names lives there.
  let deployment = '';
  // The tier the compaction asked for, billed when its answer reports none (proto/lib/reported-prices.ts).
  const tier = requestedTier(call.body ?? {});
  let pricer: UsagePricer = pricerOf(call.model, undefined, tier);
  const recordOwned = (ids: string[]) => call.recordOwned(ids, deployment);
  const deletes = call.method === 'DELETE' && conv !== null;
  return {
    method: call.method as 'GET' | 'POST' | 'DELETE',
    reply: call.reply,
    passAllHeaders: false,
    attempt(t, billAs, d) {
      deployment = d;
      pricer = pricerOf(billAs, undefined, tier);
      const payload = payloadOf(t, call);
      return { path: pathOf(t, call), headers: payload === null ? t.authHeaders : t.jsonHeaders, body: payload };
    },
    inspect(status, contentType) {
      if (status < 200 || status >= 300 || !contentType.startsWith('application/json')) return null;
      // Ids the answer names are recorded before the chunk naming them goes on (the client can
      // never name one before it is the project's): a compaction's output, a new conversation,
      // items added, listed or read.
      if (call.op === 'compact') return (compact = new ResponsesJsonReader(ignore, pricer, recordOwned));
      if (conv?.action === 'create') return new ResponsesJsonReader((id) => recordOwned([id]));
      if (conv && (conv.action === 'items' || conv.action === 'item') && call.method !== 'DELETE') return new ItemIdsReader(conv.action === 'item' ? 'id' : 'data', recordOwned);
      return null;
    },
    // Deleted upstream: forgotten before the answer goes on, so the next request is refused here.
    onResponseHead(status) {
      if (deletes && status >= 200 && status < 300) call.forget(conv!.itemId || conv!.id);
    },
    onAbort: call.onAbort,
    usageGraceMs: call.op === 'compact' ? USAGE_GRACE_MS : 0,
    onDone(status, outcome, upstreamStatus) {
      const c = compact as ResponsesJsonReader | null;
      if (call.op !== 'compact') return call.complete({ status: outcome === 'aborted' ? 499 : status, promptTokens: 0, completionTokens: 0 });
      const billed = billedTokens(status, outcome, upstreamStatus, c?.usage ?? null, () => ({ prompt: call.inputTokens, completion: c ? c.countedOutputTokens() : 0 }));
      // The tier the compaction reports it ran on, as a create's (proto/lib/reported-prices.ts).
      call.complete(c ? { ...billed, ...c.facts() } : billed);
    },
  };
}

function ignore(): void {}
