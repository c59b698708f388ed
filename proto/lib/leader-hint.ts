// How a control plane that does not lead says who does, and how nodes and the CLI read it: the
// details of a gRPC UNAVAILABLE (docs/design.md#several-control-planes-on-one-database).

const HINT_RE = /the leader is at (\S+?)\.?$/;

/** The details of a standby's (or a deposed leader's) UNAVAILABLE. */
export function standbyDetails(leaderAddress: string): string {
  return leaderAddress
    ? `this control plane is a standby: the leader is at ${leaderAddress}`
    : 'this control plane is a standby: no leader has said its address yet';
}

/** The leader an UNAVAILABLE's details name, or null. */
export function leaderFromDetails(details: string | undefined): string | null {
  return HINT_RE.exec(details ?? '')?.[1] ?? null;
}

/** True when the details are a standby's refusal: nothing was done, the call may go elsewhere. */
export function isStandbyRefusal(details: string | undefined): boolean {
  return (details ?? '').startsWith('this control plane is a standby');
}

/** `a:1,b:2` as a list of HOST:PORT (a flag or variable that names several control planes). */
export function splitAddresses(value: string): string[] {
  return value.split(',').map((s) => s.trim()).filter((s) => s !== '');
}
