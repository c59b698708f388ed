// Pure money rules of an organisation (docs/design.md#free-grant-and-monthly-cap): the grant and the
// tier's cap are read live from the current config; no I/O here.
import type { TierSettings } from '../gateway-config/gateway-config.js';

export interface OrgMoney {
  creditsMicros: number;
  spendTotalMicros: number;
  monthSpendMicros: number;
  ownCapMicros: number | null;
}

export type BlockedReason = '' | 'balance_exhausted' | 'monthly_cap_reached';

export interface OrgState {
  freeGrantMicros: number;
  /** free grant + credits − all-time spend. */
  balanceMicros: number;
  /** Own cap if set, else the tier's; null when there is none. */
  effectiveCapMicros: number | null;
  blocked: boolean;
  blockedReason: BlockedReason;
}

/** `tier` is undefined when the config no longer has the organisation's tier: no grant, no tier cap. */
export function computeOrgState(money: OrgMoney, tier: Pick<TierSettings, 'freeGrantMicros' | 'monthlyCapMicros'> | undefined): OrgState {
  const freeGrantMicros = tier?.freeGrantMicros ?? 0;
  const balanceMicros = freeGrantMicros + money.creditsMicros - money.spendTotalMicros;
  const effectiveCapMicros = money.ownCapMicros ?? tier?.monthlyCapMicros ?? null;
  let blockedReason: BlockedReason = '';
  if (balanceMicros <= 0) blockedReason = 'balance_exhausted';
  else if (effectiveCapMicros !== null && money.monthSpendMicros >= effectiveCapMicros) blockedReason = 'monthly_cap_reached';
  return { freeGrantMicros, balanceMicros, effectiveCapMicros, blocked: blockedReason !== '', blockedReason };
}
