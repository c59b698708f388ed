// Tests that need organisations, projects and keys quickly use the CLI's own promise client over gRPC
// (the CLI's tests drive the CLI as a process).
import { ConsoleClient } from '../../cli/console-client.js';

export type Console = ConsoleClient;

export function consoleClient(address: string, token: string): Console {
  return new ConsoleClient(address, token);
}

export interface DemoKey {
  key: string;
  keyId: string;
  orgId: string;
  projectId: string;
  accountId: string;
}

/** Creates an account, an organisation on `tier`, a project and a key (or reuses the given ones); returns the key once. */
export async function createKey(
  c: Console,
  opts: { tier?: string; orgId?: string; projectId?: string; allowedModels?: string[]; name?: string } = {},
): Promise<DemoKey> {
  let { orgId, projectId } = opts;
  let accountId = '';
  if (!orgId) {
    const acct = await c.createAccount({ name: `acct-${Math.random().toString(36).slice(2, 8)}` });
    accountId = acct.account!.id;
    const org = await c.createOrg({ name: 'org', ownerAccountId: accountId, tier: opts.tier ?? 'free' });
    orgId = org.id;
  }
  if (!projectId) projectId = (await c.createProject({ orgId, name: 'project' })).id;
  const created = await c.createKey({ projectId, name: opts.name ?? 'key', allowedModels: opts.allowedModels ?? [] });
  return { key: created.key, keyId: created.apiKey!.id, orgId, projectId, accountId };
}
