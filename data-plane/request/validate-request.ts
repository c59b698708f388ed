// Request validation of the JSON model endpoints (400, Shape A), a step of the pipeline after the key
// budgets. Pure: no I/O. The body that is validated and billed is exactly the body that is forwarded:
// a body whose objects repeat a key is refused, because JSON parsers disagree on which one wins.
import type { GatewayState } from '../state/key-table.js';
import { GatewayError } from '../errors.js';
import type { Route } from '../routing/routes.js';
import { unpricedInRequest } from '../../proto/lib/reported-prices.js';

const JSON_CONTENT_TYPE = /^application\/json\s*(;|$)/i;
// The Responses API is served by chat models.
const KIND_OF_ROUTE: Record<string, string> = { chat: 'chat', embeddings: 'embeddings', speech: 'speech', responses: 'chat' };

function invalid(message: string, param: string | null): GatewayError {
  return new GatewayError('INVALID_REQUEST', message, { param });
}

/** "a chat model", "an embeddings model". */
function withArticle(word: string): string {
  return `${/^[aeiou]/i.test(word) ? 'an' : 'a'} ${word}`;
}

/** Returns null when the request is valid, else the 400 to answer. `text` is the body as received. */
export function validateJson(route: Route, contentType: string, body: unknown, parseError: boolean, state: GatewayState, text?: string): GatewayError | null {
  if (!JSON_CONTENT_TYPE.test(contentType)) return invalid('Content-Type must be application/json.', null);
  if (parseError) return invalid('We could not parse the JSON body of your request. The body must be valid JSON.', null);
  if (typeof body !== 'object' || body === null || Array.isArray(body)) return invalid('The request body must be a JSON object.', null);
  if (text !== undefined) {
    const dup = findDuplicateKey(text);
    if (dup !== null) return invalid(`Duplicate key '${dup}' in the JSON body: each key may appear once.`, dup);
  }
  const obj = body as Record<string, unknown>;
  if (obj.model === undefined || obj.model === null || obj.model === '') return invalid("Missing required parameter: 'model'.", 'model');
  if (typeof obj.model !== 'string') return invalid("Invalid type for 'model': expected a string.", 'model');
  if (route.kind === 'chat') {
    if (obj.messages === undefined) return invalid("Missing required parameter: 'messages'.", 'messages');
    if (!Array.isArray(obj.messages)) return invalid("Invalid type for 'messages': expected an array.", 'messages');
    if (obj.messages.length === 0) return invalid("'messages' must contain at least one message.", 'messages');
    const bad = validateMessages(obj.messages);
    if (bad) return bad;
  }
  if (route.kind === 'responses') {
    const bad = validateResponsesInput(obj);
    if (bad) return bad;
  }
  if (route.kind === 'embeddings') {
    const input = obj.input;
    const ok = typeof input === 'string' || (Array.isArray(input) && input.length > 0);
    if (!ok) return invalid("Missing or invalid parameter: 'input' (a string or a non-empty array).", 'input');
  }
  const model = state.view.models.get(obj.model);
  if (!model) return new GatewayError('UNKNOWN_MODEL', `The model \`${obj.model}\` does not exist.`, { param: 'model' });
  if (model.kind !== KIND_OF_ROUTE[route.kind]) {
    return invalid(`The model \`${obj.model}\` is ${withArticle(model.kind)} model and cannot be used on this endpoint.`, 'model');
  }
  // A tier or built-in tool the model has no price for is refused, never billed as plain tokens.
  if (route.kind === 'chat' || route.kind === 'responses') {
    const unpriced = unpricedInRequest(model, obj);
    if (unpriced) return invalid(unpriced.message, unpriced.param);
  }
  if (route.kind === 'speech') {
    if (typeof obj.input !== 'string' || obj.input.length === 0) return invalid("Missing required parameter: 'input'.", 'input');
    if (model.voices.length > 0 && !model.voices.includes(String(obj.voice))) {
      return invalid(`Unknown voice; this model has: ${model.voices.join(', ')}.`, 'voice');
    }
  }
  return null;
}

