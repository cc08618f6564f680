/**
 * Test helpers for the Envoy renderer: throwaway certificates (openssl, into a temp dir, never
 * committed), a real Envoy process on ephemeral ports, and tiny upstream stubs.
 */
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import * as http from 'node:http';
import * as https from 'node:https';
import { join } from 'node:path';
import type { TLSSocket } from 'node:tls';
import type { JsonObject } from '../render.ts';
import { envoyBinary } from '../envoy-bin.ts';
import { removeTempDir, tempDir as newTempDir } from '../../testkit/temp-dir.ts';

/** A temp directory removed by `cleanup()`, else at exit (testkit/temp-dir.ts). */
export function tempDir(prefix: string): { dir: string; cleanup: () => void } {
  const dir = newTempDir(prefix);
  return { dir, cleanup: () => removeTempDir(dir) };
}

function openssl(args: string[], cwd: string): void {
  const r = spawnSync('openssl', args, { cwd, encoding: 'utf8' });
  if (r.status !== 0) throw new Error(`openssl ${args.join(' ')} failed: ${r.stderr}`);
}

export interface TestCerts {
  readonly caFile: string;
  readonly serverCert: string;
  readonly serverKey: string;
  /** Client pair in its own directory (the SDS watched_directory). */
  readonly clientCert: string;
  readonly clientKey: string;
}

/** Where `makeCerts(dir)` writes its files. */
export function certPaths(dir: string): TestCerts {
  return {
    caFile: join(dir, 'ca.pem'),
    serverCert: join(dir, 'server.pem'),
    serverKey: join(dir, 'server.key'),
    clientCert: join(dir, 'client', 'tls.crt'),
    clientKey: join(dir, 'client', 'tls.key'),
  };
}

/**
 * A throwaway CA, a server certificate for `serverSans` (e.g. `DNS:orders.test,IP:127.0.0.1`)
 * and a client certificate, all P-256, valid for two days.
 */
export function makeCerts(dir: string, serverSans = 'DNS:orders.test,IP:127.0.0.1'): TestCerts {
  const ec = ['-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:P-256', '-nodes'];
  openssl(['req', '-x509', ...ec, '-keyout', 'ca.key', '-out', 'ca.pem', '-days', '2', '-subj', '/CN=edge-test-ca'], dir);
  openssl(['req', ...ec, '-keyout', 'server.key', '-out', 'server.csr', '-subj', '/CN=orders.test'], dir);
  writeFileSync(join(dir, 'server.ext'), `subjectAltName=${serverSans}\n`);
  openssl(['x509', '-req', '-in', 'server.csr', '-CA', 'ca.pem', '-CAkey', 'ca.key', '-CAcreateserial',
    '-out', 'server.pem', '-days', '2', '-extfile', 'server.ext'], dir);
  mkdirSync(join(dir, 'client'));
  openssl(['req', ...ec, '-keyout', 'client/tls.key', '-out', 'client.csr', '-subj', '/CN=edge-client'], dir);
  openssl(['x509', '-req', '-in', 'client.csr', '-CA', 'ca.pem', '-CAkey', 'ca.key', '-CAcreateserial',
    '-out', 'client/tls.crt', '-days', '2'], dir);
  return certPaths(dir);
}

// ─── Walking the rendered object ───────────────────────────────────────────────────────────

/** Reads `obj.a.b[0].c` style paths; throws with the path when a step is missing. */
export function at(obj: unknown, path: string): unknown {
  let cur: unknown = obj;
  for (const step of path.split('.')) {
    const m = /^([^[\]]+)?(?:\[(\d+)\])?$/.exec(step);
    if (m === null) throw new Error(`bad path step ${step}`);
    if (m[1] !== undefined) {
      if (cur === null || typeof cur !== 'object') throw new Error(`${path}: no ${m[1]}`);
      cur = (cur as Record<string, unknown>)[m[1]];
    }
    if (m[2] !== undefined) {
      if (!Array.isArray(cur)) throw new Error(`${path}: ${step} is not an array`);
      cur = cur[Number(m[2])];
    }
    if (cur === undefined) throw new Error(`${path}: ${step} missing`);
  }
  return cur;
}

