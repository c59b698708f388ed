// Standard gRPC tooling on the control plane: the health service (grpc.health.v1) and server
// reflection (v1 and v1alpha, @grpc/reflection), so grpcurl, grpc_health_probe and Kubernetes gRPC
// probes work. Reflection describes the console API and the health service; the sync API is the
// nodes' protocol and is not listed. Both load their .proto files at run time with @grpc/proto-loader.
import { loadPackageDefinition, status as GrpcStatus, type Server, type ServerDuplexStream, type ServerUnaryCall, type ServerWritableStream, type sendUnaryData, type ServiceDefinition, type UntypedServiceImplementation } from '@grpc/grpc-js';
import { loadSync, type PackageDefinition } from '@grpc/proto-loader';
import { ReflectionService } from '@grpc/reflection';
import { fileURLToPath } from 'node:url';

const PROTO_ROOT = fileURLToPath(new URL('../../proto', import.meta.url));
// control-plane/, so the health proto's file name is the standard grpc/health/v1/health.proto.
const OPS_ROOT = fileURLToPath(new URL('..', import.meta.url));

export const CONSOLE_SERVICE = 'tollgate.v1.ConsoleService';
export const SYNC_SERVICE = 'tollgate.v1.SyncService';
const HEALTH_SERVICE = 'grpc.health.v1.Health';

type ServingStatus = 'SERVING' | 'NOT_SERVING';

/** The health service's state: every known service, and the server as a whole (""). */
export class HealthState {
  private status: ServingStatus = 'SERVING';
  private readonly watchers = new Set<ServerWritableStream<{ service: string }, { status: string }>>();
  private readonly known = new Set(['', CONSOLE_SERVICE, SYNC_SERVICE]);

  /** Serving again (a standby that took the lead). */
  setServing(): void {
    this.status = 'SERVING';
  }

  /** Everything stops serving (shutdown, standing by): watchers are told, then their streams end. */
  setNotServing(): void {
    this.status = 'NOT_SERVING';
    for (const w of this.watchers) {
      if (this.known.has(w.request.service)) w.write({ status: this.status });
      w.end();
    }
    this.watchers.clear();
  }

  handlers() {
    return {
      Check: (call: ServerUnaryCall<{ service: string }, { status: string }>, callback: sendUnaryData<{ status: string }>) => {
        if (!this.known.has(call.request.service)) return callback({ code: GrpcStatus.NOT_FOUND, details: `unknown service ${JSON.stringify(call.request.service)}` });
        callback(null, { status: this.status });
      },
      Watch: (call: ServerWritableStream<{ service: string }, { status: string }>) => {
        call.write({ status: this.known.has(call.request.service) ? this.status : 'SERVICE_UNKNOWN' });
        if (this.status === 'NOT_SERVING') return call.end();
        this.watchers.add(call);
        call.on('cancelled', () => this.watchers.delete(call));
      },
    };
  }
}

/** Adds the health service and server reflection to the server. */
export function addOpsServices(server: Server, health: HealthState): void {
  const options = { keepCase: false, longs: String, enums: String, defaults: true, oneofs: true };
  const healthDef = loadSync('grpc/health/v1/health.proto', { ...options, includeDirs: [OPS_ROOT] });
  const healthPkg = loadPackageDefinition(healthDef) as unknown as { grpc: { health: { v1: { Health: { service: ServiceDefinition } } } } };
  server.addService(healthPkg.grpc.health.v1.Health.service, health.handlers());

  addReflection(server, () => loadSync(['tollgate/v1/console.proto', 'grpc/health/v1/health.proto'], { ...options, includeDirs: [PROTO_ROOT, OPS_ROOT] }));
}

type Recorded = Map<string, { definition: ServiceDefinition; handlers: UntypedServiceImplementation }>;

/** The services a ReflectionService adds (v1 and v1alpha), by name, without a server. */
function servicesOf(reflection: ReflectionService): Recorded {
  const recorded: Recorded = new Map();
  const recorder = {
    addService(definition: ServiceDefinition, handlers: UntypedServiceImplementation) {
      recorded.set(Object.values(definition)[0].path.split('/')[1], { definition, handlers });
    },
  };
  reflection.addToServer(recorder as unknown as Server);
  return recorded;
}

/**
 * Server reflection, described on its first call: parsing the console API's .proto and indexing it
 * took about half of the control plane's start-up CPU (0.3–0.6 s), paid by every start, for a service
 * that tools call now and then. The services are added at start (an empty description gives their
 * definitions); the first call builds the real one.
 */
function addReflection(server: Server, describe: () => PackageDefinition): void {
  let real: Recorded | undefined;
  for (const [name, { definition }] of servicesOf(new ReflectionService({}, { services: [] }))) {
    server.addService(definition, {
      ServerReflectionInfo: (stream: ServerDuplexStream<unknown, unknown>) => {
        real ??= servicesOf(new ReflectionService(describe(), { services: [CONSOLE_SERVICE, HEALTH_SERVICE] }));
        (real.get(name)!.handlers.ServerReflectionInfo as (s: ServerDuplexStream<unknown, unknown>) => void)(stream);
      },
    });
  }
}
