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
 */
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { createHash, generateKeyPairSync, randomBytes, timingSafeEqual } from 'node:crypto';
import { copyFileSync, existsSync, mkdirSync, readdirSync, readFileSync, readlinkSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { connect, createServer } from 'node:net';
import { join, relative } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { fileURLToPath } from 'node:url';
import { createRedis, neverSent } from '../authz/src/common/adapters/redis.ts';
import { withServiceRuntime } from '../authz/src/common/runtime-env.ts';
import { checkSettingNames, ConfigError, DEFAULT_GEOIP_DB, loadConfig, type Config } from '../authz/src/common/config.ts';
import { checkDatabases } from '../authz/src/common/adapters/databases.ts';
import { loadCredentials, parseHmacKey, secretSetting } from '../authz/src/common/credentials.ts';
import { checkSealFileWritable, readSealFile, unsealHint } from '../authz/src/common/seal-file.ts';
import { socketPathProblem } from '../authz/src/common/unix-socket.ts';
import { getOverSocket } from './dev/unix-http.ts';
import { readTokenFile } from '../authz/src/common/token.ts';
import { envoyBinary } from '../envoy/envoy-bin.ts';
import { renderEnvoy, serverSdsPath } from '../envoy/render.ts';
import { ensureEdgeServerCert } from './dev/edge-server-cert.ts';
import { get as httpsGet } from 'node:https';
import { ensureDevPki, issue, publishClientCert, RENEW_DAYS } from './dev/certs.ts';

const ROOT = fileURLToPath(new URL('../', import.meta.url));

/**
 * Output that may go away: a terminal closed, or the reader of a pipe (`npm start | tee log`,
 * then Ctrl-C) gone. A failed write (EIO, EPIPE) is a hang-up: nothing more is written and the
 * stack stops in order, as on SIGHUP (`onHangUp`, set once the stack starts). Writing after that
 * would only fail again; writing from the error's own handler used to loop at full CPU.
 */
let outputGone = false;
let onHangUp = (): void => undefined;
function hangUp(): void {
  if (outputGone) return;
  outputGone = true;
  onHangUp();
}
for (const stream of [process.stdout, process.stderr]) stream.on('error', hangUp);
function emit(stream: NodeJS.WriteStream, text: string | Uint8Array): void {
  if (outputGone) return;
  try {
    stream.write(text);
  } catch {
    hangUp();
  }
}
const say = (msg: string): void => emit(process.stdout, `npm start: ${msg}\n`);
/** Refused before anything started: one line, exit code 2. */
function refuse(msg: string): never {
  emit(process.stderr, `npm start: ${msg}\n`);
  process.exit(2);
}

const env: Record<string, string | undefined> = { ...process.env };
const blank = (name: string): boolean => (env[name] ?? '').trim() === '';

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

// ---------------------------------------------------------------------------------------------
// 1. Settings: every one checked before anything starts.

/** A development setting: an integer in [min, max] (the wording of config.ts). */
function devInt(name: string, def: number, min: number, max: number): number {
  const raw = env[name]?.trim();
  if (raw === undefined || raw === '') return def;
  const n = Number(raw);
  if (!/^[0-9]+$/.test(raw) || n < min || n > max) throw new ConfigError(name, `an integer in [${min}, ${max}]`, raw);
  return n;
}

interface Plan {
  readonly config: Config;
  /** DEV_REDIS_PORT when this stack runs its own redis-server. */
  readonly redisPort: number | undefined;
  /** DEV_BACKEND_PORT when this stack runs the demo backend (0: a free port is chosen). */
  readonly backendPort: number | undefined;
  /** Every port the stack will listen on, by the setting that names it. */
  readonly ports: ReadonlyArray<readonly [setting: string, port: number]>;
  /** Variables that look like settings but are none (reported here, not passed to the TS service). */
  readonly unknown: readonly string[];
}

function checkSettings(): Plan {
  const unknown = checkSettingNames(env);
  for (const u of unknown) say(`warning: ${u.message}; it is ignored (STRICT_SETTINGS=1 makes this an error)`);
  const redisPort = devInt('DEV_REDIS_PORT', 6390, 1, 65535);
  const backendPort = devInt('DEV_BACKEND_PORT', 8443, 0, 65535);
  const runsRedis = blank('REDIS_URL') && spawnSync('redis-server', ['--version']).status === 0;
  // Checked as the TS service will see them: with the REDIS_URL of the redis-server started below
  // (RATE_LIMIT_SCOPE=global needs one; without redis-server, local is the only choice).
  const config = loadConfig(runsRedis ? { ...env, REDIS_URL: `redis://127.0.0.1:${redisPort}/0` } : env);
  // GEOIP_DB and ANONYMIZER_DB as the TS service will check them: the wrong kind of database is a bad setting.
  checkDatabases(config);
  const runsBackend = blank('ORDER_BACKEND_URL');
  const ports: [string, number][] = [
    ['EDGE_PORT', config.edgePort],
    // With a socket, AUTHZ_GRPC_PORT / MARKET_PORT are listened on only when set (config.ts).
    ...(config.authzGrpcTcp ? [['AUTHZ_GRPC_PORT', config.authzGrpcPort] as [string, number]] : []),
    ...(config.marketTcp ? [['MARKET_PORT', config.marketPort] as [string, number]] : []),
    ['AUTHZ_ADMIN_PORT', config.authzAdminPort], ['ENVOY_ADMIN_PORT', config.envoyAdminPort],
    // Ingest on a listener of its own only when INGEST_PORT is set; else on EDGE_PORT as every route.
    ...(config.ingestPort === undefined ? [] : [['INGEST_PORT', config.ingestPort] as [string, number]]),
    // Envoy's stats listener (GET /stats/prometheus only) only when ENVOY_STATS_PORT is set.
    ...(config.envoyStatsPort === undefined ? [] : [['ENVOY_STATS_PORT', config.envoyStatsPort] as [string, number]]),
  ];
  for (const [name, port] of ports) {
    // Port 0 lets the system choose: nobody (the banner, Envoy, a client) would know the port.
    if (port === 0) throw new ConfigError(name, 'a port in [1, 65535] for npm start', '0');
  }
  if (runsRedis) ports.push(['DEV_REDIS_PORT', redisPort]);
  if (runsBackend && backendPort !== 0) ports.push(['DEV_BACKEND_PORT', backendPort]);
  const seen = new Map<number, string>();
  for (const [name, port] of ports) {
    const other = seen.get(port);
    if (other !== undefined) throw new ConfigError(name, `a port other than ${other}'s`, String(port));
    seen.set(port, name);
  }
  return { config, redisPort: runsRedis ? redisPort : undefined, backendPort: runsBackend ? backendPort : undefined, ports, unknown: unknown.map((u) => u.name) };
}

interface DevSecrets {
  /** dev.env's settings. */
  readonly values: Record<string, string>;
  /** dev.env's text when there is none yet: written by createRunDir, once the start is not refused. */
  readonly fresh: string | undefined;
}

/** Development secrets: generated once into dev.env (mode 0600), reused across restarts. */
function devSecrets(): DevSecrets {
  const file = join(RUN, 'dev.env');
  let fresh: string | undefined;
  if (!existsSync(file)) {
    const { privateKey, publicKey } = generateKeyPairSync('ed25519');
    const seed = Buffer.from(privateKey.export({ format: 'jwk' }).d ?? '', 'base64url').toString('hex');
    const pub = Buffer.from(publicKey.export({ format: 'jwk' }).x ?? '', 'base64url').toString('hex');
    fresh = [
      `EDGE_INGEST_HMAC=hex:${randomBytes(32).toString('hex')}`,
      `EDGE_FEED_ED25519_PUBLIC_KEY=${pub}`,
      `# The feed's private key: used only by scripts/edge-client.ts to sign demo documents.`,
      `EDGE_FEED_ED25519_KEY=${seed}`,
    ].join('\n') + '\n';
  }
  const values = Object.fromEntries((fresh ?? readFileSync(file, 'utf8')).split('\n').filter((l) => /^[A-Z0-9_]+=/.test(l)).map((l) => {
    const i = l.indexOf('=');
    return [l.slice(0, i), l.slice(i + 1)];
  }));
  return { values, fresh };
}

/**
 * The run directory and a new dev.env, written only once nothing refuses the start (a refused
 * start, e.g. for ports in use, leaves no trace). An unusable DEV_RUN_DIR is a setting error.
 */
function createRunDir(secrets: DevSecrets): void {
  try {
    mkdirSync(RUN, { recursive: true, mode: 0o700 });
    if (secrets.fresh !== undefined) {
      const file = join(RUN, 'dev.env');
      writeFileSync(`${file}.tmp`, secrets.fresh, { mode: 0o600 });
      renameSync(`${file}.tmp`, file);
    }
  } catch (err) {
    throw new ConfigError('DEV_RUN_DIR', 'a directory npm start can create and write', `${RUN}: ${(err as NodeJS.ErrnoException).code ?? String(err)}`);
  }
}

/** Names an ingest HMAC key in messages without revealing it: the first 8 hex digits of the SHA-256 of its bytes. */
function fingerprint(name: string, value: string): string {
  const key = parseHmacKey(name, value);
  const hash = createHash('sha256').update(key).digest('hex').slice(0, 8);
  key.fill(0);
  return `sha256:${hash}`;
}

/** Whether setting `name`'s value `a` and dev.env's `b` are the same key (as bytes: hex:, base64: or text alike). */
function sameKey(name: string, a: string, b: string): boolean {
  const x = parseHmacKey(name, a);
  const y = parseHmacKey(name, b);
  const same = x.length === y.length && timingSafeEqual(x, y);
  x.fill(0);
  y.fill(0);
  return same;
}

/**
 * A shell that sourced dev.env (the banner's `set -a; . dev.env`) before a rotation still exports
 * the old key: a start from it would make the old key current again and rewrite dev.env to match,
 * and a feed already signing with the new key would get 401. So the environment's ingest keys may
 * differ from those dev.env holds (the keys the stack last ran with) only as the documented
 * rotation does (docs/operations.md "Ingest HMAC key"): a new EDGE_INGEST_HMAC with dev.env's
 * current key as EDGE_INGEST_HMAC_PREVIOUS (step 1), or the same EDGE_INGEST_HMAC with the
 * previous key emptied (step 3). Anything else is refused (exit 2) naming both keys by
 * fingerprint: a warning would scroll past while the stack starts, after dev.env was rewritten.
 */
function refuseStaleKeys(file: Record<string, string>): void {
  const current = secretSetting(env, 'EDGE_INGEST_HMAC');
  const previous = secretSetting(env, 'EDGE_INGEST_HMAC_PREVIOUS');
  const fileCurrent = file['EDGE_INGEST_HMAC'];
  const filePrevious = file['EDGE_INGEST_HMAC_PREVIOUS'] ?? '';
  if (current === undefined || fileCurrent === undefined) return; // dev.env's keys are used, or dev.env names none
  try {
    parseHmacKey('EDGE_INGEST_HMAC', fileCurrent);
    if (filePrevious !== '') parseHmacKey('EDGE_INGEST_HMAC_PREVIOUS', filePrevious);
  } catch {
    return; // dev.env edited by hand into something that is not a key: the environment's keys replace it
  }
  const refresh = `a shell that sourced dev.env before a rotation keeps the old keys: refresh it (set -a; . ${shown('dev.env')}; set +a) `
    + 'or unset EDGE_INGEST_HMAC EDGE_INGEST_HMAC_PREVIOUS, then start again (docs/operations.md "Ingest HMAC key")';
  if (!sameKey('EDGE_INGEST_HMAC', current, fileCurrent)) {
    if (previous !== undefined && previous !== '' && sameKey('EDGE_INGEST_HMAC_PREVIOUS', previous, fileCurrent)) return; // a rotation: step 1
    refuse(`EDGE_INGEST_HMAC in your environment (${fingerprint('EDGE_INGEST_HMAC', current)}) is not the key this stack last ran with `
      + `(${fingerprint('EDGE_INGEST_HMAC', fileCurrent)}, in ${shown('dev.env')}), nor is that key your EDGE_INGEST_HMAC_PREVIOUS: `
      + `starting would stop accepting it (feeds signing with it would get 401); ${refresh}; to rotate, give it as EDGE_INGEST_HMAC_PREVIOUS`);
  }
  if (previous !== undefined && previous !== '' && (filePrevious === '' || !sameKey('EDGE_INGEST_HMAC_PREVIOUS', previous, filePrevious))) {
    refuse(`EDGE_INGEST_HMAC_PREVIOUS in your environment (${fingerprint('EDGE_INGEST_HMAC_PREVIOUS', previous)}) is not the previous key `
      + `this stack last ran with (${filePrevious === '' ? 'none' : fingerprint('EDGE_INGEST_HMAC_PREVIOUS', filePrevious)}, in ${shown('dev.env')}): `
      + `starting would accept a retired key again; ${refresh}`);
  }
}

/**
 * The admin token (POST /admin/seal): generated once into admin-token (0600), reused across
 * restarts; a token file given in AUTHZ_ADMIN_TOKEN_FILE is used as it is.
 */
function devAdminToken(): void {
  if (env['AUTHZ_ADMIN_TOKEN_FILE'] !== ADMIN_TOKEN_DEFAULT || existsSync(ADMIN_TOKEN_DEFAULT)) return;
  writeFileSync(`${ADMIN_TOKEN_DEFAULT}.tmp`, `${randomBytes(32).toString('hex')}\n`, { mode: 0o600 });
  renameSync(`${ADMIN_TOKEN_DEFAULT}.tmp`, ADMIN_TOKEN_DEFAULT);
}

/**
 * RATELIMIT_SERVICE_ADDRESS naming this stack's own TS service (loopback, AUTHZ_GRPC_PORT) without
 * RATELIMIT_SERVICE_TOKEN_FILE: the token Envoy sends it is generated into ratelimit-token (0600),
 * since the TS service serves RateLimitService only with one.
 */
function devRateLimitToken(config: Config): void {
  const rl = config.rateLimitService;
  if (rl === undefined || !blank('RATELIMIT_SERVICE_TOKEN_FILE') || rl.port !== config.authzGrpcPort || !/^(127\.[0-9.]+|::1|localhost)$/.test(rl.host)) return;
  const file = join(RUN, 'ratelimit-token');
  if (!existsSync(file)) {
    writeFileSync(`${file}.tmp`, `${randomBytes(32).toString('hex')}\n`, { mode: 0o600 });
    renameSync(`${file}.tmp`, file);
  }
  env['RATELIMIT_SERVICE_TOKEN_FILE'] = file;
}

/**
 * dev.env holds the ingest HMAC keys the stack runs with, so the banner's `. dev.env` signs with
 * the current key: a key given in the environment (a rotation, docs/operations.md) replaces the
 * file's, an empty EDGE_INGEST_HMAC_PREVIOUS removes the previous one.
 */
function keepDevEnvCurrent(): void {
  const file = join(RUN, 'dev.env');
  const before = readFileSync(file, 'utf8');
  let lines = before.split('\n');
  for (const name of ['EDGE_INGEST_HMAC', 'EDGE_INGEST_HMAC_PREVIOUS']) {
    const value = secretSetting(env, name) ?? '';
    const at = lines.findIndex((l) => l.startsWith(`${name}=`));
    if (value === '') lines = lines.filter((l) => !l.startsWith(`${name}=`));
    else if (at >= 0) lines[at] = `${name}=${value}`;
    else lines.splice(name === 'EDGE_INGEST_HMAC' ? 0 : 1, 0, `${name}=${value}`);
  }
  const after = lines.join('\n');
  if (after !== before) {
    writeFileSync(`${file}.tmp`, after, { mode: 0o600 });
    renameSync(`${file}.tmp`, file);
    const named = (name: string): string => {
      const value = secretSetting(env, name) ?? '';
      return `${name} ${value === '' ? 'none' : fingerprint(name, value)}`;
    };
    say(`${shown('dev.env')} now holds the ingest HMAC key(s) this stack runs with (from your environment): `
      + `${named('EDGE_INGEST_HMAC')}, ${named('EDGE_INGEST_HMAC_PREVIOUS')}`);
  }
}

// ---------------------------------------------------------------------------------------------
// 2. One stack per run directory and per port.

function cmdline(pid: number | string): string {
  try {
    return readFileSync(`/proc/${pid}/cmdline`, 'utf8').replaceAll('\0', ' ').trim();
  } catch {
    return '';
  }
}
const isStack = (pid: number): boolean => cmdline(pid).includes('scripts/start.ts');

function parentOf(pid: number): number {
  try {
    // /proc/<pid>/stat: "pid (comm) state ppid …"; comm may hold spaces and parentheses.
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    return Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]);
  } catch {
    return 0;
  }
}

