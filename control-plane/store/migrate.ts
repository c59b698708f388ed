import type { Db } from './db.js';
import { MIGRATIONS, migrationSql, type Migration } from './migrations/index.js';

/** The database was migrated by a newer version of Tollgate: this one must not touch it. */
export class NewerSchemaError extends Error {
  constructor(
    readonly found: number,
    readonly known: number,
  ) {
    super(
      `the database was migrated by a newer version of Tollgate (schema version ${found}; this version knows up to ${known}): ` +
        'refusing to start; run the newer version, or restore a copy made before it',
    );
  }
}

/**
 * Applies every migration not yet recorded; returns the versions applied by this call. Refuses a
 * database that records a version newer than any this build knows (NewerSchemaError), before it
 * changes anything.
 */
export async function runMigrations(db: Db, migrations: readonly Migration[] = MIGRATIONS): Promise<number[]> {
  await db.exec(
    'CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at TEXT NOT NULL)',
  );
  const known = Math.max(0, ...MIGRATIONS.map((m) => m.version), ...migrations.map((m) => m.version));
  const found = (await db.get<{ v: number | null }>('SELECT MAX(version) AS v FROM schema_migrations'))?.v ?? 0;
  if (found > known) throw new NewerSchemaError(found, known);
  const applied: number[] = [];
  for (const m of [...migrations].sort((a, b) => a.version - b.version)) {
    // Each in a write transaction (on PostgreSQL it holds the store's write lock: two control
    // planes starting together apply each migration once).
    await db.tx(async (tx) => {
      const done = await tx.get('SELECT version FROM schema_migrations WHERE version = ?', [m.version]);
      if (done) return;
      await tx.exec(migrationSql(m, db.dialect));
      await tx.run('INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, ?, ?)', [m.version, m.name, new Date().toISOString()]);
      applied.push(m.version);
    });
  }
  return applied;
}
