import assert from 'node:assert/strict';
import { test } from 'node:test';
import { ConfigError, readProcessFlags } from '../../proto/lib/process-flags.js';

const USAGE = 'usage: p --db PATH [--drain-seconds N]';
const read = (argv: string[]) => readProcessFlags(argv, ['db', 'drain-seconds'] as const, USAGE);
const refusal = (argv: string[]): string => {
  try {
    read(argv);
  } catch (err) {
    assert.ok(err instanceof ConfigError, argv.join(' '));
    return err.message;
  }
  assert.fail(`${argv.join(' ')} was accepted`);
};

test('process flags: both spellings, the last of a repeated flag, and a negative number as a value', () => {
  assert.deepEqual(read(['--db', 'a.db', '--drain-seconds=5']), { db: 'a.db', 'drain-seconds': '5' });
  assert.deepEqual(read(['--db', 'a', '--db', 'b']), { db: 'b' });
  assert.deepEqual(read(['--drain-seconds', '-5']), { 'drain-seconds': '-5' });
  assert.deepEqual(read(['--db=']), { db: '' });
  assert.deepEqual(read([]), {});
});

test('process flags: anything else is one line naming it', () => {
  assert.equal(refusal(['--bogus', '1']), `unknown argument "--bogus"; ${USAGE}`);
  assert.equal(refusal(['--bogus=1']), `unknown argument "--bogus"; ${USAGE}`);
  assert.equal(refusal(['stray']), `unknown argument "stray"; ${USAGE}`);
  assert.equal(refusal(['-d']), `unknown argument "-d"; ${USAGE}`);
  assert.equal(refusal(['--db']), '--db needs a value');
  assert.equal(refusal(['--db', '--drain-seconds', '3']), '--db needs a value');
  assert.equal(refusal(['--help']), USAGE);
  assert.equal(refusal(['--db', 'x', '-h']), USAGE);
});
