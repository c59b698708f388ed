// Request bodies, read from uWS `onData` (attach in the synchronous handler, rule 2 of reply.ts).
// Two ways: collect a small body whole (JSON endpoints, one copy), or expose it as a Readable that
// pauses the socket (`res.pause()`) when its consumer pushes back and resumes it on demand.
// Both count bytes as they arrive and stop at the path's cap (rule 6: the content-length check
// happens before either is attached).
import { Readable } from 'node:stream';
import type { HttpResponse } from 'uWebSockets.js';
import { GatewayError } from '../errors.js';
import type { BodyBudget, BodyBudgetRefusal } from '../limits/body-budget.js';
import { type Reply } from './reply.js';
import { logBug } from '../log.js';
import { SlotSet, type Slotted } from '../slot-set.js';

export type BodyCallback = (err: GatewayError | null, body: Buffer) => void;

const EMPTY = Buffer.alloc(0);

/** The node-wide body budget and whose bytes these are (an organisation, and the account owning it). */
export interface BodyBudgetShare {
  budget: BodyBudget;
  owner: string;
  /** The account that owns the organisation ('' when unknown): its organisations share one cap. */
  account?: string;
}

function budgetRefused(why: BodyBudgetRefusal, budget: BodyBudget): GatewayError {
  const message =
    why === 'owner'
      ? `This organisation's requests are holding their share of this node's memory for request bodies (${Math.floor(budget.maxOwnerBytes / 1048576)} MiB); retry after the time in the retry-after header.`
      : why === 'account'
        ? `The organisations of this account are holding their share of this node's memory for request bodies (${Math.floor(budget.maxAccountBytes / 1048576)} MiB); retry after the time in the retry-after header.`
        : undefined;
  return new GatewayError('NODE_BUSY', message, { retryAfterSec: 1 });
}

/** Errors after which a body's connection is closed (the rest of the body is not read, or not all of it). */
export function closesConnection(err: GatewayError): boolean {
  return err.code === 'BODY_TOO_LARGE' || err.code === 'NODE_BUSY' || err.code === 'BODY_TOO_SLOW';
}

/** The least pace a body read whole must keep (BodyWatch): a grace, then a minimum average rate. */
export interface BodyPace {
  /** Bytes per second; 0: no minimum. */
  minBytesPerSec: number;
  /** Slack before the rate applies, and kept after: a body must have `rate × (elapsed − grace)` bytes. */
  graceMs: number;
}

/** What BodyWatch watches: a body being read, and how to give up on it. */
export interface PacedBody extends Slotted {
  readonly startedAt: number;
  readonly received: number;
  tooSlow(): void;
}

/**
 * Bodies being read whole, swept once a second by one timer for the node: a body below its pace is
 * refused with 408 and its connection closed, so a client trickling bytes cannot keep budget, a slot
 * and a connection for as long as it likes. Taking the budget as bytes arrive bounds what it holds;
 * this bounds for how long.
 */
export class BodyWatch {
  private readonly reading = new SlotSet<PacedBody>();
  private timer: NodeJS.Timeout | null = null;

  constructor(
    readonly pace: BodyPace,
    readonly now: () => number = () => performance.now(),
    private readonly sweepMs = 1000,
  ) {}

  add(body: PacedBody): void {
    if (this.pace.minBytesPerSec <= 0) return;
    this.reading.add(body);
    if (!this.timer) {
      this.timer = setInterval(() => this.sweep(), this.sweepMs);
      this.timer.unref();
    }
  }

  remove(body: PacedBody): void {
    this.reading.delete(body);
    if (this.reading.size === 0 && this.timer) {
      clearInterval(this.timer);
      this.timer = null;
    }
  }