/** The `npm start` (scripts/start.ts) process `pid` belongs to, if any. */
function stackOf(pid: number): number | undefined {
  for (let p = pid, i = 0; p > 1 && i < 16; p = parentOf(p), i++) if (isStack(p)) return p;
  return undefined;
}

function portInUse(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const s = createServer();
    s.once('error', (err: NodeJS.ErrnoException) => resolve(err.code === 'EADDRINUSE'));
    s.listen({ port, host: '0.0.0.0', exclusive: true }, () => s.close(() => resolve(false)));
  });
}

/** The process listening on TCP `port` (Linux /proc; only processes this user may inspect). */
function portOwner(port: number): number | undefined {
  const inodes = new Set<string>();
  for (const table of ['/proc/net/tcp', '/proc/net/tcp6']) {
    let text: string;
    try {
      text = readFileSync(table, 'utf8');
    } catch {
      continue;
    }
    for (const line of text.split('\n').slice(1)) {
      const c = line.trim().split(/\s+/);
      if (c[3] === '0A' && parseInt(c[1]?.split(':')[1] ?? '', 16) === port && c[9] !== undefined) inodes.add(c[9]);
    }
  }
  if (inodes.size === 0) return undefined;
  for (const pid of readdirSync('/proc').filter((d) => /^\d+$/.test(d))) {
    let fds: string[];
    try {
      fds = readdirSync(`/proc/${pid}/fd`);
    } catch {
      continue;
    }
    for (const fd of fds) {
      try {
        const inode = /^socket:\[(\d+)\]$/.exec(readlinkSync(`/proc/${pid}/fd/${fd}`))?.[1];
        if (inode !== undefined && inodes.has(inode)) return Number(pid);
      } catch { /* closed meanwhile */ }
    }
  }
  return undefined;
}

