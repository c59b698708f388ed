import { test } from 'node:test';
import assert from 'node:assert/strict';
import { computeOrgState } from '../../control-plane/state/org-state.js';

const free = { freeGrantMicros: 5_000_000, monthlyCapMicros: 5_000_000 };
const paid = { freeGrantMicros: 0, monthlyCapMicros: null };
const money = (credits: number, total: number, month: number, ownCap: number | null = null) => ({
  creditsMicros: credits,
  spendTotalMicros: total,
  monthSpendMicros: month,
  ownCapMicros: ownCap,
});

test('blocked state: balance first, then the effective monthly cap', () => {
  const cases: [string, ReturnType<typeof money>, typeof free | typeof paid | undefined, number, number | null, string][] = [
    ['new free org', money(0, 0, 0), free, 5_000_000, 5_000_000, ''],
    ['free org spent 4.99', money(0, 4_990_000, 4_990_000), free, 10_000, 5_000_000, ''],
    ['free org spent its grant', money(0, 5_000_000, 5_000_000), free, 0, 5_000_000, 'balance_exhausted'],
    ['free org with credits reaches the tier cap', money(10_000_000, 5_000_000, 5_000_000), free, 10_000_000, 5_000_000, 'monthly_cap_reached'],
    ['free org, last month spent, cap starts over', money(10_000_000, 5_000_000, 0), free, 10_000_000, 5_000_000, ''],
    ['new paid org has no grant', money(0, 0, 0), paid, 0, null, 'balance_exhausted'],
    ['paid org credited', money(1_000_000, 0, 0), paid, 1_000_000, null, ''],
    ['paid org overspent', money(1_000_000, 1_200_000, 1_200_000), paid, -200_000, null, 'balance_exhausted'],
    ['paid org own cap reached', money(9_000_000, 2_000_000, 2_000_000, 2_000_000), paid, 7_000_000, 2_000_000, 'monthly_cap_reached'],
    ['own cap above the tier cap wins', money(20_000_000, 6_000_000, 6_000_000, 10_000_000), free, 19_000_000, 10_000_000, ''],
    ['own cap of zero blocks', money(0, 0, 0, 0), free, 5_000_000, 0, 'monthly_cap_reached'],
    ['tier gone from the config', money(1, 0, 0), undefined, 1, null, ''],
  ];
  for (const [name, m, tier, balance, cap, reason] of cases) {
    const s = computeOrgState(m, tier);
    assert.equal(s.balanceMicros, balance, name);
    assert.equal(s.effectiveCapMicros, cap, name);
    assert.equal(s.blockedReason, reason, name);
    assert.equal(s.blocked, reason !== '', name);
  }
});
