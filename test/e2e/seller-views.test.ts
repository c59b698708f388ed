// The views a seller's own tools read (issue 35, deliverable 6; docs/operating.md#reading-the-database):
// usage_daily (usage per UTC day by organisation, project, key and model) and org_balances (credits,
// the free grant of the organisation's tier, spend, balance), on SQLite and on PostgreSQL alike. Read
// with each store's own client, they say what the CLI says; a reload that changes a tier's grant
// moves the balances it explains.
import assert from 'node:assert/strict';
import { readFileSync, writeFileSync } from 'node:fs';
import { after, before, test } from 'node:test';
import OpenAI from 'openai';
import pg from 'pg';
import { createOrgWithProjectAsync } from '../helpers/console-cli.js';
import { configYaml } from '../helpers/config.js';
import { eventually, waitUntilKnown } from '../helpers/data-plane.js';
import { setClock } from '../helpers/http.js';
import { startPostgres, type PostgresServer } from '../helpers/postgres-server.js';
import { cliJsonAsync, startControlPlane, startDataPlane, type ControlPlane } from '../helpers/processes.js';
import { queryDb } from '../helpers/usage-db.js';

// Two minutes before yesterday (UTC) ended: the usage falls on two days.
const T0 = Math.floor(Date.now() / 86_400_000) * 86_400_000 - 2 * 60_000;
const MONTH = new Date(T0).toISOString().slice(0, 7);

let server: PostgresServer;
before(async () => {
  server = await startPostgres();
});
after(() => server?.stop());

type Row = Record<string, unknown>;

/** A view's rows, through the store's own client (as a seller's tool reads them). */
async function view(cp: ControlPlane, url: string | null, sql: string, params: unknown[]): Promise<Row[]> {
  if (!url) return queryDb<Row>(cp.dbPath, sql, params);
  const client = new pg.Client({ connectionString: url });
  await client.connect();
  try {
    return (await client.query(sql.replace(/\?/g, (_m, i) => `$${sql.slice(0, i).split('?').length}`), params)).rows.map((r) =>
      Object.fromEntries(Object.entries(r).map(([k, v]) => [k, typeof v === 'string' && /^-?\d+$/.test(v) && k !== 'day' ? Number(v) : v])),
    );
  } finally {
    await client.end();
  }
}

const micros = (usd: string) => Math.round(Number(usd) * 1_000_000);

for (const store of ['sqlite', 'postgres'] as const) {
  test(`${store}: usage_daily and org_balances say what the CLI says; a reload of a tier's grant moves the balance`, async (t) => {
    const url = store === 'postgres' ? await server.createDatabase() : null;
    const cp = await startControlPlane({ configYaml: configYaml(() => {}), ...(url ? { databaseUrl: url } : {}) });
    const node = await startDataPlane(cp, { adminListen: true, env: { TOLLGATE_TEST_CLOCK: '1' } });
    t.after(async () => void (await Promise.all([node.proc.kill('SIGKILL'), cp.proc.kill('SIGKILL')])));
    await setClock(node.adminUrl!, { now_ms: T0 });
    const op = cp.secrets.operatorToken;
    const { owner, orgId, projectId } = await createOrgWithProjectAsync(cp, op, `views-${store}`);
    const key = await cliJsonAsync(cp, owner.token, ['key', 'create', '--project', projectId, '--name', 'k']);
    await cliJsonAsync(cp, op, ['org', 'credit', orgId, '--usd', '3.00', '--note', 'views']);
    await waitUntilKnown(node.url, key.key);
    const client = new OpenAI({ apiKey: key.key, baseURL: `${node.url}/v1`, maxRetries: 0 });
    await client.chat.completions.create({ model: 'demo-chat', messages: [{ role: 'user', content: 'Before midnight' }] });
    await client.embeddings.create({ model: 'demo-embed', input: 'and an embedding' });
    await setClock(node.adminUrl!, { advance_ms: 3 * 60_000 });
    await client.chat.completions.create({ model: 'demo-chat', messages: [{ role: 'user', content: 'After midnight, a longer question' }] });

    let daily: Row[] = [];
    await eventually(async () => {
      daily = await view(cp, url, 'SELECT * FROM usage_daily WHERE org_id = ? ORDER BY day, model', [orgId]);
      return daily.reduce((n, r) => n + Number(r.requests), 0) === 3;
    }, 'the three calls in usage_daily');
    const day1 = new Date(T0).toISOString().slice(0, 10);
    const day2 = new Date(T0 + 3 * 60_000).toISOString().slice(0, 10);
    assert.deepEqual(
      daily.map((r) => [r.day, r.org_id, r.project_id, r.key_id, r.model, r.requests]),
      [
        [day1, orgId, projectId, key.id, 'demo-chat', 1],
        [day1, orgId, projectId, key.id, 'demo-embed', 1],
        [day2, orgId, projectId, key.id, 'demo-chat', 1],
      ],
    );
    // The CLI's days, summed from the same rows.
    const byDay = await cliJsonAsync(cp, owner.token, ['usage', '--org', orgId, '--month', MONTH, '--by', 'day']);
    assert.equal(byDay.rows.length, 2, JSON.stringify(byDay));
    for (const r of byDay.rows) {
      const mine = daily.filter((d) => d.day === r.day);
      assert.equal(mine.reduce((n, d) => n + Number(d.requests), 0), r.requests, `requests of ${r.day}`);
      assert.equal(mine.reduce((n, d) => n + Number(d.cost_micros), 0), micros(r.cost_usd), `cost of ${r.day}`);
      assert.equal(mine.reduce((n, d) => n + Number(d.prompt_tokens), 0), r.input_tokens, `input tokens of ${r.day}`);
      assert.equal(mine.reduce((n, d) => n + Number(d.completion_tokens), 0), r.output_tokens, `output tokens of ${r.day}`);
    }

    const balance = async () => (await view(cp, url, 'SELECT * FROM org_balances WHERE org_id = ?', [orgId]))[0];
    const shown = await cliJsonAsync(cp, op, ['org', 'show', orgId]);
    const b = await balance();
    assert.deepEqual(
      [b.tier, b.credits_micros, b.free_grant_micros, b.spend_total_micros, b.balance_micros, b.blocked_reason],
      ['free', micros(shown.credits_usd), micros(shown.free_grant_usd), micros(shown.spend_total_usd), micros(shown.balance_usd), ''],
    );
    assert.equal(b.free_grant_micros, 5_000_000);

    // The tier's grant lives in the config file: a reload that changes it moves the view with it.
    const yaml = readFileSync(cp.configPath!, 'utf8');
    assert.match(yaml, /free_grant_usd: "?5\.00"?/);
    writeFileSync(cp.configPath!, yaml.replace(/(free:[\s\S]*?free_grant_usd: )"?5\.00"?/, '$1"2.00"'));
    await cliJsonAsync(cp, op, ['config', 'reload']);
    const after = await balance();
    assert.equal(after.free_grant_micros, 2_000_000);
    assert.equal(after.balance_micros, micros((await cliJsonAsync(cp, op, ['org', 'show', orgId])).balance_usd));
  });
}
