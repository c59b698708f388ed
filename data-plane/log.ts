// The node's structured logger (pino, JSON lines on stdout). main.ts sets the level from --log-level.
import { createLogger } from '../proto/lib/logger.js';

export const log = createLogger('data-plane', 'info');

let second = 0;
let inSecond = 0;
let suppressed = 0;
/** At most this many request error lines a second: an upstream outage must not flood the log. */
const REQUEST_ERRORS_PER_SEC = 20;

/** One error of one request, with its request id; rate-limited, counting what it drops. */
export function logRequestError(fields: Record<string, unknown>, msg: string): void {
  const sec = Math.floor(Date.now() / 1000);
  if (sec !== second) {
    if (suppressed > 0) log.warn({ suppressed }, `${suppressed} request error lines suppressed in the last second`);
    second = sec;
    inSecond = 0;
    suppressed = 0;
  }
  if (++inSecond > REQUEST_ERRORS_PER_SEC) {
    suppressed++;
    return;
  }
  log.error(fields, msg);
}

let bugsLogged = 0;
/** A bug (an exception that is not a catalog error): logged (the first 100), never thrown into uWS. */
export function logBug(err: unknown): void {
  if (bugsLogged++ < 100) log.error({ err }, `data plane bug: ${err instanceof Error ? err.message : String(err)}`);
}
