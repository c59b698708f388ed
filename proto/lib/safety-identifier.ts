// The `safety_identifier` the upstream receives (docs/safety-identifier.md): a stable value per
// project (or per key, or per organisation, by the model's config) that reveals no id. It is an HMAC
// under a key derived from the pepper, which the control plane and every node already share: every
// node sends the same value for the same project, and only a holder of the pepper can map a value
// back (the control plane, for `tollgate safety-id`). A client's own `safety_identifier` (or `user`)
// is namespaced under it, never passed as it is. Pure.
import { createHmac } from 'node:crypto';

/** Whose identifier a model's requests carry (`safety_identifier` in the model's config). */
export type SafetySubjectKind = 'project' | 'key' | 'organisation';

export interface SafetyIds {
  projectId: string;
  keyId: string;
  orgId: string;
}

/** Every value starts with this (then 22 characters, and a client's part after a dot). */
export const SAFETY_ID_PREFIX = 'tg_';
/** Characters of each HMAC part: 132 bits of base64url. */
const PART_CHARS = 22;

/** The key the identifiers are made with, derived from the pepper (never the pepper itself). */
export function safetyIdKey(pepper: Buffer): Buffer {
  return createHmac('sha256', pepper).update('tollgate safety identifier v1').digest();
}

/** The subject of `kind` for a caller, as it is hashed: the kind's name and the id. */
export function safetySubject(kind: SafetySubjectKind, ids: SafetyIds): string {
  return kind === 'key' ? `key:${ids.keyId}` : kind === 'organisation' ? `organisation:${ids.orgId}` : `project:${ids.projectId}`;
}

/** The identifier of a subject: `tg_` and 22 characters (25 in all). */
export function safetyIdentifierOf(key: Buffer, subject: string): string {
  return SAFETY_ID_PREFIX + part(key, subject);
}

/**
 * A client's own value namespaced under its subject's identifier: `tg_<22>.<22>` (48 characters, under
 * the upstream's 64). Two clients' equal values give different identifiers; the client's value cannot
 * be read back from it.
 */
export function namespacedSafetyIdentifier(key: Buffer, base: string, clientValue: string): string {
  return `${base}.${part(key, `${base}\u0000${clientValue}`)}`;
}

/** The subject's part of an identifier as an upstream reports it (the client's part after a dot dropped). */
export function safetyIdentifierBase(value: string): string {
  const v = value.trim();
  const dot = v.indexOf('.');
  return dot === -1 ? v : v.slice(0, dot);
}

function part(key: Buffer, text: string): string {
  return createHmac('sha256', key).update(text).digest('base64url').slice(0, PART_CHARS);
}