async function refuseIfRunning(plan: Plan): Promise<void> {
  let recorded: { pid?: number; edge?: string } = {};
  try {
    recorded = JSON.parse(readFileSync(PID_FILE, 'utf8')) as typeof recorded;
  } catch { /* none, or unreadable: the ports decide */ }
  if (typeof recorded.pid === 'number' && recorded.pid !== process.pid && isStack(recorded.pid)) {
    refuse(`a stack is already running from ${RUN} (pid ${recorded.pid}, ${recorded.edge ?? 'its ports'}); `
      + `stop it first (Ctrl-C in its terminal, or kill ${recorded.pid}), or give this one another DEV_RUN_DIR and ports`);
  }
  const busy: { setting: string; port: number; owner: number | undefined }[] = [];
  for (const [setting, port] of plan.ports) if (await portInUse(port)) busy.push({ setting, port, owner: portOwner(port) });
  if (busy.length === 0) return;
  const list = busy.map((b) => `${b.setting} ${b.port}`).join(', ');
  const stacks = [...new Set(busy.map((b) => (b.owner === undefined ? undefined : stackOf(b.owner))).filter((p) => p !== undefined))];
  if (stacks.length > 0) {
    refuse(`a stack is already running on these ports (pid ${stacks.join(', ')}): ${list}; stop it first (Ctrl-C in its terminal, or kill ${stacks.join(' ')})`);
  }
  const owners = busy.map((b) => `${b.setting} ${b.port} by ${b.owner === undefined ? 'another process' : `pid ${b.owner} (${cmdline(b.owner).slice(0, 80)})`}`);
  refuse(`ports already in use: ${owners.join('; ')}; stop that process or choose other ports (README "Settings")`);
}

