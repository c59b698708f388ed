// TLS settings shared by the control plane (server), the nodes and the CLI (clients): the three PEM
// files named by --tls-cert, --tls-key and --tls-ca, read once at start. Pure apart from reading
// those files; a missing or unreadable file is a ConfigError naming the flag.
import { credentials, type ChannelCredentials, type ChannelOptions } from '@grpc/grpc-js';
import { readFileSync } from 'node:fs';
import { isIP } from 'node:net';
import { checkServerIdentity } from 'node:tls';
import { ConfigError } from './process-flags.js';

export interface TlsFiles {
  /** PEM certificate chain this process presents (server certificate, or a node's client certificate). */
  cert: Buffer | null;
  key: Buffer | null;
  /** PEM CA bundle: on the control plane, who may connect (mutual TLS); on a client, whom to trust. */
  ca: Buffer | null;
}

function readPem(flag: string, path: string | undefined): Buffer | null {
  if (path === undefined) return null;
  let pem: Buffer;
  try {
    pem = readFileSync(path);
  } catch (err) {
    throw new ConfigError(`${flag}: cannot read ${path}: ${(err as NodeJS.ErrnoException).code ?? 'error'}`);
  }
  if (!pem.includes('-----BEGIN ')) throw new ConfigError(`${flag}: ${path} is not a PEM file`);
  return pem;
}

/** Reads the files; `--tls-cert` and `--tls-key` go together. Null when no TLS flag was given. */
export function readTlsFiles(paths: { cert?: string; key?: string; ca?: string }): TlsFiles | null {
  if (paths.cert === undefined && paths.key === undefined && paths.ca === undefined) return null;
  if ((paths.cert === undefined) !== (paths.key === undefined)) throw new ConfigError('--tls-cert and --tls-key must be given together');
  return { cert: readPem('--tls-cert', paths.cert), key: readPem('--tls-key', paths.key), ca: readPem('--tls-ca', paths.ca) };
}

/** True for addresses that never leave the machine: 127.0.0.0/8, ::1, localhost. */
export function isLoopbackAddress(hostPort: string): boolean {
  const host = hostPort.replace(/:\d+$/, '').replace(/^\[(.*)\]$/, '$1').toLowerCase();
  return host === 'localhost' || host === '::1' || /^127\.\d{1,3}\.\d{1,3}\.\d{1,3}$/.test(host) || host.startsWith('unix:');
}

/** The gRPC channel of a node or the CLI: TLS per `tls`, plaintext when null. */
export function clientChannel(tls: TlsFiles | null, address: string): { credentials: ChannelCredentials; options: ChannelOptions } {
  if (!tls) return { credentials: credentials.createInsecure(), options: {} };
  const host = address.replace(/:\d+$/, '').replace(/^\[(.*)\]$/, '$1');
  if (isIP(host) === 0) return { credentials: credentials.createSsl(tls.ca, tls.key, tls.cert), options: {} };
  // An IP address may not be sent as the TLS server name (RFC 6066; Node warns on every connection),
  // so a placeholder goes as SNI and the certificate is still checked against the IP address.
  return {
    credentials: credentials.createSsl(tls.ca, tls.key, tls.cert, { checkServerIdentity: (_name, cert) => checkServerIdentity(host, cert) }),
    options: { 'grpc.ssl_target_name_override': 'tollgate-control-plane' },
  };
}
