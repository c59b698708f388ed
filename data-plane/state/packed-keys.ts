// The node's keys packed into a few large typed arrays instead of one JS object per key (issue 19,
// target 6: a million keys in a few hundred bytes each at most). A key is a record number; its fields
// live in parallel arrays:
//   - the 32-byte hash in one Buffer (record i at i * 32), found through an open-addressing index
//     (linear probing, Uint32Array of record + 1, at most half full, backward-shift deletion);
//   - the key id as UTF-8 bytes in an arena Buffer (offset + length), found through a second index;
//   - project id, organisation id, the allowed-model set and the limits as numbers into interned tables
//     (most keys share them);
//   - expiry in a Float64Array, and a state byte: free, live or revoked (a revoked record is still
//     found by hash so a refusal can be logged against its key, but it never authenticates).
// Pure data structure: no I/O, no knowledge of organisations' state (key-table.ts owns that).
import { createHash, timingSafeEqual } from 'node:crypto';

const FREE = 0;
const LIVE = 1;
const REVOKED = 2;

/** 64 lowercase hex digits: the form hashKey gives, stored as its 32 bytes. */
function isHex64(s: string): boolean {
  if (s.length !== 64) return false;
  for (let i = 0; i < 64; i++) {
    const c = s.charCodeAt(i);
    if (!((c >= 48 && c <= 57) || (c >= 97 && c <= 102))) return false;
  }
  return true;
}
const MIN_CAPACITY = 16;

/** The limits of a key, as stored (interned: many keys share one triple). */
export interface PackedLimits {
  readonly rpmLimit: number;
  readonly tpmLimit: number;
  readonly maxParallel: number;
}

/** What a record holds, as given to `put`. */
export interface PackedKeyInput {
  keyId: string;
  keyHash: string;
  projectId: string;
  orgId: string;
  allowedModels: readonly string[];
  rpmLimit: number;
  tpmLimit: number;
  maxParallel: number;
  expiresAtMs: number;
}

const NO_MODELS: ReadonlySet<string> = new Set();
const same = (s: string): string => s;

function pow2AtLeast(n: number): number {
  let p = MIN_CAPACITY;
  while (p < n) p *= 2;
  return p;
}

/** FNV-1a over the UTF-16 code units of a string (the key-id index's hash). */
function strHash(s: string): number {
  let h = 0x811c9dc5;
  for (let i = 0; i < s.length; i++) {
    h ^= s.charCodeAt(i);
    h = Math.imul(h, 0x01000193);
  }
  return h >>> 0;
}

/** Interns values by a string key: each distinct one stored once, referred to by number. */
class Interner<T> {
  readonly values: T[] = [];
  private readonly ids = new Map<string, number>();
  id(key: string, make: (key: string) => T): number {
    let id = this.ids.get(key);
    if (id === undefined) {
      id = this.values.length;
      this.values.push(make(key));
      this.ids.set(key, id);
    }
    return id;
  }
}

export class PackedKeyTable {
  private cap = 0;
  /** Records ever used (records at or above are free and unused); freed records below go to `freeList`. */
  private used = 0;
  private readonly freeList: number[] = [];
  private hashes = Buffer.alloc(0);
  private state = new Uint8Array(0);
  private idOff = new Uint32Array(0);
  private idLen = new Uint16Array(0);
  private project = new Uint32Array(0);
  private org = new Uint32Array(0);
  private models = new Uint32Array(0);
  private limitsOf = new Uint32Array(0);
  private expires = new Float64Array(0);
  /** Key-id bytes; a record rewritten with a longer id appends (the old bytes are waste until a rebuild). */
  private arena = Buffer.alloc(0);
  private arenaUsed = 0;
  private hashIndex = new Uint32Array(0);
  private idIndex = new Uint32Array(0);
  private mask = 0;
  /** Key hashes that are not 64 lowercase hex digits (tests, or a future format): stored as sha256 of the text. */
  private readonly oddHashes = new Map<number, string>();
  private readonly strings = new Interner<string>();
  private readonly modelSets = new Interner<ReadonlySet<string>>();
  private readonly limitSets = new Interner<PackedLimits>();
  private lastLimitsId = -1;
  private scratch = Buffer.alloc(256);
  private readonly digest32 = Buffer.alloc(32);
  private nLive = 0;
  private nRevoked = 0;