// ---------------------------------------------------------------------------------------------
// 3. The children and their supervision.

type Name = 'redis' | 'backend' | 'authz' | 'envoy';
interface Run { readonly proc: ChildProcess; readonly exited: Promise<string>; readonly startedAt: number }
interface Service {
  readonly name: Name;
  /** How messages name it. */
  readonly label: string;
  readonly cmd: string;
  readonly args: readonly string[];
  readonly env: NodeJS.ProcessEnv;
  /** One readiness probe. */
  readonly ready: () => Promise<Probe>;
  run?: Run;
  delayMs: number;
  restarts: number;
  timer?: NodeJS.Timeout;
}

const services = new Map<Name, Service>();
let supervising = false;
let stopping = false;
let shutdownGraceMs = 5000;
let envoyAdminPort = 0;

function launch(svc: Service): void {
  if (stopping) return;
  // detached: a process group of its own, so a Ctrl-C at the terminal reaches only this
  // process, which stops the children in order.
  // Their output goes through this process, never straight to the terminal: when the terminal or
  // the pipe goes away, the children keep writing to a pipe that is still read (and dropped here)
  // while they are stopped in order, instead of each failing its own writes.
  const proc = spawn(svc.cmd, [...svc.args], { env: svc.env, stdio: ['ignore', 'pipe', 'pipe'], detached: true });
  proc.stdout?.on('data', (chunk: Buffer) => emit(process.stdout, chunk));
  proc.stderr?.on('data', (chunk: Buffer) => emit(process.stderr, chunk));
  const exited = new Promise<string>((resolve) => {
    proc.once('exit', (code, signal) => resolve(code === null ? `signal ${signal ?? '?'}` : `code ${code}`));
    proc.once('error', (err) => resolve(`could not start: ${err.message}`));
  });
  const run: Run = { proc, exited, startedAt: Date.now() };
  svc.run = run;
  void exited.then((how) => {
    if (svc.run === run) svc.run = undefined;
    onExit(svc, how, Date.now() - run.startedAt);
  });
}

function onExit(svc: Service, how: string, upMs: number): void {
  if (stopping) return;
  if (!supervising || svc.name === 'envoy') {
    say(`${svc.label} exited (${how}); stopping the stack`);
    void stop(1);
    return;
  }
  if (upMs >= 10_000) svc.delayMs = 500; // it had recovered: start the backoff over
  const delay = svc.delayMs;
  svc.delayMs = Math.min(delay * 2, 5000);
  svc.restarts++;
  say(`${svc.label} exited (${how}); restarting it in ${delay / 1000} s (restart ${svc.restarts})`);
  if (svc.name === 'authz' && sealed()) say(`the stack is SEALED (${shown(relative(RUN, SEAL_FILE))}): the TS service comes back sealed, without its keys; ${unsealHint(SEAL_FILE)}`);
  svc.timer = setTimeout(() => {
    svc.timer = undefined;
    if (stopping) return;
    launch(svc);
    const run = svc.run;
    void waitFor(svc.ready, 30_000).then((p) => {
      if (stopping || svc.run !== run) return;
      say(p.ok ? `${svc.label} is back (pid ${run?.proc.pid ?? '?'})${svc.name === 'authz' && sealed() ? ', SEALED' : ''}` : `${svc.label} is not ready 30 s after its restart: ${p.answer}`);
    });
  }, delay);
}

