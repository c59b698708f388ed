// The `safety_identifier` (and `user`) an OpenAI request goes upstream with (docs/safety-identifier.md):
// the caller's subject's identifier, a client's own value namespaced under it (proto/lib/safety-identifier.ts),
// spliced into the body's text where it can be (json-splice.ts), never the client's value as it is.
import type { ModelConfig } from '../../proto/gen/tollgate/v1/sync.js';
import { namespacedSafetyIdentifier, safetyIdentifierOf, safetySubject, type SafetyIds, type SafetySubjectKind } from '../../proto/lib/safety-identifier.js';
import { setTopLevelStrings } from './json-splice.js';

const KINDS: Readonly<Record<string, SafetySubjectKind | null>> = { '': 'project', project: 'project', key: 'key', organisation: 'organisation', off: null };

export class SafetyFields {
  /** Subjects' identifiers already made (bounded: cleared when full). */
  private readonly made = new Map<string, string>();

  constructor(private readonly key: Buffer) {}

  /** The members to set on a request of `model` by `caller`, or null when the model sends none. */
  fieldsFor(model: ModelConfig, caller: SafetyIds | undefined, body: Record<string, unknown>): Record<string, string> | null {
    const kind = KINDS[model.safetyIdentifier ?? ''];
    if (!kind || !caller) return null;
    const subject = safetySubject(kind, caller);
    let base = this.made.get(subject);
    if (base === undefined) {
      if (this.made.size >= 100_000) this.made.clear();
      base = safetyIdentifierOf(this.key, subject);
      this.made.set(subject, base);
    }
    const own = clientValue(body.safety_identifier) ?? clientValue(body.user);
    const fields: Record<string, string> = { safety_identifier: own === null ? base : namespacedSafetyIdentifier(this.key, base, own) };
    // The older field, namespaced as well: the upstream never sees a client's own value.
    const user = clientValue(body.user);
    if (user !== null) fields.user = namespacedSafetyIdentifier(this.key, base, user);
    else if (body.user !== undefined) fields.user = base;
    return fields;
  }
}

/** A client's value as text (a non-string is namespaced by its JSON); null when absent. */
function clientValue(v: unknown): string | null {
  if (v === undefined || v === null) return null;
  return typeof v === 'string' ? v : JSON.stringify(v);
}

/** The body text with the fields set: spliced, else (a field there not a plain string) `whole`, the body re-serialised with them. */
export function withSafetyFields(text: string, body: Record<string, unknown>, fields: Record<string, string>, whole: Record<string, unknown>): string {
  return setTopLevelStrings(text, fields, (k) => k in body) ?? JSON.stringify(whole);
}
