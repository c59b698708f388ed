// Versioned migrations, applied in order; each runs once, recorded in schema_migrations.
// Never edit a shipped migration: add the next one. The numbers are the same on both stores; on
// PostgreSQL a migration runs its `pg` text, else its SQLite text with PostgreSQL's types (pg-ddl.ts).
import { sql as initial } from './001-initial.js';
import { sql as fundsVersion } from './002-funds-version.js';
import { sql as keyTombstones } from './003-key-tombstones.js';
import { sql as usageMinutes } from './004-usage-minutes.js';
import { sql as freeGrants } from './010-free-grants.js';
import { sql as webhookOutbox } from './015-webhook-outbox.js';
import { sql as auditLog } from './016-audit-log.js';
import { sql as keyExpiry } from './017-key-expiry.js';
import { sql as storedResponses } from './035-stored-responses.js';
import { sql as moneyLimits } from './036-money-limits.js';
import { sql as nodesConnected } from './037-nodes-connected.js';
import { sql as usageJournal } from './038-usage-journal.js';
import { sql as reportSink } from './039-report-sink.js';
import { pgSql as reportSinkPg } from './039-report-sink-pg.js';
import { sql as storedResponseDeployments } from './040-stored-response-deployments.js';
import { sql as deploymentStates } from './041-deployment-states.js';
import { pgSql as sellerViewsPg, sql as sellerViews } from './042-seller-views.js';
import { sql as webhookHeld } from './043-webhook-held.js';
import { pgDdl } from './pg-ddl.js';

export interface Migration {
  version: number;
  name: string;
  sql: string;
  /** PostgreSQL's text where it differs from pgDdl(sql). */
  pg?: string;
}

/** The text of migration `m` for a store of `dialect`. */
export function migrationSql(m: Migration, dialect: 'sqlite' | 'postgres'): string {
  return dialect === 'sqlite' ? m.sql : (m.pg ?? pgDdl(m.sql));
}

export const MIGRATIONS: readonly Migration[] = [
  {
    version: 1,
    name: 'initial',
    sql: initial,
    // Owners are told apart by the order they were added in: SQLite's rowid, a column on PostgreSQL.
    pg: pgDdl(initial).replace('CREATE TABLE memberships (', 'CREATE TABLE memberships (\n  rowid BIGINT GENERATED ALWAYS AS IDENTITY,'),
  },
  { version: 2, name: 'funds-version', sql: fundsVersion },
  { version: 3, name: 'key-tombstones', sql: keyTombstones },
  { version: 4, name: 'usage-minutes', sql: usageMinutes },
  { version: 10, name: 'free-grants', sql: freeGrants, pg: pgDdl(freeGrants).replace('INSERT OR IGNORE INTO free_grants', 'INSERT INTO free_grants').replace(/ORDER BY o.created_at, o.id;/, 'ORDER BY o.created_at, o.id\n  ON CONFLICT DO NOTHING;') },
  { version: 15, name: 'webhook-outbox', sql: webhookOutbox },
  { version: 16, name: 'audit-log', sql: auditLog },
  { version: 17, name: 'key-expiry', sql: keyExpiry },
  { version: 35, name: 'stored-responses', sql: storedResponses },
  { version: 36, name: 'money-limits', sql: moneyLimits },
  { version: 37, name: 'nodes-connected', sql: nodesConnected },
  { version: 38, name: 'usage-journal', sql: usageJournal },
  { version: 39, name: 'report-sink', sql: reportSink, pg: reportSinkPg },
  { version: 40, name: 'stored-response-deployments', sql: storedResponseDeployments },
  { version: 41, name: 'deployment-states', sql: deploymentStates },
  { version: 42, name: 'seller-views', sql: sellerViews, pg: sellerViewsPg },
  { version: 43, name: 'webhook-held', sql: webhookHeld },
];
