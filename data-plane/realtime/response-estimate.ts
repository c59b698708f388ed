// What a realtime response is billed when the upstream does not say (docs/billing-endings.md): a
// `response.done` without usable `usage`, or a response still in flight when the session ends. The
// session counts as messages pass and keeps only the counts, never the stream:
// - into a response, what the client sent into the conversation since the last response: its items'
//   text (by the one estimator of proxy/tokens.ts), `instructions` and `tools`, and input audio;
// - out of it, what the upstream relayed for it: text, transcript and function-call argument deltas
//   (text tokens) and audio deltas (audio tokens).
// Audio is counted by the bytes its base64 decodes to (never decoded): bytes at the lowest byte rate the realtime API accepts and
// tokens at OpenAI's higher audio rate, so the estimate is never below the audio's real token count.
import type { TokenCounts } from '../../proto/lib/money.js';
import { toolCallsOfOutput, type BuiltInTool, type ReportedFacts, type ToolCallCounts } from '../../proto/lib/reported-prices.js';
import { estimateTextTokens, estimateTokens } from '../proxy/tokens.js';

/** Audio bytes per second assumed: G.711 µ-law/A-law (8 kHz, 8-bit mono), the fewest the realtime API takes. */
export const AUDIO_BYTES_PER_SECOND = 8_000;
/** Audio tokens per second assumed: OpenAI's assistant-audio rate (one per 50 ms), twice its user-audio rate. */
export const AUDIO_TOKENS_PER_SECOND = 20;

/** Audio tokens of `bytes` bytes of audio. */
export function audioTokensOfBytes(bytes: number): number {
  return Math.ceil((bytes * AUDIO_TOKENS_PER_SECOND) / AUDIO_BYTES_PER_SECOND);
}

/** The bytes a base64 text of `length` characters decodes to, `padding` of them `=` at its end. */
export function base64Bytes(length: number, padding: number): number {
  return Math.max(0, Math.floor((length * 3) / 4) - padding);
}

function base64StringBytes(text: string): number {
  return base64Bytes(text.length, text.endsWith('==') ? 2 : text.endsWith('=') ? 1 : 0);
}

type Obj = Record<string, unknown>;

function isObj(v: unknown): v is Obj {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

/** The counts of one response (or of what waits for the next one). */
export class ResponseTally {
  textIn = 0;
  /** Bytes of input audio. */
  audioInBytes = 0;
  textOut = 0;
  /** Bytes of output audio. */
  audioOutBytes = 0;
  /** Built-in tool calls begun (Responses API: each call item as it starts; code interpreter per container). */
  toolCalls: ToolCallCounts | null = null;
  private containers: Set<string> | null = null;

  add(o: ResponseTally): void {
    this.textIn += o.textIn;
    this.audioInBytes += o.audioInBytes;
    this.textOut += o.textOut;
    this.audioOutBytes += o.audioOutBytes;
    if (o.toolCalls) this.addToolCalls(o.toolCalls);
  }

  /** The estimate as token counts, audio as its own part (priced at the model's audio prices), and the tool calls begun. */
  counts(): TokenCounts & ReportedFacts {
    const audioIn = audioTokensOfBytes(this.audioInBytes);
    const audioOut = audioTokensOfBytes(this.audioOutBytes);
    const c: TokenCounts & ReportedFacts = {
      promptTokens: this.textIn + audioIn,
      completionTokens: this.textOut + audioOut,
      audioPromptTokens: audioIn,
      audioCompletionTokens: audioOut,
    };
    if (this.toolCalls) c.toolCalls = { ...this.toolCalls };
    return c;
  }

  /** An output item as it starts (`response.output_item.added`): a built-in tool call is counted then, as over HTTP. */
  addToolItem(item: unknown): void {
    if (!isObj(item)) return;
    const container = item.type === 'code_interpreter_call' && typeof item.container_id === 'string' ? item.container_id : '';
    if (container !== '') {
      if (this.containers?.has(container)) return;
      (this.containers ??= new Set()).add(container);
    }
    this.addToolCalls(toolCallsOfOutput([item]));
  }

  private addToolCalls(calls: ToolCallCounts): void {
    for (const [tool, n] of Object.entries(calls) as Array<[BuiltInTool, number]>) {
      if (!n) continue;
      this.toolCalls ??= {};
      this.toolCalls[tool] = (this.toolCalls[tool] ?? 0) + n;
    }
  }

  /** A conversation item the client sent (conversation.item.create, or response.create's `input`). */
  addItem(item: unknown): void {
    if (!isObj(item)) return;
    const parts: unknown[] = [];
    if (typeof item.content === 'string') parts.push({ text: item.content });
    else if (Array.isArray(item.content)) {
      for (const part of item.content) {
        if (!isObj(part)) continue;
        if (typeof part.audio === 'string') this.audioInBytes += base64StringBytes(part.audio);
        else if (typeof part.text === 'string') parts.push({ text: part.text });
        else if (typeof part.transcript === 'string') parts.push({ text: part.transcript });
        else parts.push(part);
      }
    }
    // A function call's output or arguments, as text.
    for (const k of ['name', 'arguments', 'output'] as const) if (typeof item[k] === 'string') parts.push({ text: item[k] });
    this.textIn += estimateTokens({ input: [{ content: parts }] });
  }

  /** A session.update's session or a response.create's response: instructions, tools, input items. */
  addConfig(config: unknown): void {
    if (!isObj(config)) return;
    this.textIn += estimateTokens({ instructions: config.instructions, tools: config.tools });
    // Input items (a Responses create's may also be one plain string).
    if (typeof config.input === 'string') this.textIn += estimateTextTokens(config.input);
    else if (Array.isArray(config.input)) for (const item of config.input) this.addItem(item);
  }

  addTextOut(text: string): void {
    this.textOut += estimateTextTokens(text);
  }
}

/** Upstream events whose `delta` is output text (text, audio transcript, function-call arguments). */
export const TEXT_DELTAS: ReadonlySet<string> = new Set([
  'response.output_text.delta',
  'response.text.delta',
  'response.output_audio_transcript.delta',
  'response.audio_transcript.delta',
  'response.function_call_arguments.delta',
]);

/** Upstream events whose `delta` is base64 output audio. */
export const AUDIO_DELTAS: ReadonlySet<string> = new Set(['response.output_audio.delta', 'response.audio.delta']);