/** A readiness probe's outcome; `answer` says what the component answered (for messages). */
interface Probe { readonly ok: boolean; readonly answer: string }

/** Probes until one passes or `timeoutMs` is up: the last outcome. */
async function waitFor(probe: () => Promise<Probe>, timeoutMs: number): Promise<Probe> {
  const end = Date.now() + timeoutMs;
  let last: Probe = { ok: false, answer: 'not asked yet' };
  while (Date.now() < end && !stopping) {
    last = await probe();
    if (last.ok) return last;
    await sleep(100);
  }
  return last;
}

/** Why a connection or request failed, in a few words (`connection refused (nothing listening)`, `no answer within 2 s`). */
function failure(err: unknown): string {
  const e = err as { name?: string; code?: string; cause?: { code?: string; message?: string }; message?: string };
  if (e.name === 'TimeoutError') return 'no answer within 2 s';
  const code = e.code ?? e.cause?.code;
  if (code === 'ECONNREFUSED') return 'connection refused (nothing listening)';
  return code ?? e.cause?.message ?? e.message ?? String(err);
}

/** GET `url`, through the Unix socket `socketPath` when given (MARKET_SOCKET: only the URL's path counts then). */
async function get(url: string, socketPath: string | undefined): Promise<{ status: number; body: string }> {
  if (socketPath !== undefined) return getOverSocket(socketPath, new URL(url).pathname);
  const res = await fetch(url, { signal: AbortSignal.timeout(2000) });
  return { status: res.status, body: await res.text() };
}

/** GET `url`: ready on 200; else its status and the start of its body (one line). */
const httpOk = (url: string, socketPath?: string) => async (): Promise<Probe> => {
  try {
    const res = await get(url, socketPath);
    const body = res.body.replace(/\s+/g, ' ').trim().slice(0, 200);
    const shownUrl = socketPath === undefined ? url : `${new URL(url).pathname} on ${socketPath}`;
    return { ok: res.status === 200, answer: `GET ${shownUrl} answered ${res.status}${body === '' ? '' : ` ${body}`}` };
  } catch (err) {
    return { ok: false, answer: `GET ${socketPath === undefined ? url : `${new URL(url).pathname} on ${socketPath}`}: ${failure(err)}` };
  }
};
const tcpOpen = (port: number) => (): Promise<Probe> => new Promise((resolve) => {
  const sock = connect(port, '127.0.0.1', () => { sock.destroy(); resolve({ ok: true, answer: `127.0.0.1:${port} accepts connections` }); });
  sock.once('error', (err) => resolve({ ok: false, answer: `127.0.0.1:${port}: ${failure(err)}` }));
});

/** How messages show a REDIS_URL: without its password. */
const redisShown = (url: string): string => url.replace(/^([a-z+]+:\/\/)[^@/]*@/, '$1…@');
/** How long a REDIS_URL given in the environment may take to answer before the stack gives up. */
const REDIS_WAIT_MS = 30_000;

/**
 * A REDIS_URL given in the environment (not this stack's redis-server) answers PING before the
 * TS service starts: the service would start anyway and log a reconnect error after another,
 * and the stack would never become ready. One line while waiting; after `ms` the last error.
 * Returns undefined once it answers, else that error.
 */
async function waitForRedis(url: string, ms: number): Promise<string | undefined> {
  const client = createRedis(url, { connectTimeout: 1000 });
  let last = 'no answer';
  client.on('error', (err: Error) => { last = err.message; });
  const end = Date.now() + ms;
  let said = false;
  try {
    while (!stopping) {
      try {
        if (await client.ping() === 'PONG') {
          if (said) say(`Redis at ${redisShown(url)} answers`);
          return undefined;
        }
      } catch (err) {
        if (!neverSent(err)) last = (err as Error).message; // else: not connected; the connection's error says why
      }
      if (Date.now() >= end) return last;
      if (!said) say(`waiting for Redis at ${redisShown(url)} (REDIS_URL): the TS service starts once it answers (at most ${ms / 1000} s)`);
      said = true;
      await sleep(250);
    }
    return last;
  } finally {
    client.disconnect();
  }
}
/** Whether `url` answers 503 `sealed` (docs/api.md "Seal"). */
const answersSealed = (url: string, socketPath?: string) => async (): Promise<boolean> => {
  try {
    const r = await get(url, socketPath);
    return r.status === 503 && (JSON.parse(r.body) as { error?: unknown }).error === 'sealed';
  } catch {
    return false;
  }
};
/** `probe`, or — while the stack is sealed (AUTHZ_SEAL_FILE present) — `url` answering 503 sealed: a sealed service is up. */
const orSealed = (probe: () => Promise<Probe>, url: string, socketPath?: string) => async (): Promise<Probe> => {
  const p = await probe();
  if (p.ok || !sealed()) return p;
  return (await answersSealed(url, socketPath)()) ? { ok: true, answer: `GET ${url} answered 503 sealed` } : p;
};

