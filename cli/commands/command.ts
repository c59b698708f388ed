// The shape every CLI command has, and the argument helpers they share. Parsing is node:util
// parseArgs (strict) per command; anything wrong becomes `400 <what>` plus the command's usage.
import { parseUsd } from '../../proto/lib/money.js';
import type { ConsoleClient } from '../console-client.js';
import { usageError, type Out } from '../output.js';

export interface OptionSpec {
  type: 'string' | 'boolean';
  /** Shown in the command's usage, e.g. `--name NAME  the organisation's name`. */
  help: string;
  /** Placeholder for the value (string options), e.g. `NAME`. */
  value?: string;
}

export interface Args {
  values: Record<string, string | boolean | undefined>;
  positionals: string[];
}

export interface Context {
  out: Out;
  /** The console client, created on first use (so bad arguments never dial the control plane). */
  client(): ConsoleClient;
  /** This command's usage text, for errors found while running it. */
  usage: string;
}

export interface Command {
  /** One or two words: `whoami`, `org create`. */
  name: string;
  summary: string;
  /** The arguments part of the synopsis: `ORG --tier TIER`. */
  synopsis: string;
  positionals?: string[];
  /** Set when arguments are refused outright (a secret must not be typed on the command line): the error line, which never echoes them. */
  noArgumentsReason?: string;
  options?: Record<string, OptionSpec>;
  /** Extra lines printed under the usage (constraints, examples). */
  notes?: string[];
  run(ctx: Context, args: Args): Promise<void>;
}

export const GLOBAL_FLAGS_SYNOPSIS = '[--control-plane ADDR] [--token TOKEN] [--json]';

export function commandUsage(cmd: Command): string {
  const lines = [`Usage: tollgate ${GLOBAL_FLAGS_SYNOPSIS} ${cmd.name}${cmd.synopsis ? ` ${cmd.synopsis}` : ''}`, '', cmd.summary];
  const opts = Object.entries(cmd.options ?? {});
  if (opts.length > 0) {
    const labels = opts.map(([name, o]) => `--${name}${o.type === 'string' ? ` ${o.value ?? 'VALUE'}` : ''}`);
    const width = Math.max(...labels.map((l) => l.length));
    lines.push('', 'Options:');
    opts.forEach(([, o], i) => lines.push(`  ${labels[i].padEnd(width)}  ${o.help}`));
  }
  if (cmd.notes?.length) lines.push('', ...cmd.notes);
  return `${lines.join('\n')}\n`;
}

/** A string flag the command cannot run without. */
export function requireString(args: Args, name: string, usage: string): string {
  const v = args.values[name];
  if (typeof v !== 'string') throw usageError(`missing required flag --${name}`, usage);
  return v;
}

export function optionalString(args: Args, name: string): string | undefined {
  const v = args.values[name];
  return typeof v === 'string' ? v : undefined;
}

/** A decimal USD flag parsed exactly into micro-dollars; the sign is left to the control plane to judge. */
export function usdFlag(args: Args, name: string, usage: string): number {
  const text = requireString(args, name, usage);
  const micros = parseUsd(text);
  if (micros === null) throw usageError(`--${name} must be a decimal USD amount such as 5 or 12.50 (at most 6 decimals), got ${JSON.stringify(text)}`, usage);
  return micros;
}

/** Comma-separated list flag: `a,b` → ['a', 'b']; empty parts dropped. */
export function listFlag(args: Args, name: string): string[] {
  const v = optionalString(args, name);
  if (v === undefined) return [];
  return v
    .split(',')
    .map((s) => s.trim())
    .filter((s) => s.length > 0);
}
