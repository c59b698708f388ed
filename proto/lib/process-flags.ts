// Command-line flags of the long-running processes (control plane, data-plane node), read with
// node:util parseArgs: `--flag value` or `--flag=value`, only known flags, each with a value. Each
// process's config.ts owns its list; this module only turns what parseArgs found into one-line errors.
import { parseArgs } from 'node:util';

/** A bad setting: the process prints the message as one line and exits with code 2. */
export class ConfigError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'ConfigError';
  }
}

/**
 * The values of NAMES (without the leading `--`) in ARGV. Anything else (an unknown flag, a
 * positional, a flag without its value) is a ConfigError; `--help` or `-h` is a ConfigError holding
 * USAGE. A value that starts with `--` is taken for a forgotten value; one that starts with a single
 * `-` (a negative number) is a value, judged by the caller. The last of a repeated flag wins.
 */
export function readProcessFlags<N extends string>(argv: readonly string[], names: readonly N[], usage: string): Partial<Record<N, string>> {
  const options = Object.fromEntries(names.map((n) => [n, { type: 'string' as const }]));
  // Not strict: parseArgs' strict mode refuses a value starting with `-`, and its errors are wordy.
  const { values, tokens } = parseArgs({ args: [...argv], options, strict: false, allowPositionals: true, tokens: true });
  for (const t of tokens) {
    if (t.kind !== 'option') throw new ConfigError(`unknown argument ${JSON.stringify(t.kind === 'positional' ? t.value : '--')}; ${usage}`);
    if (t.rawName === '--help' || t.rawName === '-h') throw new ConfigError(usage);
    if (!(names as readonly string[]).includes(t.name) || t.rawName !== `--${t.name}`) throw new ConfigError(`unknown argument ${JSON.stringify(t.rawName)}; ${usage}`);
    if (t.value === undefined || (!t.inlineValue && t.value.startsWith('--'))) throw new ConfigError(`${t.rawName} needs a value`);
  }
  return { ...values } as Partial<Record<N, string>>;
}