  constructor(expected = 0) {
    this.modelSets.id('', () => NO_MODELS);
    this.grow(Math.max(MIN_CAPACITY, expected));
  }

  get liveCount(): number {
    return this.nLive;
  }

  get revokedCount(): number {
    return this.nRevoked;
  }

  /** Bytes held in the table's arrays and arena (not counting the interned values, few by design). */
  get byteSize(): number {
    const arrays = [this.hashes, this.state, this.idOff, this.idLen, this.project, this.org, this.models, this.limitsOf, this.expires, this.arena, this.hashIndex, this.idIndex];
    return arrays.reduce((n, a) => n + a.byteLength, 0);
  }

  // ---- reads ---------------------------------------------------------------------------------------

  /** The live or revoked record whose hash is `digest` (32 bytes), else -1. Candidate found by the index, confirmed in constant time. */
  findDigest(digest: Buffer): number {
    const rec = this.probeHash(digest);
    if (rec < 0) return -1;
    const off = rec * 32;
    return timingSafeEqual(digest, this.hashes.subarray(off, off + 32)) ? rec : -1;
  }

  /** The live or revoked record of a hash as synced (hex text), else -1. */
  findHash(keyHash: string): number {
    const d = this.digestOf(keyHash);
    const rec = this.probeHash(d);
    if (rec < 0) return -1;
    if (this.oddHashes.size > 0 && (this.oddHashes.get(rec) ?? null) !== (isHex64(keyHash) ? null : keyHash)) return -1;
    return rec;
  }

  isLive(rec: number): boolean {
    return this.state[rec] === LIVE;
  }

  keyId(rec: number): string {
    const off = this.idOff[rec];
    return this.arena.toString('utf8', off, off + this.idLen[rec]);
  }

  keyHash(rec: number): string {
    return this.oddHashes.get(rec) ?? this.hashes.toString('hex', rec * 32, rec * 32 + 32);
  }

  projectId(rec: number): string {
    return this.strings.values[this.project[rec]];
  }

  orgId(rec: number): string {
    return this.strings.values[this.org[rec]];
  }

  allowedModels(rec: number): ReadonlySet<string> {
    return this.modelSets.values[this.models[rec]];
  }

  limits(rec: number): PackedLimits {
    return this.limitSets.values[this.limitsOf[rec]];
  }

  expiresAtMs(rec: number): number {
    return this.expires[rec];
  }

  /** Live records' hashes (hex). */
  *liveHashes(): IterableIterator<string> {
    for (let rec = 0; rec < this.used; rec++) if (this.state[rec] === LIVE) yield this.keyHash(rec);
  }

  /** The live record of a key id, else -1. */
  findKeyId(keyId: string, idHash = strHash(keyId)): number {
    let slot = idHash & this.mask;
    for (;;) {
      const v = this.idIndex[slot];
      if (v === 0) return -1;
      if (this.idMatches(v - 1, keyId)) return v - 1;
      slot = (slot + 1) & this.mask;
    }
  }

  /** Whether a record's key id is `keyId`: byte by byte against the arena (through UTF-8 when not ASCII). */
  private idMatches(rec: number, keyId: string): boolean {
    const len = this.idLen[rec];
    const off = this.idOff[rec];
    const a = this.arena;
    if (len === keyId.length) {
      let i = 0;
      for (; i < len; i++) {
        const c = keyId.charCodeAt(i);
        if (c >= 0x80 || a[off + i] !== c) break;
      }
      if (i === len) return true;
      if (keyId.charCodeAt(i) < 0x80) return false;
    }
    const n = this.writeScratch(keyId);
    return n === len && a.compare(this.scratch, 0, n, off, off + n) === 0;
  }

  // ---- writes --------------------------------------------------------------------------------------