/** A Responses API request: `input` a string or an array of items (objects); ids are strings. */
function validateResponsesInput(obj: Record<string, unknown>): GatewayError | null {
  const input = obj.input;
  if (input === undefined || input === null) return invalid("Missing required parameter: 'input'.", 'input');
  if (typeof input !== 'string' && !Array.isArray(input)) return invalid("Invalid type for 'input': expected a string or an array of input items.", 'input');
  if (Array.isArray(input)) {
    for (let i = 0; i < input.length; i++) {
      const item = input[i];
      if (typeof item !== 'object' || item === null || Array.isArray(item)) return invalid(`Invalid type for 'input[${i}]': expected an input item object.`, `input[${i}]`);
    }
  }
  const prev = obj.previous_response_id;
  if (prev !== undefined && prev !== null && typeof prev !== 'string') return invalid("Invalid type for 'previous_response_id': expected a string.", 'previous_response_id');
  return null;
}

/**
 * Each chat message is an object with a non-empty string `role`; its `content` is a string or an array
 * of content parts (objects with a string `type`), or null/absent on an assistant message that carries
 * tool calls, a function call or a refusal, as the OpenAI API allows.
 */
function validateMessages(messages: unknown[]): GatewayError | null {
  for (let i = 0; i < messages.length; i++) {
    const m = messages[i];
    const at = `messages.[${i}]`;
    if (typeof m !== 'object' || m === null || Array.isArray(m)) return invalid(`Invalid type for '${at}': expected an object with 'role' and 'content'.`, at);
    const msg = m as Record<string, unknown>;
    if (typeof msg.role !== 'string' || msg.role.length === 0) return invalid(`Invalid or missing '${at}.role': expected a string such as "user".`, `${at}.role`);
    const content = msg.content;
    if (typeof content === 'string') continue;
    if (Array.isArray(content)) {
      for (let j = 0; j < content.length; j++) {
        const part = content[j] as Record<string, unknown> | null;
        if (typeof part !== 'object' || part === null || Array.isArray(part) || typeof part.type !== 'string') {
          return invalid(`Invalid '${at}.content.[${j}]': expected a content part object with a string 'type'.`, `${at}.content.[${j}]`);
        }
      }
      continue;
    }
    const carriesCall = msg.tool_calls !== undefined || msg.function_call !== undefined || msg.refusal !== undefined;
    if ((content === null || content === undefined) && msg.role === 'assistant' && carriesCall) continue;
    return invalid(`Invalid '${at}.content': expected a string or an array of content parts.`, `${at}.content`);
  }
  return null;
}

interface Frame {
  /** Keys seen so far in an object; null for an array. */
  keys: Set<string> | null;
  /** The key (object) or position (array) whose value is being read. */
  name: string;
  index: number;
  expectKey: boolean;
}

/**
 * The path of the first key repeated inside one object (`messages.[0].role`), or null. `text` must
 * be JSON that JSON.parse accepted; one linear pass, skipping string contents with indexOf.
 */
export function findDuplicateKey(text: string): string | null {
  const stack: Frame[] = [];
  const n = text.length;
  let i = 0;
  while (i < n) {
    const c = text.charCodeAt(i);
    if (c === 34 /* " */) {
      let end = text.indexOf('"', i + 1);
      // Skip escaped quotes: a quote preceded by an odd number of backslashes.
      while (end !== -1) {
        let b = end - 1;
        while (text.charCodeAt(b) === 92 /* \ */) b--;
        if ((end - 1 - b) % 2 === 0) break;
        end = text.indexOf('"', end + 1);
      }
      if (end === -1) return null;
      const top = stack.length > 0 ? stack[stack.length - 1] : undefined;
      if (top !== undefined && top.keys !== null && top.expectKey) {
        let key = text.slice(i + 1, end);
        if (key.includes('\\')) key = JSON.parse(text.slice(i, end + 1)) as string;
        if (top.keys.has(key)) return pathOf(stack, key);
        top.keys.add(key);
        top.name = key;
        top.expectKey = false;
      }
      i = end + 1;
      continue;
    }
    if (c === 123 /* { */) stack.push({ keys: new Set(), name: '', index: 0, expectKey: true });
    else if (c === 91 /* [ */) stack.push({ keys: null, name: '', index: 0, expectKey: false });
    else if (c === 125 /* } */ || c === 93 /* ] */) stack.pop();
    else if (c === 44 /* , */ && stack.length > 0) {
      const top = stack[stack.length - 1];
      if (top.keys !== null) top.expectKey = true;
      else top.index++;
    }
    i++;
  }
  return null;
}

function pathOf(stack: Frame[], key: string): string {
  const parts: string[] = [];
  for (let k = 0; k < stack.length - 1; k++) parts.push(stack[k].keys !== null ? stack[k].name : `[${stack[k].index}]`);
  parts.push(key);
  return parts.join('.');
}
