// `tollgate [--control-plane ADDR] [--token TOKEN] [--json] COMMAND …`: the admin CLI, a gRPC client
// of the control plane's console API. Exit codes: 0 ok, 1 the call failed, 2 bad arguments. A failure
// is one line on stderr starting with an HTTP-style status (`403 …`); never a stack trace.
import { parseArgs, type ParseArgsConfig } from 'node:util';
import { isLoopbackAddress, readTlsFiles } from '../proto/lib/tls.js';
import { splitAddresses } from '../proto/lib/leader-hint.js';
import { accountCommands } from './commands/account.js';
import { commandUsage, GLOBAL_FLAGS_SYNOPSIS, type Args, type Command, type OptionSpec } from './commands/command.js';
import { keyCommands } from './commands/key.js';
import { logsCommands } from './commands/logs.js';
import { memberCommands } from './commands/member.js';
import { miscCommands } from './commands/misc.js';
import { orgCommands } from './commands/org.js';
import { poolCommands } from './commands/pools.js';
import { projectCommands } from './commands/project.js';
import { auditCommands, webhooksCommands } from './commands/webhooks.js';
import { ConsoleClient, DEFAULT_CONTROL_PLANE } from './console-client.js';
import { describeError, stdOut, usageError } from './output.js';

const COMMANDS: Command[] = [
  ...accountCommands,
  ...orgCommands,
  ...memberCommands,
  ...projectCommands,
  ...keyCommands,
  ...miscCommands,
  ...poolCommands,
  ...logsCommands,
  ...webhooksCommands,
  ...auditCommands,
];

const GLOBAL_OPTIONS: Record<string, OptionSpec> = {
  'control-plane': { type: 'string', value: 'ADDR', help: `control plane address, or several separated by commas (the leader is found among them; env TOLLGATE_CONTROL_PLANE; default ${DEFAULT_CONTROL_PLANE})` },
  token: { type: 'string', value: 'TOKEN', help: 'the operator token or an account console token (env TOLLGATE_TOKEN)' },
  json: { type: 'boolean', help: 'print exactly one JSON object (snake_case fields) instead of tables' },
  'tls-ca': { type: 'string', value: 'FILE', help: "CA that signed the control plane's certificate: connect with TLS (env TOLLGATE_TLS_CA)" },
  'tls-cert': { type: 'string', value: 'FILE', help: 'client certificate, when the control plane requires one (env TOLLGATE_TLS_CERT)' },
  'tls-key': { type: 'string', value: 'FILE', help: 'key of the client certificate (env TOLLGATE_TLS_KEY)' },
};
const TLS_FLAGS = ['tls-ca', 'tls-cert', 'tls-key'] as const;

function generalHelp(): string {
  const rows = COMMANDS.map((c) => [`${c.name}${c.synopsis ? ` ${c.synopsis}` : ''}`, c.summary]);
  const width = Math.max(...rows.map(([left]) => left.length));
  const flagLabels = Object.entries(GLOBAL_OPTIONS).map(([n, o]) => [`--${n}${o.type === 'string' ? ` ${o.value}` : ''}`, o.help]);
  flagLabels.push(['--help', 'this help; `tollgate COMMAND --help` shows the usage of one command']);
  const flagWidth = Math.max(...flagLabels.map(([l]) => l.length));
  return [
    'tollgate: the Tollgate admin CLI (a client of the control plane console API)',
    '',
    `Usage: tollgate ${GLOBAL_FLAGS_SYNOPSIS} COMMAND [ARGS]`,
    '',
    'Commands:',
    ...rows.map(([left, summary]) => `  ${left.padEnd(width)}  ${summary}`),
    '',
    'Global flags:',
    ...flagLabels.map(([l, h]) => `  ${l.padEnd(flagWidth)}  ${h}`),
    '',
    'Failures print one line on stderr starting with an HTTP-style status (401, 403, 404, 400, ...);',
    'the exit code is 1 when the control plane refused, 2 for bad arguments.',
    '',
  ].join('\n');
}