  /**
   * Makes a key live: rewrites its record in place when its hash is known (live or revoked), moves it
   * when its key id had another hash (the old hash is forgotten), else takes a new record. The record.
   */
  put(k: PackedKeyInput): number {
    const idHash = strHash(k.keyId);
    const prior = this.findKeyId(k.keyId, idHash);
    let rec = this.findHash(k.keyHash);
    if (prior >= 0 && prior !== rec) this.free(prior);
    if (rec >= 0) {
      if (this.state[rec] === LIVE) {
        // Re-indexed under its (possibly new) key id below; another key id that held this hash no longer finds it.
        this.idIndexDelete(rec);
        this.nLive--;
      } else {
        this.nRevoked--;
      }
    } else {
      rec = this.alloc();
      this.writeHash(rec, k.keyHash);
      this.hashIndexInsert(rec);
    }
    this.state[rec] = LIVE;
    this.nLive++;
    this.writeFields(rec, k.keyId, k.projectId, k.orgId);
    this.models[rec] = k.allowedModels.length === 0 ? 0 : this.modelSets.id([...k.allowedModels].sort().join('\n'), () => new Set(k.allowedModels));
    const last = this.lastLimitsId >= 0 ? this.limitSets.values[this.lastLimitsId] : undefined;
    if (!last || last.rpmLimit !== k.rpmLimit || last.tpmLimit !== k.tpmLimit || last.maxParallel !== k.maxParallel) {
      this.lastLimitsId = this.limitSets.id(`${k.rpmLimit} ${k.tpmLimit} ${k.maxParallel}`, () => Object.freeze({ rpmLimit: k.rpmLimit, tpmLimit: k.tpmLimit, maxParallel: k.maxParallel }));
    }
    this.limitsOf[rec] = this.lastLimitsId;
    this.expires[rec] = k.expiresAtMs;
    this.idIndexInsert(rec, idHash);
    return rec;
  }

  /** Revokes a live key (it stays findable by hash, never by key id). False when not live. */
  revoke(keyHash: string): boolean {
    const rec = this.findHash(keyHash);
    if (rec < 0 || this.state[rec] !== LIVE) return false;
    this.idIndexDelete(rec);
    this.state[rec] = REVOKED;
    this.nLive--;
    this.nRevoked++;
    return true;
  }

  /** Records a revoked key known only by its tombstone; nothing when the hash is live. */
  putRevoked(keyHash: string, keyId: string, projectId: string, orgId: string): void {
    let rec = this.findHash(keyHash);
    if (rec >= 0 && this.state[rec] === LIVE) return;
    if (rec < 0) {
      rec = this.alloc();
      this.writeHash(rec, keyHash);
      this.hashIndexInsert(rec);
      this.state[rec] = REVOKED;
      this.nRevoked++;
    }
    this.writeFields(rec, keyId, projectId, orgId);
    this.models[rec] = 0;
    this.expires[rec] = 0;
  }

  /** Forgets a record entirely (its hash is no longer found). */
  private free(rec: number): void {
    if (this.state[rec] === LIVE) {
      this.idIndexDelete(rec);
      this.nLive--;
    } else if (this.state[rec] === REVOKED) {
      this.nRevoked--;
    } else {
      return;
    }
    this.hashIndexDelete(rec);
    this.state[rec] = FREE;
    this.oddHashes.delete(rec);
    this.freeList.push(rec);
  }

  // ---- internals -----------------------------------------------------------------------------------

  /** The 32 bytes a synced hash is stored as, in `digest32` (overwritten by the next call). */
  private digestOf(keyHash: string): Buffer {
    if (isHex64(keyHash)) this.digest32.write(keyHash, 0, 'hex');
    else createHash('sha256').update(keyHash).digest().copy(this.digest32);
    return this.digest32;
  }

  private writeHash(rec: number, keyHash: string): void {
    this.digestOf(keyHash).copy(this.hashes, rec * 32);
    if (!isHex64(keyHash)) this.oddHashes.set(rec, keyHash);
  }

  private writeFields(rec: number, keyId: string, projectId: string, orgId: string): void {
    const len = Buffer.byteLength(keyId);
    if (len > 0xffff) throw new Error('key id too long');
    // A record's old bytes are reused when the new id fits in them (a fresh record has none).
    if (this.idLen[rec] < len) {
      if (this.arenaUsed + len > this.arena.length) {
        const next = Buffer.alloc(Math.max(Math.ceil(this.arena.length * 1.5), this.arenaUsed + len, 1024));
        this.arena.copy(next, 0, 0, this.arenaUsed);
        this.arena = next;
      }
      this.idOff[rec] = this.arenaUsed;
      this.arenaUsed += len;
    }
    this.arena.write(keyId, this.idOff[rec], len, 'utf8');
    this.idLen[rec] = len;
    this.project[rec] = this.strings.id(projectId, same);
    this.org[rec] = this.strings.id(orgId, same);
  }

