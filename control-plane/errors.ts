// The control plane's one error catalog: stable code → gRPC status. Domain code throws CpError only;
// anything else reaching a handler is a bug, answered as INTERNAL and logged once (without secrets).
import { status, type ServiceError, Metadata } from '@grpc/grpc-js';
import { randomBytes } from 'node:crypto';

export const ERROR_CATALOG = {
  UNAUTHENTICATED: status.UNAUTHENTICATED,
  PERMISSION_DENIED: status.PERMISSION_DENIED,
  NOT_FOUND: status.NOT_FOUND,
  INVALID_ARGUMENT: status.INVALID_ARGUMENT,
  CONFIG_INVALID: status.INVALID_ARGUMENT,
  FAILED_PRECONDITION: status.FAILED_PRECONDITION,
  PEPPER_MISMATCH: status.FAILED_PRECONDITION,
  RATE_LIMITED: status.RESOURCE_EXHAUSTED,
  /**
   * This control plane lost the lead (a fenced write). The leader gate answers the call as a standby
   * (UNAVAILABLE naming the leader) once the lead is given up; this is what reaches it before that.
   */
  NOT_LEADER: status.FAILED_PRECONDITION,
  INTERNAL: status.INTERNAL,
} as const;

export type ErrorCode = keyof typeof ERROR_CATALOG;

export class CpError extends Error {
  constructor(
    readonly code: ErrorCode,
    message: string,
  ) {
    super(message);
    this.name = 'CpError';
  }
}

export const unauthenticated = (msg = 'missing or invalid token') => new CpError('UNAUTHENTICATED', msg);
export const permissionDenied = (msg: string) => new CpError('PERMISSION_DENIED', msg);
export const notFound = (msg: string) => new CpError('NOT_FOUND', msg);
export const invalidArgument = (msg: string) => new CpError('INVALID_ARGUMENT', msg);

/** The one mapper from any thrown value to a gRPC status object (nice-grpc's createErrorStatusObject). */
export function toServiceError(err: unknown, log: (line: string) => void = (l) => console.error(l)): Partial<ServiceError> {
  if (err instanceof CpError) {
    return { code: ERROR_CATALOG[err.code], details: err.message, metadata: new Metadata() };
  }
  // Unexpected: log once, without the request (it may carry secrets), and answer a generic INTERNAL
  // naming a reference the operator finds in the log.
  const e = err as { name?: string; message?: string; stack?: string };
  const ref = randomBytes(6).toString('hex');
  log(`internal error ${ref}: ${e?.name ?? 'Error'}: ${e?.message ?? String(err)}${e?.stack ? `\n${e.stack.split('\n').slice(1, 12).join('\n')}` : ''}`);
  return { code: status.INTERNAL, details: `internal error (reference ${ref})`, metadata: new Metadata() };
}
