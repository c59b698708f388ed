// The console's API keys (proto/tollgate/v1/console.proto): creation, listing, lookup by id or by
// value, the organisation's lifetime policy, and revocation in the spec's order. Roles per
// docs/design.md#console-roles: admin or above to change keys, member to read them.
import { generateKey, hashKey, keyPattern, maskKey, newId, secretsEqual } from '../../proto/lib/keys.js';
import type { ApiKey, ConsoleServiceServer, RevokeKeyResponse } from '../../proto/gen/tollgate/v1/console.js';
import { keyEntryOf } from '../state/control-state.js';
import { CpError, invalidArgument, notFound } from '../errors.js';
import { getRole } from '../store/accounts-repo.js';
import { getOrg } from '../store/orgs-repo.js';
import { credentialHashOf, deleteCredential, getKey, insertKey, keyIdOfHash, listKeys, markRevoked, type ApiKeyRow } from '../store/keys-repo.js';
import { listNodes as listNodeRows } from '../store/sync-repo.js';
import { getKeyPolicy, setKeyPolicy, setKeyExpiry, setRevokedReason } from '../store/key-expiry-repo.js';
import { noteAuditTarget } from '../audit/audit-recorder.js';
import { FindKeyLimiter } from './find-key-limiter.js';
import { ConsoleAccess, MAX_NAME, parseInstant, requireId } from './console-access.js';
import { applyKeyLimit, keyLimitFields, keyLimitOf, withKeySpend } from './limits-service.js';

/** Longer than any key value; a bigger "value" is refused before it is hashed. */
const MAX_KEY_VALUE_CHARS = 512;

export function apiKeyOf(k: ApiKeyRow): ApiKey {
  return {
    id: k.id,
    projectId: k.project_id,
    orgId: k.org_id,
    name: k.name,
    keyPrefix: k.key_prefix,
    allowedModels: JSON.parse(k.allowed_models) as string[],
    status: k.status,
    lastUsedAt: k.last_used_at,
    createdAt: k.created_at,
    revokedAt: k.revoked_at,
    rpmLimit: k.rpm_limit,
    tpmLimit: k.tpm_limit,
    maxParallelRequests: k.max_parallel_requests,
    expiresAt: k.expires_at_ms ? new Date(k.expires_at_ms).toISOString() : '',
    revokedReason: k.status === 'revoked' ? k.revoked_reason || 'revoked' : '',
    ...keyLimitFields(k),
  };
}

/** Longest key lifetime accepted (and longest policy): 10 years. */
const MAX_KEY_LIFETIME_SEC = 10 * 366 * 86_400;

/** Seconds as the CLI writes durations: 90d, 12h, 45m, 30s. */
function durationText(sec: number): string {
  for (const [unit, n] of [['d', 86_400], ['h', 3_600], ['m', 60]] as const) if (sec % n === 0) return `${sec / n}${unit}`;
  return `${sec}s`;
}

type KeyCalls = 'createKey' | 'listKeys' | 'revokeKey' | 'getKey' | 'findKey' | 'setKeyPolicy';

export class KeyService extends ConsoleAccess {
  /** Revocations waiting for node acks: a second revoke of the same key joins the first. */
  private readonly revoking = new Map<string, Promise<RevokeKeyResponse>>();
  private readonly findLimiter = new FindKeyLimiter();

