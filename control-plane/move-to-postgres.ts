// `npm run move-to-postgres -- --db FILE [--logs-db FILE] --database-url postgres://…` (or
// TOLLGATE_DATABASE_URL): a control plane's SQLite files copied into an empty PostgreSQL database
// (store/sqlite-to-postgres.ts), for a control plane started on it next with --database-url and the
// same secrets. Stop the control plane first. Prints what it copied; a setting to fix or a target
// that is not empty is one line and exit 2; a failure is one line and exit 1, nothing committed of
// the part that failed.
import { existsSync } from 'node:fs';
import { ConfigError } from '../proto/lib/process-flags.js';
import { loadMoveConfig } from './config.js';
import { describeUrl } from './store/pg-db.js';
import { moveSqliteToPostgres, TargetNotEmptyError } from './store/sqlite-to-postgres.js';

async function main(): Promise<void> {
  const cfg = loadMoveConfig();
  console.log(`moving ${cfg.dbPath} (request logs: ${existsSync(cfg.logsDbPath) ? cfg.logsDbPath : 'none'}) to postgres ${describeUrl(cfg.databaseUrl)}`);
  const report = await moveSqliteToPostgres(cfg, cfg.databaseUrl, (line) => console.log(line));
  for (const t of report.tables) console.log(`  ${t.table}: ${t.rows} rows`);
  console.log(`  request logs: ${report.logBlocks} blocks over ${report.logDays.length} days`);
  console.log('moved: start the control plane with --database-url and the same secrets (pepper, operator and node tokens)');
}

main().catch((err: unknown) => {
  if (err instanceof ConfigError || err instanceof TargetNotEmptyError) {
    console.error(err.message);
    process.exit(2);
  }
  console.error(`move-to-postgres failed: ${(err as Error)?.message ?? String(err)}`);
  process.exit(1);
});
