// The console's accounts, organisations, members and projects (proto/tollgate/v1/console.proto).
// Roles per docs/design.md#console-roles: admin or above for members, projects and caps; the operator
// for accounts, tiers and credits.
import { generateToken, hashToken, newId } from '../../proto/lib/keys.js';
import type { Account, ConsoleServiceServer, Member, Org } from '../../proto/gen/tollgate/v1/console.js';
import { CpError, invalidArgument, notFound, permissionDenied } from '../errors.js';
import type { Queryable } from '../store/db.js';
import { getAccount, getRole, insertAccount, listMembers, upsertMember, type AccountRow } from '../store/accounts-repo.js';
import {
  addCredit,
  getOrg,
  insertOrg,
  claimFreeGrant,
  countOwnedOrgs,
  setOrgFreeGrant,
  insertProject,
  listAllOrgs,
  listOrgsOfAccount,
  listProjects,
  setOrgOwnCap,
  setOrgTier,
  type ProjectRow,
} from '../store/orgs-repo.js';
import { noteAuditTarget } from '../audit/audit-recorder.js';
import { checkName, ConsoleAccess, isRole, requireId } from './console-access.js';
import { projectOf, projectViews, setProjectCapCall } from './limits-service.js';

const MAX_NOTE = 500;

function accountOf(a: AccountRow): Account {
  return { id: a.id, name: a.name, createdAt: a.created_at };
}

type OrgCalls =
  | 'createAccount'
  | 'whoAmI'
  | 'createOrg'
  | 'listOrgs'
  | 'getOrg'
  | 'setOrgTier'
  | 'creditOrg'
  | 'setOrgCap'
  | 'addMember'
  | 'listMembers'
  | 'createProject'
  | 'listProjects'
  | 'setProjectCap';

export class OrgService extends ConsoleAccess {
  /** An account owns at most `max_orgs_per_account` organisations, unless the operator makes it own more. */
  private async checkOwnedOrgs(q: Queryable, accountId: string): Promise<void> {
    const limit = this.state.gateway.settings.maxOrgsPerAccount;
    const owned = await countOwnedOrgs(q, accountId);
    if (owned >= limit) {
      throw new CpError(
        'FAILED_PRECONDITION',
        `account ${accountId} already owns ${owned} organisation${owned === 1 ? '' : 's'}, the most an account may own (max_orgs_per_account ${limit}); ask the operator for more`,
      );
    }
  }

  private checkTier(raw: string): string {
    const tier = raw.trim() || this.state.gateway.settings.defaultTier;
    if (!this.state.tier(tier)) {
      throw invalidArgument(`unknown tier ${JSON.stringify(tier)}; known tiers: ${[...this.state.gateway.settings.tiers.keys()].join(', ')}`);
    }
    return tier;
  }

