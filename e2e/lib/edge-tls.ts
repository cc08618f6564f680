/**
 * TLS on the client listener, for the e2e suite: a PKI generated at run time (an edge CA and its
 * server certificate for localhost, published like a Kubernetes Secret volume; a client CA and
 * another CA for client certificates), and real TLS clients (Node's tls, https and http2; curl).
 */
import { execFile } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { connect as h2connect } from 'node:http2';
import { request as httpsRequest, type RequestOptions } from 'node:https';
import { join } from 'node:path';
import { connect as tlsConnect, type ConnectionOptions, type SecureVersion } from 'node:tls';
import { X509Certificate } from 'node:crypto';
import { ca, issue, publishClientCert } from '../../scripts/dev/certs.ts';
import { tempDir } from '../../testkit/temp-dir.ts';

export interface EdgeTlsPki {
  readonly dir: string;
  /** The CA clients trust for the edge's server certificate (`curl --cacert`). */
  readonly caFile: string;
  /** EDGE_TLS_CERT_FILE / EDGE_TLS_KEY_FILE: symlinks through `..data`, as a Secret volume mounts them. */
  readonly certFile: string;
  readonly keyFile: string;
  /** EDGE_TLS_CLIENT_CA_FILE: the CA client certificates must chain to. */
  readonly clientCaFile: string;
  /** A new server certificate for localhost from the edge CA; returns its files and SHA-256. */
  server(name: string): Issued;
  /** A client certificate from the client CA (`trusted`) or from a CA the edge does not trust. */
  client(name: string, trusted: boolean): Issued;
  /** Publishes a certificate and key as the served pair: one atomic `..data` symlink swap. */
  publish(cert: Issued, key?: Issued): void;
}

export interface Issued {
  readonly certFile: string;
  readonly keyFile: string;
  /** SHA-256 of the certificate's DER, lower-case hex (as x-edge-client-cert-sha256 carries it). */
  readonly sha256: string;
}

function issued(dir: string, name: string): Issued {
  const certFile = join(dir, `${name}.crt`);
  const fp = new X509Certificate(readFileSync(certFile)).fingerprint256.replaceAll(':', '').toLowerCase();
  return { certFile, keyFile: join(dir, `${name}.key`), sha256: fp };
}

/** The PKI under a fresh temp directory (the caller removes `dir`); the first server certificate is published. */
export function edgeTlsPki(): EdgeTlsPki {
  const dir = tempDir('edge-tls-pki-');
  for (const name of ['edge-ca', 'api-client-ca', 'other-ca']) ca(dir, name);
  const certDir = join(dir, 'server');
  const pki: EdgeTlsPki = {
    dir,
    caFile: join(dir, 'edge-ca.crt'),
    certFile: join(certDir, 'tls.crt'),
    keyFile: join(certDir, 'tls.key'),
    clientCaFile: join(dir, 'api-client-ca.crt'),
    server(name) {
      issue(dir, 'edge-ca', name, 'localhost', 'DNS:localhost,IP:127.0.0.1', 'serverAuth');
      return issued(dir, name);
    },
    client(name, trusted) {
      issue(dir, trusted ? 'api-client-ca' : 'other-ca', name, `market-maker-${name}`, `DNS:${name}.clients.example`, 'clientAuth');
      return issued(dir, name);
    },
    publish(cert, key = cert) {
      publishClientCert(certDir, readFileSync(cert.certFile), readFileSync(key.keyFile));
    },
  };
  pki.publish(pki.server('server-1'));
  return pki;
}

export interface TlsReply {
  readonly status: number;
  readonly body: string;
  /** The negotiated TLS version (`TLSv1.3`) and ALPN protocol (`h2`, `http/1.1`, or false). */
  readonly protocol: string | null;
  readonly alpn: string | false | null;
  /** SHA-256 of the server certificate this connection saw. */
  readonly serverSha256: string;
}

interface ClientOpts {
  readonly ca: string;
  readonly cert?: Issued;
  readonly headers?: Record<string, string>;
}

function tlsFiles(o: ClientOpts): { ca: Buffer; cert?: Buffer; key?: Buffer } {
  return { ca: readFileSync(o.ca), ...(o.cert === undefined ? {} : { cert: readFileSync(o.cert.certFile), key: readFileSync(o.cert.keyFile) }) };
}

function fingerprint(raw: Buffer): string {
  return new X509Certificate(raw).fingerprint256.replaceAll(':', '').toLowerCase();
}

