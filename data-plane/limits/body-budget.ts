// The node-wide budget for request bodies held in memory (JSON bodies are read whole before they are
// parsed). Pure and I/O-free. A body with a known length takes its whole length before the first byte
// is read; a chunked body takes what arrives. A body that does not fit is refused (503, retry-after 1)
// instead of growing the node's memory: one client's huge or many bodies never starve the others.
export const DEFAULT_MAX_BUFFERED_BODY_BYTES = 256 * 1024 * 1024;

export class BodyBudget {
  private usedBytes = 0;

  constructor(readonly maxBytes: number = DEFAULT_MAX_BUFFERED_BODY_BYTES) {}

  /** Takes `bytes` if they fit; false (nothing taken) otherwise. */
  tryTake(bytes: number): boolean {
    if (bytes <= 0) return true;
    if (this.usedBytes + bytes > this.maxBytes) return false;
    this.usedBytes += bytes;
    return true;
  }

  give(bytes: number): void {
    this.usedBytes = Math.max(0, this.usedBytes - bytes);
  }

  /** Bytes held now. For tests and metrics. */
  get held(): number {
    return this.usedBytes;
  }
}
