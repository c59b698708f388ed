// The built-in demo provider's realtime model: a conversation answered locally in the OpenAI
// realtime event style (GA event names), so `npm start` shows realtime sessions with no network.
// It keeps a text conversation; `response.create` answers the last user message with
// response.created, output item and content part events, text deltas, and response.done with usage
// counted by the gateway's tokenizer. Audio appended to the input buffer is accepted and billed as
// input tokens (one per 100 bytes); the demo answers in text only.
import type { ModelConfig } from '../../../proto/gen/tollgate/v1/sync.js';
import { LocalUpstreamLink } from '../local-link.js';
import { countTokens, contentText, truncateTokens } from '../tokens.js';
import { demoReplyText } from './demo.js';

type Obj = Record<string, any>;

/** The conversation the demo keeps: older items are dropped, so a response costs bounded work. */
const MAX_ITEMS = 64;

/** Audio bytes billed as one input token (the demo has no audio model; a round, visible rate). */
const AUDIO_BYTES_PER_TOKEN = 100;

let seq = 0;
const newId = (prefix: string) => `${prefix}_demo${(++seq).toString(36).padStart(6, '0')}`;

export class DemoRealtimeLink extends LocalUpstreamLink {
  private readonly sessionId = newId('sess');
  private instructions = 'You are the Tollgate demo model.';
  private readonly items: Array<{ id: string; role: string; text: string }> = [];
  private audioBytes = 0;

  constructor(private readonly model: ModelConfig) {
    super(false);
    this.emit({ type: 'session.created', session: this.session() });
  }

  send(data: Buffer, isBinary: boolean): void {
    if (this.closed) return;
    let ev: Obj;
    try {
      ev = isBinary ? null : JSON.parse(data.toString('utf8'));
    } catch {
      ev = null as unknown as Obj;
    }
    if (!ev || typeof ev !== 'object' || typeof ev.type !== 'string') {
      return this.error('invalid_request_error', 'invalid_event', 'Each message must be a JSON object with a string `type`.', null);
    }
    const eventId = typeof ev.event_id === 'string' ? ev.event_id : null;
    switch (ev.type) {
      case 'session.update':
        if (ev.session && typeof ev.session.instructions === 'string') this.instructions = ev.session.instructions;
        return this.emit({ type: 'session.updated', session: this.session() });
      case 'conversation.item.create': {
        const item = ev.item as Obj | undefined;
        if (!item || item.type !== 'message' || typeof item.role !== 'string') {
          return this.error('invalid_request_error', 'invalid_value', 'The demo model accepts message items only.', eventId);
        }
        const stored = { id: typeof item.id === 'string' ? item.id : newId('item'), role: item.role, text: contentText(item.content) };
        this.remember(stored);
        const out = { id: stored.id, object: 'realtime.item', type: 'message', status: 'completed', role: stored.role, content: item.content ?? [] };
        this.emit({ type: 'conversation.item.added', previous_item_id: null, item: out });
        return this.emit({ type: 'conversation.item.done', previous_item_id: null, item: out });
      }
      case 'input_audio_buffer.append':
        if (typeof ev.audio === 'string') this.audioBytes += Math.floor((ev.audio.length * 3) / 4);
        return;
      case 'input_audio_buffer.clear':
        this.audioBytes = 0;
        return this.emit({ type: 'input_audio_buffer.cleared' });
      case 'input_audio_buffer.commit':
        return this.emit({ type: 'input_audio_buffer.committed', previous_item_id: null, item_id: newId('item') });
      case 'response.create':
        return this.respond(ev.response as Obj | undefined);
      case 'response.cancel':
        // Demo responses are complete as soon as they start: nothing to cancel.
        return;
      default:
        return this.error('invalid_request_error', 'unknown_event', `The demo model does not handle \`${String(ev.type).slice(0, 64)}\` events.`, eventId);
    }
  }

  private session(): Obj {
    return {
      type: 'realtime',
      object: 'realtime.session',
      id: this.sessionId,
      model: this.model.id,
      output_modalities: ['text'],
      instructions: this.instructions,
      tools: [],
      tool_choice: 'auto',
      max_output_tokens: 'inf',
    };
  }

