/**
 * Development/test PKI, generated at run time with openssl (never committed):
 * a backend CA + server certificate for the demo order backend, a client CA + the edge's
 * client certificate, and (for negative tests) a rogue CA with a server certificate.
 *
 * Client certificate files are laid out like a Kubernetes secret volume so rotation can be
 * exercised the same way: <dir>/client/tls.crt → ..data/tls.crt, ..data → ..<timestamp>/.
 */
import { execFileSync, type ExecFileSyncOptions } from 'node:child_process';
import { chmodSync, mkdirSync, readFileSync, renameSync, symlinkSync, writeFileSync, existsSync, readlinkSync, rmSync } from 'node:fs';
import { createPrivateKey, X509Certificate } from 'node:crypto';
import { join } from 'node:path';

export interface DevPki {
  readonly dir: string;
  /** CA that signed the backend's server certificate (ORDER_BACKEND_CA_FILE). */
  readonly backendCaFile: string;
  readonly backendCertFile: string;
  readonly backendKeyFile: string;
  /** CA the backend trusts for client certificates. */
  readonly clientCaFile: string;
  readonly clientCaKeyFile: string;
  /** The edge's client certificate paths (symlinks through ..data). */
  readonly clientCertFile: string;
  readonly clientKeyFile: string;
  /** A server certificate from another CA (for "wrong CA" tests). */
  readonly rogueCertFile: string;
  readonly rogueKeyFile: string;
  readonly san: string;
}

/** Days a development certificate is valid. */
const VALID_DAYS = 30;
/** A kept certificate with fewer days than this left is issued again (a stack can run for days). */
export const RENEW_DAYS = 7;

function openssl(args: string[], cwd: string): void {
  // detached: a process group of its own, so a Ctrl-C at the terminal during `npm start`'s first
  // second reaches npm start (which stops cleanly once the PKI is written), not openssl (whose
  // death by SIGINT made execFileSync throw: a stack trace instead of a clean stop). Node's
  // spawnSync honours `detached` like spawn does; @types/node does not list it.
  const options: ExecFileSyncOptions & { detached: boolean } = { cwd, stdio: ['ignore', 'ignore', 'pipe'], detached: true };
  execFileSync('openssl', args, options);
}

export function ca(dir: string, name: string): void {
  openssl(['req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:P-256', '-nodes', '-days', String(VALID_DAYS),
    '-subj', `/CN=${name}`, '-keyout', `${name}.key`, '-out', `${name}.crt`,
    '-addext', 'basicConstraints=critical,CA:TRUE', '-addext', 'keyUsage=critical,keyCertSign,cRLSign'], dir);
  chmodSync(join(dir, `${name}.key`), 0o600);
}

/** Issues a leaf certificate `name` signed by CA `caName`, with the given SANs and usage. */
export function issue(dir: string, caName: string, name: string, cn: string, sans: string, usage: 'serverAuth' | 'clientAuth'): void {
  openssl(['req', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:P-256', '-nodes', '-subj', `/CN=${cn}`,
    '-keyout', `${name}.key`, '-out', `${name}.csr`], dir);
  writeFileSync(join(dir, `${name}.ext`), `subjectAltName=${sans}\nextendedKeyUsage=${usage}\nbasicConstraints=CA:FALSE\n`);
  openssl(['x509', '-req', '-in', `${name}.csr`, '-CA', `${caName}.crt`, '-CAkey', `${caName}.key`, '-CAcreateserial',
    '-days', String(VALID_DAYS), '-out', `${name}.crt`, '-extfile', `${name}.ext`], dir);
  chmodSync(join(dir, `${name}.key`), 0o600);
}

/**
 * Publishes a client certificate into the k8s-style directory atomically:
 * write ..<stamp>/tls.{crt,key}, point ..data_tmp at it, rename over ..data.
 */
export function publishClientCert(clientDir: string, certPem: Buffer | string, keyPem: Buffer | string, prepare?: (dir: string) => void): void {
  mkdirSync(clientDir, { recursive: true });
  const stamp = `..${Date.now()}_${Math.random().toString(36).slice(2, 8)}`;
  const target = join(clientDir, stamp);
  mkdirSync(target, { mode: 0o700 });
  writeFileSync(join(target, 'tls.crt'), certPem, { mode: 0o600 });
  writeFileSync(join(target, 'tls.key'), keyPem, { mode: 0o600 });
  prepare?.(target); // owner and mode final before the swap publishes it
  const tmp = join(clientDir, '..data_tmp');
  rmSync(tmp, { force: true });
  symlinkSync(stamp, tmp);
  let old: string | undefined;
  try {
    old = readlinkSync(join(clientDir, '..data'));
  } catch { /* first publication */ }
  renameSync(tmp, join(clientDir, '..data'));
  for (const f of ['tls.crt', 'tls.key']) {
    if (!existsSync(join(clientDir, f))) symlinkSync(join('..data', f), join(clientDir, f));
  }
  if (old !== undefined && old !== stamp) rmSync(join(clientDir, old), { recursive: true, force: true });
}

