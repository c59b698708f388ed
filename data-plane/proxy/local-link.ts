// An upstream that answers in-process (the demo models, realtime and the Responses socket): what it
// says is queued and delivered on a later tick, as a network upstream's messages would be, never from
// inside the caller's `send`. `pause` holds the queue (the client is not reading), `close` drops it.
import { Fifo } from '../limits/fifo.js';
import type { UpstreamEvents, UpstreamLink } from './upstream-link.js';

export abstract class LocalUpstreamLink implements UpstreamLink {
  events: UpstreamEvents | null = null;
  protected closed = false;
  private queue = new Fifo<Buffer>();
  private queuedBytes = 0;
  private flushing = false;

  /** `paused`: whether the link starts held (until the session resumes it). */
  constructor(private paused: boolean) {}

  abstract send(data: Buffer, isBinary: boolean): void;

  /** Events produced and not yet taken (a client that asks for responses but does not read them). */
  get bufferedAmount(): number {
    return this.queuedBytes;
  }

  pause(): void {
    this.paused = true;
  }

  resume(): void {
    this.paused = false;
    this.flush();
  }

  close(): void {
    this.closed = true;
    this.queue = new Fifo<Buffer>();
    this.queuedBytes = 0;
  }

  protected emit(ev: object): void {
    if (this.closed) return;
    const data = Buffer.from(JSON.stringify(ev));
    this.queue.push(data);
    this.queuedBytes += data.length;
    if (!this.flushing) {
      this.flushing = true;
      setImmediate(() => {
        this.flushing = false;
        this.flush();
      });
    }
  }

  private flush(): void {
    while (!this.paused && !this.closed && this.events && this.queue.size > 0) {
      const data = this.queue.shift()!;
      this.queuedBytes -= data.length;
      this.events.message(data, false);
    }
  }
}
