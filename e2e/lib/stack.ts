/**
 * The whole edge as local processes, driven only through Envoy's port:
 *   private redis-server · the TS service (`authz/src/main.ts`, Node 24) · real Envoy 1.40
 *   (config from envoy/render.ts) · the demo mTLS order backend (in this process, so tests
 *   can read exactly what it received).
 * Certificates and keys are generated at run time into a temp dir.
 * Where Docker exists, E2E_DRIVER=containers runs the same scenarios on containers
 * (deploy/); on this machine there is no Docker engine, so the local driver is used.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { randomBytes, generateKeyPairSync } from 'node:crypto';
import { writeFileSync, createWriteStream, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { fileURLToPath } from 'node:url';
import { loadConfig } from '../../authz/src/common/config.ts';
import { withServiceRuntime } from '../../authz/src/common/runtime-env.ts';
import { envoyBinary } from '../../envoy/envoy-bin.ts';
import { renderEnvoy, serverSdsPath, type RenderOptions } from '../../envoy/render.ts';
import { freePort, PrivateRedis } from '../../testkit/redis-server.ts';
import { generateDevPki, type DevPki } from '../../scripts/dev/certs.ts';
import { createOrderBackend, type OrderBackend } from '../../scripts/dev/order-backend.ts';
import { removeTempDir, tempDir } from '../../testkit/temp-dir.ts';
import { recordPem, recordSecret, shortenEnvoyFlush, traceAudit } from '../../testkit/trace-ledger.ts';

const ROOT = fileURLToPath(new URL('../../', import.meta.url));
const NODE = join(ROOT, 'scripts', 'node');

export interface StackOptions {
  /** Extra env for both the TS service and the renderer (e.g. RPS_PER_IP, BLOCKED_COUNTRIES). */
  readonly env?: Record<string, string>;
  readonly geoipDb?: string;
  /**
   * A Redis the stack does not own (e.g. `redis+sentinel://…` of testkit/sentinel.ts), for
   * REDIS_URL; local driver only. Unset: a private redis-server (`stack.redis`).
   */
  readonly redisUrl?: string;
  /**
   * The service's entry script: authz/src/main.ts unless given (bench:market measures the
   * JavaScript the image runs, compiled by bench/lib/compile-js.ts).
   */
  readonly serviceEntry?: string;
  /**
   * Envoy asks the TS service's own RateLimitService for the global limit (RATELIMIT_SERVICE_ADDRESS
   * = its gRPC port, with a RATELIMIT_SERVICE_TOKEN_FILE both read); local driver only.
   */
  readonly rateLimitServiceSelf?: boolean;
  /** Renderer options beyond the SDS path (benchmarks: bench:capacity raises the descriptor cap). */
  readonly render?: Omit<RenderOptions, 'sdsPath'>;
  /** How long the TS service may take to answer after its start (default 15 s; benchmarks on a loaded machine wait longer). */
  readonly startTimeoutMs?: number;
}

export interface Stack {
  readonly dir: string;
  readonly edgeUrl: string;
  /** The ingest listener's URL (INGEST_PORT); edgeUrl when ingest is served there (no INGEST_PORT). */
  readonly ingestUrl: string;
  readonly env: Record<string, string>;
  readonly pki: DevPki;
  /** The backend currently listening (replaced by swapBackend). */
  backend: OrderBackend;
  /** Replaces the backend on the same port: 'good' (pinned CA), 'rogue' (another CA), 'down' (nothing listening). */
  swapBackend(kind: 'good' | 'rogue' | 'down'): Promise<void>;
  /** PIDs of the processes the stack started (for the no-process-left-behind check). */
  pids(): number[];
  /** Envoy's pid (its /proc/<pid>/status for its resident memory); undefined when it is not running. */
  envoyPid(): number | undefined;
  /** The stack's private redis-server (with `redisUrl`: a stand-in whose stop and resume throw). */
  readonly redis: PrivateRedis;
  readonly hmacKey: Buffer;
  readonly feedPrivateKey: ReturnType<typeof generateKeyPairSync>['privateKey'];
  readonly envoyAdmin: string;
  readonly authzAdmin: string;
  /** The admin token (AUTHZ_ADMIN_TOKEN_FILE): POST /admin/seal needs `authorization: Bearer <it>`. */
  readonly adminToken: string;
  /** host:port of the TS service's gRPC server, as a caller beside Envoy reaches it. */
  readonly authzGrpc: string;
  /** Every line the processes wrote (stdout + stderr), for the no-secrets-in-logs check. */
  logs(): string;
  killAuthz(): Promise<void>;
  startAuthz(): Promise<void>;
  stop(): Promise<void>;
}