/**
 * Whether `<base>.crt` and `.key` (under `dir`, or the paths given) are a usable pair: both
 * parse, the key is the certificate's, it is valid for RENEW_DAYS more, and, given its CA, that
 * CA issued and signed it. Anything missing, unreadable or half-written → false.
 */
function usable(certFile: string, keyFile: string, caFile?: string): boolean {
  try {
    const cert = new X509Certificate(readFileSync(certFile));
    if (!cert.checkPrivateKey(createPrivateKey(readFileSync(keyFile)))) return false;
    if (Date.parse(cert.validTo) - Date.now() < RENEW_DAYS * 86_400_000 || Date.parse(cert.validFrom) > Date.now()) return false;
    if (caFile === undefined) return true;
    const ca = new X509Certificate(readFileSync(caFile));
    return cert.checkIssued(ca) && cert.verify(ca.publicKey);
  } catch {
    return false;
  }
}

function pkiPaths(dir: string, san: string): DevPki {
  const clientDir = join(dir, 'client');
  return {
    dir,
    backendCaFile: join(dir, 'backend-ca.crt'),
    backendCertFile: join(dir, 'backend.crt'),
    backendKeyFile: join(dir, 'backend.key'),
    clientCaFile: join(dir, 'client-ca.crt'),
    clientCaKeyFile: join(dir, 'client-ca.key'),
    clientCertFile: join(clientDir, 'tls.crt'),
    clientKeyFile: join(clientDir, 'tls.key'),
    rogueCertFile: join(dir, 'rogue.crt'),
    rogueKeyFile: join(dir, 'rogue.key'),
    san,
  };
}

/**
 * Builds the development PKI under `dir`; with `keep`, a usable part (see usable) is kept and
 * only what is missing, expiring or no longer signed by its (new) CA is issued again. Returns the
 * names of what was issued.
 */
function buildPki(dir: string, san: string, keep: boolean): string[] {
  mkdirSync(dir, { recursive: true, mode: 0o700 });
  const issued: string[] = [];
  const has = (name: string, caName?: string): boolean => keep
    && usable(join(dir, `${name}.crt`), join(dir, `${name}.key`), caName === undefined ? undefined : join(dir, `${caName}.crt`));
  for (const name of ['backend-ca', 'client-ca', 'rogue-ca']) {
    if (has(name)) continue;
    ca(dir, name);
    issued.push(name);
  }
  const servers: [string, string][] = [['backend', 'backend-ca'], ['rogue', 'rogue-ca']];
  for (const [name, caName] of servers) {
    // Kept only for the same host name (the demo backend's address).
    if (has(name, caName) && new X509Certificate(readFileSync(join(dir, `${name}.crt`))).checkHost(san) !== undefined) continue;
    issue(dir, caName, name, san, `DNS:${san},IP:127.0.0.1`, 'serverAuth');
    issued.push(name);
  }
  // The edge's client certificate: the one published (perhaps rotated since), while usable.
  const clientDir = join(dir, 'client');
  if (!(keep && usable(join(clientDir, 'tls.crt'), join(clientDir, 'tls.key'), join(dir, 'client-ca.crt')))) {
    issue(dir, 'client-ca', 'client-1', 'edge-client-1', 'DNS:edge.internal', 'clientAuth');
    publishClientCert(clientDir, readFileSync(join(dir, 'client-1.crt')), readFileSync(join(dir, 'client-1.key')));
    issued.push('client');
  }
  return issued;
}

/** Generates the whole development PKI under `dir`. ~0.2 s. */
export function generateDevPki(dir: string, san = 'localhost'): DevPki {
  buildPki(dir, san, false);
  return pkiPaths(dir, san);
}

/**
 * The development PKI of `npm start` (its run directory's pki/): kept across starts, so a client
 * certificate rotated with `--rotate-client-cert` and the CAs a client was given stay; only what
 * is missing, unreadable, expiring within RENEW_DAYS or signed by a CA issued again is issued
 * again (`issued` names it).
 */
export function ensureDevPki(dir: string, san = 'localhost'): DevPki & { readonly issued: readonly string[] } {
  const issued = buildPki(dir, san, true);
  return { ...pkiPaths(dir, san), issued };
}
