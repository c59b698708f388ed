// The contract of a Responses API provider (the demo and the OpenAI one): what the Responses endpoint
// (endpoints/responses/responses.ts) hands a provider for a create, a stored response's request, and a
// background follower's read. It lives with the providers, so proxy/ never imports the endpoints.
import type { ReportedFacts } from '../../../proto/lib/reported-prices.js';
import type { ModelConfig } from '../../../proto/gen/tollgate/v1/sync.js';
import type { TokenCounts } from '../../../proto/lib/money.js';
import type { ConversationPath, StoredAction } from '../../routing/responses-paths.js';
import type { ResponseSink } from '../response-sink.js';
import type { CallResult, ModelCall } from './provider.js';

/** A create: a model call that also names the response's id as soon as the upstream does. */
export interface ResponsesCall extends ModelCall {
  /**
   * A pooled model: the deployment it must go to, where what it names lives (endpoints/responses/affinity.ts;
   * '' the first); undefined: any.
   */
  deployment?: string;
  /**
   * Records that the key's project owns the response `id`, held by `deployment` (the id of the pooled
   * model's deployment that answered; '' for a model's one upstream); a provider calls it before the
   * bytes naming the id reach the client, so the client can never ask for it before it is recorded.
   */
  recordOwner(id: string, deployment: string): void;
  /**
   * A background response (`background: true`) that the answer left running upstream, its usage not
   * in it: the node follows it to its end (on `deployment`) and bills it then. Called instead of
   * `complete`, with the status `complete` would have had.
   */
  follow(id: string, status: number, deployment: string): void;
  /** The ids of the answer's output items: the key's project owns them (an `item_reference` may name them). */
  recordItems(ids: string[], deployment: string): void;
}

/**
 * A request of the Responses API beyond creating and reading responses, its ids already checked to
 * be the key's project's own: `POST /v1/responses/compact`, `POST /v1/responses/input_tokens`, and the
 * Conversations API.
 */
export interface ForwardCall {
  requestId: string;
  reply: ResponseSink;
  /** The model it is for (named, or the model of what it names): its provider serves it. */
  model: ModelConfig;
  op: 'compact' | 'input_tokens' | 'conversation';
  /** A pooled model: the deployment it must go to ('' the first); undefined: any (a new conversation, a count naming nothing stored). */
  deployment?: string;
  /** For `conversation`: the path's conversation and item. */
  conversation: ConversationPath | null;
  method: string;
  /** The query string as sent (pagination of items), without `?`. */
  query: string;
  /** The JSON body as parsed (null: none), and as received. */
  body: Record<string, unknown> | null;
  bodyText: string;
  /** The input estimate (what a compaction cut short bills). */
  inputTokens: number;
  complete(result: CallResult): void;
  onAbort(fn: () => void): void;
  fail(err: unknown): void;
  /** Ids the answer names that the key's project now owns (a new conversation, items listed or added), held by `deployment`. */
  recordOwned(ids: string[], deployment: string): void;
  /** The upstream deleted this conversation or item: its owner record goes too. */
  forget(id: string): void;
  /** A pooled model: the deployment that served, the model priced as it bills, every attempt ("id:outcome"). */
  served?(billAs: ModelConfig, deployment: string, attempts: string): void;
}

/** What the upstream said of a response read off the request path (a follower's retrieve or cancel). */
export interface UpstreamRead {
  /** The answer's HTTP status; 0 when none came (unreachable, timed out). */
  httpStatus: number;
  /** The response's `status` (`queued`, `in_progress`, `completed`, …); null when not read. */
  status: string | null;
  usage: TokenCounts | null;
  /** Output tokens of its `output`, counted (for a terminal response without usage). */
  outputTokens: number;
  /** What it reports besides its tokens: the tier it ran on, its built-in tool calls. */
  facts?: ReportedFacts;
  /** The ids of its `output` items (the project owns them once it ended). */
  itemIds?: string[];
}

/** A request on a stored response, already checked to be the key's own. */
export interface StoredCall {
  requestId: string;
  reply: ResponseSink;
  /** The model the response was created with (its provider serves the request). */
  model: ModelConfig;
  /** A pooled model: the deployment that holds the response ('' the first). */
  deployment?: string;
  id: string;
  action: StoredAction;
  method: string;
  /** The query string as sent (pagination of input_items), without `?`. */
  query: string;
  complete(result: CallResult): void;
  onAbort(fn: () => void): void;
  fail(err: unknown): void;
  /** The response was deleted upstream: its owner record goes too. */
  forget(): void;
  /** Ids of items its answer lists (`input_items`): the key's project owns them. */
  recordOwned(ids: string[]): void;
}

export interface ResponsesProvider {
  create(call: ResponsesCall): void;
  stored(call: StoredCall): void;
  /** Compact, count input tokens, or a request of the Conversations API. */
  forward(call: ForwardCall): void;
  /** `GET /responses/{id}` for a follower, off the request path (on `deployment` of a pooled model); `done` is called exactly once. */
  retrieve(model: ModelConfig, id: string, done: (r: UpstreamRead) => void, deployment?: string): void;
  /** `POST /responses/{id}/cancel` for a follower whose key may no longer run it; `done` once. */
  cancel(model: ModelConfig, id: string, done: (r: UpstreamRead) => void, deployment?: string): void;
}
