// Command-line flags of the long-running processes (control plane, data-plane node): `--flag value`
// or `--flag=value`, only known flags, each with a value. Pure; each process's config.ts owns its list.

/** A bad setting: the process prints the message as one line and exits with code 2. */
export class ConfigError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'ConfigError';
  }
}

export function parseFlags(argv: readonly string[], known: ReadonlySet<string>, usage: string): Map<string, string> {
  const out = new Map<string, string>();
  for (let i = 0; i < argv.length; i++) {
    let arg = argv[i];
    let value: string | undefined;
    const eq = arg.indexOf('=');
    if (arg.startsWith('--') && eq > 0) {
      value = arg.slice(eq + 1);
      arg = arg.slice(0, eq);
    }
    if (arg === '--help' || arg === '-h') throw new ConfigError(usage);
    if (!known.has(arg)) throw new ConfigError(`unknown argument ${JSON.stringify(arg)}; ${usage}`);
    if (value === undefined) {
      value = argv[++i];
      if (value === undefined || value.startsWith('--')) throw new ConfigError(`${arg} needs a value`);
    }
    out.set(arg, value);
  }
  return out;
}
