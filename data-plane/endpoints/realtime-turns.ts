// A `response.create` on a realtime socket (`/v1/realtime`), as a turn (socket-turns.ts): its input
// is what the client sent into the conversation since the last response began (counted as it
// passed, realtime/response-tallies.ts) with the create's own instructions, tools and input items;
// it reserves that plus the output ceiling it names (`max_output_tokens`, or the beta's
// `max_response_output_tokens`). Its fields stand under `response`, where the realtime API reads
// them; the session's model cannot be switched there (realtime/client-events.ts refuses a switch
// before it is a turn), so it goes on as it was sent.
import { GatewayError } from '../errors.js';
import { findDuplicateKey } from '../request/validate-request.js';
import type { TurnRules } from './socket-turns.js';

type Obj = Record<string, unknown>;

export class RealtimeTurnRules implements TurnRules {
  /** The realtime API names the client event an error is about (`error.event_id`). */
  readonly errorsNameTheirEvent = true;

  check(_ev: Obj, text: string, data: Buffer): GatewayError | Buffer {
    // What the upstream reads must be what was read here: one JSON object, each key once.
    try {
      JSON.parse(text);
    } catch {
      return new GatewayError('INVALID_REQUEST', 'The event is not valid JSON.', { param: null });
    }
    const dup = findDuplicateKey(text);
    if (dup !== null) return new GatewayError('INVALID_REQUEST', `Duplicate key '${dup.slice(0, 64)}' in the event: each key may appear once.`, { param: dup.slice(0, 64) });
    return data;
  }

  estimate(ev: Obj, pendingInput: number): number {
    return pendingInput + outputCeiling(ev.response);
  }

  inputEstimate(_ev: Obj, pendingInput: number): number {
    return pendingInput;
  }

  outputFields(ev: Obj): unknown {
    return ev.response;
  }
}

/** The output ceiling a realtime response names ("inf" or none: nothing to reserve beyond the input). */
function outputCeiling(config: unknown): number {
  if (config === null || typeof config !== 'object' || Array.isArray(config)) return 0;
  const c = config as Obj;
  const max = c.max_output_tokens ?? c.max_response_output_tokens;
  return typeof max === 'number' && Number.isSafeInteger(max) && max > 0 ? max : 0;
}