  /** Refuses every body below its pace at `now`; returns how many. */
  sweep(now: number = this.now()): number {
    const { minBytesPerSec, graceMs } = this.pace;
    let refused = 0;
    for (const body of this.reading.values()) {
      if (!this.reading.has(body)) continue;
      const owed = ((now - body.startedAt - graceMs) * minBytesPerSec) / 1000;
      if (owed <= 0 || body.received >= owed) continue;
      this.remove(body);
      refused++;
      try {
        body.tooSlow();
      } catch (err) {
        logBug(err);
      }
    }
    return refused;
  }

  get watching(): number {
    return this.reading.size;
  }
}

/**
 * Collects the whole body, at most `capBytes`. `cb` is called once, unless the client aborts first
 * (then cleanup belongs to the Reply's finish path). With a budget share, bytes are taken from the
 * node-wide budget (and the organisation's and account's shares of it) as they arrive, and given back
 * when the response has ended, since the body is held until then (parsed, forwarded, kept for
 * billing); a refused body's bytes go back at once. A chunk that does not fit gets NODE_BUSY. With a
 * watch, a body below its pace gets BODY_TOO_SLOW (408).
 */
export function collectBody(res: HttpResponse, reply: Reply, capBytes: number, contentLength: number, cb: BodyCallback, share?: BodyBudgetShare, watch?: BodyWatch): void {
  const c = new BodyCollector(reply, capBytes, cb, share, watch);
  if (share || watch) reply.onFinish(() => c.release());
  watch?.add(c);
  res.onData((chunk, isLast) => c.data(chunk, isLast));
}

/** One body being collected (a class: no closures per request beyond the two uWS and Reply need). */
class BodyCollector implements PacedBody {
  readonly owner: string;
  readonly account: string;
  private readonly budget: BodyBudget | undefined;
  readonly startedAt: number;
  /** Its slot among the bodies the watch reads (slot-set.ts). */
  slot = -1;
  heldBytes = 0;
  private parts: Buffer[] = [];
  received = 0;
  private settled = false;

  constructor(
    private readonly reply: Reply,
    private readonly capBytes: number,
    private readonly cb: BodyCallback,
    share: BodyBudgetShare | undefined,
    private readonly watch: BodyWatch | undefined,
  ) {
    this.budget = share?.budget;
    this.owner = share?.owner ?? '';
    this.account = share?.account ?? '';
    this.startedAt = watch ? watch.now() : 0;
  }

  release(): void {
    this.watch?.remove(this);
    if (this.budget && this.heldBytes > 0) this.budget.give(this.heldBytes, this.owner, this.account);
    this.heldBytes = 0;
  }

  tooSlow(): void {
    if (this.settled || this.reply.done) return;
    // A client this slow is not waited for: no lingering close.
    this.reply.noLinger = true;
    this.settle(new GatewayError('BODY_TOO_SLOW'), EMPTY);
  }

  private settle(err: GatewayError | null, body: Buffer): void {
    this.settled = true;
    this.parts = [];
    this.watch?.remove(this);
    try {
      this.cb(err, body);
    } finally {
      // A refused body is dropped now; a read one is held until the response ends.
      if (err) this.release();
    }
  }

  data(chunk: ArrayBuffer, isLast: boolean): void {
    try {
      if (this.settled || this.reply.done) return;
      const { budget } = this;
      const n = chunk.byteLength;
      this.reply.bodyArrived(n, isLast);
      if (this.received + n > this.capBytes) return this.settle(new GatewayError('BODY_TOO_LARGE'), EMPTY);
      if (budget && n > 0) {
        const refused = budget.tryTake(n, this.owner, this.account);
        if (refused) return this.settle(budgetRefused(refused, budget), EMPTY);
        this.heldBytes += n;
      }
      // Copy: uWS detaches the ArrayBuffer when this callback returns (rule 5).
      if (n > 0) this.parts.push(Buffer.from(new Uint8Array(chunk)));
      this.received += n;
      if (isLast) {
        const parts = this.parts;
        // Usually one chunk: no second copy.
        const body = parts.length === 0 ? EMPTY : parts.length === 1 ? parts[0] : Buffer.concat(parts, this.received);
        this.settle(null, body);
      }
    } catch (err) {
      logBug(err);
    }
  }
}

