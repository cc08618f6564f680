/**
 * `npm start`: the whole local stack in the foreground, supervised.
 *
 *   Redis (a private redis-server when one is installed and REDIS_URL is unset; a REDIS_URL
 *   given must answer within 30 s; else the in-memory stores) · development certificates and
 *   keys (generated into .run/, never committed; kept across starts) · the demo mTLS order backend (unless ORDER_BACKEND_URL is set) · the TS
 *   service · Envoy. Every setting of the README is honoured. Ready when the TS service's
 *   GET /healthz (MARKET_PORT) and Envoy's admin GET /ready (ENVOY_ADMIN_PORT) answer 200; the
 *   banner then says what GET http://127.0.0.1:$EDGE_PORT/healthz answers this machine (200,
 *   or 451 when loopback is not in GEO_TRUSTED_CIDRS and geo blocks it: readiness never goes
 *   through geo). A component that does not become ready is named with its last answer.
 *
 * Before anything starts, every setting is checked (loadConfig, loadCredentials and the
 * development ones): a bad one ends it with one line naming the variable and what was expected,
 * exit code 2, nothing started. Unknown settings with the project's prefixes, and near misses of
 * known ones, are reported (STRICT_SETTINGS=1 refuses them). A stack already running from the
 * same run directory (its pid file, start.pid) or on the same ports is named, exit code 2, and
 * so are ingest HMAC keys in the environment that would undo a rotation (a stale shell). A
 * refused start writes nothing.
 *
 * Each child runs in its own process group, so a Ctrl-C at the terminal reaches this process
 * only (package.json `exec`s it, so npm's signals do too), and it stops the stack in dependency
 * order: Envoy stops taking requests, the TS service seals and drains (SHUTDOWN_GRACE_MS), then
 * Envoy, the demo backend and Redis exit. Once the stack is ready, a TS service, Redis or demo
 * backend that exits is restarted after 0.5 s, doubling up to 5 s while it keeps failing (Envoy
 * answers 503 service_unavailable meanwhile); Envoy's exit, SIGINT, SIGTERM or SIGHUP ends the stack.
 *
 * Seal: the admin token is generated once into admin-token under the run directory (0600), and a
 * seal through POST /admin/seal is kept in `sealed` there (AUTHZ_ADMIN_TOKEN_FILE, AUTHZ_SEAL_FILE,
 * unless set): the TS service exits after the seal, is restarted, and comes back sealed (no key
 * loaded, every request 503 sealed), as does a later `npm start`, until the operator removes the
 * file (docs/operations.md "Seal and unseal"). Ctrl-C, SIGTERM and SIGHUP seal too, but leave nothing.
 *
 * `npm start -- --rotate-client-cert` issues a new client certificate for the edge from the
 * development client CA and publishes it atomically; the running Envoy loads it (docs/operations.md).
 *
 * This file is the start sequence and the banner; each other concern is a module of scripts/start/:
 * output.ts (npm start's own lines), preflight.ts (the settings), lock.ts (one stack per run
 * directory and port), secrets.ts (dev.env, tokens, secret files), probes.ts (readiness),
 * supervisor.ts (launch, restart, stop).
 */