  private respond(options: Obj | undefined): void {
    const lastUser = [...this.items].reverse().find((i) => i.role === 'user');
    const reply = demoReplyText(lastUser ? [{ role: 'user', content: lastUser.text }] : []);
    const max = typeof options?.max_output_tokens === 'number' && options.max_output_tokens > 0 ? Math.floor(options.max_output_tokens) : Number.MAX_SAFE_INTEGER;
    const cut = truncateTokens(reply, max);
    const text = cut.text;
    const responseId = newId('resp');
    const itemId = newId('item');
    let inputText = countTokens(this.instructions);
    for (const i of this.items) inputText += countTokens(i.text) + 4;
    const inputAudio = Math.ceil(this.audioBytes / AUDIO_BYTES_PER_TOKEN);
    this.audioBytes = 0;
    const outputTokens = cut.tokens;
    const base = { object: 'realtime.response', id: responseId, conversation_id: null, output_modalities: ['text'], max_output_tokens: 'inf', metadata: null };
    this.emit({ type: 'response.created', response: { ...base, status: 'in_progress', status_details: null, output: [], usage: null } });
    const part = { type: 'output_text', text: '' };
    const item = { id: itemId, object: 'realtime.item', type: 'message', status: 'in_progress', role: 'assistant', content: [] as Obj[] };
    this.emit({ type: 'response.output_item.added', response_id: responseId, output_index: 0, item });
    this.emit({ type: 'response.content_part.added', response_id: responseId, item_id: itemId, output_index: 0, content_index: 0, part });
    for (const piece of splitWords(text, 4)) {
      this.emit({ type: 'response.output_text.delta', response_id: responseId, item_id: itemId, output_index: 0, content_index: 0, delta: piece });
    }
    this.emit({ type: 'response.output_text.done', response_id: responseId, item_id: itemId, output_index: 0, content_index: 0, text });
    const donePart = { type: 'output_text', text };
    this.emit({ type: 'response.content_part.done', response_id: responseId, item_id: itemId, output_index: 0, content_index: 0, part: donePart });
    const doneItem = { ...item, status: 'completed', content: [donePart] };
    this.emit({ type: 'response.output_item.done', response_id: responseId, output_index: 0, item: doneItem });
    this.remember({ id: itemId, role: 'assistant', text });
    const inputTokens = inputText + inputAudio;
    const usage = {
      total_tokens: inputTokens + outputTokens,
      input_tokens: inputTokens,
      output_tokens: outputTokens,
      input_token_details: { cached_tokens: 0, text_tokens: inputText, audio_tokens: inputAudio, image_tokens: 0 },
      output_token_details: { text_tokens: outputTokens, audio_tokens: 0 },
    };
    this.emit({
      type: 'response.done',
      response: { ...base, status: cut.cut ? 'incomplete' : 'completed', status_details: cut.cut ? { type: 'incomplete', reason: 'max_output_tokens' } : null, output: [doneItem], usage },
    });
  }

  private remember(item: { id: string; role: string; text: string }): void {
    this.items.push(item);
    if (this.items.length > MAX_ITEMS) this.items.shift();
  }

  private error(type: string, code: string, message: string, eventId: string | null): void {
    this.emit({ type: 'error', error: { type, code, message, param: null, event_id: eventId } });
  }

  /** Every event of the demo carries its own event_id, as OpenAI's do. */
  protected override emit(ev: Obj): void {
    super.emit({ event_id: newId('event'), ...ev });
  }
}

/** Splits a text into up to `parts` pieces at spaces (for deltas). */
function splitWords(text: string, parts: number): string[] {
  const words = text.split(/(?<= )/);
  const per = Math.max(1, Math.ceil(words.length / parts));
  const out: string[] = [];
  for (let i = 0; i < words.length; i += per) out.push(words.slice(i, i + per).join(''));
  return out.length > 0 ? out : [''];
}
