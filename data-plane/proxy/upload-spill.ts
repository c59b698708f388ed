// The bytes of an upload that must be kept before it can be forwarded (the parts before its `model`
// field): held in memory up to a small threshold, past it written to a temporary file, so a node's
// memory stays flat however large and however many the uploads are.
//
// Bytes are copied into a few fixed blocks that are reused once written, and read back into a few
// buffers that are reused too, so a spilled upload costs no allocation per chunk either way (dead
// chunk buffers wait for a GC, V8 lets young ones reach about 32 MB first, and RSS grows with them).
// Writes and reads are async with backpressure (the request path never waits on a sync disk call).
// The file is private to the process (mode 0600, created exclusively), and `remove()` deletes it at
// any moment: while it is being opened, written, completed or read.
import { randomBytes } from 'node:crypto';
import { createWriteStream, unlink, type WriteStream } from 'node:fs';
import { open, type FileHandle } from 'node:fs/promises';
import { join } from 'node:path';
import { GatewayError } from '../errors.js';
import type { BodyBudget } from '../limits/body-budget.js';

/**
 * The node-wide budget for spilled bytes (a BodyBudget counting bytes on disk: `--max-spill-mib`) and
 * whose upload this is: an organisation, and the account owning it, each held to a share of it.
 */
export interface SpillShare {
  budget: BodyBudget;
  owner: string;
  account?: string;
}

/** Held in memory up to this; past it an upload goes to disk. */
export const SPILL_MEMORY_BYTES = 1024 * 1024;
const BLOCK_BYTES = 256 * 1024;
/** Blocks being written at most before the body is paused: the most one spill holds, with `current`. */
const MAX_WRITING_BLOCKS = 4;
const READ_CHUNK_BYTES = 64 * 1024;
/** Read buffers in rotation: a chunk's buffer is refilled this many chunks later (see `chunks`). */
const READ_BUFFERS = 4;
const EMPTY = Buffer.alloc(0);

export class UploadSpill {
  /** Bytes written to the file so far. */
  fileBytes = 0;
  /** Full blocks held in memory (before spilling). */
  private held: Buffer[] = [];
  /** Written blocks, ready for reuse. */
  private free: Buffer[] = [];
  private current: Buffer | null = null;
  private used = 0;
  private writing = 0;
  private file: WriteStream | null = null;
  private path = '';
  private fileClosed = false;
  private reader: FileHandle | null = null;
  private removed = false;
  private failure: GatewayError | null = null;
  private errorCb: ((err: GatewayError) => void) | null = null;
  private drainCb: (() => void) | null = null;
  /** Bytes taken from the spill budget (given back when the file is removed). */
  private budgeted = 0;

  constructor(
    private readonly dir: string,
    private readonly memoryBytes = SPILL_MEMORY_BYTES,
    private readonly share?: SpillShare,
  ) {}

  /** Whether some bytes went to disk. */
  get spilled(): boolean {
    return this.file !== null;
  }

  /**
   * Keeps a copy of `bytes` (they may be reused by the caller once this returns). False when the
   * file is behind: the caller stops until `onDrain`.
   */
  write(bytes: Buffer): boolean {
    if (this.removed || this.failure) return true;
    let offset = 0;
    while (offset < bytes.length) {
      if (!this.current) {
        this.current = this.free.pop() ?? Buffer.allocUnsafe(BLOCK_BYTES);
        this.used = 0;
      }
      const n = bytes.copy(this.current, this.used, offset);
      offset += n;
      this.used += n;
      if (this.used === this.current.length) {
        const block = this.current;
        this.current = null;
        this.keepBlock(block);
      }
    }
    return this.writing < MAX_WRITING_BLOCKS;
  }

  /** Calls `cb` once the file has caught up (at once if it is not behind). */
  onDrain(cb: () => void): void {
    if (this.writing < MAX_WRITING_BLOCKS || this.removed || this.failure) return void setImmediate(cb);
    this.drainCb = cb;
  }

  /** Reports a write failure while bytes are still coming (null stops reporting). */
  onError(cb: ((err: GatewayError) => void) | null): void {
    this.errorCb = cb;
  }

  /**
   * No more bytes: once the file is complete, `cb` gets the bytes still in memory (all of them when
   * nothing went to disk), handed over, not kept.
   */
  finish(cb: (err: Error | null, held: Buffer) => void): void {
    const tail = this.current ? this.current.subarray(0, this.used) : EMPTY;
    this.current = null;
    if (this.failure) return void setImmediate(cb, this.failure, EMPTY);
    if (this.removed) return void setImmediate(cb, new Error('the upload was removed'), EMPTY);
    const file = this.file;
    if (!file) {
      const held = this.held.length === 0 ? tail : Buffer.concat([...this.held, tail]);
      this.held = [];
      return void setImmediate(cb, null, held);
    }
    let called = false;
    const once = (err: Error | null) => {
      if (called) return;
      called = true;
      cb(err, EMPTY);
    };
    file.once('finish', () => once(this.failure));
    file.once('close', () => once(this.failure ?? new Error('the upload was removed')));
    if (tail.length > 0) this.toFile(tail);
    file.end();
  }

