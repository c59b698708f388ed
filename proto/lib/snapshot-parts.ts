// A snapshot in parts (docs/design.md#snapshots-in-parts): a snapshot of a million keys is about
// 130 MB as one message, and the node held it twice over while it arrived (in HTTP/2 frames, then
// joined into one buffer by grpc-js), which its C heap did not always give back. In parts of
// PART_ENTRIES keys or tombstones each, no message is larger than about 1.3 MB. Shared by the control
// plane (which splits) and its tests; the node assembles them (data-plane/state/key-table.ts).
import type { Snapshot } from '../gen/tollgate/v1/sync.js';

/** Keys and tombstones per part by default: about 1.3 MB a message. */
export const PART_ENTRIES = 10_000;

/**
 * The messages that carry `s`, in order: `s` itself when it holds at most `perPart` keys and
 * tombstones; else parts, the first with the version, config, organisations, project caps and the
 * first keys, then the remaining keys, then the tombstones (a node adds tombstones after every key).
 */
export function splitSnapshot(s: Snapshot, perPart: number = PART_ENTRIES): Snapshot[] {
  const entries = s.keys.length + s.tombstones.length;
  const size = Math.max(1, Math.floor(perPart));
  if (entries <= size) return [s];
  const count = Math.ceil(entries / size);
  const parts: Snapshot[] = [];
  for (let index = 0; index < count; index++) {
    const from = index * size;
    const to = Math.min(entries, from + size);
    const keys = s.keys.slice(Math.min(from, s.keys.length), Math.min(to, s.keys.length));
    const tombstones = s.tombstones.slice(Math.max(0, from - s.keys.length), Math.max(0, to - s.keys.length));
    const first = index === 0;
    parts.push({
      version: s.version,
      config: first ? s.config : undefined,
      keys,
      orgs: first ? s.orgs : [],
      tombstones,
      projectCaps: first ? s.projectCaps : undefined,
      part: { index, count, entries: first ? entries : 0 },
    });
  }
  return parts;
}