/** A route's typed_per_filter_config entry for `filter` (filter names contain dots). */
export function perFilter(route: unknown, filter: string): Record<string, unknown> {
  const v = (at(route, 'typed_per_filter_config') as Record<string, unknown>)[filter];
  if (v === undefined) throw new Error(`no per-filter config for ${filter}`);
  return v as Record<string, unknown>;
}

/** The listener named `name` (`edge`, the public one, by default; `ingest` with INGEST_PORT). */
export function listenerNamed(bootstrap: JsonObject, name = 'edge'): Record<string, unknown> | undefined {
  return (at(bootstrap, 'static_resources.listeners') as Record<string, unknown>[]).find((l) => l['name'] === name);
}

export function hcmOf(bootstrap: JsonObject, listener = 'edge'): Record<string, unknown> {
  const l = listenerNamed(bootstrap, listener);
  if (l === undefined) throw new Error(`no listener ${listener}`);
  return at(l, 'filter_chains[0].filters[0].typed_config') as Record<string, unknown>;
}

export function httpFilters(bootstrap: JsonObject, listener = 'edge'): Record<string, unknown>[] {
  return hcmOf(bootstrap, listener)['http_filters'] as Record<string, unknown>[];
}

export function routesOf(bootstrap: JsonObject, listener = 'edge'): Record<string, unknown>[] {
  return at(hcmOf(bootstrap, listener), 'route_config.virtual_hosts[0].routes') as Record<string, unknown>[];
}

export function routeNamed(bootstrap: JsonObject, name: string, listener = 'edge'): Record<string, unknown> {
  const r = routesOf(bootstrap, listener).find((x) => x['name'] === name);
  if (r === undefined) throw new Error(`no route ${name}`);
  return r;
}

export function clusterNamed(bootstrap: JsonObject, name: string): Record<string, unknown> | undefined {
  return (at(bootstrap, 'static_resources.clusters') as Record<string, unknown>[]).find((c) => c['name'] === name);
}

// ─── A live Envoy ──────────────────────────────────────────────────────────────────────────

export interface LiveEnvoy {
  readonly edgePort: number;
  readonly adminPort: number;
  readonly process: ChildProcess;
  stats(filter: string): Promise<Map<string, string>>;
  stop(): Promise<void>;
}

async function pollFile(path: string, timeoutMs: number, isDone: () => string | undefined): Promise<string> {
  const end = Date.now() + timeoutMs;
  for (;;) {
    const why = isDone();
    if (why !== undefined) throw new Error(why);
    try {
      const s = readFileSync(path, 'utf8').trim();
      if (s !== '') return s;
    } catch { /* not yet written */ }
    if (Date.now() > end) throw new Error(`timed out waiting for ${path}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

/**
 * Starts Envoy on a bootstrap whose listener and admin ports are 0, and finds the ports
 * it bound through `--admin-address-path` and the admin `/listeners` endpoint.
 */
export async function startEnvoy(bootstrapPath: string, workDir: string): Promise<LiveEnvoy> {
  const adminPath = join(workDir, `admin-${Date.now()}.txt`);
  let output = '';
  const proc = spawn(envoyBinary(), [
    '-c', bootstrapPath, '--concurrency', '2', '--disable-hot-restart', '--log-level', 'warn',
    '--admin-address-path', adminPath,
  ], { stdio: ['ignore', 'pipe', 'pipe'] });
  proc.stdout.on('data', (d: Buffer) => { output += d.toString(); });
  proc.stderr.on('data', (d: Buffer) => { output += d.toString(); });
  const exited = (): string | undefined => (proc.exitCode !== null ? `envoy exited ${proc.exitCode}: ${output}` : undefined);
  const admin = await pollFile(adminPath, 15_000, exited);
  const adminPort = Number(admin.slice(admin.lastIndexOf(':') + 1));
  let edgePort = 0;
  const end = Date.now() + 15_000;
  while (edgePort === 0) {
    const why = exited();
    if (why !== undefined) throw new Error(why);
    try {
      const ready = await fetch(`http://127.0.0.1:${adminPort}/ready`);
      if (ready.status === 200) {
        const ls = await (await fetch(`http://127.0.0.1:${adminPort}/listeners?format=json`)).json() as {
          listener_statuses: { local_address: { socket_address: { port_value: number } } }[];
        };
        edgePort = ls.listener_statuses[0]?.local_address.socket_address.port_value ?? 0;
      }
    } catch { /* admin not up yet */ }
    if (edgePort === 0) {
      if (Date.now() > end) throw new Error(`envoy not ready: ${output}`);
      await new Promise((r) => setTimeout(r, 50));
    }
  }
  return {
    edgePort,
    adminPort,
    process: proc,
    async stats(filter) {
      const text = await (await fetch(`http://127.0.0.1:${adminPort}/stats?filter=${encodeURIComponent(filter)}`)).text();
      return new Map(text.split('\n').filter((l) => l.includes(': ')).map((l) => l.split(': ') as [string, string]));
    },
    stop() {
      if (proc.exitCode !== null) return Promise.resolve();
      return new Promise((resolve) => {
        proc.once('exit', () => resolve());
        proc.kill('SIGTERM');
      });
    },
  };
}

