// The two ways a request enters a node, and THE one place where the order of checks differs between
// them (docs/design.md#the-gate). Every check not named here runs for both, in the same order, with the
// same answer: gate.ts reads these flags and nothing else to tell the entrances apart, and
// test/e2e/gate-order.test.ts proves the shared order over real HTTP requests and WebSocket upgrades.

export interface Entrance {
  readonly name: 'http' | 'upgrade';
  /**
   * Refuse while the node drains (503 node_draining, connection closed), before any other check but
   * readiness. Upgrades only: a new WebSocket session would live past the drain and only be cut at
   * its deadline. An HTTP request that still reaches a draining node (on a kept-alive connection)
   * is short: it is served, and its connection closes after the answer (reply.ts).
   */
  readonly refusesWhileDraining: boolean;
  /**
   * Refuse while realtime sessions hold the node-wide message budget (503, realtime-memory.ts).
   * Upgrades only: an HTTP request holds no session buffers.
   */
  readonly boundBySessionMemory: boolean;
  /**
   * Refuse a declared body over the path family's cap (413), right after the edge budgets. HTTP
   * only: an upgrade is a GET without a body, and what a session sends later is bounded per message.
   */
  readonly capsBody: boolean;
  /**
   * Refuse a key offered as a `Sec-WebSocket-Protocol` (browser style), before the credential is read.
   * Upgrades only: only a WebSocket client can put one there (spec, Authentication 10: keys never go
   * in browser code).
   */
  readonly refusesKeyInSubprotocol: boolean;
  /**
   * Register in open-streams.ts once the key passed, so its policy (revocation, blocking, scope,
   * staleness) ends the request. HTTP only here: a socket registers in the same registry when it
   * opens (realtime/session.ts; an attempt refused before that holds nothing to end).
   */
  readonly registersOpenStream: boolean;
  /**
   * Where the route comes from: the route table (404, 405 + Allow), or the WebSocket endpoints (404
   * for any other path under them). uWS hands an upgrade only on the paths the realtime gateway
   * registered, so the route table's HTTP methods do not apply to it.
   */
  readonly routes: 'table' | 'sockets';
}

export const HTTP: Entrance = Object.freeze({
  name: 'http',
  refusesWhileDraining: false,
  boundBySessionMemory: false,
  capsBody: true,
  refusesKeyInSubprotocol: false,
  registersOpenStream: true,
  routes: 'table',
});

export const UPGRADE: Entrance = Object.freeze({
  name: 'upgrade',
  refusesWhileDraining: true,
  boundBySessionMemory: true,
  capsBody: false,
  refusesKeyInSubprotocol: true,
  registersOpenStream: false,
  routes: 'sockets',
});
