// Structured logs of the long-running processes: one JSON line per event on stdout (pino), with a
// level, an ISO time, the process kind and its pid. Events carry ids (node, key id, request id), never
// a key, token or pepper: fields with those names are censored wherever they appear, as a safety net
// under the rule that no secret is ever passed to a logger.
import { pino, type Logger } from 'pino';

export type { Logger };

export const LOG_LEVELS = ['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent'] as const;
export type LogLevel = (typeof LOG_LEVELS)[number];

/** The message of a bad `--log-level`, or null when the value is a level. */
export function checkLogLevel(value: string): string | null {
  return (LOG_LEVELS as readonly string[]).includes(value) ? null : `--log-level must be one of ${LOG_LEVELS.join(', ')}, got ${JSON.stringify(value)}`;
}

const SECRET_FIELDS = ['token', 'nodeToken', 'operatorToken', 'authorization', 'pepper', 'apiKey', 'api_key', 'key', 'secret', 'password'];

export function createLogger(service: 'control-plane' | 'data-plane', level: LogLevel): Logger {
  return pino(
    {
      level,
      base: { service, pid: process.pid },
      timestamp: pino.stdTimeFunctions.isoTime,
      // `level` as its name ("info"), not pino's number: readable without a lookup table.
      formatters: { level: (label) => ({ level: label }) },
      redact: { paths: [...SECRET_FIELDS, ...SECRET_FIELDS.map((f) => `*.${f}`)], censor: '[redacted]' },
    },
    // Synchronous: lines keep their order with the plain process-interface lines, and nothing is lost
    // when the process exits right after logging. Logs are events, not per-request lines.
    pino.destination({ dest: 1, sync: true }),
  );
}