// ─── HTTP ──────────────────────────────────────────────────────────────────────────────────

export interface Reply {
  readonly status: number;
  readonly headers: http.IncomingHttpHeaders;
  readonly body: string;
}

/** One HTTP/1.1 request on a fresh connection. */
export function request(port: number, method: string, path: string, headers: Record<string, string> = {}, body?: string | Buffer): Promise<Reply> {
  return new Promise((resolve, reject) => {
    const r = http.request({ host: '127.0.0.1', port, method, path, headers, agent: false }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, headers: res.headers, body: Buffer.concat(chunks).toString('utf8') }));
    });
    r.on('error', reject);
    r.end(body);
  });
}

export interface Recorded {
  readonly method: string;
  readonly url: string;
  readonly headers: http.IncomingHttpHeaders;
  readonly body: Buffer;
  readonly clientCertCn?: string;
}

export interface Upstream<S> {
  readonly server: S;
  readonly port: number;
  readonly seen: Recorded[];
  close(): Promise<void>;
}

function collect(req: http.IncomingMessage, done: (body: Buffer) => void): void {
  const chunks: Buffer[] = [];
  req.on('data', (c: Buffer) => chunks.push(c));
  req.on('end', () => done(Buffer.concat(chunks)));
}

function listen<S extends http.Server>(server: S, seen: Recorded[]): Promise<Upstream<S>> {
  return new Promise((resolve) => {
    server.listen(0, '127.0.0.1', () => {
      const addr = server.address();
      resolve({
        server,
        port: typeof addr === 'object' && addr !== null ? addr.port : 0,
        seen,
        close: () => new Promise((r) => { server.closeAllConnections(); server.close(() => r()); }),
      });
    });
  });
}

/** A plain HTTP upstream (the market service stand-in): records requests, answers 200 JSON. */
export function startMarketStub(): Promise<Upstream<http.Server>> {
  const seen: Recorded[] = [];
  const server = http.createServer((req, res) => collect(req, (body) => {
    seen.push({ method: req.method ?? '', url: req.url ?? '', headers: req.headers, body });
    res.writeHead(200, { 'content-type': 'application/json' });
    res.end('{"ok":true}');
  }));
  return listen(server, seen);
}

export type BackendMode = 'ok' | 'slow' | 'reset';

/** An mTLS order backend stand-in: requires a client certificate from the test CA. */
export function startBackendStub(certs: TestCerts, mode: () => BackendMode): Promise<Upstream<https.Server>> {
  const seen: Recorded[] = [];
  const server = https.createServer({
    key: readFileSync(certs.serverKey), cert: readFileSync(certs.serverCert), ca: readFileSync(certs.caFile),
    requestCert: true, rejectUnauthorized: true,
  }, (req, res) => collect(req, (body) => {
    const cn = (req.socket as TLSSocket).getPeerCertificate().subject?.CN;
    seen.push({ method: req.method ?? '', url: req.url ?? '', headers: req.headers, body, clientCertCn: Array.isArray(cn) ? cn[0] : cn });
    const m = mode();
    if (m === 'reset') { req.socket.destroy(); return; }
    if (m === 'slow') {
      const t = setTimeout(() => { if (!res.destroyed) res.end('late'); }, 2000);
      res.on('close', () => clearTimeout(t));
      return;
    }
    res.writeHead(201, { 'content-type': 'application/json' });
    res.end('{"accepted":true}');
  }));
  return listen(server, seen);
}
