import type { Db } from './db.js';
import { MIGRATIONS, type Migration } from './migrations/index.js';

/** Applies every migration not yet recorded; returns the versions applied by this call. */
export async function runMigrations(db: Db, migrations: readonly Migration[] = MIGRATIONS): Promise<number[]> {
  await db.exec(
    'CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at TEXT NOT NULL)',
  );
  const applied: number[] = [];
  for (const m of [...migrations].sort((a, b) => a.version - b.version)) {
    await db.tx(async (tx) => {
      const done = await tx.get('SELECT version FROM schema_migrations WHERE version = ?', [m.version]);
      if (done) return;
      await tx.exec(m.sql);
      await tx.run('INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, ?, ?)', [m.version, m.name, new Date().toISOString()]);
      applied.push(m.version);
    });
  }
  return applied;
}
