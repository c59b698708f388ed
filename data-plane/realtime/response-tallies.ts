// The counts of a session's responses in flight, for the estimate a response is billed when the
// upstream reports no usage (response-estimate.ts): what the client sent since the last response
// began (its input), and each response begun upstream by its id with its output deltas.
import { base64SpanBytes, decodeString, eventTypeOf, parse, stringMemberSpans } from './event-scan.js';
import { AUDIO_DELTAS, ResponseTally, TEXT_DELTAS } from './response-estimate.js';

/** Responses in flight tallied apart; past this many, a new one's counts join the last one's (still billed). */
const MAX_TALLIED_RESPONSES = 64;

export class ResponseTallies {
  /** What the client sent since the last response began: the next response's input. */
  private pendingInput = new ResponseTally();
  /** The responses in flight (response.created seen, no response.done), by id, with their counts. */
  private readonly tallies = new Map<string, ResponseTally>();
  private lastTally: ResponseTally | null = null;

  /**
   * A client event that adds to the next response's input: counted, then forgotten. A create's own
   * fields stand under `response` on /v1/realtime, at the top level in the Responses API's WebSocket
   * mode (`responsesApi`), where its `input` may also be a plain string.
   */
  clientEvent(data: Buffer, responsesApi = false): void {
    const type = eventTypeOf(data);
    const t = this.pendingInput;
    if (type === 'input_audio_buffer.append') {
      const [audio] = stringMemberSpans(data, ['audio']);
      if (audio) t.audioInBytes += base64SpanBytes(data, audio);
    } else if (type === 'conversation.item.create') t.addItem(parse(data)?.item);
    else if (type === 'session.update') t.addConfig(parse(data)?.session);
    else if (type === 'response.create') {
      const ev = parse(data);
      t.addConfig(responsesApi ? ev : ev?.response);
    }
  }

  /** The input tokens of what waits for the next response, as far as it was counted. */
  pendingInputTokens(): number {
    return this.pendingInput.counts().promptTokens;
  }

  /** A response `id` began upstream: what the client sent since the last one is its input. */
  created(id: string): void {
    const tally = this.pendingInput;
    this.pendingInput = new ResponseTally();
    const known = this.tallies.get(id);
    if (known) known.add(tally);
    else if (this.tallies.size >= MAX_TALLIED_RESPONSES && this.lastTally) this.lastTally.add(tally);
    else this.tallies.set(id, tally);
    this.lastTally = this.tallies.get(id) ?? this.lastTally;
  }

  /**
   * An upstream event that counts toward a response: an output delta, or (the Responses API's
   * WebSocket mode, one response at a time) a built-in tool call item as it starts, so that a turn
   * cut before its final event still bills the calls the upstream made.
   */
  upstreamEvent(type: string, data: Buffer, responsesApi: boolean): void {
    if (TEXT_DELTAS.has(type) || AUDIO_DELTAS.has(type)) return this.delta(data, AUDIO_DELTAS.has(type));
    if (responsesApi && type === 'response.output_item.added' && data.includes('_call"')) (this.lastTally ?? this.pendingInput).addToolItem(parse(data)?.item);
  }

  /** An output delta, to the response it names (else the last one begun). */
  delta(data: Buffer, audio: boolean): void {
    const [delta, responseId] = stringMemberSpans(data, ['delta', 'response_id']);
    if (!delta) return;
    const id = responseId ? decodeString(data, responseId[0], responseId[1]) : undefined;
    const tally = (id !== undefined ? this.tallies.get(id) : undefined) ?? this.lastTally ?? this.pendingInput;
    if (audio) tally.audioOutBytes += base64SpanBytes(data, delta);
    else tally.addTextOut(decodeString(data, delta[0], delta[1]) ?? '');
  }

  /**
   * The counts of the response `named` ends, taken out of those in flight: by its id, else the oldest
   * in flight, else (no response.created was seen) what the client sent since the last one.
   */
  take(named: string | undefined): ResponseTally {
    const id = named !== undefined && this.tallies.has(named) ? named : this.tallies.keys().next().value;
    if (id === undefined) {
      const waiting = this.pendingInput;
      this.pendingInput = new ResponseTally();
      return waiting;
    }
    const tally = this.tallies.get(id)!;
    this.tallies.delete(id);
    if (this.lastTally === tally) {
      this.lastTally = null;
      for (const t of this.tallies.values()) this.lastTally = t;
    }
    return tally;
  }

  /** Every response still in flight, by id, taken out (the session ends: each is billed its estimate). */
  takeAll(): Map<string, ResponseTally> {
    const all = new Map(this.tallies);
    this.tallies.clear();
    this.lastTally = null;
    return all;
  }
}
