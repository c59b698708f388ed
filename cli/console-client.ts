// A promise-based client of the console API (proto/tollgate/v1/console.proto): the bearer token in
// metadata and a deadline on every call. Given several control planes (`a:50051,b:50051`) it finds the
// leader itself: a standby's UNAVAILABLE names the leader and the call goes there; an address that
// takes no connection, or none within CONNECT_TIMEOUT_MS, is passed over for the next
// (docs/design.md#several-control-planes-on-one-database).
import { Metadata, status as GrpcStatus, type CallOptions, type ClientUnaryCall, type ServiceError } from '@grpc/grpc-js';
import { clientChannel, type TlsFiles } from '../proto/lib/tls.js';
import { isStandbyRefusal, leaderFromDetails, splitAddresses } from '../proto/lib/leader-hint.js';
import { CONNECT_TIMEOUT_MS, whenConnectionSettled } from '../proto/lib/connection-wait.js';
import {
  ConsoleServiceClient,
  type AddMemberRequest,
  type ApiKey,
  type CreateAccountRequest,
  type CreateAccountResponse,
  CreateKeyRequest,
  type CreateKeyResponse,
  type CreateOrgRequest,
  type CreateProjectRequest,
  type CreditOrgRequest,
  type FindKeyRequest,
  type ResolveSafetyIdentifierRequest,
  type ResolveSafetyIdentifierResponse,
  type GetKeyRequest,
  type GetOrgRequest,
  type GetModelsStatusRequest,
  type GetModelsStatusResponse,
  type SetDeploymentStateRequest,
  type SetDeploymentStateResponse,
  GetUsageRequest,
  type GetUsageResponse,
  ListKeysRequest,
  type KeyPolicy,
  type SetKeyPolicyRequest,
  type SetProjectCapRequest,
  type ListKeysResponse,
  type ListMembersRequest,
  type ListMembersResponse,
  type ListModelsResponse,
  type ListNodesResponse,
  type ListOrgsResponse,
  type ListProjectsRequest,
  type ListProjectsResponse,
  type Member,
  type Org,
  type Project,
  type ReloadConfigResponse,
  type RevokeKeyRequest,
  type RevokeKeyResponse,
  type SetOrgCapRequest,
  type SetOrgTierRequest,
  type WhoAmIResponse,
  ListRequestLogsRequest,
  ListRequestLogsResponse,
  type ListAuditEntriesRequest,
  type ListAuditEntriesResponse,
  type ListWebhookDeliveriesRequest,
  type ListWebhookDeliveriesResponse,
  type ListWebhooksResponse,
  type TestWebhookResponse,
} from '../proto/gen/tollgate/v1/console.js';

export const DEFAULT_CONTROL_PLANE = '127.0.0.1:50051';
export const DEFAULT_TIMEOUT_MS = 30_000;
/** Revocation waits for every node's ack (bounded by the control plane), so it gets longer. */
export const REVOKE_TIMEOUT_MS = 120_000;

type UnaryMethod<Req, Res> = (
  request: Req,
  metadata: Metadata,
  options: Partial<CallOptions>,
  callback: (error: ServiceError | null, response: Res) => void,
) => ClientUnaryCall;

/** An UNAVAILABLE that says the call never ran: a standby's refusal, or no connection made. */
function neverRan(err: ServiceError): boolean {
  return err.code === GrpcStatus.UNAVAILABLE && (isStandbyRefusal(err.details) || /No connection established|ECONNREFUSED/.test(err.details ?? ''));
}

/** What a call that never started says: read as no connection made (neverRan). */
function notConnected(): ServiceError {
  const details = `No connection established within ${CONNECT_TIMEOUT_MS} ms`;
  return Object.assign(new Error(`${GrpcStatus.UNAVAILABLE} UNAVAILABLE: ${details}`), { code: GrpcStatus.UNAVAILABLE, details, metadata: new Metadata() });
}