  handlers(): Pick<ConsoleServiceServer, KeyCalls> {
    return {
      createKey: this.unary(async (req, caller) => {
        const rawName = req.name ?? '';
        const name = rawName.trim();
        if (rawName !== '' && name === '') throw invalidArgument('key name must not be blank');
        if (name.length > MAX_NAME) throw invalidArgument(`key name must be at most ${MAX_NAME} characters`);
        const models = this.state.gateway.settings.models;
        const allowed: string[] = [];
        for (const raw of req.allowedModels) {
          const id = raw.trim();
          if (!models.has(id)) throw invalidArgument(`unknown model ${JSON.stringify(raw)} in allowed_models`);
          if (!allowed.includes(id)) allowed.push(id);
        }
        const expiresInSec = req.expiresInSec ?? 0;
        const expiresAtText = (req.expiresAt ?? '').trim();
        if (expiresInSec !== 0 && expiresAtText !== '') throw invalidArgument('give at most one of expires_in_sec and expires_at');
        if (!Number.isSafeInteger(expiresInSec) || expiresInSec < 0 || expiresInSec > MAX_KEY_LIFETIME_SEC) throw invalidArgument(`expires_in_sec must be from 1 to ${MAX_KEY_LIFETIME_SEC} seconds`);
        const nowMs = this.state.now();
        let expiresAtMs = expiresInSec > 0 ? nowMs + expiresInSec * 1000 : expiresAtText !== '' ? parseInstant('expires_at', expiresAtText) : 0;
        if (expiresAtText !== '' && expiresAtMs <= nowMs) throw invalidArgument('expires_at must be in the future');
        if (expiresAtMs > nowMs + MAX_KEY_LIFETIME_SEC * 1000) throw invalidArgument('expires_at must be within 10 years');
        const limit = keyLimitOf(req);
        return this.state.db.tx(async (tx) => {
          const { project } = await this.projectFor(tx, caller, req.projectId, 'admin');
          const org = (await getOrg(tx, project.org_id))!;
          // The organisation's policy: no expiry means its maximum; past the maximum is refused.
          const maxLifetimeSec = await getKeyPolicy(tx, org.id);
          if (maxLifetimeSec !== null) {
            if (expiresAtMs === 0) expiresAtMs = nowMs + maxLifetimeSec * 1000;
            else if (expiresAtMs > nowMs + maxLifetimeSec * 1000) {
              throw invalidArgument(`organisation ${org.id} allows keys to live at most ${durationText(maxLifetimeSec)}: ask for an expiry within that, or none (the maximum)`);
            }
          }
          const tier = this.state.tier(org.tier);
          if (!tier) throw new CpError('FAILED_PRECONDITION', `organisation ${org.id} has tier ${JSON.stringify(org.tier)}, which the config does not define`);
          const value = generateKey(this.state.gateway.settings.serviceName);
          const keyHash = hashKey(this.opts.pepper, value);
          const row: ApiKeyRow = {
            id: newId('key'),
            project_id: project.id,
            org_id: org.id,
            name,
            key_prefix: maskKey(value),
            allowed_models: JSON.stringify(allowed),
            status: 'active',
            // Fixed from the organisation's tier now; a later tier change leaves this key as it is.
            rpm_limit: tier.rpm,
            tpm_limit: tier.tpm,
            max_parallel_requests: tier.maxParallelRequests,
            created_at: this.state.nowIso(),
            revoked_at: '',
            last_used_at: '',
          };
          noteAuditTarget(row.id, row.org_id);
          await insertKey(tx, row, keyHash);
          if (expiresAtMs > 0) {
            row.expires_at_ms = expiresAtMs;
            await setKeyExpiry(tx, row.id, expiresAtMs);
          }
          await applyKeyLimit(tx, row, limit);
          await this.state.emit(tx, { keyUpsert: keyEntryOf(row, keyHash) });
          await this.opts.webhooks?.events.keyCreated(tx, { id: row.id, projectId: row.project_id, orgId: row.org_id, name: row.name, keyPrefix: row.key_prefix, createdAt: row.created_at });
          return { apiKey: apiKeyOf(row), key: value };
        });
      }),

      listKeys: this.unary(async (req, caller) =>
        this.state.db.read(async (q) => {
          const { project } = await this.projectFor(q, caller, req.projectId, 'member');
          const within = req.expiringWithinSec ?? 0;
          if (!Number.isSafeInteger(within) || within < 0) throw invalidArgument('expiring_within_sec must not be negative');
          let keys = await listKeys(q, project.id);
          if (within > 0) {
            const until = this.state.now() + within * 1000;
            keys = keys.filter((k) => k.status === 'active' && (k.expires_at_ms ?? 0) > 0 && k.expires_at_ms! <= until);
          }
          return { keys: keys.map(apiKeyOf) };
        }),
      ),

      revokeKey: this.unary(async (req, caller) => {
        const keyId = requireId('key_id', req.keyId);
        const hidden = notFound(`key ${keyId} not found`);
        const key = await this.state.db.read(async (q) => {
          const row = await getKey(q, keyId);
          if (!row) throw hidden;
          await this.requireRole(q, caller, row.org_id, 'admin', hidden);
          return row;
        });
        return this.revoke(key.id);
      }),

      getKey: this.unary(async (req, caller) => {
        const keyId = requireId('key_id', req.keyId);
        const hidden = notFound(`key ${keyId} not found`);
        return this.state.db.read(async (q) => {
          const row = await getKey(q, keyId);
          if (!row) throw hidden;
          await this.requireRole(q, caller, row.org_id, 'member', hidden);
          return withKeySpend(q, apiKeyOf(row), row, this.state.now());
        });
      }),

      findKey: this.unary(async (req, caller) => {
        // Never echo the value: every message below is fixed text.
        const value = (req.key ?? '').trim();
        if (value === '') throw invalidArgument('key is required');
        if (value.length > MAX_KEY_VALUE_CHARS || /[\s\x00-\x1f]/.test(value)) throw invalidArgument('that is not a key value: one line of at most 512 characters, no spaces');
        this.findLimiter.take(caller.kind === 'operator' ? 'operator' : caller.account.id, this.state.now());
        // Values are 256-bit random: guessing is hopeless, and a non-member learns nothing (the same answer
        // as for an unknown value, after the same work).
        const unknown = notFound(
          keyPattern(this.state.gateway.settings.serviceName).test(value)
            ? 'no key you can see matches this value'
            : `no key you can see matches this value (keys of this gateway look like sk-${this.state.gateway.settings.serviceName}-…)`,
        );
        const keyHash = hashKey(this.opts.pepper, value);
        return this.state.db.read(async (q) => {
          const hit = await keyIdOfHash(q, keyHash);
          const matched = hit !== undefined && secretsEqual(hit.key_hash, keyHash);
          // The same three lookups whether or not the value matched, so that timing does not tell a
          // non-member "a key of some other organisation" from "no key".
          const row = await getKey(q, matched ? hit.key_id : '');
          const role = caller.kind === 'operator' ? 'operator' : await getRole(q, row?.org_id ?? '', caller.account.id);
          if (!matched || !row || !role) throw unknown;
          return apiKeyOf(row);
        });
      }),

      setKeyPolicy: this.unary(async (req, caller) => {
        const max = req.maxLifetimeSec ?? 0;
        if (req.clear ? max !== 0 : !Number.isSafeInteger(max) || max < 60 || max > MAX_KEY_LIFETIME_SEC) {
          throw invalidArgument(req.clear ? 'give either a maximum lifetime or clear, not both' : `max_lifetime_sec must be from 60 to ${MAX_KEY_LIFETIME_SEC} seconds (or clear)`);
        }
        return this.state.db.tx(async (tx) => {
          const { org } = await this.orgFor(tx, caller, req.orgId, 'admin');
          await setKeyPolicy(tx, org.id, req.clear ? null : max);
          return { orgId: org.id, maxLifetimeSec: req.clear ? 0 : max };
        });
      }),
    };
  }

