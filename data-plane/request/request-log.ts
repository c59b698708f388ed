// One request-log entry per request that reached authentication with a known key (a revoked key's
// tombstone counts: its attempts are logged against it), written when the request has ended in every
// sense: the response is over and, when it was admitted, its usage is settled. Plus a sampled,
// bounded record of 401s for unknown keys (IP and the first characters only). Never a key value,
// prompt or completion: only what the request line, a few headers and the outcome say.
import type { LogRow } from '../../proto/lib/log-columns.js';
import { CATALOG, type Refusal } from '../errors.js';

/** The facts of a request known when it is authenticated. */
export interface LogHead {
  method: string;
  path: string;
  ip: string;
  userAgent: string;
  contentLength: number;
  /** performance.now() when the request arrived. */
  startedAt: number;
}

export interface LogOwner {
  keyId: string;
  projectId: string;
  orgId: string;
}

/** What the response tells: Reply keeps these up to date. */
export interface LogOutcome {
  status: number;
  bytesOut: number;
  reason: string;
}

export interface LogSink {
  log(row: LogRow): void;
}

/** A refusal as the request log names it: the 429 dimension, the 401 type, or the error's code ('' when none). */
export function refusalReason(refusal: Refusal | null): string {
  if (!refusal) return '';
  const entry = CATALOG[refusal.code];
  if (refusal.code === 'EDGE_RATE_LIMITED') return 'edge';
  if (entry.status === 429 || entry.status === 401) return refusal.type ?? entry.typeA;
  return entry.codeB;
}

/** The first characters of a presented key that matched nothing: enough to tell campaigns apart, never enough to use. */
export const UNKNOWN_PREFIX_CHARS = 16;

export function unknownKeyPrefix(presented: string): string {
  return presented.slice(0, UNKNOWN_PREFIX_CHARS).replace(/[^A-Za-z0-9_.-]/g, '?');
}

export class LogDraft {
  requestId = '';
  model = '';
  promptTokens = 0;
  completionTokens = 0;
  costMicros = 0;
  /** The Responses API: the response the request created or read. */
  responseId = '';
  /** A pooled model: the deployment that served, and every attempt ("id:outcome" …). */
  deployment = '';
  attempts = '';
  private expectsContext = false;
  private contextDone = false;
  private replyEnded = false;
  private emitted = false;
  private outcome: LogOutcome = { status: 0, bytesOut: 0, reason: '' };

  constructor(
    private readonly sink: LogSink,
    private readonly head: LogHead,
    private readonly owner: LogOwner,
    private readonly now: () => number,
    private readonly newId: () => string,
  ) {}

  /** An admitted request: the entry waits for its usage to settle too. */
  adoptContext(requestId: string): void {
    this.requestId = requestId;
    this.expectsContext = true;
  }

  /** The admitted request was settled (completed or refused). */
  settle(usage?: { model: string; promptTokens: number; completionTokens: number; costMicros: number }, responseId?: string | null, upstream?: { deployment: string; attempts: string } | null): void {
    if (responseId) this.responseId = responseId;
    if (upstream) {
      this.deployment = upstream.deployment;
      this.attempts = upstream.attempts;
    }
    if (usage) {
      this.model = usage.model;
      this.promptTokens = usage.promptTokens;
      this.completionTokens = usage.completionTokens;
      this.costMicros = usage.costMicros;
    }
    this.contextDone = true;
    this.maybeEmit();
  }

  /** The response ended (sent in full, or aborted: 499 when nothing was answered). */
  endReply(status: number, bytesOut: number, reason: string, aborted: boolean): void {
    // Aborted before an answer: 499, client_closed. Cut after the head went out (the client left, or a
    // drain deadline closed it): the status the client saw, reason aborted.
    const cut = aborted ? (status ? 'aborted' : 'client_closed') : '';
    this.outcome = { status: status || (aborted ? 499 : 0), bytesOut, reason: reason || cut };
    this.replyEnded = true;
    this.maybeEmit();
  }

  private maybeEmit(): void {
    if (this.emitted || !this.replyEnded || (this.expectsContext && !this.contextDone)) return;
    this.emitted = true;
    this.sink.log(logRow(this.requestId || this.newId(), this.now(), this.head, this.owner, this.outcome, this));
  }
}

export function logRow(
  requestId: string,
  atMs: number,
  head: LogHead,
  owner: LogOwner,
  outcome: LogOutcome,
  usage: { model: string; promptTokens: number; completionTokens: number; costMicros: number; responseId?: string; deployment?: string; attempts?: string } | null,
  keyPrefix = '',
): LogRow {
  const row: LogRow = {
    requestId,
    atMs,
    keyId: owner.keyId,
    projectId: owner.projectId,
    orgId: owner.orgId,
    clientIp: head.ip,
    userAgent: head.userAgent,
    method: head.method,
    path: head.path,
    status: outcome.status,
    latencyUs: Math.round((performance.now() - head.startedAt) * 1000),
    bytesIn: head.contentLength > 0 ? head.contentLength : 0,
    bytesOut: outcome.bytesOut,
    model: usage?.model ?? '',
    promptTokens: usage?.promptTokens ?? 0,
    completionTokens: usage?.completionTokens ?? 0,
    costMicros: usage?.costMicros ?? 0,
    reason: outcome.reason,
    keyPrefix,
  };
  if (usage?.responseId) row.responseId = usage.responseId;
  if (usage?.deployment) row.deployment = usage.deployment;
  if (usage?.attempts) row.attempts = usage.attempts;
  return row;
}

/**
 * How many 401s of unknown keys are logged: a token bucket (RATE_PER_SEC, at most BURST at once);
 * the rest are only counted. An attacker stuffing credentials cannot fill the journal this way. One
 * per node, the gate's (gate/gate.ts), shared by HTTP requests and WebSocket upgrades.
 */
export class UnknownKeySampler {
  static readonly RATE_PER_SEC = 10;
  static readonly BURST = 100;
  private tokens = UnknownKeySampler.BURST;
  private lastMs = 0;
  skipped = 0;

  take(nowMs: number): boolean {
    const elapsed = Math.max(0, nowMs - this.lastMs);
    this.lastMs = nowMs;
    this.tokens = Math.min(UnknownKeySampler.BURST, this.tokens + (elapsed / 1000) * UnknownKeySampler.RATE_PER_SEC);
    if (this.tokens < 1) {
      this.skipped++;
      return false;
    }
    this.tokens -= 1;
    return true;
  }
}