export class ConsoleClient {
  private readonly addresses: string[];
  private readonly clients = new Map<string, ConsoleServiceClient>();
  /** The address calls go to: the first given, then the leader found. */
  private current: string;

  constructor(
    readonly address: string,
    private readonly token: string | undefined,
    /** TLS to the control plane (default: plaintext). */
    private readonly tls: TlsFiles | null = null,
    /** Told when a standby sent the call on to the leader it named. */
    private readonly onRedirect?: (from: string, details: string, to: string) => void,
  ) {
    const list = splitAddresses(address);
    this.addresses = list.length > 0 ? list : [address];
    this.current = this.addresses[0];
  }

  private clientFor(address: string): ConsoleServiceClient {
    let c = this.clients.get(address);
    if (!c) {
      const channel = clientChannel(this.tls, address);
      this.clients.set(address, (c = new ConsoleServiceClient(address, channel.credentials, channel.options)));
    }
    return c;
  }

  /** The client of the address calls go to now (its methods are the same on every address's client). */
  private get client(): ConsoleServiceClient {
    return this.clientFor(this.current);
  }

  close(): void {
    for (const c of this.clients.values()) c.close();
  }

  private connectionSettled(timeoutMs: number): Promise<boolean> {
    return new Promise((resolve) => whenConnectionSettled(this.client.getChannel(), timeoutMs, resolve));
  }

  private callOnce<Req, Res>(method: UnaryMethod<Req, Res>, request: Req, deadline: number): Promise<Res> {
    const metadata = new Metadata();
    if (this.token) metadata.set('authorization', `Bearer ${this.token}`);
    return new Promise<Res>((resolve, reject) => {
      method.call(this.client, request, metadata, { deadline }, (err, res) => (err ? reject(err) : resolve(res)));
    });
  }

  /**
   * One call, sent again elsewhere only when it never ran: to the leader a standby names, else to the
   * next address not yet tried. A call that may have run is never sent twice.
   */
  private async call<Req, Res>(method: UnaryMethod<Req, Res>, request: Req, timeoutMs = DEFAULT_TIMEOUT_MS): Promise<Res> {
    const deadline = Date.now() + timeoutMs;
    const tried = new Set<string>();
    let standbyErr: ServiceError | null = null;
    for (;;) {
      try {
        // With another address to try, one whose connection is not made soon is passed over.
        const other = this.addresses.some((a) => a !== this.current && !tried.has(a));
        if (other && !(await this.connectionSettled(Math.min(CONNECT_TIMEOUT_MS, deadline - Date.now())))) throw notConnected();
        return await this.callOnce(method, request, deadline);
      } catch (err) {
        const e = err as ServiceError;
        if (!neverRan(e)) throw err;
        tried.add(this.current);
        if (isStandbyRefusal(e.details)) standbyErr = e;
        const leader = isStandbyRefusal(e.details) ? leaderFromDetails(e.details) : null;
        const next = leader !== null && !tried.has(leader) ? leader : this.addresses.find((a) => !tried.has(a));
        // Nowhere left: a standby's refusal says more than a refused connection.
        if (next === undefined) throw standbyErr ?? err;
        if (next === leader) this.onRedirect?.(this.current, e.details, next);
        this.current = next;
      }
    }
  }