function groupHelp(group: string): string {
  const cmds = COMMANDS.filter((c) => c.name.startsWith(`${group} `));
  const width = Math.max(...cmds.map((c) => c.name.length + 1 + c.synopsis.length));
  return [
    `Usage: tollgate ${GLOBAL_FLAGS_SYNOPSIS} ${group} SUBCOMMAND`,
    '',
    ...cmds.map((c) => `  ${`${c.name} ${c.synopsis}`.padEnd(width)}  ${c.summary}`),
    '',
  ].join('\n');
}

/** Turns parseArgs' wordy errors into one short line. */
function parseErrorLine(err: unknown): string {
  const e = err as { code?: string; message?: string };
  const flag = /'(-{1,2}[^' =]+)/.exec(e.message ?? '')?.[1];
  switch (e.code) {
    case 'ERR_PARSE_ARGS_UNKNOWN_OPTION':
      return `unknown flag ${flag ?? ''}`.trim();
    case 'ERR_PARSE_ARGS_INVALID_OPTION_VALUE':
      if (/does not take an argument/.test(e.message ?? '')) return `flag ${flag} takes no value`;
      return `flag ${flag} needs a value${/ambiguous/.test(e.message ?? '') ? ` (write ${flag}=VALUE for a value starting with -)` : ''}`;
    default:
      return (e.message ?? 'bad arguments').split('. ')[0];
  }
}

/** `--usd -5` means the value -5 (the control plane judges its sign), not an unknown flag `-5`. */
function joinNegativeValues(tokens: string[], stringFlags: Set<string>): string[] {
  const out: string[] = [];
  for (let i = 0; i < tokens.length; i++) {
    const t = tokens[i];
    if (t === '--') {
      out.push(...tokens.slice(i));
      break;
    }
    const next = tokens[i + 1];
    if (t.startsWith('--') && !t.includes('=') && stringFlags.has(t.slice(2)) && next !== undefined && /^-[\d.]/.test(next)) {
      out.push(`${t}=${next}`);
      i++;
    } else out.push(t);
  }
  return out;
}

interface Globals {
  json?: boolean;
  controlPlane?: string;
  token?: string;
  tls: Partial<Record<(typeof TLS_FLAGS)[number], string>>;
}

