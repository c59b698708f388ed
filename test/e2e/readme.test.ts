// The README as an operator follows it. Before: its CLI examples called a bare `tollgate` that is not
// on PATH after `npm install` and left out commands `--help` lists, and its config section did not
// match the shipped file (no audio_usd_per_unit, voices or realtime_upstreams).
import assert from 'node:assert/strict';
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { after, test } from 'node:test';
import { parse } from 'yaml';
import { accountCommands } from '../../cli/commands/account.js';
import { keyCommands } from '../../cli/commands/key.js';
import { memberCommands } from '../../cli/commands/member.js';
import { miscCommands } from '../../cli/commands/misc.js';
import { orgCommands } from '../../cli/commands/org.js';
import { projectCommands } from '../../cli/commands/project.js';
import { poolCommands } from '../../cli/commands/pools.js';
import { auditCommands, webhooksCommands } from '../../cli/commands/webhooks.js';
import { DEMO_CONFIG_PATH, parseGatewayConfig } from '../../control-plane/gateway-config/gateway-config.js';
import { consoleClient, createKey } from '../helpers/console.js';
import { safetyIdentifierOf, safetyIdKey, safetySubject } from '../../proto/lib/safety-identifier.js';
import { configYaml } from '../helpers/config.js';
import { ROOT, runProcessAsync, scriptArgs, startControlPlane, startProcess, stopAll } from '../helpers/processes.js';
import { newWebhookSecret } from '../helpers/webhook-receiver.js';

after(stopAll);

const readme = readFileSync(join(ROOT, 'README.md'), 'utf8');
// The config file's reference moved to docs/ with the rest of the operator's documentation (issue 22).
const configDoc = readFileSync(join(ROOT, 'docs', 'configuration.md'), 'utf8');
const docs = readdirSync(join(ROOT, 'docs')).filter((n) => n.endsWith('.md')).map((n) => readFileSync(join(ROOT, 'docs', n), 'utf8'));

/** The fenced block of `lang` that follows the heading `heading` in `doc`. */
function blockAfter(heading: string, lang: string, nth = 0, doc = readme): string {
  assert.ok(doc.includes(heading), `no heading ${heading}`);
  const section = doc.slice(doc.indexOf(heading));
  const blocks = [...section.matchAll(new RegExp('```' + lang + '\\n([\\s\\S]*?)```', 'g'))];
  return blocks[nth][1];
}

const commandNames = [...accountCommands, ...orgCommands, ...memberCommands, ...projectCommands, ...keyCommands, ...miscCommands, ...poolCommands, ...webhooksCommands, ...auditCommands].map((c) => c.name);