  /**
   * Revocation in the spec's order: (1) delete the credential and record the change in one
   * transaction, (2) the change is pushed to every connected node, (3) wait (bounded) for their acks,
   * (4) only then set the console record to revoked. Never moves a key out of revoked.
   */
  revoke(keyId: string, reason: 'revoked' | 'expired' = 'revoked'): Promise<RevokeKeyResponse> {
    const running = this.revoking.get(keyId);
    if (running) return running;
    const work = (async () => {
      const step1 = await this.state.db.tx(async (tx) => {
        const row = (await getKey(tx, keyId))!;
        if (row.status === 'revoked') return { row, version: null };
        const keyHash = await credentialHashOf(tx, keyId);
        if (keyHash === undefined) return { row, version: null };
        const at = this.state.nowIso();
        await deleteCredential(tx, keyHash, at);
        const version = await this.state.emit(tx, { keyRemoved: keyHash });
        const watch = this.opts.webhooks?.revokedKeys;
        if (watch) tx.afterCommit(() => watch.keyRevoked(keyId, Date.parse(at)));
        return { row, version };
      });
      if (step1.row.status === 'revoked') return { apiKey: apiKeyOf(step1.row), nodesTotal: 0, nodesConfirmed: 0, nodesUnconfirmed: [], nodesDisconnected: [] };
      const acks = step1.version === null ? { total: 0, confirmed: 0, unconfirmed: [] } : await this.fleet.awaitAcks(step1.version, this.opts.revokeAckTimeoutMs);
      if (step1.version !== null) this.log(`key ${keyId} revoked at version ${step1.version}: ${acks.confirmed} of ${acks.total} connected nodes confirmed`, { event: 'key_revoked', keyId, version: step1.version, nodesTotal: acks.total, nodesConfirmed: acks.confirmed, nodesUnconfirmed: acks.unconfirmed });
      const row = await this.state.db.tx(async (tx) => {
        await markRevoked(tx, keyId, this.state.nowIso());
        await setRevokedReason(tx, keyId, reason);
        const revoked = (await getKey(tx, keyId))!;
        await this.opts.webhooks?.events.keyRevoked(tx, { id: revoked.id, projectId: revoked.project_id, orgId: revoked.org_id, keyPrefix: revoked.key_prefix, revokedAt: revoked.revoked_at }, revoked.revoked_reason || reason);
        return revoked;
      });
      // Nodes seen before but not connected now may still be serving the key from their last state.
      const connected = new Set(this.fleet.liveNodes().map((n) => n.id));
      const nodesDisconnected = (await listNodeRows(this.state.db)).filter((n) => !connected.has(n.id)).map((n) => ({ id: n.id, lastSeenAt: n.last_seen_at }));
      return { apiKey: apiKeyOf(row), nodesTotal: acks.total, nodesConfirmed: acks.confirmed, nodesUnconfirmed: acks.unconfirmed, nodesDisconnected };
    })();
    this.revoking.set(keyId, work);
    const forget = () => void this.revoking.delete(keyId);
    work.then(forget, forget);
    return work;
  }
}