  handlers(): Pick<ConsoleServiceServer, OrgCalls> {
    return {
      createAccount: this.unary(async (req, caller) => {
        this.requireOperator(caller);
        const name = checkName('account', req.name);
        const token = generateToken('acct');
        const row: AccountRow = { id: newId('acct'), name, token_hash: hashToken(token), created_at: this.state.nowIso() };
        noteAuditTarget(row.id);
        await this.state.db.tx((tx) => insertAccount(tx, row));
        return { account: accountOf(row), token };
      }),

      whoAmI: this.unary(async (_req, caller) =>
        caller.kind === 'operator' ? { operator: true, account: undefined } : { operator: false, account: accountOf(caller.account) },
      ),

      createOrg: this.unary(async (req, caller) => {
        const name = checkName('organisation', req.name);
        // Every organisation has an owner: the operator names one; an account creating its own
        // becomes its owner, on the default tier (tier changes need the operator).
        let ownerId = req.ownerAccountId.trim();
        if (caller.kind === 'operator') {
          if (!ownerId) throw invalidArgument('owner_account_id is required: name the account that owns the organisation');
        } else {
          if (ownerId && ownerId !== caller.account.id) throw permissionDenied('an account can only create organisations it owns itself');
          if (req.tier.trim() && req.tier.trim() !== this.state.gateway.settings.defaultTier) {
            throw permissionDenied('operator token required to choose a tier other than the default');
          }
          ownerId = caller.account.id;
        }
        const tier = this.checkTier(req.tier);
        const org = { id: newId('org'), name, tier, created_at: this.state.nowIso() };
        noteAuditTarget(org.id, org.id);
        return this.state.db.tx(async (tx) => {
          if (!(await getAccount(tx, ownerId))) throw notFound(`account ${ownerId} not found`);
          if (caller.kind !== 'operator') await this.checkOwnedOrgs(tx, ownerId);
          await insertOrg(tx, org);
          // One free grant per owning account: its first organisation on a tier with a grant takes
          // it, later ones start at their credits (the operator credits them).
          const tierHasGrant = (this.state.tier(tier)?.freeGrantMicros ?? 0) > 0;
          const granted = tierHasGrant && (await claimFreeGrant(tx, ownerId, org.id, org.created_at));
          if (!granted) await setOrgFreeGrant(tx, org.id, false);
          await upsertMember(tx, org.id, ownerId, 'owner');
          await this.state.refreshOrgs(tx, [org.id]);
          return this.state.orgView(tx, (await getOrg(tx, org.id))!, caller.kind === 'operator' ? 'operator' : 'owner');
        });
      }),

      listOrgs: this.unary(async (_req, caller) =>
        this.state.db.read(async (q) => {
          const orgs: Org[] = [];
          if (caller.kind === 'operator') for (const o of await listAllOrgs(q)) orgs.push(await this.state.orgView(q, o, 'operator'));
          else for (const o of await listOrgsOfAccount(q, caller.account.id)) orgs.push(await this.state.orgView(q, o, o.role));
          return { orgs };
        }),
      ),

      getOrg: this.unary(async (req, caller) =>
        this.state.db.read(async (q) => {
          const { org, role } = await this.orgFor(q, caller, req.orgId, 'member');
          return this.state.orgView(q, org, role);
        }),
      ),

      setOrgTier: this.unary(async (req, caller) => {
        this.requireOperator(caller);
        if (!req.tier.trim()) throw invalidArgument('tier is required');
        const tier = this.checkTier(req.tier);
        return this.state.db.tx(async (tx) => {
          const { org } = await this.orgFor(tx, caller, req.orgId, 'owner');
          await setOrgTier(tx, org.id, tier);
          await this.state.refreshOrgs(tx, [org.id], { fundsChanged: true });
          return this.state.orgView(tx, (await getOrg(tx, org.id))!, 'operator');
        });
      }),

      creditOrg: this.unary(async (req, caller) => {
        this.requireOperator(caller);
        if (!Number.isSafeInteger(req.amountMicros) || req.amountMicros <= 0) throw invalidArgument('credit amount must be positive');
        const note = (req.note ?? '').trim();
        if (note.length > MAX_NOTE) throw invalidArgument(`note must be at most ${MAX_NOTE} characters`);
        return this.state.db.tx(async (tx) => {
          const { org } = await this.orgFor(tx, caller, req.orgId, 'owner');
          await addCredit(tx, org.id, req.amountMicros, note, this.state.nowIso());
          await this.state.refreshOrgs(tx, [org.id], { fundsChanged: true });
          return this.state.orgView(tx, (await getOrg(tx, org.id))!, 'operator');
        });
      }),

      setOrgCap: this.unary(async (req, caller) => {
        const cap = req.capMicros ?? null;
        if (cap !== null && (!Number.isSafeInteger(cap) || cap < 0)) throw invalidArgument('cap must not be negative');
        return this.state.db.tx(async (tx) => {
          const { org, role } = await this.orgFor(tx, caller, req.orgId, 'admin');
          await setOrgOwnCap(tx, org.id, cap);
          await this.state.refreshOrgs(tx, [org.id], { fundsChanged: true });
          return this.state.orgView(tx, (await getOrg(tx, org.id))!, role);
        });
      }),

      addMember: this.unary(async (req, caller) => {
        const roleWanted = req.role.trim();
        if (!isRole(roleWanted)) throw invalidArgument(`unknown role ${JSON.stringify(req.role)}; expected owner, admin or member`);
        const accountId = requireId('account_id', req.accountId);
        return this.state.db.tx(async (tx): Promise<Member> => {
          const { org, role } = await this.orgFor(tx, caller, req.orgId, 'admin');
          const account = await getAccount(tx, accountId);
          if (!account) throw notFound(`account ${accountId} not found`);
          const existing = await getRole(tx, org.id, accountId);
          // Only an owner (or the operator) makes owners or changes an owner's role.
          if ((roleWanted === 'owner' || existing === 'owner') && role !== 'owner' && role !== 'operator') {
            throw permissionDenied(`owner role required to grant or change the owner role in organisation ${org.id}`);
          }
          if (roleWanted === 'owner' && existing !== 'owner' && role !== 'operator') await this.checkOwnedOrgs(tx, accountId);
          await upsertMember(tx, org.id, accountId, roleWanted);
          return { orgId: org.id, accountId, accountName: account.name, role: roleWanted };
        });
      }),

      listMembers: this.unary(async (req, caller) =>
        this.state.db.read(async (q) => {
          const { org } = await this.orgFor(q, caller, req.orgId, 'member');
          const members = (await listMembers(q, org.id)).map(
            (m): Member => ({ orgId: m.org_id, accountId: m.account_id, accountName: m.account_name, role: m.role }),
          );
          return { members };
        }),
      ),

      createProject: this.unary(async (req, caller) => {
        const name = checkName('project', req.name);
        return this.state.db.tx(async (tx) => {
          const { org } = await this.orgFor(tx, caller, req.orgId, 'admin');
          const row: ProjectRow = { id: newId('proj'), org_id: org.id, name, created_at: this.state.nowIso() };
          noteAuditTarget(row.id);
          await insertProject(tx, row);
          return projectOf(row);
        });
      }),

      listProjects: this.unary(async (req, caller) =>
        this.state.db.read(async (q) => {
          const { org } = await this.orgFor(q, caller, req.orgId, 'member');
          return { projects: await projectViews(q, await listProjects(q, org.id), this.state.now()) };
        }),
      ),

      setProjectCap: this.unary((req, caller) => setProjectCapCall(this.state, req, (q) => this.projectFor(q, caller, req.projectId, 'admin'), this.opts.onProjectCapSet)),
    };
  }
}
