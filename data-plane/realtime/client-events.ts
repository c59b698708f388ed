// What the gateway will not pass on from a realtime client: a switch to another model than the
// session's (it is billed at the prices of the model it was opened for), input-audio transcription
// (billed by the upstream apart from the session), and an event that repeats a key.
import type { ModelConfig } from '../../proto/gen/tollgate/v1/sync.js';
import { findDuplicateKey } from '../request/validate-request.js';
import { parseText, type Obj } from './event-scan.js';

/**
 * An `error` event for a client event the gateway will not pass on, else null: a session.update that
 * names another model than the session's, or an event that repeats a key inside one object (the
 * upstream may read the other copy of `type` or `model` than the one checked here).
 */
export function clientEventRefusal(data: Buffer, model: ModelConfig): Obj | null {
  const text = data.toString('utf8');
  const ev = parseText(text);
  if (!ev) return null;
  const eventId = typeof ev.event_id === 'string' ? ev.event_id : null;
  const repeated = findDuplicateKey(text);
  if (repeated !== null) {
    return errorEvent('invalid_request_error', `The event repeats the key \`${repeated.slice(0, 64)}\`; send each key once.`, repeated.slice(0, 64), eventId);
  }
  if (ev.type === 'transcription_session.update' || (ev.type === 'session.update' && turnsOnTranscription(ev.session))) {
    return errorEvent(
      'feature_not_available',
      'Input audio transcription is not available through this gateway: it is billed by the upstream apart from the session. Transcribe with /v1/audio/transcriptions instead.',
      'session.audio.input.transcription',
      eventId,
    );
  }
  if (ev.type !== 'session.update') return null;
  const wanted = ev.session?.model;
  if (wanted === undefined || wanted === model.id || wanted === model.upstreamModel) return null;
  return errorEvent('model_not_allowed', `This session is for the model \`${model.id}\`; open a new session to use another model.`, 'session.model', eventId);
}

/** The upstream event that reports a transcription of the input audio (with its own usage). */
export const TRANSCRIPTION_DONE = 'conversation.item.input_audio_transcription.completed';

/** Whether a session.update's session asks for input audio transcription (beta and GA shapes). */
function turnsOnTranscription(session: unknown): boolean {
  if (!session || typeof session !== 'object') return false;
  const s = session as Obj;
  if (s.input_audio_transcription !== undefined && s.input_audio_transcription !== null) return true;
  const t = s.audio?.input?.transcription;
  return t !== undefined && t !== null;
}

function errorEvent(code: string, message: string, param: string, eventId: string | null): Obj {
  return {
    type: 'error',
    event_id: `event_gw_${Date.now().toString(36)}`,
    error: { type: 'invalid_request_error', code, message, param, event_id: eventId },
  };
}