/** SIGTERM, then up to `ms` for it to exit; SIGKILL to its process group after that. */
async function halt(svc: Service | undefined, ms: number): Promise<void> {
  const run = svc?.run;
  if (svc === undefined || run === undefined) return;
  run.proc.kill('SIGTERM');
  const done = await Promise.race([run.exited.then(() => true), sleep(ms, false, { ref: false })]);
  if (done) return;
  say(`${svc.label} did not stop within ${ms / 1000} s; killing it`);
  try {
    process.kill(-(run.proc.pid ?? 0), 'SIGKILL');
  } catch { /* gone */ }
  await run.exited;
}

async function stop(code: number): Promise<void> {
  if (stopping) return;
  stopping = true;
  supervising = false;
  const t0 = Date.now();
  for (const s of services.values()) clearTimeout(s.timer);
  say('stopping: Envoy stops taking requests, the TS service seals and drains, then the backend and Redis stop');
  if (services.get('envoy')?.run !== undefined) {
    // Listeners closed: no new connection; requests in flight finish while the TS service drains.
    try {
      await fetch(`http://127.0.0.1:${envoyAdminPort}/drain_listeners?inboundonly`, { method: 'POST', signal: AbortSignal.timeout(1000) });
    } catch { /* Envoy is going anyway */ }
  }
  await halt(services.get('authz'), shutdownGraceMs + 5000);
  await halt(services.get('envoy'), 5000);
  await Promise.all([halt(services.get('backend'), 5000), halt(services.get('redis'), 10_000)]);
  removePidFile();
  say(`stopped in ${((Date.now() - t0) / 1000).toFixed(1)} s`);
  process.exit(code);
}

