// The reference for the control plane's cost per message: a bare SyncService in its own process. It
// decodes what nodes send with the same generated codec and answers each message with the messages
// the control plane sends for it (a snapshot for Hello, ReportAck(s) for reports; for a lease request,
// a grant acknowledging `used` and empty grants of the standing shares and slices it asks for). It
// keeps, checks and writes nothing, and grants no key, slot or money want (so --bare refuses
// --fake-leases per-minute). What the control plane costs above it is its own work; what it costs up
// to it is the price of the messages themselves, on this machine, with grpc-js.
// Used by `npm run bench:tenants -- --fake-nodes --bare`. Prints `bare sync listening on HOST:PORT`.
import { Server, ServerCredentials, status, type ServerDuplexStream } from '@grpc/grpc-js';
import { SyncServiceService, type ControlMessage, type LeaseGrant, type NodeMessage } from '../../proto/gen/tollgate/v1/sync.js';

function grant(p: Partial<LeaseGrant>): LeaseGrant {
  return { keys: [], orgs: [], pools: [], usedAck: 0, slots: [], bulk: undefined, slotShare: undefined, reclaiming: false, orgSlices: false, ...p };
}

function connect(call: ServerDuplexStream<NodeMessage, ControlMessage>): void {
  call.on('data', (msg: NodeMessage) => {
    if (msg.hello) call.write({ snapshot: { version: 1, config: undefined, keys: [], orgs: [], tombstones: [] } });
    else if (msg.report) call.write({ reportAck: { seq: msg.report.seq, instanceId: msg.report.instanceId } });
    else if (msg.reports) call.write({ reportAcks: { acks: msg.reports.reports.map((r) => ({ seq: r.seq, instanceId: r.instanceId })) } });
    else if (msg.leaseRequest) {
      // As many grants as the control plane sends (lease-service.ts): one acknowledging `used`, one
      // for the standing shares asked, one for the organisations' slices asked; each empty here.
      const r = msg.leaseRequest;
      if (r.usedSeq > 0) call.write({ leaseGrant: grant({ usedAck: r.usedSeq }) });
      if (r.bulkMinute > 0 || r.wantSlotShare) {
        call.write({
          leaseGrant: grant({
            bulk: r.bulkMinute > 0 ? { minute: r.bulkMinute, granted: false, nodes: 1, exceptions: [] } : undefined,
            slotShare: r.wantSlotShare ? { granted: false, nodes: 1, exceptions: [] } : undefined,
          }),
        });
      }
      if (r.wantOrgSlices) call.write({ leaseGrant: grant({ orgSlices: true }) });
    }
  });
  call.on('end', () => call.end());
  call.on('error', () => undefined);
}

const server = new Server({ 'grpc.max_receive_message_length': 64 * 1024 * 1024 });
server.addService(SyncServiceService, {
  connect,
  queryUsage: (_call: unknown, cb: (err: { code: number; details: string }) => void) => cb({ code: status.UNIMPLEMENTED, details: 'bare sync server' }),
});
server.bindAsync('127.0.0.1:0', ServerCredentials.createInsecure(), (err, port) => {
  if (err) throw err;
  console.log(`bare sync listening on 127.0.0.1:${port}`);
});
process.on('SIGTERM', () => {
  server.tryShutdown(() => process.exit(0));
  // Streams that do not end within a second are cut.
  setTimeout(() => {
    server.forceShutdown();
    process.exit(0);
  }, 1000).unref();
});
