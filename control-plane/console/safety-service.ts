// Maps a `safety_identifier` an upstream reported back to whom it was made for (docs/safety-identifier.md):
// the control plane holds the pepper the identifiers are made with, so it recomputes the identifier of
// every organisation, project and key it knows and answers the one that matches. Operator only.
import type { ConsoleServiceServer } from '../../proto/gen/tollgate/v1/console.js';
import { safetyIdentifierBase, safetyIdentifierOf, safetyIdKey, safetySubject } from '../../proto/lib/safety-identifier.js';
import { invalidArgument, notFound } from '../errors.js';
import { listAllKeyIds } from '../store/keys-repo.js';
import { listAllOrgs, listAllProjectIds } from '../store/orgs-repo.js';
import { ConsoleAccess } from './console-access.js';

const IDENTIFIER = /^tg_[A-Za-z0-9_-]{22}$/;

export class SafetyService extends ConsoleAccess {
  handlers(): Pick<ConsoleServiceServer, 'resolveSafetyIdentifier'> {
    return {
      resolveSafetyIdentifier: this.unary(async (req, caller) => {
        this.requireOperator(caller);
        const base = safetyIdentifierBase(req.value ?? '');
        if (!IDENTIFIER.test(base)) throw invalidArgument('that is not a Tollgate safety identifier: tg_ and 22 characters, optionally a dot and a client part');
        const key = safetyIdKey(this.opts.pepper);
        const made = (subject: string) => safetyIdentifierOf(key, subject) === base;
        return this.state.db.read(async (q) => {
          for (const p of await listAllProjectIds(q)) {
            if (made(safetySubject('project', { projectId: p.id, keyId: '', orgId: p.org_id }))) return { subject: 'project', projectId: p.id, orgId: p.org_id, keyId: '' };
          }
          for (const k of await listAllKeyIds(q)) {
            if (made(safetySubject('key', { projectId: k.project_id, keyId: k.id, orgId: k.org_id }))) return { subject: 'key', projectId: k.project_id, orgId: k.org_id, keyId: k.id };
          }
          for (const o of await listAllOrgs(q)) {
            if (made(safetySubject('organisation', { projectId: '', keyId: '', orgId: o.id }))) return { subject: 'organisation', projectId: '', orgId: o.id, keyId: '' };
          }
          throw notFound('no project, key or organisation of this gateway has this safety identifier (made with another pepper?)');
        });
      }),
    };
  }
}