async function waitFor(fn: () => Promise<boolean>, timeoutMs: number, what: string): Promise<void> {
  const end = Date.now() + timeoutMs;
  while (Date.now() < end) {
    try {
      if (await fn()) return;
    } catch { /* not yet */ }
    await sleep(50);
  }
  throw new Error(`timed out waiting for ${what}`);
}

function exitOf(p: ChildProcess): Promise<void> {
  return p.exitCode !== null || p.signalCode !== null ? Promise.resolve() : new Promise((r) => p.once('exit', () => r()));
}

/** `stack.redis` when REDIS_URL names a Redis the stack did not start. */
function notOwned(url: string): PrivateRedis {
  const refuse = (): Promise<void> => Promise.reject(new Error(`the stack does not own ${url}`));
  return { port: 0, dir: '', url, stop: refuse, resume: refuse } as unknown as PrivateRedis;
}

export async function startStack(opts: StackOptions = {}): Promise<Stack> {
  const dir = tempDir('edge-e2e-');
  const pki = generateDevPki(join(dir, 'pki'));
  const owned = opts.redisUrl === undefined ? await PrivateRedis.start() : undefined;
  const redis = owned ?? notOwned(opts.redisUrl as string);
  let backend: OrderBackend | undefined = createOrderBackend({ certFile: pki.backendCertFile, keyFile: pki.backendKeyFile, clientCaFile: pki.clientCaFile });
  const backendPort = await backend.listen();
  const hmacKey = randomBytes(32);
  const feed = generateKeyPairSync('ed25519');
  const feedPub = Buffer.from(feed.publicKey.export({ format: 'jwk' }).x ?? '', 'base64url').toString('hex');
  recordSecret('ingest HMAC key', hmacKey);
  recordSecret('feed Ed25519 public key', Buffer.from(feedPub, 'hex'));
  recordSecret('feed Ed25519 private key', Buffer.from(feed.privateKey.export({ format: 'jwk' }).d ?? '', 'base64url'));
  if (traceAudit) for (const f of [pki.clientKeyFile, pki.backendKeyFile, pki.clientCaKeyFile, pki.rogueKeyFile]) recordPem(`PKI private key ${f}`, readFileSync(f, 'utf8'));
  const [edgePort, grpcPort, marketPort, adminPort, envoyAdminPort] = await Promise.all([freePort(), freePort(), freePort(), freePort(), freePort()]);
  // The admin token and the seal marker, as npm start and the deployments have them.
  const adminToken = randomBytes(32).toString('hex');
  writeFileSync(join(dir, 'admin-token'), `${adminToken}\n`, { mode: 0o600 });
  recordSecret('admin token', adminToken);
  if (opts.rateLimitServiceSelf === true) {
    const rateLimitToken = randomBytes(32).toString('hex');
    writeFileSync(join(dir, 'ratelimit-token'), `${rateLimitToken}\n`, { mode: 0o600 });
    recordSecret('rate limit service token', rateLimitToken);
  }
  const env: Record<string, string> = {
    EDGE_PORT: String(edgePort),
    AUTHZ_GRPC_PORT: String(grpcPort),
    MARKET_PORT: String(marketPort),
    AUTHZ_ADMIN_PORT: String(adminPort),
    ENVOY_ADMIN_PORT: String(envoyAdminPort),
    REDIS_URL: opts.redisUrl ?? redis.url,
    ORDER_BACKEND_URL: `https://localhost:${backendPort}`,
    ORDER_BACKEND_CA_FILE: pki.backendCaFile,
    EDGE_CLIENT_CERT_FILE: pki.clientCertFile,
    EDGE_CLIENT_KEY_FILE: pki.clientKeyFile,
    ...(opts.geoipDb !== undefined ? { GEOIP_DB: opts.geoipDb } : {}),
    LOG_LEVEL: 'info',
    SHUTDOWN_GRACE_MS: '200',
    AUTHZ_ADMIN_TOKEN_FILE: join(dir, 'admin-token'),
    AUTHZ_SEAL_FILE: join(dir, 'sealed'),
    ...(opts.rateLimitServiceSelf === true ? { RATELIMIT_SERVICE_ADDRESS: `127.0.0.1:${grpcPort}`, RATELIMIT_SERVICE_TOKEN_FILE: join(dir, 'ratelimit-token') } : {}),
    // The trace audit (npm run audit:traces): Envoy's config is rendered from this env, not from process.env.
    ...(traceAudit ? { OTEL_EXPORTER_OTLP_ENDPOINT: process.env['OTEL_EXPORTER_OTLP_ENDPOINT'] ?? '' } : {}),
    ...opts.env,
  };
  const secrets = { EDGE_INGEST_HMAC: `hex:${hmacKey.toString('hex')}`, EDGE_FEED_ED25519_PUBLIC_KEY: feedPub };

  const logPath = join(dir, 'processes.log');
  const log = createWriteStream(logPath, { flags: 'a' });
  // Whole lines, each with its process's name: a chunk may end mid-line, and another process's
  // chunk written in between would cut a JSON line (an access-log line a test looks up by id)
  // or a secret the no-secrets-in-logs check searches for.
  const pipe = (name: string, p: ChildProcess): void => {
    for (const stream of [p.stdout, p.stderr]) {
      let rest = '';
      stream?.setEncoding('utf8');
      stream?.on('data', (d: string) => {
        const lines = (rest + d).split('\n');
        rest = lines.pop() ?? '';
        if (!log.writableEnded) for (const l of lines) log.write(`[${name}] ${l}\n`);
      });
      stream?.on('end', () => {
        // Output may still arrive after stop() closed the log (a process's exit comes first).
        if (rest !== '' && !log.writableEnded) log.write(`[${name}] ${rest}\n`);
      });
    }
  };

  let authz: ChildProcess | undefined;
  const startAuthz = async (): Promise<void> => {
    authz = spawn(NODE, [opts.serviceEntry ?? join(ROOT, 'authz/src/main.ts')], { env: withServiceRuntime({ ...process.env, ...env, ...secrets }), stdio: ['ignore', 'pipe', 'pipe'] });
    pipe('authz', authz);
    // E2E_START_TIMEOUT_MS: a longer wait on a machine so loaded that loading the modules alone takes over 15 s.
    await waitFor(async () => (await fetch(`http://127.0.0.1:${marketPort}/`)).status === 200, opts.startTimeoutMs ?? Number(process.env['E2E_START_TIMEOUT_MS'] ?? 30_000), 'authz/market service');
  };
  // A stack that fails to come up stops what it started (else its processes keep the test alive).
  const abandon = async (err: unknown): Promise<never> => {
    for (const p of [authz, started.envoy]) if (p !== undefined && p.exitCode === null && p.signalCode === null) p.kill('SIGKILL');
    await backend?.close();
    await owned?.stop();
    log.end();
    const logs = readFileSync(logPath, 'utf8').slice(-2000);
    if (process.env['E2E_KEEP'] === undefined) removeTempDir(dir);
    throw new Error(`${String(err)}; logs:\n${logs}`);
  };
  const started: { envoy?: ChildProcess } = {};
  await startAuthz().catch(abandon);

  const config = loadConfig(env);
  const sdsPath = join(dir, 'sds.yaml');
  const rendered = renderEnvoy(config, { ...opts.render, sdsPath });
  writeFileSync(join(dir, 'envoy.yaml'), rendered.bootstrap);
  if (rendered.sds !== undefined) writeFileSync(sdsPath, rendered.sds);
  if (rendered.serverSds !== undefined) writeFileSync(serverSdsPath({ sdsPath }), rendered.serverSds);
  const envoy = spawn(envoyBinary(), ['-c', join(dir, 'envoy.yaml'), '--disable-hot-restart', '--concurrency', '2', '-l', 'warning'], { stdio: ['ignore', 'pipe', 'pipe'] });
  started.envoy = envoy;
  pipe('envoy', envoy);
  // With EDGE_TLS_* the public listener speaks TLS only (its certificate names localhost).
  const edgeUrl = config.edgeTls === undefined ? `http://127.0.0.1:${edgePort}` : `https://localhost:${edgePort}`;
  const ingestUrl = config.ingestPort === undefined ? edgeUrl : `http://127.0.0.1:${config.ingestPort}`;
  if (config.edgeTls === undefined && config.proxyProtocol === 'off') {
    // Through Envoy and authz: 200, or 451 where the loopback peer is not in GEO_TRUSTED_CIDRS.
    await waitFor(async () => [200, 451].includes((await fetch(`${edgeUrl}/healthz`)).status), Number(process.env['E2E_START_TIMEOUT_MS'] ?? 20_000), 'Envoy /healthz answered by authz').catch(abandon);
  } else {
    // TLS or PROXY protocol: a plain fetch cannot ask; Envoy is LIVE once its SDS secrets loaded (the service is up already).
    await waitFor(async () => (await (await fetch(`http://127.0.0.1:${envoyAdminPort}/ready`)).text()).trim() === 'LIVE', Number(process.env['E2E_START_TIMEOUT_MS'] ?? 20_000), 'Envoy LIVE').catch(abandon);
  }
  // The trace audit: Envoy exports every 5 s and drops what it holds when stopped, so the spans of
  // a stack's last seconds would escape the audit. Its admin runtime layer (envoy/render/tracing.ts)
  // shortens the interval for this Envoy only (from its next flush on); stop() waits for one more.
  const untilFlushed = traceAudit ? await shortenEnvoyFlush(envoyAdminPort).catch(abandon) : undefined;

  const stack: Stack = {
    dir, edgeUrl, ingestUrl, env, pki, redis, hmacKey,
    backend,
    async swapBackend(kind) {
      await backend?.close();
      backend = undefined;
      if (kind === 'down') return;
      const rogue = kind === 'rogue';
      backend = createOrderBackend({
        certFile: rogue ? pki.rogueCertFile : pki.backendCertFile,
        keyFile: rogue ? pki.rogueKeyFile : pki.backendKeyFile,
        clientCaFile: pki.clientCaFile,
      });
      await backend.listen(backendPort);
      stack.backend = backend;
    },
    pids: () => [envoy.pid, authz?.pid].filter((p): p is number => p !== undefined),
    envoyPid: () => (envoy.exitCode === null && envoy.signalCode === null ? envoy.pid : undefined),
    feedPrivateKey: feed.privateKey,
    envoyAdmin: `http://127.0.0.1:${envoyAdminPort}`,
    authzAdmin: `http://127.0.0.1:${adminPort}`,
    adminToken,
    authzGrpc: `127.0.0.1:${grpcPort}`,
    logs: () => readFileSync(logPath, 'utf8'),
    async killAuthz() {
      if (authz === undefined) return;
      const p = authz;
      p.kill('SIGKILL');
      await exitOf(p);
      authz = undefined;
    },
    startAuthz,
    async stop() {
      if (untilFlushed !== undefined) await sleep(untilFlushed());
      const procs = [envoy, authz].filter((p): p is ChildProcess => p !== undefined);
      for (const p of procs) p.kill('SIGTERM');
      await Promise.race([Promise.all(procs.map(exitOf)), sleep(5000)]);
      for (const p of procs) if (p.exitCode === null && p.signalCode === null) p.kill('SIGKILL');
      await Promise.all(procs.map(exitOf));
      await backend?.close();
      await owned?.stop();
      log.end();
      if (process.env['E2E_KEEP'] === undefined) removeTempDir(dir);
    },
  };
  return stack;
}
