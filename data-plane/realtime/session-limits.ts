// After each response of a session: is the key's tpm spent, or the organisation's money (its
// project's cap, the key's own limit)? Then the socket closes once no response is in flight, never in
// the middle of one: 1013 for tokens, 1008 for money, with a reason a client can branch on. A money
// slice still on its way is waited for (woken by its grant), not taken as spent.
import type { KeyRecord } from '../state/key-table.js';
import { closeReasonOf, endError } from '../errors.js';
import { secondsToNextMinute, type Clock } from '../limits/clock.js';
import type { KeyBudgets } from '../limits/key-budgets.js';
import type { LeaseClient } from '../leases/lease-client.js';
import { cancelMoneyWait, moneyVerdict, waitForMoney } from '../leases/request-money.js';
import { CLOSE } from '../endpoints/close-codes.js';

export interface SessionLimitsDeps {
  clock: Clock;
  keyBudgets: KeyBudgets;
  leases?: LeaseClient;
}

export class SessionLimits {
  /** The close decided, waiting for the response in flight to end. */
  pendingClose: { code: number; reason: string } | null = null;
  private orgWake: (() => void) | null = null;

  constructor(
    private readonly deps: SessionLimitsDeps,
    private readonly key: KeyRecord,
    /** Called when a money slice that was on its way arrived and was checked. */
    private readonly recheck: () => void,
  ) {}

  /** After a response: the key's tokens, then the money. */
  check(): void {
    // The key's tpm spent: the next turn would be refused; the socket closes after the response in flight.
    const headers = this.deps.keyBudgets.headers(this.key.limits);
    if (headers.limitTokens > 0 && headers.remainingTokens <= 0) {
      const retry = secondsToNextMinute(this.deps.clock.now());
      this.closeAfterResponse(CLOSE.TRY_AGAIN_LATER, `tokens: the key's tokens per minute (${headers.limitTokens}) are spent; retry after ${retry} s`);
    }
    this.checkMoney();
  }

  /** The session ended: no more waiting for money. */
  stop(): void {
    if (this.orgWake && this.deps.leases) cancelMoneyWait(this.deps.leases, this.key, this.orgWake);
    this.orgWake = null;
  }

  /** The organisation's money: spent (close), on its way (wait for the control plane), or there. */
  private checkMoney(): void {
    const org = this.key.org;
    // The organisation's money, the project's cap and the key's own limit (docs/money-limits.md).
    const leases = this.deps.leases;
    const money = org.blocked ? null : leases ? moneyVerdict(leases, this.key, this.deps.clock.now()) : { verdict: 'yes' as const };
    if (money === null || money.verdict === 'no') {
      this.closeAfterResponse(CLOSE.POLICY, money && money.pool ? `insufficient_quota: ${money.short}` : closeReasonOf(endError('org_blocked', { blockedReason: org.blockedReason })));
    } else if (money.verdict === 'wait' && !this.orgWake) {
      const wake = () => {
        this.orgWake = null;
        setImmediate(() => {
          this.checkMoney();
          this.recheck();
        });
      };
      if (leases && waitForMoney(leases, money.pool, wake)) this.orgWake = wake;
    }
  }

  private closeAfterResponse(code: number, reason: string): void {
    this.pendingClose ??= { code, reason };
  }
}
