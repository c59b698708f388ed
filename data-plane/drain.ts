// What a graceful drain waits for (main.ts): every kind of open work registers here once at start
// (HTTP responses; realtime sockets register the same way), so the drain can wait until nothing is
// open and, past its deadline, close what is left through each kind's own abort path.
export interface Drainable {
  /** How many are open now. */
  open(): number;
  /** Closes every open one (each records its usage as an abort); returns how many it closed. */
  closeAll(): number;
}

const drainables: Drainable[] = [];
let draining = false;

export function registerDrainable(d: Drainable): void {
  drainables.push(d);
}

export function markDrainStarted(): void {
  draining = true;
}

/**
 * True once the node drains. THE one drain flag: every HTTP response from then on closes its
 * connection when it ends (reply.ts), and the gate refuses new WebSocket sessions (gate/entrances.ts).
 */
export function isDraining(): boolean {
  return draining;
}

export function openWork(): number {
  let n = 0;
  for (const d of drainables) n += d.open();
  return n;
}

export function closeAllWork(): number {
  let n = 0;
  for (const d of drainables) n += d.closeAll();
  return n;
}
