import assert from 'node:assert/strict';
import { test } from 'node:test';
import { ConfigError } from '../../proto/lib/process-flags.js';
import { parseWebhooksConfig } from '../../control-plane/gateway-config/webhook-config.js';

const SECRET = `whsec_${Buffer.alloc(32, 7).toString('base64')}`;
const env = { HOOK: SECRET, SHORT: 'whsec_c2hvcnQ=', PLAIN: 'not-a-whsec-secret' };

test('webhook destinations: valid entries, and every mistake named in one line without the secret', () => {
  const ok = parseWebhooksConfig([{ url: 'https://h.example/x', secret_env: 'HOOK', events: ['org.blocked', 'key.revoked'] }], '2.50', env);
  assert.equal(ok.balanceLowMicros, 2_500_000);
  assert.equal(ok.destinations[0].url, 'https://h.example/x');
  assert.deepEqual([...ok.destinations[0].events], ['org.blocked', 'key.revoked']);
  assert.equal(ok.destinations[0].retryInitialMs, 5000);
  assert.equal(parseWebhooksConfig([{ url: 'http://h/', secret_env: 'HOOK', events: ['*'] }], undefined, env).destinations[0].events.size, 11);
  assert.deepEqual(parseWebhooksConfig(undefined, undefined, env), { destinations: [], balanceLowMicros: 1_000_000 });

  const bad: [unknown, unknown, RegExp][] = [
    [{ url: 'x' }, undefined, /^webhooks: must be a list/],
    [[{ url: 'ftp://h/', secret_env: 'HOOK', events: ['*'] }], undefined, /url: must be http/],
    [[{ url: 'https://u:p@h/', secret_env: 'HOOK', events: ['*'] }], undefined, /must not carry credentials/],
    [[{ url: 'https://h/', secret_env: 'MISSING', events: ['*'] }], undefined, /MISSING is not set/],
    [[{ url: 'https://h/', secret_env: 'SHORT', events: ['*'] }], undefined, /SHORT must hold a Standard Webhooks secret/],
    [[{ url: 'https://h/', secret_env: 'PLAIN', events: ['*'] }], undefined, /PLAIN must hold a Standard Webhooks secret/],
    [[{ url: 'https://h/', secret_env: 'HOOK', events: ['org.spent'] }], undefined, /unknown event type "org.spent"/],
    [[{ url: 'https://h/', secret_env: 'HOOK', events: [] }], undefined, /events: must be a non-empty list/],
    [[{ url: 'https://h/', secret_env: 'HOOK', events: ['*'], retry_initial_ms: 5 }], undefined, /retry_initial_ms/],
    [[{ url: 'https://h/', secret_env: 'HOOK', events: ['*'], secret: 'x' }], undefined, /unknown key "secret"/],
    [[{ url: 'https://h/', secret_env: 'HOOK', events: ['*'] }, { url: 'https://h/', secret_env: 'HOOK', events: ['*'] }], undefined, /listed twice/],
    [[], '-1', /webhook_balance_low_usd/],
  ];
  for (const [raw, low, re] of bad) {
    assert.throws(() => parseWebhooksConfig(raw, low, env), (err: Error) => {
      assert.ok(err instanceof ConfigError);
      assert.match(err.message, re);
      assert.ok(!err.message.includes(SECRET) && !err.message.includes('not-a-whsec-secret'));
      return true;
    });
  }
});