function removePidFile(): void {
  try {
    if ((JSON.parse(readFileSync(PID_FILE, 'utf8')) as { pid?: number }).pid === process.pid) rmSync(PID_FILE, { force: true });
  } catch { /* not ours, or gone */ }
}

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
  plan = checkSettings();
  // Token files given in the environment, checked as the TS service will (readable, long enough)
  // before anything is written; the generated ones are made after the run directory (below).
  if (env['AUTHZ_ADMIN_TOKEN_FILE'] !== ADMIN_TOKEN_DEFAULT) readTokenFile('AUTHZ_ADMIN_TOKEN_FILE', env['AUTHZ_ADMIN_TOKEN_FILE'] ?? '');
  if (!blank('RATELIMIT_SERVICE_TOKEN_FILE')) readTokenFile('RATELIMIT_SERVICE_TOKEN_FILE', env['RATELIMIT_SERVICE_TOKEN_FILE'] ?? '');
  secrets = devSecrets();
  if (secrets.fresh === undefined) refuseStaleKeys(secrets.values);
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
await refuseIfRunning(plan);
try {
  createRunDir(secrets);
  // A refused start writes nothing: the development tokens only now, in the run directory.
  devAdminToken();
  devRateLimitToken(plan.config);
  readTokenFile('AUTHZ_ADMIN_TOKEN_FILE', env['AUTHZ_ADMIN_TOKEN_FILE'] ?? '');
  checkSealFileWritable(SEAL_FILE);
} catch (err) {
  if (err instanceof ConfigError) refuse(err.message);
  throw err;
}
keepDevEnvCurrent();
shutdownGraceMs = plan.config.shutdownGraceMs;
envoyAdminPort = plan.config.envoyAdminPort;
for (const sig of ['SIGINT', 'SIGTERM', 'SIGHUP'] as const) process.on(sig, () => void stop(0));
onHangUp = () => void stop(0);
if (outputGone) onHangUp();
writeFileSync(PID_FILE, `${JSON.stringify({ pid: process.pid, edge: `http://127.0.0.1:${plan.config.edgePort}`, ports: Object.fromEntries(plan.ports) })}\n`);
process.on('exit', () => {
  // After stop() every child has exited; after an internal error, leave nothing behind either.
  for (const s of services.values()) {
    try {
      if (s.run?.proc.pid !== undefined) process.kill(-s.run.proc.pid, 'SIGKILL');
    } catch { /* gone */ }
  }
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

/**
 * The TS service reads its secrets from files (the `*_FILE` settings, as in the deployments):
 * a value in its environment would stay readable in /proc/<pid>/environ for the life of the
 * process, sealed or not. Each secret setting that has a value (from the environment or
 * dev.env) is written to secrets/<name> under the run directory (0600, rewritten on every start,
 * so a key changed in the environment takes effect) and replaced by its `_FILE` setting.
 */
const FILE_SECRETS = ['EDGE_INGEST_HMAC', 'EDGE_INGEST_HMAC_PREVIOUS', 'EDGE_FEED_ED25519_KEY'] as const;
mkdirSync(join(RUN, 'secrets'), { recursive: true, mode: 0o700 });
for (const k of FILE_SECRETS) {
  const value = env[k];
  if (value === undefined || value === '') continue;
  const file = join(RUN, 'secrets', k.toLowerCase());
  rmSync(file, { force: true });
  writeFileSync(file, `${value}\n`, { mode: 0o600 });
  delete env[k];
  env[`${k}_FILE`] = file;
}
/** Only the TS service needs these (as files, see FILE_SECRETS); Redis, the backend and Envoy start without them. */
const SECRET_ENV = new Set([
  'EDGE_INGEST_HMAC', 'EDGE_INGEST_HMAC_PREVIOUS', 'EDGE_FEED_ED25519_KEY',
  'EDGE_INGEST_HMAC_FILE', 'EDGE_INGEST_HMAC_PREVIOUS_FILE', 'EDGE_FEED_ED25519_KEY_FILE', 'REDIS_URL',
]);
const withoutSecrets = (): NodeJS.ProcessEnv => Object.fromEntries(Object.entries(env).filter(([k]) => !SECRET_ENV.has(k)));

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
  services.set('redis', redis);
  launch(redis);
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
  services.set('backend', backend);
  launch(backend);
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
  if (!p.ok && !stopping) {
    say(`${svc.label} did not come up: ${p.answer}`);
    await stop(1);
  }
}
/** A child exited while starting: stop() is under way and ends the process. */
const stopped = (): Promise<never> => new Promise<never>(() => undefined);
if (stopping) await stopped();
if (plan.redisPort === undefined && !blank('REDIS_URL')) {
  const url = env['REDIS_URL'] ?? '';
  const failed = await waitForRedis(url, REDIS_WAIT_MS);
  if (failed !== undefined && !stopping) {
    say(`Redis at ${redisShown(url)} (REDIS_URL) did not answer within ${REDIS_WAIT_MS / 1000} s (${failed}): start it, or fix or unset REDIS_URL`);
    await stop(1);
  }
  if (stopping) await stopped();
}

// TLS on the client port (DEV_EDGE_TLS=1; README "Development only"): a development server
// certificate for localhost under the run directory, unless EDGE_TLS_CERT_FILE/KEY_FILE are given.
let edgeCaFile: string | undefined;
const devEdgeTls = (env['DEV_EDGE_TLS'] ?? '').trim();
if (devEdgeTls !== '' && devEdgeTls !== '0' && devEdgeTls !== '1') refuse(new ConfigError('DEV_EDGE_TLS', '1 or 0', devEdgeTls).message);
if (devEdgeTls === '1' && blank('EDGE_TLS_CERT_FILE') && blank('EDGE_TLS_KEY_FILE')) {
  const cert = ensureEdgeServerCert(join(RUN, 'pki'));
  Object.assign(env, { EDGE_TLS_CERT_FILE: cert.certFile, EDGE_TLS_KEY_FILE: cert.keyFile });
  edgeCaFile = cert.caFile;
  say(`TLS on the client port: a development certificate for localhost in ${shown('pki/edge-server')} (its CA: ${shown('pki/edge-ca.crt')}${cert.issued ? ', issued now' : ', kept'})`);
}

const config = loadConfig(env);
/** Where the TS service's own GET /healthz is asked: MARKET_PORT, or MARKET_SOCKET when it listens on that only. */
const marketBase = `http://127.0.0.1:${config.marketPort}`;
const marketVia = config.marketTcp ? undefined : config.marketSocket;
const authzGrpcShown = config.authzGrpcSocket === undefined
  ? `127.0.0.1:${config.authzGrpcPort}   (.venv/bin/grpcurl -plaintext 127.0.0.1:${config.authzGrpcPort} list)`
  : `${config.authzGrpcSocket}${config.authzGrpcTcp ? ` and 127.0.0.1:${config.authzGrpcPort}` : ''}   (.venv/bin/grpcurl -plaintext -unix ${config.authzGrpcSocket} list)`;
const marketShown = config.marketSocket === undefined ? `127.0.0.1:${config.marketPort}`
  : `${config.marketSocket}${config.marketTcp ? ` and 127.0.0.1:${config.marketPort}` : ''}   (curl --unix-socket ${config.marketSocket} http://market/healthz)`;
for (const note of UDS_NOTES) say(note);
const authz: Service = {
  name: 'authz', label: 'the TS service', cmd: join(ROOT, 'scripts', 'node'), args: [join(ROOT, 'authz/src/main.ts')],
  // Its own health (authz not sealed, GeoIP and the store ready), asked directly: no geo on the way.
  env: withServiceRuntime(Object.fromEntries(Object.entries(env).filter(([k]) => !plan.unknown.includes(k)))), ready: orSealed(httpOk(`${marketBase}/healthz`, marketVia), `${marketBase}/`, marketVia), delayMs: 500, restarts: 0,
};
services.set('authz', authz);
launch(authz);
const authzReady = await waitFor(authz.ready, 30_000);
if (!authzReady.ok && !stopping) {
  say(`the TS service did not become ready within 30 s: ${authzReady.answer}`);
  await stop(1);
}
if (stopping) await stopped();
const sdsPath = join(RUN, 'sds.yaml');
const rendered = renderEnvoy(config, { sdsPath });
for (const w of rendered.warnings) say(`envoy config warning: ${w}`);
writeFileSync(join(RUN, 'envoy.yaml'), rendered.bootstrap);
if (rendered.sds !== undefined) writeFileSync(sdsPath, rendered.sds);
if (rendered.serverSds !== undefined) writeFileSync(serverSdsPath({ sdsPath }), rendered.serverSds);
const edge = config.edgeTls === undefined ? `http://127.0.0.1:${config.edgePort}` : `https://localhost:${config.edgePort}`;
/** With TLS: the `curl --cacert <CA>` a client of the edge needs (the development CA, or "your CA"). */
const cacert = config.edgeTls === undefined ? '' : `--cacert ${edgeCaFile === undefined ? '<the CA of EDGE_TLS_CERT_FILE>' : shown('pki/edge-ca.crt')} `;
/** Where ingests go: the ingest listener (INGEST_PORT, reached on loopback when it binds every address), else Envoy's client port. */
const ingestHost = ['0.0.0.0', '::'].includes(config.ingestBindAddress) ? '127.0.0.1' : config.ingestBindAddress;
const ingestUrl = config.ingestPort === undefined ? edge : `http://${ingestHost.includes(':') ? `[${ingestHost}]` : ingestHost}:${config.ingestPort}`;
const envoy: Service = {
  name: 'envoy', label: 'Envoy', cmd: envoyBinary(env), args: ['-c', join(RUN, 'envoy.yaml'), '--disable-hot-restart', '-l', 'warning'],
  // Envoy's own readiness (listeners and clusters initialized), on its admin port: not a route
  // through geo, which may answer this machine 451 by design (GEO_TRUSTED_CIDRS without loopback).
  env: withoutSecrets(), ready: httpOk(`http://127.0.0.1:${config.envoyAdminPort}/ready`), delayMs: 500, restarts: 0,
};
services.set('envoy', envoy);
launch(envoy);
const envoyReady = await waitFor(envoy.ready, 30_000);
if (!envoyReady.ok && !stopping) {
  say(`Envoy did not become ready within 30 s: ${envoyReady.answer}`);
  await stop(1);
}
/** What the edge answers this machine's GET /healthz (the whole path: Envoy, rate limit, geo, the TS service). */
async function throughTheEdge(): Promise<string> {
  if (config.proxyProtocol === 'required') return 'not asked (EDGE_PROXY_PROTOCOL=required closes a connection without a PROXY header)';
  if (config.edgeTls !== undefined) {
    if (edgeCaFile === undefined) return `not asked (TLS with your certificate: curl ${cacert}${edge}/healthz)`;
    const ca = readFileSync(edgeCaFile);
    return new Promise((resolve) => {
      const req = httpsGet(`${edge}/healthz`, { ca, timeout: 2000 }, (res) => {
        res.resume();
        resolve(`${res.statusCode ?? 0} over ${(res.socket as import('node:tls').TLSSocket).getProtocol() ?? 'TLS'}`);
      });
      req.on('timeout', () => req.destroy(new Error('no answer within 2 s')));
      req.on('error', (err) => resolve(failure(err)));
    });
  }
  try {
    const res = await fetch(`${edge}/healthz`, { signal: AbortSignal.timeout(2000) });
    const text = await res.text();
    if (res.status === 200) return '200';
    let code = '';
    try {
      code = (JSON.parse(text) as { error?: string }).error ?? '';
    } catch { /* not JSON */ }
    const why = res.status === 451 ? ' (geo judges 127.0.0.1 like any client: it is not in GEO_TRUSTED_CIDRS)' : '';
    return `${res.status}${code === '' ? '' : ` ${code}`}${why}`;
  } catch (err) {
    return failure(err);
  }
}
/** How the banner names a file given by path (inside the run directory or not). */
const shownPath = (file: string): string => shown(relative(RUN, file));
if (!stopping && sealed()) {
  supervising = true;
  const record = readSealFile(SEAL_FILE)?.record;
  say(`SEALED  ${edge}/healthz → 503 sealed${record === undefined ? '' : ` (sealed ${record.sealedAt} by ${record.reason === 'admin' ? 'POST /admin/seal' : record.reason})`}
  ${shownPath(SEAL_FILE)} is present: the TS service started without loading any key, and every request is answered 503 sealed.
  ${unsealHint(SEAL_FILE)}
  Ctrl-C stops everything.`);
} else if (!stopping) {
  supervising = true;
  say(`READY  the TS service GET ${marketVia === undefined ? `127.0.0.1:${config.marketPort}/healthz` : `/healthz over ${marketVia}`} → 200, Envoy admin GET /ready → 200
  this machine  GET ${edge}/healthz → ${await throughTheEdge()}
  clients       ${edge}   ${config.edgeTls === undefined ? '' : `(TLS: curl ${cacert}${edge}/healthz) `}(Envoy; per-IP rate limit ${config.rpsPerIp}/s burst ${config.rateBurst}, ${config.rateLimitScope === 'global' ? 'global: across replicas, in Redis' : 'local: per Envoy'})
  ingest        ${config.ingestPort === undefined ? `${edge}/internal/ingest/market   (the client port: INGEST_PORT unset)` : `${ingestUrl}/internal/ingest/market   (its own listener, INGEST_PORT on ${config.ingestBindAddress}; the client port answers that path 404)`}
  authz gRPC    ${authzGrpcShown}
  market        ${marketShown}
  metrics       http://127.0.0.1:${config.authzAdminPort}/metrics
  seal          curl -X POST -H "authorization: Bearer $(cat ${shownPath(env['AUTHZ_ADMIN_TOKEN_FILE'] ?? '')})" http://127.0.0.1:${config.authzAdminPort}/admin/seal
                (kept in ${shownPath(SEAL_FILE)}: restarts stay sealed until it is removed; docs/operations.md "Seal and unseal")
  envoy admin   http://127.0.0.1:${config.envoyAdminPort}${config.envoyStatsPort === undefined ? '' : `\n  envoy stats   http://127.0.0.1:${config.envoyStatsPort}/stats/prometheus   (ENVOY_STATS_PORT, all interfaces: that path only)`}
  geoip         ${env['GEOIP_DB'] === join(RUN, 'geoip', 'country.mmdb') ? `${shown('geoip/country.mmdb')} (replace it by rename: docs/operations.md)` : config.geoipDb}
  try it:
    set -a; . ${shown('dev.env')}; set +a
    ${config.ingestPort !== undefined ? `scripts/node scripts/edge-client.ts demo-ingest 0xdemo --url ${ingestUrl}` : config.edgeTls === undefined ? `EDGE_PORT=${config.edgePort} scripts/node scripts/edge-client.ts demo-ingest 0xdemo` : `NODE_EXTRA_CA_CERTS=${edgeCaFile === undefined ? '<the CA of EDGE_TLS_CERT_FILE>' : shown('pki/edge-ca.crt')} scripts/node scripts/edge-client.ts demo-ingest 0xdemo --url ${edge}`}
    curl -s ${cacert}${edge}/v1/markets | head -c 300; echo
    head -c 64 /dev/urandom > ${shown('order.bin')}
    ${config.edgeTls === undefined ? `EDGE_PORT=${config.edgePort} scripts/node scripts/edge-client.ts order 0xdemo 10 ${shown('order.bin')}` : `NODE_EXTRA_CA_CERTS=${edgeCaFile === undefined ? '<the CA of EDGE_TLS_CERT_FILE>' : shown('pki/edge-ca.crt')} scripts/node scripts/edge-client.ts order 0xdemo 10 ${shown('order.bin')} --url ${edge}`}
  A TS service, Redis or demo backend that exits is restarted; Ctrl-C seals and stops everything.`);
}