/** One HTTP/1.1 request over a new TLS connection (no keep-alive), pinned to one TLS version. */
export function https1(url: string, o: ClientOpts & { version?: SecureVersion; method?: string; body?: string }): Promise<TlsReply> {
  return new Promise((resolve, reject) => {
    // https passes the TLS options on to tls.connect (ALPNProtocols included; its type omits it).
    const options: RequestOptions & ConnectionOptions = {
      ...tlsFiles(o), method: o.method ?? 'GET', agent: false, servername: 'localhost', ALPNProtocols: ['http/1.1'],
      ...(o.version === undefined ? {} : { minVersion: o.version, maxVersion: o.version }),
      headers: { ...o.headers, ...(o.body === undefined ? {} : { 'content-length': String(Buffer.byteLength(o.body)) }) },
    };
    const req = httpsRequest(url, options, (res) => {
      const chunks: Buffer[] = [];
      const socket = res.socket as import('node:tls').TLSSocket;
      const meta = { protocol: socket.getProtocol(), alpn: socket.alpnProtocol, serverSha256: fingerprint(socket.getPeerCertificate().raw) };
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, body: Buffer.concat(chunks).toString(), ...meta }));
      res.on('error', reject);
    });
    req.on('error', reject);
    req.end(o.body);
  });
}

/** One HTTP/2 request over a new TLS connection (ALPN h2). */
export function https2(url: string, path: string, o: ClientOpts & { method?: string; body?: string }): Promise<TlsReply> {
  return new Promise((resolve, reject) => {
    const session = h2connect(url, { ...tlsFiles(o), servername: 'localhost' });
    session.on('error', reject);
    session.on('connect', () => {
      const socket = session.socket as import('node:tls').TLSSocket;
      const meta = { protocol: socket.getProtocol(), alpn: session.alpnProtocol ?? null, serverSha256: fingerprint(socket.getPeerCertificate().raw) };
      const req = session.request({ ':method': o.method ?? 'GET', ':path': path, ...o.headers });
      let status = 0;
      const chunks: Buffer[] = [];
      req.on('response', (h) => { status = Number(h[':status']); });
      req.on('data', (c: Buffer) => chunks.push(c));
      req.on('end', () => { session.close(); resolve({ status, body: Buffer.concat(chunks).toString(), ...meta }); });
      req.on('error', (e) => { session.destroy(); reject(e); });
      req.end(o.body);
    });
  });
}

/**
 * A bare TLS handshake at the given versions; resolves with the negotiated version, or the error
 * code of a refused handshake. `ciphers: DEFAULT@SECLEVEL=0` lets this client offer TLS 1.1 at
 * all (OpenSSL 3 refuses to by default), so a refusal is the server's.
 */
export function handshake(port: number, o: ClientOpts & { min: SecureVersion; max: SecureVersion }): Promise<{ ok: true; protocol: string | null } | { ok: false; code: string }> {
  return new Promise((resolve) => {
    const s = tlsConnect({ host: '127.0.0.1', port, servername: 'localhost', ...tlsFiles(o), minVersion: o.min, maxVersion: o.max, ciphers: 'DEFAULT@SECLEVEL=0' });
    s.once('secureConnect', () => { const protocol = s.getProtocol(); s.destroy(); resolve({ ok: true, protocol }); });
    s.once('error', (e: NodeJS.ErrnoException) => { s.destroy(); resolve({ ok: false, code: e.code ?? e.message }); });
  });
}

/** curl from Debian: `curl --cacert` with the given extra arguments; resolves `%{http_code} %{http_version}`, or the exit status. */
export function curl(args: string[]): Promise<{ code: number; out: string; err: string }> {
  return new Promise((resolve) => {
    execFile('curl', ['-sS', '-o', '/dev/null', '-w', '%{http_code} %{http_version}', '--max-time', '10', ...args], (error, stdout, stderr) => {
      resolve({ code: error === null ? 0 : Number((error as { code?: number }).code ?? 1), out: stdout, err: stderr });
    });
  });
}

/** h2load from Debian (nghttp2-client) with the given arguments; resolves its exit status and output. */
export function h2load(args: string[]): Promise<{ code: number; out: string }> {
  return new Promise((resolve) => {
    execFile('h2load', args, { maxBuffer: 16 * 1024 * 1024 }, (error, stdout, stderr) => {
      resolve({ code: error === null ? 0 : Number((error as { code?: number }).code ?? 1), out: `${stdout}${stderr}` });
    });
  });
}
