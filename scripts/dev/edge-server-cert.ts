/**
 * The development server certificate of the client listener (`npm start` with DEV_EDGE_TLS=1):
 * a CA of its own (`edge-ca.crt`, what `curl --cacert` is given) and a certificate for localhost
 * and 127.0.0.1, published like a Kubernetes Secret volume (`edge-server/tls.crt` → `..data/…`)
 * so rotating it is the production procedure. Generated at run time, never committed; kept
 * across starts while usable (the CA a client was given stays valid).
 */
import { X509Certificate, createPrivateKey } from 'node:crypto';
import { mkdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { ca, issue, publishClientCert, RENEW_DAYS } from './certs.ts';

export interface EdgeServerCert {
  readonly caFile: string;
  readonly certFile: string;
  readonly keyFile: string;
  /** Whether this call issued anything (else the kept files are in use). */
  readonly issued: boolean;
}

function usable(certFile: string, keyFile: string, caFile: string): boolean {
  try {
    const cert = new X509Certificate(readFileSync(certFile));
    const caCert = new X509Certificate(readFileSync(caFile));
    return cert.checkPrivateKey(createPrivateKey(readFileSync(keyFile)))
      && Date.parse(cert.validTo) - Date.now() >= RENEW_DAYS * 86_400_000
      && cert.checkIssued(caCert) && cert.verify(caCert.publicKey) && cert.checkHost('localhost') !== undefined;
  } catch {
    return false;
  }
}

/** Ensures `<dir>/edge-ca.crt` and `<dir>/edge-server/tls.{crt,key}`. */
export function ensureEdgeServerCert(dir: string): EdgeServerCert {
  mkdirSync(dir, { recursive: true, mode: 0o700 });
  const caFile = join(dir, 'edge-ca.crt');
  const serverDir = join(dir, 'edge-server');
  const paths = { caFile, certFile: join(serverDir, 'tls.crt'), keyFile: join(serverDir, 'tls.key') };
  if (usable(paths.certFile, paths.keyFile, caFile)) return { ...paths, issued: false };
  let caOk = false;
  try {
    const c = new X509Certificate(readFileSync(caFile));
    caOk = Date.parse(c.validTo) - Date.now() >= RENEW_DAYS * 86_400_000;
  } catch { /* issued below */ }
  if (!caOk) ca(dir, 'edge-ca');
  issue(dir, 'edge-ca', 'edge-server-next', 'localhost', 'DNS:localhost,IP:127.0.0.1', 'serverAuth');
  publishClientCert(serverDir, readFileSync(join(dir, 'edge-server-next.crt')), readFileSync(join(dir, 'edge-server-next.key')));
  return { ...paths, issued: true };
}
