// The sync stream's deserializer (data-plane/sync/sync-client.ts): a ControlMessage, except that a
// snapshot's keys and tombstones go straight into a packed GatewayState as they are read, one
// short-lived KeyEntry at a time, instead of an array of a million objects that would all live (and
// grow the heap) until the snapshot is applied. A snapshot in parts (proto/lib/snapshot-parts.ts,
// docs/design.md#snapshots-in-parts) is built into one state part after part: every part but the
// last decodes to an empty message, and the last to the whole snapshot. The Snapshot returned has
// empty `keys` and `tombstones`; StateHolder.applySnapshot takes the state built (key-table.ts).
import { BinaryReader } from '@bufbuild/protobuf/wire';
import {
  ControlMessage,
  GatewayConfig as GatewayConfigCodec,
  KeyEntry as KeyEntryCodec,
  KeyTombstone as KeyTombstoneCodec,
  OrgEntry as OrgEntryCodec,
  ProjectCaps as ProjectCapsCodec,
  SnapshotPart as SnapshotPartCodec,
} from '../../proto/gen/tollgate/v1/sync.js';
import type { KeyTombstone, Snapshot, SnapshotPart } from '../../proto/gen/tollgate/v1/sync.js';
import { buildConfigView, GatewayState, prebuilt } from './key-table.js';

// Tags (field number << 3 | wire type) of a ControlMessage's snapshot and of Snapshot's fields.
const SNAPSHOT = (1 << 3) | 2;
const VERSION = (1 << 3) | 0;
const CONFIG = (2 << 3) | 2;
const KEY = (3 << 3) | 2;
const ORG = (4 << 3) | 2;
const TOMBSTONE = (5 << 3) | 2;
const PROJECT_CAPS = (900 << 3) | 2;
const PART = (901 << 3) | 2;

/** A snapshot being read: whole, or the parts so far of one in parts. */
interface Assembly {
  snapshot: Snapshot;
  state: GatewayState;
  /** Added after every key (a tombstone never hides a live key), as GatewayState.fromSnapshot does. */
  tombstones: KeyTombstone[];
  /** The index of the next part expected, and how many there are (1: a whole snapshot). */
  next: number;
  count: number;
}

/** One per stream: a stream that breaks mid-snapshot leaves its parts behind with it. */
export class SnapshotDecoder {
  private assembling: Assembly | null = null;

  /** The deserializer (an arrow: grpc-js calls it unbound). */
  readonly decode = (buf: Uint8Array): ControlMessage => {
    const reader = new BinaryReader(buf);
    // ControlMessage is a oneof; a snapshot is field 1 alone.
    if (buf.length === 0 || reader.uint32() !== SNAPSHOT) return ControlMessage.decode(buf);
    const length = reader.uint32();
    const end = reader.pos + length;
    if (end !== buf.length) return ControlMessage.decode(buf);
    // One cheap pass to count the entries (to size the table exactly) and find the part, then the real one.
    let entries = 0;
    let part: SnapshotPart | undefined;
    while (reader.pos < end) {
      const tag = reader.uint32();
      if (tag === KEY || tag === TOMBSTONE) entries++;
      if (tag === PART) part = SnapshotPartCodec.decode(reader, reader.uint32());
      else reader.skip(tag & 7);
    }
    reader.pos = end - length;
    const a = this.assemblyFor(part, entries);
    while (reader.pos < end) {
      const tag = reader.uint32();
      if (tag === VERSION) {
        const version = Number(reader.int64());
        if (part && part.index > 0 && version !== a.snapshot.version) throw this.broken(`snapshot part ${part.index} is of version ${version}, not ${a.snapshot.version}`);
        a.snapshot.version = version;
      } else if (tag === CONFIG) a.snapshot.config = GatewayConfigCodec.decode(reader, reader.uint32());
      else if (tag === KEY) a.state.upsertKey(KeyEntryCodec.decode(reader, reader.uint32()));
      else if (tag === ORG) {
        const o = OrgEntryCodec.decode(reader, reader.uint32());
        a.snapshot.orgs.push(o);
        a.state.upsertOrg(o);
      } else if (tag === TOMBSTONE) a.tombstones.push(KeyTombstoneCodec.decode(reader, reader.uint32()));
      else if (tag === PROJECT_CAPS) {
        // Projects with a spend cap.
        const caps = ProjectCapsCodec.decode(reader, reader.uint32());
        for (const p of caps.projects) a.state.upsertProject(p);
        a.snapshot.projectCaps!.projects.push(...caps.projects);
      } else reader.skip(tag & 7);
    }
    a.next++;
    // More parts to come: nothing to apply yet.
    if (a.next < a.count) return ControlMessage.decode(new Uint8Array(0));
    this.assembling = null;
    for (const t of a.tombstones) a.state.addTombstone(t);
    a.state.version = a.snapshot.version;
    a.state.view = buildConfigView(a.snapshot.config);
    prebuilt.set(a.snapshot, a.state);
    const msg = ControlMessage.decode(new Uint8Array(0));
    msg.snapshot = a.snapshot;
    return msg;
  };

  /** A whole snapshot or a first part starts an assembly; a later part continues the current one, in order. */
  private assemblyFor(part: SnapshotPart | undefined, entries: number): Assembly {
    if (!part || part.index === 0) {
      const snapshot: Snapshot = { version: 0, config: undefined, keys: [], orgs: [], tombstones: [], projectCaps: { projects: [] } };
      const count = part ? Math.max(1, part.count) : 1;
      const a: Assembly = { snapshot, state: new GatewayState(undefined, Math.max(entries, part?.entries ?? 0)), tombstones: [], next: 0, count };
      this.assembling = count > 1 ? a : null;
      return a;
    }
    const a = this.assembling;
    if (!a || part.index !== a.next || part.count !== a.count) throw this.broken(`snapshot part ${part.index} of ${part.count} came out of order`);
    return a;
  }

  /** The stream fails (its next one starts with a fresh snapshot). */
  private broken(message: string): Error {
    this.assembling = null;
    return new Error(message);
  }
}

/** Decodes one message with a decoder of its own (a whole snapshot; for tests and benchmarks). */
export function decodeControlMessage(buf: Uint8Array): ControlMessage {
  return new SnapshotDecoder().decode(buf);
}