  private writeScratch(s: string): number {
    const need = Buffer.byteLength(s);
    if (need > this.scratch.length) this.scratch = Buffer.alloc(need * 2);
    return this.scratch.write(s, 0, 'utf8');
  }

  private alloc(): number {
    const reuse = this.freeList.pop();
    if (reuse !== undefined) return reuse;
    if (this.used === this.cap) this.grow(Math.ceil(this.cap * 1.5));
    return this.used++;
  }

  private grow(cap: number): void {
    const copy = <T extends Uint8Array | Uint16Array | Uint32Array | Float64Array>(old: T, make: (n: number) => T): T => {
      const a = make(cap);
      a.set(old);
      return a;
    };
    const hashes = Buffer.alloc(cap * 32);
    this.hashes.copy(hashes);
    this.hashes = hashes;
    this.state = copy(this.state, (n) => new Uint8Array(n));
    this.idOff = copy(this.idOff, (n) => new Uint32Array(n));
    this.idLen = copy(this.idLen, (n) => new Uint16Array(n));
    this.project = copy(this.project, (n) => new Uint32Array(n));
    this.org = copy(this.org, (n) => new Uint32Array(n));
    this.models = copy(this.models, (n) => new Uint32Array(n));
    this.limitsOf = copy(this.limitsOf, (n) => new Uint32Array(n));
    this.expires = copy(this.expires, (n) => new Float64Array(n));
    if (this.arena.length === 0) this.arena = Buffer.alloc(cap * 16);
    this.cap = cap;
    // Indexes at most half full: rebuilt at a power of two at least twice the capacity.
    const slots = pow2AtLeast(cap * 2);
    this.mask = slots - 1;
    this.hashIndex = new Uint32Array(slots);
    this.idIndex = new Uint32Array(slots);
    for (let rec = 0; rec < this.used; rec++) {
      if (this.state[rec] === FREE) continue;
      this.hashIndexInsert(rec);
      if (this.state[rec] === LIVE) this.idIndexInsert(rec);
    }
  }

  private hashHome(rec: number): number {
    return this.hashes.readUInt32LE(rec * 32) & this.mask;
  }

  private idHome(rec: number): number {
    return strHash(this.keyId(rec)) & this.mask;
  }

  private probeHash(digest: Buffer): number {
    let slot = digest.readUInt32LE(0) & this.mask;
    for (;;) {
      const v = this.hashIndex[slot];
      if (v === 0) return -1;
      const off = (v - 1) * 32;
      const h = this.hashes;
      let i = 0;
      while (i < 32 && h[off + i] === digest[i]) i++;
      if (i === 32) return v - 1;
      slot = (slot + 1) & this.mask;
    }
  }

  private hashIndexInsert(rec: number): void {
    let slot = this.hashHome(rec);
    while (this.hashIndex[slot] !== 0) slot = (slot + 1) & this.mask;
    this.hashIndex[slot] = rec + 1;
  }

  private idIndexInsert(rec: number, idHash?: number): void {
    let slot = idHash === undefined ? this.idHome(rec) : idHash & this.mask;
    while (this.idIndex[slot] !== 0) slot = (slot + 1) & this.mask;
    this.idIndex[slot] = rec + 1;
  }

  private hashIndexDelete(rec: number): void {
    deleteSlot(this.hashIndex, this.mask, rec, this.hashHome(rec), (r) => this.hashHome(r));
  }

  private idIndexDelete(rec: number): void {
    deleteSlot(this.idIndex, this.mask, rec, this.idHome(rec), (r) => this.idHome(r));
  }
}

/** Removes `rec` from a linear-probing index and shifts back the entries after it (no tombstones in the index). */
function deleteSlot(index: Uint32Array, mask: number, rec: number, home: number, homeOf: (rec: number) => number): void {
  let i = home;
  while (index[i] !== rec + 1) {
    if (index[i] === 0) return;
    i = (i + 1) & mask;
  }
  let j = i;
  for (;;) {
    j = (j + 1) & mask;
    const v = index[j];
    if (v === 0) break;
    const k = homeOf(v - 1);
    // The entry at j stays when its home lies cyclically in (i, j].
    if (i <= j ? i < k && k <= j : i < k || k <= j) continue;
    index[i] = v;
    i = j;
  }
  index[i] = 0;
}
