// Standard gRPC tooling against the control plane, driven as grpcurl drives it: a reflection client
// (the reflection proto loaded with @grpc/proto-loader) lists the services, fetches the console API's
// descriptors from the server alone, builds a client from them and calls it with the operator token;
// the health service answers SERVING, and NOT_SERVING once the control plane stops.
import assert from 'node:assert/strict';
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import { after, before, test } from 'node:test';
import { credentials, loadPackageDefinition, Metadata, type Client, type GrpcObject, type ServiceClientConstructor } from '@grpc/grpc-js';
import { loadFileDescriptorSetFromBuffer, loadSync } from '@grpc/proto-loader';
import { startControlPlane, stopAll, type ControlPlane } from '../helpers/processes.js';

const require = createRequire(import.meta.url);
const REFLECTION_PROTO_DIR = join(dirname(require.resolve('@grpc/reflection/package.json')), 'build', 'proto');

let cp: ControlPlane;
before(async () => {
  cp = await startControlPlane();
});
after(async () => {
  await stopAll();
});

interface ReflectionResponse {
  listServicesResponse?: { service: Array<{ name: string }> };
  fileDescriptorResponse?: { fileDescriptorProto: Buffer[] };
  errorResponse?: { errorCode: number; errorMessage: string };
}

/** One reflection exchange per request, on one stream, as grpcurl does. */
function reflectionClient(address: string) {
  const def = loadSync('grpc/reflection/v1/reflection.proto', { includeDirs: [REFLECTION_PROTO_DIR], keepCase: false, oneofs: true });
  const pkg = loadPackageDefinition(def) as unknown as { grpc: { reflection: { v1: { ServerReflection: ServiceClientConstructor } } } };
  const client = new pkg.grpc.reflection.v1.ServerReflection(address, credentials.createInsecure()) as unknown as Client & {
    serverReflectionInfo(): import('@grpc/grpc-js').ClientDuplexStream<unknown, ReflectionResponse>;
  };
  const ask = (req: Record<string, unknown>) =>
    new Promise<ReflectionResponse>((resolve, reject) => {
      const call = client.serverReflectionInfo();
      call.once('data', (res: ReflectionResponse) => {
        resolve(res);
        call.end();
      });
      call.once('error', reject);
      call.write(req);
    });
  return { ask, close: () => client.close() };
}

/** A FileDescriptorSet (field 1, repeated FileDescriptorProto) from serialized FileDescriptorProtos. */
function descriptorSet(files: Buffer[]): Buffer {
  const parts: Buffer[] = [];
  for (const f of files) {
    const len: number[] = [];
    let n = f.length;
    while (n > 0x7f) {
      len.push((n & 0x7f) | 0x80);
      n >>>= 7;
    }
    len.push(n);
    parts.push(Buffer.from([0x0a, ...len]), f);
  }
  return Buffer.concat(parts);
}

/** Fetches every file needed for `symbol` (following dependencies) and loads them as a package definition. */
async function packageOf(r: ReturnType<typeof reflectionClient>, symbol: string): Promise<GrpcObject> {
  const res = await r.ask({ fileContainingSymbol: symbol });
  assert.equal(res.errorResponse, undefined, JSON.stringify(res.errorResponse));
  const files = res.fileDescriptorResponse!.fileDescriptorProto;
  assert.ok(files.length >= 1);
  return loadPackageDefinition(loadFileDescriptorSetFromBuffer(descriptorSet(files), { keepCase: false, longs: String, enums: String, defaults: true }));
}

function unary<T>(client: Client, method: string, req: unknown, md = new Metadata()): Promise<T> {
  return new Promise((resolve, reject) => {
    (client as unknown as Record<string, Function>)[method](req, md, (err: Error | null, res: T) => (err ? reject(err) : resolve(res)));
  });
}

test('a reflection client lists the console and health services, and calls the console API with the operator token', async () => {
  const r = reflectionClient(cp.address);
  try {
    const listed = await r.ask({ listServices: '*' });
    const names = listed.listServicesResponse!.service.map((s) => s.name).sort();
    assert.ok(names.includes('tollgate.v1.ConsoleService'), names.join(', '));
    assert.ok(names.includes('grpc.health.v1.Health'), names.join(', '));
    // The nodes' protocol is not advertised.
    assert.ok(!names.includes('tollgate.v1.SyncService'), names.join(', '));

    // Everything needed to call the console API comes from the server's descriptors.
    const pkg = (await packageOf(r, 'tollgate.v1.ConsoleService')) as unknown as { tollgate: { v1: { ConsoleService: ServiceClientConstructor } } };
    const Console = pkg.tollgate.v1.ConsoleService;
    const client = new Console(cp.address, credentials.createInsecure());
    try {
      const md = new Metadata();
      md.set('authorization', `Bearer ${cp.secrets.operatorToken}`);
      const who = await unary<{ operator: boolean }>(client, 'WhoAmI', {}, md);
      assert.equal(who.operator, true);
      const account = await unary<{ account: { id: string; name: string } }>(client, 'CreateAccount', { name: 'via-reflection' }, md);
      assert.equal(account.account.name, 'via-reflection');
      const models = await unary<{ models: Array<{ id: string }> }>(client, 'ListModels', {}, md);
      assert.ok(models.models.some((m) => m.id === 'demo-chat'));
      // Without the token: UNAUTHENTICATED (16).
      await assert.rejects(unary(client, 'WhoAmI', {}), (err: { code: number }) => err.code === 16);
    } finally {
      client.close();
    }
  } finally {
    r.close();
  }
});

test('the health service answers SERVING for the server and its services, NOT_FOUND for others, and NOT_SERVING on stop', async () => {
  const own = await startControlPlane();
  const r = reflectionClient(own.address);
  const pkg = (await packageOf(r, 'grpc.health.v1.Health')) as unknown as { grpc: { health: { v1: { Health: ServiceClientConstructor } } } };
  r.close();
  const health = new pkg.grpc.health.v1.Health(own.address, credentials.createInsecure());
  try {
    for (const service of ['', 'tollgate.v1.ConsoleService', 'tollgate.v1.SyncService']) {
      const res = await unary<{ status: string }>(health, 'Check', { service });
      assert.equal(res.status, 'SERVING', service);
    }
    await assert.rejects(unary(health, 'Check', { service: 'no.such.Service' }), (err: { code: number }) => err.code === 5);

    // A watcher hears NOT_SERVING when the control plane stops.
    const watch = (health as unknown as { Watch(req: unknown): import('@grpc/grpc-js').ClientReadableStream<{ status: string }> }).Watch({ service: '' });
    const statuses: string[] = [];
    const ended = new Promise<void>((resolve) => {
      watch.on('data', (m: { status: string }) => {
        statuses.push(m.status);
        if (statuses.length === 1) own.proc.child.kill('SIGTERM');
      });
      watch.on('error', () => resolve());
      watch.on('end', () => resolve());
    });
    await ended;
    assert.deepEqual(statuses, ['SERVING', 'NOT_SERVING']);
    const child = own.proc.child;
    const code = child.exitCode ?? (await new Promise<number | null>((resolve) => child.once('exit', (c) => resolve(c))));
    assert.equal(code, 0);
    assert.match(own.proc.output(), /"msg":"stopped: database closed cleanly"/);
  } finally {
    health.close();
  }
});
