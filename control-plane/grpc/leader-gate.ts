// Every call of the console and sync APIs passes this gate (docs/design.md#several-control-planes-on-one-database):
// while this control plane stands by, or once it lost the lead, each is answered UNAVAILABLE naming
// the leader, and nothing else runs; while it leads, calls go to the services it was given.
import { status as GrpcStatus, type ServiceDefinition, type UntypedServiceImplementation } from '@grpc/grpc-js';
import { standbyDetails } from '../../proto/lib/leader-hint.js';

type Handler = (call: any, callback?: (err: unknown, value?: unknown) => void) => void;

export class LeaderGate {
  private leading = false;
  private leaderAddress = '';
  private readonly impls = new Map<string, UntypedServiceImplementation>();

  get isLeading(): boolean {
    return this.leading;
  }

  /** Standing by (or deposed): every call is refused, naming `leaderAddress` when known. */
  standBy(leaderAddress: string): void {
    this.leading = false;
    this.leaderAddress = leaderAddress;
  }

  /** Leads: calls reach the services given to `serve`. */
  lead(): void {
    this.leading = true;
  }

  /** The services' implementations, once built (a standby has none yet). */
  serve(service: string, impl: UntypedServiceImplementation): void {
    this.impls.set(service, impl);
  }

  private refusal() {
    return { code: GrpcStatus.UNAVAILABLE, details: standbyDetails(this.leaderAddress) };
  }

  /** Handlers for every method of `def` that pass this gate first. */
  handlers(service: string, def: ServiceDefinition): UntypedServiceImplementation {
    const out: UntypedServiceImplementation = {};
    for (const [name, method] of Object.entries(def)) {
      const unary = !method.requestStream && !method.responseStream;
      out[name] = ((call: any, callback?: (err: unknown, value?: unknown) => void) => {
        const impl = this.leading ? (this.impls.get(service)?.[name] as Handler | undefined) : undefined;
        if (!impl) {
          if (unary) callback!(this.refusal());
          else call.emit('error', this.refusal());
          return;
        }
        if (!unary) return impl(call);
        // A refusal made because the lead was lost meanwhile (the fence) reads as a standby's.
        impl(call, (err, value) => (err && !this.leading ? callback!(this.refusal()) : callback!(err, value)));
      }) as UntypedServiceImplementation[string];
    }
    return out;
  }
}