import { copyFileSync, existsSync, mkdirSync, readFileSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';
import { withServiceRuntime } from '../authz/src/common/runtime-env.ts';
import { ConfigError, DEFAULT_GEOIP_DB, loadConfig } from '../authz/src/common/config.ts';
import { loadCredentials } from '../authz/src/common/credentials.ts';
import { checkSealFileWritable, readSealFile, unsealHint } from '../authz/src/common/seal-file.ts';
import { socketPathProblem } from '../authz/src/common/unix-socket.ts';
import { readTokenFile } from '../authz/src/common/token.ts';
import { envoyBinary } from '../envoy/envoy-bin.ts';
import { renderEnvoy, serverSdsPath } from '../envoy/render.ts';
import { ensureEdgeServerCert } from './dev/edge-server-cert.ts';
import { ensureDevPki, issue, publishClientCert, RENEW_DAYS } from './dev/certs.ts';
import { emit, refuse, say, setOnHangUp } from './start/output.ts';
import { checkSettings, isBlank, type Plan, type StartEnv } from './start/preflight.ts';
import { runningProblem } from './start/lock.ts';
import {
  createRunDir, devAdminToken, devRateLimitToken, devSecrets, keepDevEnvCurrent, secretsToFiles, staleKeysProblem, withoutSecrets as withoutSecretsOf,
  type DevSecrets,
} from './start/secrets.ts';
import { httpOk, orSealed, REDIS_WAIT_MS, redisShown, tcpOpen, waitForRedis } from './start/probes.ts';
import { Supervisor, type Probe, type Service } from './start/supervisor.ts';
import { readyBanner, sealedBanner, type BannerInput } from './start/banner.ts';

const ROOT = fileURLToPath(new URL('../', import.meta.url));

const env: StartEnv = { ...process.env };
const blank = (name: string): boolean => isBlank(env, name);

/** Where keys, certificates, Redis data and the rendered config go (DEV_RUN_DIR, default .run/). */
const RUN = blank('DEV_RUN_DIR') ? join(ROOT, '.run') : (env['DEV_RUN_DIR'] ?? '').trim();
/** How the banner names a file in RUN: relative (./…) below the working directory, else absolute; quoted. */
const shown = (file: string): string => {
  const rel = relative(process.cwd(), join(RUN, file));
  return `'${rel.startsWith('..') || rel.startsWith('/') ? join(RUN, file) : `./${rel}`}'`;
};
const PID_FILE = join(RUN, 'start.pid');
/** The admin token and the seal marker: the run directory's unless set (docs/operations.md "Seal and unseal"). */
const ADMIN_TOKEN_DEFAULT = join(RUN, 'admin-token');
if (blank('AUTHZ_ADMIN_TOKEN_FILE')) env['AUTHZ_ADMIN_TOKEN_FILE'] = ADMIN_TOKEN_DEFAULT;
if (blank('AUTHZ_SEAL_FILE')) env['AUTHZ_SEAL_FILE'] = join(RUN, 'sealed');
const SEAL_FILE = (env['AUTHZ_SEAL_FILE'] ?? '').trim();
/**
 * Envoy reaches the TS service over Unix sockets in the run directory (AUTHZ_GRPC_SOCKET,
 * MARKET_SOCKET; docs/envoy.md "Unix domain sockets": measured faster than loopback TCP), unless
 * the setting is given (`off`: TCP), the service is elsewhere (AUTHZ_ADDRESS / MARKET_ADDRESS), the
 * rate limit service is named by address, or the run directory's path is too long for a socket address.
 */
const UDS_NOTES: string[] = [];
for (const [name, addressName, file] of [['AUTHZ_GRPC_SOCKET', 'AUTHZ_ADDRESS', 'authz.sock'], ['MARKET_SOCKET', 'MARKET_ADDRESS', 'market.sock']] as const) {
  if (!blank(name) || !blank(addressName) || (name === 'AUTHZ_GRPC_SOCKET' && !blank('RATELIMIT_SERVICE_ADDRESS'))) continue;
  const path = join(RUN, 'sockets', file);
  if (socketPathProblem(path) === undefined) env[name] = path;
  else UDS_NOTES.push(`${name}: TCP (the run directory's socket path ${path} is too long for a Unix socket address; set ${name} to a shorter path)`);
}
/** Whether the stack is sealed: the marker is present (any form: fail closed, as the service reads it). */
const sealed = (): boolean => readSealFile(SEAL_FILE) !== undefined;

function removePidFile(): void {
  try {
    if ((JSON.parse(readFileSync(PID_FILE, 'utf8')) as { pid?: number }).pid === process.pid) rmSync(PID_FILE, { force: true });
  } catch { /* not ours, or gone */ }
}

const supervisor = new Supervisor({
  say, emit, sealed,
  sealedNote: () => `the stack is SEALED (${shown(relative(RUN, SEAL_FILE))}): the TS service comes back sealed, without its keys; ${unsealHint(SEAL_FILE)}`,
  afterStop: removePidFile,
  exit: (code) => process.exit(code),
});
const stop = (code: number): Promise<void> => supervisor.stop(code);
const waitFor = supervisor.waitFor.bind(supervisor);
const withoutSecrets = (): NodeJS.ProcessEnv => withoutSecretsOf(env);

// ---------------------------------------------------------------------------------------------
// `npm start -- --rotate-client-cert`: a new client certificate for the running stack.

if (process.argv.includes('--rotate-client-cert')) {
  const pki = join(RUN, 'pki');
  if (!existsSync(join(pki, 'client-ca.key'))) refuse(`${pki} has no development client CA: run npm start first`);
  const name = `client-${Date.now()}`;
  issue(pki, 'client-ca', name, `edge-${name}`, 'DNS:edge.internal', 'clientAuth');
  publishClientCert(join(pki, 'client'), readFileSync(join(pki, `${name}.crt`)), readFileSync(join(pki, `${name}.key`)));
  say(`published ${name} (CN=edge-${name}) into ${shown('pki/client')}: Envoy loads it without a restart; `
    + 'new connections to the backend present it (docs/operations.md, "Client certificate")');
  process.exit(0);
}

// ---------------------------------------------------------------------------------------------
// Start.

let plan: Plan;
let secrets: DevSecrets;
try {
  plan = checkSettings(env, say);
  // Token files given in the environment, checked as the TS service will (readable, long enough)
  // before anything is written; the generated ones are made after the run directory (below).
  if (env['AUTHZ_ADMIN_TOKEN_FILE'] !== ADMIN_TOKEN_DEFAULT) readTokenFile('AUTHZ_ADMIN_TOKEN_FILE', env['AUTHZ_ADMIN_TOKEN_FILE'] ?? '');
  if (!blank('RATELIMIT_SERVICE_TOKEN_FILE')) readTokenFile('RATELIMIT_SERVICE_TOKEN_FILE', env['RATELIMIT_SERVICE_TOKEN_FILE'] ?? '');
  secrets = devSecrets(RUN);
  const stale = secrets.fresh === undefined ? staleKeysProblem(env, secrets.values, shown('dev.env')) : undefined;
  if (stale !== undefined) refuse(stale);
  for (const [k, v] of Object.entries(secrets.values)) {
    // A key given in the environment, directly or as a file, wins over dev.env's.
    if (k !== 'EDGE_FEED_ED25519_KEY' && env[k] === undefined && env[`${k}_FILE`] === undefined) env[k] = v;
  }
  // A sealed stack's TS service reads no key (docs/api.md "Seal"): nor is one checked here.
  if (!sealed()) loadCredentials({ ...env }).zeroize();
} catch (err) {
  if (err instanceof ConfigError) refuse(err.message);
  throw err;
}
const running = await runningProblem(PID_FILE, RUN, plan.ports);
if (running !== undefined) refuse(running);
try {
  createRunDir(RUN, secrets);
  // A refused start writes nothing: the development tokens only now, in the run directory.
  devAdminToken(env, ADMIN_TOKEN_DEFAULT);
  devRateLimitToken(env, RUN, plan.config);
  readTokenFile('AUTHZ_ADMIN_TOKEN_FILE', env['AUTHZ_ADMIN_TOKEN_FILE'] ?? '');
  checkSealFileWritable(SEAL_FILE);
} catch (err) {
  if (err instanceof ConfigError) refuse(err.message);
  throw err;
}
const devEnvNote = keepDevEnvCurrent(env, RUN, shown('dev.env'));
if (devEnvNote !== undefined) say(devEnvNote);
supervisor.shutdownGraceMs = plan.config.shutdownGraceMs;
supervisor.envoyAdminPort = plan.config.envoyAdminPort;
for (const sig of ['SIGINT', 'SIGTERM', 'SIGHUP'] as const) process.on(sig, () => void stop(0));
setOnHangUp(() => void stop(0));
writeFileSync(PID_FILE, `${JSON.stringify({ pid: process.pid, edge: `http://127.0.0.1:${plan.config.edgePort}`, ports: Object.fromEntries(plan.ports) })}\n`);
process.on('exit', () => {
  // After stop() every child has exited; after an internal error, leave nothing behind either.
  supervisor.killAll();
  removePidFile();
});
// Said once: an error while stopping (or while saying so) must not start the handler again.
let crashed = false;
process.on('uncaughtException', (err) => {
  if (crashed) return;
  crashed = true;
  emit(process.stderr, `npm start: internal error: ${err.stack ?? String(err)}\n`);
  void stop(1);
});

// The TS service reads its secrets from files, never its environment (secrets.ts).
secretsToFiles(env, RUN);

// GeoIP: the packaged database sits in node_modules; the stack serves a copy under the run
// directory, so it can be replaced by rename like in the deployments (docs/operations.md).
if (blank('GEOIP_DB')) {
  const copy = join(RUN, 'geoip', 'country.mmdb');
  if (!existsSync(copy)) {
    mkdirSync(join(RUN, 'geoip'), { recursive: true, mode: 0o700 });
    copyFileSync(DEFAULT_GEOIP_DB, `${copy}.tmp`);
    renameSync(`${copy}.tmp`, copy);
  }
  env['GEOIP_DB'] = copy;
}

// Redis: honour REDIS_URL; else a private redis-server when installed; else in-memory stores.
const starting: Promise<[Service, Probe]>[] = [];
if (plan.redisPort !== undefined) {
  const port = plan.redisPort;
  mkdirSync(join(RUN, 'redis'), { recursive: true, mode: 0o700 });
  const redis: Service = {
    name: 'redis', label: 'redis-server', cmd: 'redis-server', env: withoutSecrets(), ready: tcpOpen(port), delayMs: 500, restarts: 0,
    // --set-proc-title no: its command line keeps naming its data directory (ps, and the e2e test).
    args: ['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'yes', '--appendfsync', 'always',
      '--dir', join(RUN, 'redis'), '--set-proc-title', 'no', '--loglevel', 'warning'],
  };
  supervisor.add(redis);
  env['REDIS_URL'] = `redis://127.0.0.1:${port}/0`;
  starting.push(waitFor(redis.ready, 10_000).then((p) => [redis, p]));
  say(`redis-server on 127.0.0.1:${port} (data in ${shown('redis')})`);
} else if (blank('REDIS_URL')) {
  say('redis-server not found: the TS service will use its in-memory stores (development only)');
}

// Order backend: honour ORDER_BACKEND_URL; else the demo mTLS backend (scripts/dev/order-backend-main.ts).
if (plan.backendPort !== undefined) {
  const pkiExisted = existsSync(join(RUN, 'pki', 'client-ca.crt'));
  const pki = ensureDevPki(join(RUN, 'pki'));
  const port = plan.backendPort !== 0 ? plan.backendPort : await new Promise<number>((resolve) => {
    const s = createServer().listen(0, '127.0.0.1', () => {
      const a = s.address();
      s.close(() => resolve(typeof a === 'object' && a !== null ? a.port : 0));
    });
  });
  const backend: Service = {
    name: 'backend', label: 'the demo backend', cmd: join(ROOT, 'scripts', 'node'), args: [join(ROOT, 'scripts/dev/order-backend-main.ts')],
    env: {
      ...withoutSecrets(), BACKEND_CERT_FILE: pki.backendCertFile, BACKEND_KEY_FILE: pki.backendKeyFile,
      BACKEND_CLIENT_CA_FILE: pki.clientCaFile, BACKEND_PORT: String(port), BACKEND_BIND_ADDRESS: '127.0.0.1',
    },
    ready: tcpOpen(port), delayMs: 500, restarts: 0,
  };
  supervisor.add(backend);
  Object.assign(env, {
    ORDER_BACKEND_URL: `https://localhost:${port}`,
    ORDER_BACKEND_CA_FILE: pki.backendCaFile,
    EDGE_CLIENT_CERT_FILE: pki.clientCertFile,
    EDGE_CLIENT_KEY_FILE: pki.clientKeyFile,
  });
  starting.push(waitFor(backend.ready, 15_000).then((p) => [backend, p]));
  const renewed = pkiExisted && pki.issued.length > 0 ? `; issued again, as missing or expiring within ${RENEW_DAYS} days: ${pki.issued.join(', ')}` : '';
  say(`demo mTLS order backend on https://localhost:${port} (certificates in ${shown('pki')}${renewed})`);
}
for (const [svc, p] of await Promise.all(starting)) {
  if (!p.ok && !supervisor.stopping) {
    say(`${svc.label} did not come up: ${p.answer}`);
    await stop(1);
  }
}
/** A child exited while starting: stop() is under way and ends the process. */
const stopped = (): Promise<never> => new Promise<never>(() => undefined);
if (supervisor.stopping) await stopped();
if (plan.redisPort === undefined && !blank('REDIS_URL')) {
  const url = env['REDIS_URL'] ?? '';
  const failed = await waitForRedis(url, REDIS_WAIT_MS, () => supervisor.stopping, say);
  if (failed !== undefined && !supervisor.stopping) {
    say(`Redis at ${redisShown(url)} (REDIS_URL) did not answer within ${REDIS_WAIT_MS / 1000} s (${failed}): start it, or fix or unset REDIS_URL`);
    await stop(1);
  }
  if (supervisor.stopping) await stopped();
}

// TLS on the client port (DEV_EDGE_TLS=1; README "Development only"): a development server
// certificate for localhost under the run directory, unless EDGE_TLS_CERT_FILE/KEY_FILE are given.
let edgeCaFile: string | undefined;
// DEV_EDGE_TLS was checked with the other settings (preflight.ts), before anything started.
if (plan.devEdgeTls && blank('EDGE_TLS_CERT_FILE') && blank('EDGE_TLS_KEY_FILE')) {
  const cert = ensureEdgeServerCert(join(RUN, 'pki'));
  Object.assign(env, { EDGE_TLS_CERT_FILE: cert.certFile, EDGE_TLS_KEY_FILE: cert.keyFile });
  edgeCaFile = cert.caFile;
  say(`TLS on the client port: a development certificate for localhost in ${shown('pki/edge-server')} (its CA: ${shown('pki/edge-ca.crt')}${cert.issued ? ', issued now' : ', kept'})`);
}

const config = loadConfig(env);
/** Where the TS service's own GET /healthz is asked: MARKET_PORT, or MARKET_SOCKET when it listens on that only. */
const marketBase = `http://127.0.0.1:${config.marketPort}`;
const marketVia = config.marketTcp ? undefined : config.marketSocket;
for (const note of UDS_NOTES) say(note);
const authz: Service = {
  name: 'authz', label: 'the TS service', cmd: join(ROOT, 'scripts', 'node'), args: [join(ROOT, 'authz/src/main.ts')],
  // Its own health (authz not sealed, GeoIP and the store ready), asked directly: no geo on the way.
  env: withServiceRuntime(Object.fromEntries(Object.entries(env).filter(([k]) => !plan.unknown.includes(k)))), ready: orSealed(sealed, httpOk(`${marketBase}/healthz`, marketVia), `${marketBase}/`, marketVia), delayMs: 500, restarts: 0,
};
supervisor.add(authz);
const authzReady = await waitFor(authz.ready, 30_000);
if (!authzReady.ok && !supervisor.stopping) {
  say(`the TS service did not become ready within 30 s: ${authzReady.answer}`);
  await stop(1);
}
if (supervisor.stopping) await stopped();
const sdsPath = join(RUN, 'sds.yaml');
const rendered = renderEnvoy(config, { sdsPath });
for (const w of rendered.warnings) say(`envoy config warning: ${w}`);
writeFileSync(join(RUN, 'envoy.yaml'), rendered.bootstrap);
if (rendered.sds !== undefined) writeFileSync(sdsPath, rendered.sds);
if (rendered.serverSds !== undefined) writeFileSync(serverSdsPath({ sdsPath }), rendered.serverSds);
const envoy: Service = {
  name: 'envoy', label: 'Envoy', cmd: envoyBinary(env), args: ['-c', join(RUN, 'envoy.yaml'), '--disable-hot-restart', '-l', 'warning'],
  // Envoy's own readiness (listeners and clusters initialized), on its admin port: not a route
  // through geo, which may answer this machine 451 by design (GEO_TRUSTED_CIDRS without loopback).
  env: withoutSecrets(), ready: httpOk(`http://127.0.0.1:${config.envoyAdminPort}/ready`), delayMs: 500, restarts: 0,
};
supervisor.add(envoy);
const envoyReady = await waitFor(envoy.ready, 30_000);
if (!envoyReady.ok && !supervisor.stopping) {
  say(`Envoy did not become ready within 30 s: ${envoyReady.answer}`);
  await stop(1);
}
const banner: BannerInput = { config, env, run: RUN, sealFile: SEAL_FILE, edgeCaFile, marketVia, shown };
if (!supervisor.stopping && sealed()) {
  supervisor.supervising = true;
  say(sealedBanner(banner));
} else if (!supervisor.stopping) {
  supervisor.supervising = true;
  say(await readyBanner(banner));
}
