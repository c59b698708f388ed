// Small helpers shared by the lease ledgers (key-lease-ledger.ts, slot-ledger.ts).

/** Connection ids are `instanceId#n` (node-session.ts). */
export function instanceOf(connId: string): string {
  const i = connId.lastIndexOf('#');
  return i < 0 ? connId : connId.slice(0, i);
}

export function limitOf(n: number): number {
  return Number.isFinite(n) && n > 0 ? n : Infinity;
}

export const limitOfN = limitOf;

export function finite(n: number): number {
  return Number.isFinite(n) ? Math.max(0, n) : 0;
}

export function clamp(want: number, available: number): number {
  return Math.max(0, Math.min(Math.max(0, want), available));
}