  createAccount(req: CreateAccountRequest): Promise<CreateAccountResponse> {
    return this.call(this.client.createAccount, req);
  }
  whoAmI(): Promise<WhoAmIResponse> {
    return this.call(this.client.whoAmI, {});
  }
  createOrg(req: CreateOrgRequest): Promise<Org> {
    return this.call(this.client.createOrg, req);
  }
  listOrgs(): Promise<ListOrgsResponse> {
    return this.call(this.client.listOrgs, {});
  }
  getOrg(req: GetOrgRequest): Promise<Org> {
    return this.call(this.client.getOrg, req);
  }
  setOrgTier(req: SetOrgTierRequest): Promise<Org> {
    return this.call(this.client.setOrgTier, req);
  }
  creditOrg(req: CreditOrgRequest): Promise<Org> {
    return this.call(this.client.creditOrg, req);
  }
  setOrgCap(req: SetOrgCapRequest): Promise<Org> {
    return this.call(this.client.setOrgCap, req);
  }
  addMember(req: AddMemberRequest): Promise<Member> {
    return this.call(this.client.addMember, req);
  }
  listMembers(req: ListMembersRequest): Promise<ListMembersResponse> {
    return this.call(this.client.listMembers, req);
  }
  createProject(req: CreateProjectRequest): Promise<Project> {
    return this.call(this.client.createProject, req);
  }
  listProjects(req: ListProjectsRequest): Promise<ListProjectsResponse> {
    return this.call(this.client.listProjects, req);
  }
  /** Fields left out are empty (no expiry asked for). */
  createKey(req: Partial<CreateKeyRequest>): Promise<CreateKeyResponse> {
    return this.call(this.client.createKey, CreateKeyRequest.fromPartial(req));
  }
  listKeys(req: Partial<ListKeysRequest>): Promise<ListKeysResponse> {
    return this.call(this.client.listKeys, ListKeysRequest.fromPartial(req));
  }
  setKeyPolicy(req: SetKeyPolicyRequest): Promise<KeyPolicy> {
    return this.call(this.client.setKeyPolicy, req);
  }

  setProjectCap(req: SetProjectCapRequest): Promise<Project> {
    return this.call(this.client.setProjectCap, req);
  }
  revokeKey(req: RevokeKeyRequest): Promise<RevokeKeyResponse> {
    return this.call(this.client.revokeKey, req, REVOKE_TIMEOUT_MS);
  }
  /** Fields left out are empty (the current month, one row per key and model). */
  getUsage(req: Partial<GetUsageRequest>): Promise<GetUsageResponse> {
    return this.call(this.client.getUsage, GetUsageRequest.fromPartial(req));
  }
  getKey(req: GetKeyRequest): Promise<ApiKey> {
    return this.call(this.client.getKey, req);
  }
  findKey(req: FindKeyRequest): Promise<ApiKey> {
    return this.call(this.client.findKey, req);
  }
  resolveSafetyIdentifier(req: ResolveSafetyIdentifierRequest): Promise<ResolveSafetyIdentifierResponse> {
    return this.call(this.client.resolveSafetyIdentifier, req);
  }
  listModels(): Promise<ListModelsResponse> {
    return this.call(this.client.listModels, {});
  }
  listNodes(): Promise<ListNodesResponse> {
    return this.call(this.client.listNodes, {});
  }
  getModelsStatus(req: GetModelsStatusRequest): Promise<GetModelsStatusResponse> {
    return this.call(this.client.getModelsStatus, req);
  }
  setDeploymentState(req: SetDeploymentStateRequest): Promise<SetDeploymentStateResponse> {
    return this.call(this.client.setDeploymentState, req);
  }
  reloadConfig(): Promise<ReloadConfigResponse> {
    return this.call(this.client.reloadConfig, {});
  }
  listRequestLogs(req: ListRequestLogsRequest): Promise<ListRequestLogsResponse> {
    return this.call(this.client.listRequestLogs, req);
  }
  listWebhooks(): Promise<ListWebhooksResponse> {
    return this.call(this.client.listWebhooks, {});
  }
  testWebhook(url: string): Promise<TestWebhookResponse> {
    return this.call(this.client.testWebhook, { url });
  }
  listWebhookDeliveries(req: ListWebhookDeliveriesRequest): Promise<ListWebhookDeliveriesResponse> {
    return this.call(this.client.listWebhookDeliveries, req);
  }
  listAuditEntries(req: ListAuditEntriesRequest): Promise<ListAuditEntriesResponse> {
    return this.call(this.client.listAuditEntries, req);
  }
}
