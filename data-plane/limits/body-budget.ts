// The node-wide budget for request bodies held in memory (JSON bodies are read whole before they are
// parsed). Pure and I/O-free. A body takes what arrives, chunk by chunk, never what it only declares,
// and gives it back once it is no longer held. A chunk that does not fit is refused (503, retry-after
// 1) instead of growing the node's memory. No one owner (an organisation) may hold more than a quarter
// of the budget, and the organisations of one account together no more than that either (an account
// can create organisations at will), so one customer's huge or slow bodies never starve the others.
export const DEFAULT_MAX_BUFFERED_BODY_BYTES = 256 * 1024 * 1024;
export const OWNER_SHARE = 1 / 4;
export const ACCOUNT_SHARE = 1 / 4;

/** Why bytes could not be taken: the node's budget is spent, or the owner's or its account's share. */
export type BodyBudgetRefusal = 'node' | 'owner' | 'account';

export class BodyBudget {
  private usedBytes = 0;
  private readonly byOwner = new Map<string, number>();
  private readonly byAccount = new Map<string, number>();
  readonly maxOwnerBytes: number;
  readonly maxAccountBytes: number;
  /** Chunks refused, by which limit refused them (metrics). */
  readonly refusals: Record<BodyBudgetRefusal, number> = { node: 0, owner: 0, account: 0 };

  constructor(readonly maxBytes: number = DEFAULT_MAX_BUFFERED_BODY_BYTES) {
    this.maxOwnerBytes = Math.floor(maxBytes * OWNER_SHARE);
    this.maxAccountBytes = Math.floor(maxBytes * ACCOUNT_SHARE);
  }

  /**
   * Takes `bytes` for `owner` (and its `account`, '' when unknown) if they fit; otherwise takes nothing
   * and says which limit refused.
   */
  tryTake(bytes: number, owner: string, account = ''): BodyBudgetRefusal | null {
    if (bytes <= 0) return null;
    const ownerHeld = this.byOwner.get(owner) ?? 0;
    const accountHeld = account ? (this.byAccount.get(account) ?? 0) : 0;
    let refused: BodyBudgetRefusal | null = null;
    if (ownerHeld + bytes > this.maxOwnerBytes) refused = 'owner';
    else if (account && accountHeld + bytes > this.maxAccountBytes) refused = 'account';
    else if (this.usedBytes + bytes > this.maxBytes) refused = 'node';
    if (refused) {
      this.refusals[refused]++;
      return refused;
    }
    this.usedBytes += bytes;
    this.byOwner.set(owner, ownerHeld + bytes);
    if (account) this.byAccount.set(account, accountHeld + bytes);
    return null;
  }

  give(bytes: number, owner: string, account = ''): void {
    this.usedBytes = Math.max(0, this.usedBytes - bytes);
    subtract(this.byOwner, owner, bytes);
    if (account) subtract(this.byAccount, account, bytes);
  }

  /** Bytes held now, by everyone or by one owner. For tests and metrics. */
  held(owner?: string): number {
    return owner === undefined ? this.usedBytes : (this.byOwner.get(owner) ?? 0);
  }

  /** Bytes held now by the organisations of one account. */
  heldByAccount(account: string): number {
    return this.byAccount.get(account) ?? 0;
  }
}

function subtract(m: Map<string, number>, k: string, bytes: number): void {
  const left = (m.get(k) ?? 0) - bytes;
  if (left > 0) m.set(k, left);
  else m.delete(k);
}
