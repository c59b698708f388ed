// Versioned migrations, applied in order; each runs once, recorded in schema_migrations.
// Never edit a shipped migration: add the next one.
import { sql as initial } from './001-initial.js';
import { sql as fundsVersion } from './002-funds-version.js';
import { sql as keyTombstones } from './003-key-tombstones.js';
import { sql as usageMinutes } from './004-usage-minutes.js';
import { sql as storedResponses } from './035-stored-responses.js';

export interface Migration {
  version: number;
  name: string;
  sql: string;
}

export const MIGRATIONS: readonly Migration[] = [
  { version: 1, name: 'initial', sql: initial },
  { version: 2, name: 'funds-version', sql: fundsVersion },
  { version: 3, name: 'key-tombstones', sql: keyTombstones },
  { version: 4, name: 'usage-minutes', sql: usageMinutes },
  { version: 35, name: 'stored-responses', sql: storedResponses },
];
