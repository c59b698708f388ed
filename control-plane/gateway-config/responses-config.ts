// The `responses:` key of the gateway config file: how many owner records of upstream objects
// (responses, conversations, items) a node keeps per project and per organisation, which model's upstream keeps
// conversations, and which of the operator's prompt ids and vector stores each tier may name. Pure.
import { ConfigError } from '../../proto/lib/process-flags.js';
import type { ResponsesSettings } from '../../proto/gen/tollgate/v1/sync.js';

/** Owner records per project when the config names no bound (docs/configuration.md#responses). */
export const DEFAULT_OWNER_RECORDS_PER_PROJECT = 100_000;
/** Per organisation likewise (or the per-project bound, when that is larger). */
export const DEFAULT_OWNER_RECORDS_PER_ORG = 250_000;

const KEYS = new Set(['owner_records_per_project', 'owner_records_per_org', 'conversations_model', 'prompts', 'vector_stores']);

type Obj = Record<string, unknown>;
const isObj = (v: unknown): v is Obj => typeof v === 'object' && v !== null && !Array.isArray(v);

function fail(where: string, msg: string): never {
  throw new ConfigError(`gateway config: ${where}: ${msg}`);
}

/** What the nodes need of a model and a tier to check the section against. */
interface Known {
  models: ReadonlyMap<string, { kind: string }>;
  tiers: ReadonlyMap<string, unknown>;
}

export function parseResponsesConfig(raw: unknown, known: Known): ResponsesSettings {
  const out: ResponsesSettings = { ownerRecordsPerProject: DEFAULT_OWNER_RECORDS_PER_PROJECT, ownerRecordsPerOrg: DEFAULT_OWNER_RECORDS_PER_ORG, conversationsModel: '', prompts: [], vectorStores: [] };
  if (raw === undefined || raw === null) return out;
  if (!isObj(raw)) fail('responses', 'must be a mapping');
  for (const k of Object.keys(raw)) if (!KEYS.has(k)) fail('responses', `unknown setting ${JSON.stringify(k)} (known: ${[...KEYS].join(', ')})`);
  const bound = raw.owner_records_per_project;
  if (bound !== undefined) {
    if (typeof bound !== 'number' || !Number.isSafeInteger(bound) || bound < 1) fail('responses.owner_records_per_project', 'must be a whole number of at least 1');
    out.ownerRecordsPerProject = bound;
  }
  const orgBound = raw.owner_records_per_org;
  if (orgBound !== undefined) {
    if (typeof orgBound !== 'number' || !Number.isSafeInteger(orgBound) || orgBound < 1) fail('responses.owner_records_per_org', 'must be a whole number of at least 1');
    out.ownerRecordsPerOrg = orgBound;
  } else out.ownerRecordsPerOrg = Math.max(DEFAULT_OWNER_RECORDS_PER_ORG, out.ownerRecordsPerProject);
  const model = raw.conversations_model;
  if (model !== undefined) {
    if (typeof model !== 'string' || !known.models.has(model)) fail('responses.conversations_model', `names unknown model ${JSON.stringify(model)}`);
    if (known.models.get(model)!.kind !== 'chat') fail('responses.conversations_model', `${JSON.stringify(model)} must be a model of kind chat`);
    out.conversationsModel = model;
  }
  for (const [tier, ids] of tierLists(raw, 'prompts', 'prompt ids', known)) out.prompts.push({ tier, promptIds: ids });
  for (const [tier, ids] of tierLists(raw, 'vector_stores', 'vector store ids', known)) out.vectorStores.push({ tier, vectorStoreIds: ids });
  return out;
}

/** A mapping of tier name to a list of the operator's upstream object ids (`prompts`, `vector_stores`). */
function tierLists(raw: Obj, key: string, what: string, known: Known): Array<[string, string[]]> {
  const v = raw[key];
  if (v === undefined) return [];
  if (!isObj(v)) fail(`responses.${key}`, `must be a mapping of tier name to a list of ${what}`);
  return Object.entries(v).map(([tier, ids]) => {
    const where = `responses.${key}.${tier}`;
    if (!known.tiers.has(tier)) fail(where, `names unknown tier ${JSON.stringify(tier)}`);
    if (!Array.isArray(ids) || ids.some((x) => typeof x !== 'string' || x === '')) fail(where, `must be a list of ${what}`);
    return [tier, [...new Set(ids as string[])]];
  });
}