/** Takes chunks synchronously: `chunk` is a view of uWS's buffer, valid only during the call (rule 5). */
export type BodySink = (chunk: Buffer, isLast: boolean) => void;

/**
 * A request body as a Readable with backpressure onto the client's socket. Its chunks can instead be
 * diverted to a sink that copies only what it keeps (the multipart scan), so a large upload costs no
 * allocation per chunk.
 */
export class BodyStream extends Readable {
  received = 0;
  private paused = false;
  private sink: BodySink | null = null;
  /** The last chunk arrived while diverted. */
  private endedDiverted = false;
  /** The last chunk arrived while not diverted (the Readable was ended). */
  private endedBuffered = false;
  private readonly reply: Reply;

  constructor(res: HttpResponse, reply: Reply, capBytes: number) {
    super();
    this.reply = reply;
    res.onData((chunk, isLast) => {
      try {
        if (this.destroyed || reply.done) return;
        const n = chunk.byteLength;
        reply.bodyArrived(n, isLast);
        this.received += n;
        if (this.received > capBytes) {
          this.destroy(new GatewayError('BODY_TOO_LARGE'));
          return;
        }
        if (this.sink) {
          // Consumed synchronously: a view, not a copy (rule 5).
          if (isLast) this.endedDiverted = true;
          this.sink(Buffer.from(chunk, 0, n), isLast);
          return;
        }
        // Buffer.from(Uint8Array) copies (rule 5).
        const more = n > 0 ? this.push(Buffer.from(new Uint8Array(chunk))) : true;
        if (isLast) {
          this.endedBuffered = true;
          this.push(null);
        } else if (!more && !this.paused) {
          this.paused = true;
          reply.pause();
        }
      } catch (err) {
        logBug(err);
      }
    });
    reply.onFinish((aborted) => {
      if (aborted && !this.readableEnded) this.destroy(new Error('client closed the connection'));
    });
  }

  /**
   * Until `undivert()`, chunks go to `sink` as they arrive; it stops the socket with `hold()`. Chunks
   * already buffered (they arrived while admission waited for a lease) go first, and the socket that
   * buffer paused is read again.
   */
  divert(sink: BodySink): void {
    this.sink = sink;
    const buffered: Buffer[] = [];
    for (let c = this.read() as Buffer | null; c !== null; c = this.read() as Buffer | null) buffered.push(c);
    if (this.endedBuffered) this.endedDiverted = true;
    for (let i = 0; i < buffered.length; i++) sink(buffered[i], this.endedBuffered && i === buffered.length - 1);
    if (this.endedBuffered && buffered.length === 0) sink(Buffer.alloc(0), true);
    this.release();
  }

  /**
   * Back to a Readable: later chunks are buffered for its reader (a body that ended while diverted
   * ends), and the socket is read again up to the buffer's limit, so a client going away is noticed
   * even before the reader starts.
   */
  undivert(): void {
    if (!this.sink) return;
    this.sink = null;
    // Ended while diverted: the Readable ends too (unless it had already ended before).
    if (this.endedDiverted && !this.endedBuffered) this.push(null);
    this.release();
  }

  /** Stops reading the client's socket (a diverted sink's backpressure). */
  hold(): void {
    if (this.paused || this.destroyed) return;
    this.paused = true;
    this.reply.pause();
  }

  /** Reads the client's socket again. */
  release(): void {
    if (!this.paused) return;
    this.paused = false;
    this.reply.resume();
  }

  /**
   * The rest of the body is not wanted (the request is answered before it was read): drop it as it
   * arrives, and unpause the client's socket, which `done` would otherwise leave paused for good.
   * Call before answering.
   */
  discard(): void {
    this.sink = null;
    this.destroy();
    this.release();
  }

  override _read(): void {
    if (!this.sink) this.release();
  }
}

export function streamBody(res: HttpResponse, reply: Reply, capBytes: number): BodyStream {
  return new BodyStream(res, reply, capBytes);
}