test("the README's CLI examples list every command and run as written with npx", async (t) => {
  const block = blockAfter('## The CLI', 'sh', 1);
  const lines = block.split('\n').filter((l) => l.startsWith('npx tollgate '));
  const named = new Set(lines.map((l) => commandNames.find((n) => l.startsWith(`npx tollgate ${n} `) || l.trim() === `npx tollgate ${n}` || l.startsWith(`npx tollgate ${n}  `))));
  for (const name of commandNames) assert.ok(named.has(name), `the README has no example of ${name}`);
  assert.doesNotMatch(readme, /^tollgate /m, 'no bare tollgate command lines');
  for (const doc of docs) assert.doesNotMatch(doc, /^tollgate /m, 'no bare tollgate command lines in docs/');
  assert.match(block, /^export TOLLGATE_TOKEN=\$\(cat data\/operator-token\)$/m);

  // `webhooks test` needs a destination that answers: its own process (this one blocks on each CLI run).
  const secret = newWebhookSecret();
  const receiver = startProcess(['test/helpers/webhook-receiver-main.ts'], { WEBHOOK_SECRET: secret });
  const webhookUrl = (await receiver.waitFor(/webhook receiver listening on (\S+)/))[1];
  const cp = await startControlPlane({
    env: { README_WEBHOOK_SECRET: secret, OPENAI_KEY_A: 'sk-a', OPENAI_KEY_B: 'sk-b' },
    configYaml: configYaml((cfg) => {
      cfg.webhooks = [{ url: webhookUrl, secret_env: 'README_WEBHOOK_SECRET', events: ['*'] }];
      // The README's pooled model (its `models` examples steer it), both keys from the environment here.
      const pooled = parse(blockAfter('**Configuration: [docs/configuration.md]', 'yaml', 0))[0];
      pooled.deployments[1] = { ...pooled.deployments[1], api_key_file: undefined, api_key_env: 'OPENAI_KEY_B' };
      cfg.models.push(pooled);
    }),
  });
  const c = consoleClient(cp.address, cp.secrets.operatorToken);
  t.after(() => c.close());
  const key = await createKey(c, { tier: 'paid' });
  const member = (await c.createAccount({ name: 'bob' })).account!.id;
  // The identifier an upstream would report for the key's project (what the nodes send it).
  const safetyId = safetyIdentifierOf(safetyIdKey(Buffer.from(cp.secrets.pepper, 'utf8')), safetySubject('project', key));
  const ids: Record<string, string> = { ACCOUNT_ID: key.accountId, MEMBER_ID: member, ORG_ID: key.orgId, PROJECT_ID: key.projectId, KEY_ID: key.keyId, WEBHOOK_URL: webhookUrl, SAFETY_ID: safetyId };
  const env = { ...process.env, TOLLGATE_CONTROL_PLANE: cp.address, TOLLGATE_TOKEN: cp.secrets.operatorToken, LEAKED_KEY: key.key };
  // Each line as written, through bash. The first through npx itself (npx finds the package's bin from
  // the project folder); the others with `npx tollgate` running this run's CLI directly, four at a
  // time, `key revoke` last: npx costs about 1 s of CPU a line, which was 39 s of this file's 71.
  const cli = scriptArgs('cli/main.ts').map((a) => `'${a}'`).join(' ');
  const run = async (line: string, viaNpx: boolean) => {
    const command = line.replace(/\s+#.*$/, '').replace(/\b(ACCOUNT_ID|MEMBER_ID|ORG_ID|PROJECT_ID|KEY_ID|WEBHOOK_URL|SAFETY_ID)\b/g, (m) => ids[m]);
    const shell = viaNpx ? command : `npx() { [ "$1" = tollgate ] || exit 97; shift; '${process.execPath}' ${cli} "$@"; }\n${command}`;
    const r = await runProcessAsync('bash', ['-c', shell], { env });
    assert.equal(r.code, 0, `${line}\n${r.stderr}`);
  };
  const [first, ...rest] = lines;
  await run(first, true);
  const last = rest.filter((l) => l.startsWith('npx tollgate key revoke '));
  const queue = rest.filter((l) => !last.includes(l));
  await Promise.all(Array.from({ length: 4 }, async () => {
    for (let line = queue.shift(); line !== undefined; line = queue.shift()) await run(line, false);
  }));
  for (const line of last) await run(line, false);
});

test("the documented config (docs/configuration.md) matches the shipped file and validates", () => {
  const block = blockAfter('## Configuration file', 'yaml', 0, configDoc);
  const doc = parse(block);
  const cfg = parseGatewayConfig(doc, { OPENAI_API_KEY: 'sk-test' }, () => 'sk-from-file');
  assert.equal(cfg.proto.models.find((m) => m.id === 'local-llm')?.upstreamApiKey, 'sk-from-file');

  const shipped = parse(readFileSync(DEMO_CONFIG_PATH, 'utf8'));
  assert.deepEqual(Object.keys(doc).sort(), Object.keys(shipped).sort());
  assert.deepEqual(doc.tiers, shipped.tiers);
  const keysUsed = (models: Record<string, unknown>[]) => new Set(models.flatMap((m) => Object.keys(m)));
  for (const k of keysUsed(shipped.models)) assert.ok(keysUsed(doc.models).has(k), `the README's models never show ${k}`);
  for (const m of doc.models.filter((x: { provider: string }) => x.provider === 'demo')) {
    assert.deepEqual(m, shipped.models.find((s: { id: string }) => s.id === m.id), `README model ${m.id} differs from the shipped file`);
  }
  for (const k of ['api_key_env', 'api_key_file', 'voices', 'audio_usd_per_unit', 'realtime_upstreams']) assert.match(block, new RegExp(`\\b${k}:`));
});
