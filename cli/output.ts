// Everything the CLI prints goes through here: one JSON object with --json, aligned tables and
// `key: value` lines otherwise, and exactly one error line on stderr that starts with an HTTP-style
// status. No stack trace ever reaches the user.
import { status as GrpcStatus, type ServiceError } from '@grpc/grpc-js';
import { isStandbyRefusal } from '../proto/lib/leader-hint.js';

/** A failure the CLI reports as one line; `usage` (bad arguments) is printed after it and exits 2. */
export class CliError extends Error {
  constructor(
    readonly httpStatus: number,
    message: string,
    readonly exitCode = 1,
    readonly usage?: string,
  ) {
    super(message);
  }
}

/** Bad arguments: `400 <what is wrong>`, then the usage of the command, exit 2. */
export function usageError(message: string, usage?: string): CliError {
  return new CliError(400, message, 2, usage);
}

function isServiceError(err: unknown): err is ServiceError {
  return typeof err === 'object' && err !== null && typeof (err as ServiceError).code === 'number' && 'details' in err;
}

const HTTP_OF_GRPC: Partial<Record<GrpcStatus, number>> = {
  [GrpcStatus.UNAUTHENTICATED]: 401,
  [GrpcStatus.PERMISSION_DENIED]: 403,
  [GrpcStatus.NOT_FOUND]: 404,
  [GrpcStatus.INVALID_ARGUMENT]: 400,
  [GrpcStatus.FAILED_PRECONDITION]: 400,
  [GrpcStatus.OUT_OF_RANGE]: 400,
  [GrpcStatus.ALREADY_EXISTS]: 409,
  [GrpcStatus.RESOURCE_EXHAUSTED]: 429,
};

/** Turns anything thrown into the one line printed on stderr and the exit code. */
export function describeError(err: unknown, address: string): { line: string; exitCode: number; usage?: string } {
  if (err instanceof CliError) return { line: `${err.httpStatus} ${err.message}`, exitCode: err.exitCode, usage: err.usage };
  if (isServiceError(err)) {
    // No leader among the addresses given, and the one a standby named did not answer.
    if (err.code === GrpcStatus.UNAVAILABLE && isStandbyRefusal(err.details)) return { line: `503 ${oneLine(err.details)} (asked ${address})`, exitCode: 1 };
    if (err.code === GrpcStatus.UNAVAILABLE || err.code === GrpcStatus.DEADLINE_EXCEEDED) {
      const why = err.code === GrpcStatus.DEADLINE_EXCEEDED ? ' (deadline exceeded)' : '';
      return { line: `503 control plane unreachable at ${address}${why}`, exitCode: 1 };
    }
    const http = HTTP_OF_GRPC[err.code] ?? 500;
    const details = oneLine(err.details || GrpcStatus[err.code] || 'error');
    if (err.code === GrpcStatus.UNAUTHENTICATED) {
      return { line: `401 ${details}: pass --token or set TOLLGATE_TOKEN (npm start keeps the operator token in data/operator-token)`, exitCode: 1 };
    }
    return { line: `${http} ${details}`, exitCode: 1 };
  }
  const message = err instanceof Error ? err.message : String(err);
  return { line: `500 internal error: ${oneLine(message)}`, exitCode: 1 };
}

function oneLine(text: string): string {
  return text.replace(/\s*\n\s*/g, ' ').trim();
}

/** Where a command writes; tests of the CLI run it as a process, so this is plain stdout. */
export interface Out {
  json: boolean;
  write(text: string): void;
  warn(text: string): void;
}

export function stdOut(json: boolean): Out {
  return {
    json,
    write: (text) => process.stdout.write(text.endsWith('\n') ? text : `${text}\n`),
    warn: (text) => process.stderr.write(text.endsWith('\n') ? text : `${text}\n`),
  };
}

/** Exactly one JSON object on stdout. */
export function printJson(out: Out, value: Record<string, unknown>): void {
  out.write(`${JSON.stringify(value, null, 2)}\n`);
}

export type Cell = string | number | boolean | null | undefined;

function cellText(v: Cell): string {
  if (v === null || v === undefined || v === '') return '-';
  return String(v);
}

/** An aligned table with a header row; `(none)` when there are no rows. */
export function formatTable(headers: string[], rows: Cell[][]): string {
  if (rows.length === 0) return '(none)\n';
  const texts = rows.map((r) => r.map(cellText));
  const widths = headers.map((h, i) => Math.max(h.length, ...texts.map((r) => r[i]?.length ?? 0)));
  const line = (cells: string[]) =>
    cells
      .map((c, i) => (i === cells.length - 1 ? c : c.padEnd(widths[i])))
      .join('  ')
      .trimEnd();
  return `${[line(headers.map((h) => h.toUpperCase())), ...texts.map(line)].join('\n')}\n`;
}

/** `key: value` lines with the values aligned. */
export function formatFields(fields: [string, Cell][]): string {
  const width = Math.max(...fields.map(([k]) => k.length)) + 1;
  return `${fields.map(([k, v]) => `${`${k}:`.padEnd(width)} ${cellText(v)}`).join('\n')}\n`;
}

/** The spec's timestamps are strings; "never" is the empty string on the wire and null in JSON. */
export function nullIfEmpty(s: string | undefined): string | null {
  return s ? s : null;
}
