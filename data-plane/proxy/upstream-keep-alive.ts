// How long an idle upstream connection is kept for reuse (undici Pool `keepAliveTimeout`), for model
// providers and tool backends alike. It must be shorter than the idle timeout of the servers behind
// it: a request sent on a connection the server is closing at that moment fails (a 502 for a POST,
// which cannot be retried). Node's http server closes idle connections after 5 s, uvicorn after 5 s;
// 4 s stays below both. A server that states its own (`Keep-Alive: timeout=N`) is believed, less 2 s
// (undici's keepAliveTimeoutThreshold), up to 10 minutes.
export const UPSTREAM_KEEP_ALIVE_MS = 4_000;
