// The node-wide budget for request bodies held in memory (JSON bodies are read whole before they are
// parsed). Pure and I/O-free. A body with a known length takes its whole length before the first byte
// is read; a chunked body takes what arrives. A body that does not fit is refused (503, retry-after 1)
// instead of growing the node's memory. No one owner (an organisation) may hold more than a quarter of
// the budget, so one customer's huge or slow bodies never starve the others.
export const DEFAULT_MAX_BUFFERED_BODY_BYTES = 256 * 1024 * 1024;
export const OWNER_SHARE = 1 / 4;

/** Why bytes could not be taken: the node's budget is spent, or the owner's share of it. */
export type BodyBudgetRefusal = 'node' | 'owner';

export class BodyBudget {
  private usedBytes = 0;
  private readonly byOwner = new Map<string, number>();
  readonly maxOwnerBytes: number;

  constructor(readonly maxBytes: number = DEFAULT_MAX_BUFFERED_BODY_BYTES) {
    this.maxOwnerBytes = Math.floor(maxBytes * OWNER_SHARE);
  }

  /** Takes `bytes` for `owner` if they fit; otherwise takes nothing and says which limit refused. */
  tryTake(bytes: number, owner: string): BodyBudgetRefusal | null {
    if (bytes <= 0) return null;
    const ownerHeld = this.byOwner.get(owner) ?? 0;
    if (ownerHeld + bytes > this.maxOwnerBytes) return 'owner';
    if (this.usedBytes + bytes > this.maxBytes) return 'node';
    this.usedBytes += bytes;
    this.byOwner.set(owner, ownerHeld + bytes);
    return null;
  }

  give(bytes: number, owner: string): void {
    this.usedBytes = Math.max(0, this.usedBytes - bytes);
    const left = (this.byOwner.get(owner) ?? 0) - bytes;
    if (left > 0) this.byOwner.set(owner, left);
    else this.byOwner.delete(owner);
  }

  /** Bytes held now, by everyone or by one owner. For tests and metrics. */
  held(owner?: string): number {
    return owner === undefined ? this.usedBytes : (this.byOwner.get(owner) ?? 0);
  }
}
