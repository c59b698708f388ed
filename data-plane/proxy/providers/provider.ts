// What a model provider gets for one request, and what it reports back. The HTTP layer has already
// authenticated, admitted, validated and scope-checked the request; the provider only answers it.
import type { ModelConfig } from '../../../proto/gen/tollgate/v1/sync.js';
import type { TokenCounts } from '../../../proto/lib/money.js';
import type { ReportedFacts } from '../../../proto/lib/reported-prices.js';
import type { SafetyIds } from '../../../proto/lib/safety-identifier.js';
import type { ResponseSink } from '../response-sink.js';
import type { ModelField } from '../multipart-model.js';

/**
 * How a request ended, for usage and cost. Tokens for chat/embeddings; units for audio. The token
 * details are the parts of the tokens the upstream prices apart (proto/lib/money.ts, TokenCounts).
 */
export interface CallResult extends TokenCounts, ReportedFacts {
  status: number;
  promptTokens: number;
  completionTokens: number;
  /** Audio: seconds of input audio (transcription) or characters of input text (speech). */
  audioUnits?: number;
}

export interface ModelCall {
  /** Unique per request; used in response ids. */
  requestId: string;
  reply: ResponseSink;
  model: ModelConfig;
  /** Parsed JSON body (chat, embeddings, speech). */
  body: Record<string, unknown>;
  rawBody: Buffer;
  /** `rawBody` decoded as UTF-8 (the text that was parsed): rewrites start from it, not from a second decoding. */
  bodyText: string;
  /**
   * The input tokens the request is billed when it ends without the upstream's usage: the estimate
   * its admission took (a Responses chain's context included, as far as the node knows it).
   */
  inputTokens: number;
  /** Whose request it is: what its `safety_identifier` is made from (safety-fields.ts). */
  caller?: SafetyIds;
  /** Records usage and settles the key's ticket; idempotent (first call wins). */
  complete(result: CallResult): void;
  /** Registers what to do when the client goes away before the response ended. */
  onAbort(fn: () => void): void;
  /**
   * Ends the request with an error: rendered in the route's shape if nothing was sent yet (a 413 also
   * closes the connection), else the stream is ended or closed. Completes with the error's status.
   */
  fail(err: unknown): void;
  /** A pooled model (issue 36): the deployment that served, the model priced as it bills, every attempt ("id:outcome" …). */
  served?(billAs: ModelConfig, deployment: string, attempts: string): void;
  /** Refused before any upstream was asked (every deployment of a pooled model unavailable): given back whole. */
  refuse?(err: unknown): void;
}

/** A transcription: the multipart body, already read up to and including its `model` field. */
export interface TranscriptionCall extends Omit<ModelCall, 'body' | 'rawBody' | 'bodyText' | 'inputTokens'> {
  contentType: string;
  /**
   * The body in three pieces, in order: the bytes spilled to disk (`upload.spill.chunks()`), the bytes in
   * memory (`upload.head`, holding the model's value), the rest of the stream (`upload.rest`).
   */
  upload: ModelField;
}

export interface Provider {
  chat(call: ModelCall): void;
  embeddings(call: ModelCall): void;
  speech(call: ModelCall): void;
  transcription(call: TranscriptionCall): void;
}