async function runCli(argv: string[]): Promise<number> {
  const globals: Globals = { tls: {} };
  let address = process.env.TOLLGATE_CONTROL_PLANE || DEFAULT_CONTROL_PLANE;
  let usage: string | undefined = generalHelp();
  let client: ConsoleClient | undefined;
  try {
    // Global flags before the command.
    let i = 0;
    for (; i < argv.length && argv[i].startsWith('-'); i++) {
      const [flag, inline] = argv[i].split(/=(.*)/s, 2) as [string, string | undefined];
      if (flag === '--help' || flag === '-h') {
        process.stdout.write(generalHelp());
        return 0;
      }
      if (flag === '--json' && inline === undefined) globals.json = true;
      else if (flag === '--control-plane' || flag === '--token' || TLS_FLAGS.some((f) => flag === `--${f}`)) {
        const value = inline ?? argv[++i];
        if (value === undefined) throw usageError(`flag ${flag} needs a value`);
        if (flag === '--token') globals.token = value;
        else if (flag === '--control-plane') globals.controlPlane = value;
        else globals.tls[flag.slice(2) as (typeof TLS_FLAGS)[number]] = value;
      } else throw usageError(argv[i] === '--' ? 'missing command' : `unknown flag ${flag}`);
    }
    const rest = argv.slice(i);
    if (rest.length === 0) {
      process.stdout.write(generalHelp());
      return 0;
    }
    if (rest[0] === 'help') {
      const cmd = COMMANDS.find((c) => c.name === rest.slice(1).join(' '));
      if (cmd) process.stdout.write(commandUsage(cmd));
      else if (rest.length === 2 && COMMANDS.some((c) => c.name.startsWith(`${rest[1]} `))) process.stdout.write(groupHelp(rest[1]));
      else process.stdout.write(generalHelp());
      return 0;
    }

    // The command: two words when the first names a group (`org create`), else one (`whoami`).
    let cmd = COMMANDS.find((c) => c.name === rest[0]);
    let argStart = 1;
    if (!cmd && COMMANDS.some((c) => c.name.startsWith(`${rest[0]} `))) {
      const group = rest[0];
      const sub = rest[1];
      if (sub === undefined || sub === '--help' || sub === '-h') {
        if (sub === undefined) throw usageError(`${group}: missing subcommand`, groupHelp(group));
        process.stdout.write(groupHelp(group));
        return 0;
      }
      cmd = COMMANDS.find((c) => c.name === `${group} ${sub}`);
      if (!cmd) throw usageError(`unknown command "${group} ${sub}"`, groupHelp(group));
      argStart = 2;
    }
    if (!cmd) throw usageError(`unknown command "${rest[0]}"`);
    const command = cmd;
    usage = commandUsage(command);

    const tokens = rest.slice(argStart);
    const dashDash = tokens.indexOf('--');
    const flagsPart = dashDash === -1 ? tokens : tokens.slice(0, dashDash);
    if (flagsPart.includes('--help') || flagsPart.includes('-h')) {
      process.stdout.write(usage);
      return 0;
    }
    const optionSpecs = { ...GLOBAL_OPTIONS, ...(command.options ?? {}) };
    const options: NonNullable<ParseArgsConfig['options']> = {};
    for (const [name, o] of Object.entries(optionSpecs)) options[name] = { type: o.type };
    const stringFlags = new Set(Object.entries(optionSpecs).filter(([, o]) => o.type === 'string').map(([n]) => n));
    let parsed: Args;
    try {
      const r = parseArgs({ args: joinNegativeValues(tokens, stringFlags), options, allowPositionals: true, strict: true });
      parsed = { values: r.values as Args['values'], positionals: r.positionals };
    } catch (err) {
      throw usageError(parseErrorLine(err), usage);
    }
    const wanted = command.positionals ?? [];
    if (parsed.positionals.length < wanted.length) throw usageError(`missing ${wanted[parsed.positionals.length]}`, usage);
    if (parsed.positionals.length > wanted.length && command.noArgumentsReason) throw usageError(command.noArgumentsReason, usage);
    if (parsed.positionals.length > wanted.length) throw usageError(`unexpected argument ${JSON.stringify(parsed.positionals[wanted.length])}`, usage);
    if (parsed.positionals.some((p) => p.trim() === '')) throw usageError(`${wanted[parsed.positionals.findIndex((p) => p.trim() === '')]} must not be empty`, usage);

    // Global flags may also follow the command.
    const json = globals.json === true || parsed.values.json === true;
    const controlPlane = (parsed.values['control-plane'] as string | undefined) ?? globals.controlPlane;
    if (controlPlane !== undefined) address = controlPlane;
    const token = (parsed.values.token as string | undefined) ?? globals.token ?? (process.env.TOLLGATE_TOKEN || undefined);
    if (address.trim() === '') throw usageError('--control-plane must not be empty', usage);

    const tlsPath = (f: (typeof TLS_FLAGS)[number]) =>
      (parsed.values[f] as string | undefined) ?? globals.tls[f] ?? (process.env[`TOLLGATE_${f.replace('-', '_').toUpperCase()}`] || undefined);
    let tls;
    try {
      tls = readTlsFiles({ ca: tlsPath('tls-ca'), cert: tlsPath('tls-cert'), key: tlsPath('tls-key') });
    } catch (err) {
      throw usageError((err as Error).message, usage);
    }
    if (!tls && token && !splitAddresses(address).every(isLoopbackAddress)) process.stderr.write(`warning: the token goes in plaintext to ${address}; pass --tls-ca (or set TOLLGATE_TLS_CA)\n`);

    const commandUsageText = usage;
    await command.run(
      {
        out: stdOut(json),
        usage: commandUsageText,
        client: () => (client ??= new ConsoleClient(address, token, tls, (from, details, to) => process.stderr.write(`note: ${from} answered "${details}"; asking ${to}\n`))),
      },
      parsed,
    );
    return 0;
  } catch (err) {
    const { line, exitCode, usage: errUsage } = describeError(err, address);
    process.stderr.write(`${line}\n`);
    if (errUsage ?? (exitCode === 2 ? usage : undefined)) process.stderr.write(`\n${errUsage ?? usage}`);
    return exitCode;
  } finally {
    client?.close();
  }
}

process.exitCode = await runCli(process.argv.slice(2));
