// The control plane's structured logger (pino, JSON lines on stdout). main.ts sets the level from
// --log-level.
import { createLogger } from '../proto/lib/logger.js';

export const log = createLogger('control-plane', 'info');

const INTERNAL = /\binternal error\b/;
const PROBLEM = /\b(failed|not written|not reloaded|refused|mismatch)\b/;

/**
 * The `(line, fields?)` callback the services take: one event per call, its level read from the line
 * (internal errors: error; failures and refusals: warn; the rest: info).
 */
export function logLine(line: string, fields?: Record<string, unknown>): void {
  const level = INTERNAL.test(line) ? 'error' : PROBLEM.test(line) ? 'warn' : 'info';
  if (fields) log[level](fields, line);
  else log[level](line);
}