  /**
   * The bytes on disk, in order, read as they are pulled (nothing when none went to disk). A chunk is
   * valid until the consumer pulls the 4th after it: its buffer is then refilled. That suits a consumer
   * that pulls the next chunk only once it handed the last to its socket, whose write buffer holds far
   * less than those chunks (undici, pulling an async iterable body: it waits for 'drain' whenever the
   * socket's buffer is over its high-water mark, 16 KiB).
   */
  async *chunks(): AsyncGenerator<Buffer> {
    if (!this.file) return;
    if (this.removed) throw new Error('the upload was removed');
    const handle = await open(this.path, 'r');
    this.reader = handle;
    try {
      const buffers = Array.from({ length: READ_BUFFERS }, () => Buffer.allocUnsafe(READ_CHUNK_BYTES));
      let position = 0;
      for (let i = 0; position < this.fileBytes; i++) {
        if (this.removed) throw new Error('the upload was removed');
        const buf = buffers[i % READ_BUFFERS];
        const { bytesRead } = await handle.read(buf, 0, Math.min(buf.length, this.fileBytes - position), position);
        if (bytesRead === 0) throw new Error('the spilled upload is shorter than what was written');
        position += bytesRead;
        yield buf.subarray(0, bytesRead);
      }
    } finally {
      this.reader = null;
      await handle.close().catch(() => {});
    }
  }

  /** Deletes the file, however far writing or reading got; idempotent. */
  remove(): void {
    if (this.removed) return;
    this.removed = true;
    if (this.share && this.budgeted > 0) this.share.budget.give(this.budgeted, this.share.owner, this.share.account);
    this.budgeted = 0;
    this.held = [];
    this.free = [];
    this.current = null;
    // Closes after any read in flight; a later read then fails and ends the consumer's iteration.
    void this.reader?.close().catch(() => {});
    const file = this.file;
    if (!file) return;
    const path = this.path;
    // Once the file is closed its open() has completed, so the name exists (or never will).
    const unlinkIt = () => unlink(path, () => {});
    if (this.fileClosed) unlinkIt();
    else {
      file.once('close', unlinkIt);
      file.destroy();
    }
  }

  private keepBlock(block: Buffer): void {
    if (this.file) return this.toFile(block);
    this.held.push(block);
    if (this.held.length * BLOCK_BYTES <= this.memoryBytes) return;
    this.open();
    for (const b of this.held.splice(0)) this.toFile(b);
  }

  private open(): void {
    this.path = join(this.dir, `tollgate-upload-${randomBytes(12).toString('hex')}`);
    const file = createWriteStream(this.path, { flags: 'wx', mode: 0o600 });
    file.on('close', () => {
      this.fileClosed = true;
    });
    file.on('error', (err) => {
      if (this.failure || this.removed) return;
      logSpillFailure(this.dir, err);
      this.fail(new GatewayError('INTERNAL', 'The gateway could not store the upload for forwarding; retry later.'));
    });
    this.file = file;
  }

  private fail(err: GatewayError): void {
    if (this.failure || this.removed) return;
    this.failure = err;
    this.errorCb?.(err);
  }

  private toFile(block: Buffer): void {
    if (this.failure) return;
    const share = this.share;
    if (share) {
      const refused = share.budget.tryTake(block.length, share.owner, share.account);
      if (refused) return this.fail(spillRefused(refused, share.budget));
      this.budgeted += block.length;
    }
    this.fileBytes += block.length;
    this.writing++;
    this.file!.write(block, (err) => {
      this.writing--;
      // A full block is free again once written; a partial one (the last) is not reused.
      if (!err && !this.removed && block.length === BLOCK_BYTES) this.free.push(block);
      const cb = this.drainCb;
      if (cb && (this.writing < MAX_WRITING_BLOCKS || this.removed || this.failure)) {
        this.drainCb = null;
        cb();
      }
    });
  }
}

function spillRefused(why: 'node' | 'owner' | 'account', budget: BodyBudget): GatewayError {
  const mib = (n: number) => Math.floor(n / 1048576);
  const message =
    why === 'node'
      ? "This gateway node's room for uploads in progress is spent; retry after the time in the retry-after header."
      : `The ${why === 'owner' ? "organisation's" : "account's"} uploads in progress are holding their share of this gateway node's room for uploads (${mib(why === 'owner' ? budget.maxOwnerBytes : budget.maxAccountBytes)} MiB); retry after the time in the retry-after header.`;
  return new GatewayError('NODE_BUSY', message, { retryAfterSec: 1 });
}

let failuresLogged = 0;
function logSpillFailure(dir: string, err: Error): void {
  if (failuresLogged++ < 100) console.error(`data plane: cannot spill an upload to ${dir}: ${(err as NodeJS.ErrnoException).code ?? err.message}`);
}
