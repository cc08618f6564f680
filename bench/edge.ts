/**
 * `npm run bench:edge`: the data plane, side by side in one run, against the same upstreams:
 *   (1) bare Envoy: renderEnvoy's production bootstrap with every HTTP filter but the router
 *       and every per-route filter config removed (`bare()` below): same listener, routes,
 *       clusters, upstream mTLS and access log, no rate limit, no ext_authz, no order-body filter;
 *   (2) the production bootstrap (rate limit, client-address header, ext_authz, the order-body
 *       Lua filter on orders) with the `authz` cluster pointed at a trivial allow-all ext_authz
 *       that hands an order's payload over as metadata (bench/edge-floor-server.ts): the floor;
 *   (3) the full edge: the production bootstrap against the real TS service (authz/src/main.ts
 *       on Redis), `allowedHeaders: 'minimal'` (the default);
 *   (3*) as (3) with `allowedHeaders: 'all'` (every request header sent to authz).
 * Shared upstreams: the market service of the TS process (MARKET_PORT of authz/src/main.ts,
 * which is also (3)'s authz) and the demo mTLS order backend (bench/edge-backend.ts, its own
 * process). Load: h2load --h1 from 127.0.0.1, which GEO_TRUSTED_CIDRS (default 127.0.0.0/8)
 * trusts, so geo allows it without a GeoIP hit; RPS_PER_IP = RATE_BURST = 10^6 so the limiter
 * runs on every request but never throttles the single client address. Every Node server on the
 * path records its GC pauses (bench/lib/gc-pauses-preload.ts), and the report matches each
 * fixed-rate request over the p99 target's limit against them.
 *
 * Env: BENCH_ROUNDS (4), BENCH_SECONDS (3), BENCH_NO_DOCS=1 to leave docs/benchmarks.md alone;
 * for investigation only (a subset implies BENCH_NO_DOCS): BENCH_ONLY_EPS (markets,orders) and
 * BENCH_ONLY_MODES (sat,fixed,poll) run a subset; BENCH_KEEP=1 keeps the work directory (Envoy
 * configs, process logs, every h2load per-request log, each Envoy's rq_time histograms); BENCH_AUTHZ_NODE_OPTIONS is the
 * NODE_OPTIONS of the TS process only; BENCH_AUTHZ_B_NODE_ARGS (e.g. `--max-semi-space-size=1`)
 * adds a stack (3b): the full edge against a second TS process started with those Node flags,
 * interleaved with the others, for a side-by-side A/B (BENCH_AUTHZ_B_NODE_ARGS='' with
 * BENCH_AUTHZ_B_NODE_BIN=/path/to/node runs that stack on another Node binary instead);
 * BENCH_LEG_LOG=1 writes each Envoy's access log to access-<stack>.log in the work directory (kept)
 * with per-leg timings in µs (LEG_LOG_FORMAT) instead of to /dev/null, and logs each leg's p50/p99.
 */

/**
 * Access log for BENCH_LEG_LOG: the production fields (edge_us and upstream_us among them) plus the
 * legs before and after them, in µs from Envoy's clocks.
 */
const LEG_LOG_FORMAT = {
  ...ACCESS_LOG_FORMAT,
  // First byte received → last byte received (the request head and body from the client).
  rx_us: '%COMMON_DURATION(DS_RX_BEG:DS_RX_END:us)%',
  // Last byte of the upstream answer → last byte to the client.
  tx_us: '%COMMON_DURATION(US_RX_END:DS_TX_END:us)%',
  total_us: '%COMMON_DURATION(DS_RX_BEG:DS_TX_END:us)%',
} as const;
const LEG_FIELDS = ['rx_us', 'edge_us', 'upstream_us', 'tx_us', 'total_us'] as const;

/**
 * Per route of one access log written with LEG_LOG_FORMAT: p50/p99 of each leg, for the log. Stack (1)
 * has no filter that buffers the order body, so its orders go upstream before they have arrived whole
 * and their edge_us means nothing.
 */
function legSummary(file: string): string[] {
  const byRoute = new Map<string, Record<string, unknown>[]>();
  for (const line of readFileSync(file, 'utf8').split('\n')) {
    if (!line.startsWith('{')) continue;
    const row = JSON.parse(line) as Record<string, unknown>;
    const route = String(row['route']);
    byRoute.set(route, [...(byRoute.get(route) ?? []), row]);
  }
  return [...byRoute].map(([route, rows]) => `${route} (${rows.length} requests): ${LEG_FIELDS.map((f) => {
    const v = sortedCopy(rows.flatMap((r) => (typeof r[f] === 'number' ? [r[f]] : [])));
    return `${f} p50 ${fmt(percentile(v, 50))} p99 ${fmt(percentile(v, 99))}`;
  }).join(', ')}`);
}

/** Replaces the json_format of every access log in a parsed bootstrap (BENCH_LEG_LOG). */
function withLegLog(node: unknown): unknown {
  if (Array.isArray(node)) return node.map(withLegLog);
  if (node === null || typeof node !== 'object') return node;
  const out: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(node)) out[k] = k === 'log_format' ? { json_format: LEG_LOG_FORMAT } : withLegLog(v);
  return out;
}
import { execFileSync } from 'node:child_process';
import { createHash, createHmac, generateKeyPairSync, randomBytes, sign } from 'node:crypto';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { fileURLToPath } from 'node:url';
import YAML from 'yaml';
import { loadConfig } from '../authz/src/config.ts';
import { freePort, PrivateRedis } from '../authz/test/redis-server.ts';
import { envoyBinary } from '../envoy/envoy-bin.ts';
import { ACCESS_LOG_FORMAT, renderEnvoy } from '../envoy/render.ts';
import { generateDevPki } from '../scripts/dev/certs.ts';
import { forkNode, spawnProgram, type Child } from './lib/child.ts';
import { duringPause, GC_PAUSES_IMPORT, readGcPauses } from './lib/gc-pauses.ts';
import { ensureH2load, runH2load } from './lib/h2load.ts';
import { envInt, machineLine, redisPid } from './lib/market-env.ts';
import { writeSection } from './lib/markdown-section.ts';
import { cpuidleDriver, holdCpuIdleLatency, startCpuWindow } from './lib/proc.ts';
import { fmt, markdownTable, median, percentile, sortedCopy } from './lib/stats.ts';

// Even: the stack order is reversed every other round, so each order counts equally.
const ROUNDS = envInt('BENCH_ROUNDS', 4, 1);
const SECONDS = envInt('BENCH_SECONDS', 3, 1);
// Workers per Envoy. 1 by default: the machine has 2 vCPUs for everything (load generator included).
const ENVOY_CONCURRENCY = String(envInt('BENCH_ENVOY_CONCURRENCY', 1, 1));
const SAT_CONNECTIONS = 16;
const FIXED = { connections: 10, rpsPerClient: 100 } as const;
/** Seconds of unmeasured fixed-rate load before each measured fixed-rate run (see run()). */
const FIXED_PRELOAD_S = 0.5;
const ROOT = fileURLToPath(new URL('../', import.meta.url));
const dir = mkdtempSync(join(tmpdir(), 'bench-edge-'));
const LEG_LOG = process.env['BENCH_LEG_LOG'] === '1';
if (process.env['BENCH_KEEP'] === '1' || LEG_LOG) process.stderr.write(`[bench:edge] work directory (kept): ${dir}\n`);
if (process.env['BENCH_KEEP'] !== '1' && !LEG_LOG) process.once('exit', () => rmSync(dir, { recursive: true, force: true }));
const t0 = performance.now();
const log = (m: string): void => void process.stderr.write(`[bench:edge ${((performance.now() - t0) / 1000).toFixed(1).padStart(5)}s] ${m}\n`);
const h2load = ensureH2load(log);
if (h2load === undefined) throw new Error('h2load (Debian nghttp2-client) is required');
const children: Child[] = [];
/** The version of BENCH_AUTHZ_B_NODE_BIN, for the (3b) label. */
const bNodeVersion = (): string => execFileSync(process.env['BENCH_AUTHZ_B_NODE_BIN'] ?? 'node', ['--version'], { encoding: 'utf8' }).trim();
let redis: PrivateRedis | undefined;

/**
 * What a browser-like client sends besides the request line: 7 headers, ~560 bytes (a session
 * cookie, user agent, accept-*). The same on every stack; it is what `allowedHeaders: 'all'`
 * forwards to authz and `'minimal'` keeps out.
 */
const CLIENT_HEADERS: Readonly<Record<string, string>> = {
  'user-agent': 'Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 Safari/537.36',
  accept: 'application/json, text/plain, */*',
  'accept-language': 'en-US,en;q=0.9,de;q=0.8',
  'accept-encoding': 'gzip, deflate, br, zstd',
  cookie: `session=${randomBytes(32).toString('hex')}; theme=dark; _ga=GA1.1.${randomBytes(6).readUIntBE(0, 6)}.1763700000; consent=${randomBytes(48).toString('base64url')}`,
  referer: 'https://app.example.com/markets/trending?tab=all&sort=volume',
  origin: 'https://app.example.com',
};

async function waitHttp(url: string): Promise<void> {
  for (let i = 0; i < 300; i++) {
    try {
      if ((await fetch(url)).status < 500) return;
    } catch { /* not yet */ }
    await sleep(50);
  }
  throw new Error(`not up: ${url}`);
}

/** Removes every HTTP filter but the router, and every per-route filter config: stack (1). */
function bare(node: unknown): unknown {
  if (Array.isArray(node)) return node.map(bare);
  if (node === null || typeof node !== 'object') return node;
  const out: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(node)) {
    if (k === 'typed_per_filter_config') continue;
    if (k === 'http_filters' && Array.isArray(v)) {
      out[k] = v.filter((f: { name?: string }) => f.name === 'envoy.filters.http.router');
      continue;
    }
    out[k] = bare(v);
  }
  return out;
}

type Ep = 'markets' | 'orders';
const only = (name: string): string[] | undefined => process.env[name]?.split(',').map((x) => x.trim()).filter(Boolean);
const EPS: readonly Ep[] = (['markets', 'orders'] as const).filter((e) => only('BENCH_ONLY_EPS')?.includes(e) ?? true);
/**
 * sat: saturation; fixed: 1,000 req/s; poll: 1,000 req/s again, with idle CPUs polling instead of halting
 * for that run (holdCpuIdleLatency(0): PM QoS, as tuned's latency-performance profile sets it).
 */
type Mode = 'sat' | 'fixed' | 'poll';
const REQUESTED_MODES = (['sat', 'fixed', 'poll'] as const).filter((m) => only('BENCH_ONLY_MODES')?.includes(m) ?? true);
const SUBSET = EPS.length < 2 || REQUESTED_MODES.length < 3;
/** Why the poll mode cannot run here (the PM QoS device needs root), or undefined. */
const POLL_UNAVAILABLE = ((): string | undefined => {
  if (!REQUESTED_MODES.includes('poll')) return undefined;
  const probe = holdCpuIdleLatency(0);
  if (probe instanceof Error) return probe.message;
  probe();
  return undefined;
})();
const MODES = REQUESTED_MODES.filter((m) => m !== 'poll' || POLL_UNAVAILABLE === undefined);
const MARKETS_PATH = '/v1/markets';
/** Size of the read's response body, from the preflight. */
let readBytes = 0;
const epName = (ep: Ep): string => (ep === 'markets' ? `\`GET ${MARKETS_PATH}\` (one market, ${readBytes} bytes)` : '`POST /v1/orders` (256-byte payload, mTLS backend)');

interface Stack {
  readonly name: '1' | '2' | '3' | '3*' | '3b';
  readonly label: string;
  readonly port: number;
  readonly envoy: Child;
  readonly adminPort: number;
  /** The ext_authz process, or undefined for (1). */
  readonly authzPid: number | undefined;
  /** GC pause logs of the Node processes a read / an order of this stack passes through. */
  readonly gcFiles: Readonly<Record<Ep, readonly string[]>>;
}
interface Sample {
  round: number; rps: number; ok: number; done: number; p50: number; p99: number;
  envoyUs: number; authzUs: number; marketUs: number; backendUs: number; redisUs: number; totalUs: number; busy: number;
  /** Fixed rate only: each request's start (µs since the epoch) and latency (µs), for the tail analysis. */
  startsUs?: Float64Array; latenciesUs?: Float64Array;
  /** µs per request that Envoy's threads / the authz process's threads waited for a CPU (run queue). */
  envoyWaitUs: number; authzWaitUs: number;
}
/** Every GC pause of each Node server is logged (bench/lib/gc-pauses-preload.ts) to one of these. */
const GC_FILES = {
  authz: join(dir, 'gc-authz.tsv'), floor: join(dir, 'gc-floor.tsv'), authzB: join(dir, 'gc-authz-b.tsv'), backend: join(dir, 'gc-backend.tsv'),
} as const;
/** A request that began this soon after a GC pause ended counts as queued behind it. */
const GC_DRAIN_US = 2000;

try {
  const pki = generateDevPki(join(dir, 'pki'));
  redis = await PrivateRedis.start();
  const redisProc = redisPid(redis.port);
  const backend = await forkNode(fileURLToPath(new URL('./edge-backend.ts', import.meta.url)), {
    env: { ...process.env, PORT: String(await freePort()), CERT: pki.backendCertFile, KEY: pki.backendKeyFile, CLIENT_CA: pki.clientCaFile, BENCH_GC_PAUSES_FILE: GC_FILES.backend },
    logFile: join(dir, 'backend.log'), execArgv: [GC_PAUSES_IMPORT],
  });
  children.push(backend);
  const floor = await forkNode(fileURLToPath(new URL('./edge-floor-server.ts', import.meta.url)), {
    logFile: join(dir, 'floor.log'), execArgv: [GC_PAUSES_IMPORT], env: { ...process.env, BENCH_GC_PAUSES_FILE: GC_FILES.floor },
  });
  children.push(floor);

  const hmacKey = randomBytes(32);
  const feed = generateKeyPairSync('ed25519');
  const feedPub = Buffer.from(feed.publicKey.export({ format: 'jwk' }).x ?? '', 'base64url').toString('hex');
  const [grpcPort, marketPort, adminPort] = [await freePort(), await freePort(), await freePort()];
  const base: Record<string, string> = {
    AUTHZ_GRPC_PORT: String(grpcPort), MARKET_PORT: String(marketPort), AUTHZ_ADMIN_PORT: String(adminPort),
    REDIS_URL: redis.url, RPS_PER_IP: '1000000', RATE_BURST: '1000000', LOG_LEVEL: 'warn',
    ORDER_BACKEND_URL: `https://localhost:${backend.port}`, ORDER_BACKEND_CA_FILE: pki.backendCaFile,
    EDGE_CLIENT_CERT_FILE: pki.clientCertFile, EDGE_CLIENT_KEY_FILE: pki.clientKeyFile,
  };
  const authz = spawnProgram(join(ROOT, 'scripts/node'), [join(ROOT, 'authz/src/main.ts')], {
    env: {
      ...process.env, ...base, EDGE_INGEST_HMAC: `hex:${hmacKey.toString('hex')}`, EDGE_FEED_ED25519_PUBLIC_KEY: feedPub,
      NODE_OPTIONS: `${process.env['BENCH_AUTHZ_NODE_OPTIONS'] ?? process.env['NODE_OPTIONS'] ?? ''} ${GC_PAUSES_IMPORT}`.trim(),
      BENCH_GC_PAUSES_FILE: GC_FILES.authz,
    },
    logFile: join(dir, 'authz.log'),
  });
  children.push(authz);
  await waitHttp(`http://127.0.0.1:${marketPort}/`);
  // Investigation only: a second TS process with other Node flags, as its own stack (3b).
  const bArgs = process.env['BENCH_AUTHZ_B_NODE_ARGS']?.split(' ').filter(Boolean);
  const portsB = { grpc: await freePort(), market: await freePort(), admin: await freePort() };
  const authzB = bArgs === undefined ? undefined : spawnProgram(process.env['BENCH_AUTHZ_B_NODE_BIN'] ?? join(ROOT, 'scripts/node'), [...bArgs, GC_PAUSES_IMPORT, join(ROOT, 'authz/src/main.ts')], {
    env: {
      ...process.env, ...base, EDGE_INGEST_HMAC: `hex:${hmacKey.toString('hex')}`, EDGE_FEED_ED25519_PUBLIC_KEY: feedPub,
      AUTHZ_GRPC_PORT: String(portsB.grpc), MARKET_PORT: String(portsB.market), AUTHZ_ADMIN_PORT: String(portsB.admin),
      BENCH_GC_PAUSES_FILE: GC_FILES.authzB,
    },
    logFile: join(dir, 'authz-b.log'),
  });
  if (authzB !== undefined) {
    children.push(authzB);
    await waitHttp(`http://127.0.0.1:${portsB.market}/`);
  }

  // The four Envoys (--concurrency 1 each: one worker, as the machine has 2 vCPUs for everything).
  const stacks: Stack[] = [];
  const sdsPath = join(dir, 'sds.yaml');
  const variants: (readonly [Stack['name'], string, number, 'bare' | 'minimal' | 'all', number])[] = [
    ['1', '(1) bare Envoy', grpcPort, 'bare', marketPort],
    ['2', '(2) filters + allow-all authz (floor)', floor.port, 'minimal', marketPort],
    ['3', '(3) full edge', grpcPort, 'minimal', marketPort],
    ['3*', '(3*) full edge, `allowedHeaders: all`', grpcPort, 'all', marketPort],
  ];
  const bLabel = [process.env['BENCH_AUTHZ_B_NODE_BIN'] === undefined ? '' : `Node ${bNodeVersion()}`, bArgs?.join(' ') ?? ''].filter(Boolean).join(', ');
  if (authzB !== undefined) variants.push(['3b', `(3b) full edge, TS process with \`${bLabel}\``, portsB.grpc, 'minimal', portsB.market]);
  for (const [name, label, authzPortFor, variant, marketPortFor] of variants) {
    const [edgePort, envoyAdmin] = [await freePort(), await freePort()];
    const config = loadConfig({ ...base, EDGE_PORT: String(edgePort), ENVOY_ADMIN_PORT: String(envoyAdmin), AUTHZ_GRPC_PORT: String(authzPortFor), MARKET_PORT: String(marketPortFor) });
    // The access log is formatted and written as in production, to /dev/null instead of stdout.
    const rendered = renderEnvoy(config, { sdsPath, allowedHeaders: variant === 'all' ? 'all' : 'minimal', accessLogPath: LEG_LOG ? join(dir, `access-${name}.log`) : '/dev/null' });
    let parsed: unknown = YAML.parse(rendered.bootstrap);
    if (variant === 'bare') parsed = bare(parsed);
    if (LEG_LOG) parsed = withLegLog(parsed);
    const bootstrap = YAML.stringify(parsed);
    const file = join(dir, `envoy-${edgePort}.yaml`);
    writeFileSync(file, bootstrap);
    if (rendered.sds !== undefined) writeFileSync(sdsPath, rendered.sds);
    const envoy = spawnProgram(envoyBinary(), ['-c', file, '--disable-hot-restart', '--concurrency', ENVOY_CONCURRENCY, '-l', 'error'], { logFile: join(dir, `envoy-${name}.log`) });
    children.push(envoy);
    const authzGc = variant === 'bare' ? [] : [name === '2' ? GC_FILES.floor : name === '3b' ? GC_FILES.authzB : GC_FILES.authz];
    const marketGc = name === '3b' ? GC_FILES.authzB : GC_FILES.authz;
    stacks.push({
      name, label, port: edgePort, envoy, adminPort: envoyAdmin,
      authzPid: variant === 'bare' ? undefined : name === '2' ? floor.pid : name === '3b' ? authzB?.pid : authz.pid,
      // A read passes the authz process (none for (1)) and the market service (the TS process, B's own
      // for (3b)); an order passes the authz process and the order backend.
      gcFiles: {
        markets: [...new Set([...authzGc, marketGc])],
        orders: [...authzGc, GC_FILES.backend],
      },
    });
  }
  for (const s of stacks) await waitHttp(`http://127.0.0.1:${s.port}/healthz`);

  // One market, ingested (HMAC + Ed25519 signed) through the full edge.
  const market = '0xbench';
  const doc = Buffer.from(JSON.stringify({ conditionId: market, seq: 1, question: 'bench?', active: true, closed: false, minSize: '1', maxSize: '1000', outcomes: [{ tokenId: '1', name: 'Yes', bid: '0.5', ask: '0.6', last: '0.55' }], updatedAt: 1 }));
  const body = Buffer.from(JSON.stringify({ conditionId: market, d: doc.toString('base64'), s: sign(null, createHash('sha256').update(doc).digest(), feed.privateKey).toString('hex'), k: 'ed25519-sha256' }));
  const ts = String(Math.floor(Date.now() / 1000));
  const nonce = randomBytes(16).toString('hex');
  const mac = createHmac('sha256', hmacKey).update(`${ts}.${nonce}.`).update(body).digest('hex');
  const ing = await fetch(`http://127.0.0.1:${stacks[2]?.port}/internal/ingest/market`, { method: 'POST', body: new Uint8Array(body), headers: { 'x-edge-timestamp': ts, 'x-edge-nonce': nonce, 'x-edge-signature': `v1=${mac}` } });
  if (ing.status !== 200) throw new Error(`ingest failed: ${ing.status} ${await ing.text()}`);
  const payload = randomBytes(256);
  const orderJson = JSON.stringify({ marketId: market, deadline: Math.floor(Date.now() / 1000) + 3600, size: '10', payload: payload.toString('base64') });
  const orderFile = join(dir, 'order.json');
  writeFileSync(orderFile, orderJson);

  // Preflight through every stack: the read returns the market; the backend receives the decoded
  // 256 payload bytes when the order-body filter runs, (1) forwards the JSON untouched.
  const payloadSha = createHash('sha256').update(payload).digest('hex');
  for (const s of stacks) {
    const r = await fetch(`http://127.0.0.1:${s.port}${MARKETS_PATH}`, { headers: CLIENT_HEADERS });
    const text = await r.text();
    if (r.status !== 200 || !text.includes(market)) throw new Error(`preflight ${s.label} read: ${r.status} ${text.slice(0, 200)}`);
    readBytes = Buffer.byteLength(text);
    const o = await fetch(`http://127.0.0.1:${s.port}/v1/orders`, { method: 'POST', body: orderJson, headers: { ...CLIENT_HEADERS, 'content-type': 'application/json' } });
    const got = (await o.json()) as { bytes?: number; sha256?: string };
    const want = s.name === '1' ? { bytes: Buffer.byteLength(orderJson), sha256: createHash('sha256').update(orderJson).digest('hex') } : { bytes: 256, sha256: payloadSha };
    if (o.status !== 200 || got.bytes !== want.bytes || got.sha256 !== want.sha256) throw new Error(`preflight ${s.label} order: ${o.status} ${JSON.stringify(got)}`);
  }
  log('preflight ok: every stack reads the market and delivers the order as expected');

  const sat = new Map<string, Sample[]>();
  const fixed = new Map<string, Sample[]>();
  const polled = new Map<string, Sample[]>();
  const k = (s: Stack | string, ep: Ep): string => `${typeof s === 'string' ? s : s.name}|${ep}`;

  /** Whether the stack's authz process is a TS service that also serves its market upstream. */
  const servesMarket = (s: Stack): boolean => s.authzPid !== undefined && s.authzPid !== floor.pid;

  async function run(s: Stack, ep: Ep, mode: Mode, round: number): Promise<void> {
    const paced = mode !== 'sat';
    const pids = [s.envoy.pid, authz.pid, backend.pid, floor.pid, redisProc, ...(authzB === undefined ? [] : [authzB.pid])];
    const load = (seconds: number, logFile: string): ReturnType<typeof runH2load> => runH2load(h2load as string, {
      url: `http://127.0.0.1:${s.port}${ep === 'markets' ? MARKETS_PATH : '/v1/orders'}`,
      h1: true,
      ...(ep === 'orders' ? { dataFile: orderFile } : {}),
      headers: ep === 'orders' ? { ...CLIENT_HEADERS, 'content-type': 'application/json' } : CLIENT_HEADERS,
      connections: mode === 'sat' ? SAT_CONNECTIONS : FIXED.connections, streamsPerConnection: 1, durationSeconds: Math.max(1, seconds),
      logFile,
      // Fixed rate: each connection paced at rpsPerClient, the connections opened 1 ms apart so their
      // timers interleave (a request every 1 ms, not bursts of `connections` every 10 ms).
      ...(paced ? {
        rpsPerClient: FIXED.rpsPerClient, requests: Math.round(FIXED.connections * FIXED.rpsPerClient * seconds),
        connectionRate: { perPeriod: 1, period: `${1000 / (FIXED.connections * FIXED.rpsPerClient)}ms` },
      } : {}),
    });
    // Fixed rate measures the steady state: the stack sat idle while the others ran, long enough for
    // Envoy to close its market and backend connections (upstream idle_timeout 4 s), so the same
    // load runs FIXED_PRELOAD_S first, unmeasured, and the measured run starts on open connections.
    const release = mode === 'poll' ? holdCpuIdleLatency(0) : undefined;
    if (release instanceof Error) throw release;
    if (paced) await load(FIXED_PRELOAD_S, join(dir, `h2load-preload-${mode}-${s.name}-${ep}-${round}.log`));
    const close = startCpuWindow(pids);
    const r = await load(SECONDS, join(dir, `h2load-${mode}-${s.name}-${ep}-${round}.log`));
    const cpu = close();
    release?.();
    const per = (pid: number): number => ((cpu.cpuSeconds.get(pid) ?? 0) * 1e6) / Math.max(1, r.done);
    const waitPer = (pid: number | undefined): number => (pid === undefined ? Number.NaN : ((cpu.waitSeconds.get(pid) ?? Number.NaN) * 1e6) / Math.max(1, r.done));
    const lat = sortedCopy(r.latenciesUs);
    const sample: Sample = {
      round, rps: r.reqPerSec, ok: r.succeeded, done: r.done, p50: percentile(lat, 50), p99: percentile(lat, 99),
      envoyUs: per(s.envoy.pid),
      authzUs: s.authzPid === undefined ? 0 : per(s.authzPid),
      // (3), (3*), (3b): one TS process does ext_authz *and* serves the market upstream: one figure.
      marketUs: servesMarket(s) ? 0 : per(authz.pid),
      backendUs: per(backend.pid),
      redisUs: per(redisProc),
      totalUs: pids.reduce((a, p) => a + per(p), 0),
      busy: cpu.machineBusy,
      envoyWaitUs: waitPer(s.envoy.pid),
      // (1)'s reads wait on the TS process as their market upstream; its orders pass no authz process.
      authzWaitUs: waitPer(s.authzPid ?? (ep === 'markets' ? authz.pid : undefined)),
      ...(mode === 'fixed' ? { startsUs: r.startsUs, latenciesUs: r.latenciesUs } : {}),
    };
    const m = mode === 'sat' ? sat : mode === 'fixed' ? fixed : polled;
    m.set(k(s, ep), [...(m.get(k(s, ep)) ?? []), sample]);
    log(`${round < 0 ? 'warm-up' : `round ${round + 1}`} ${mode} ${s.label} ${ep}: ${fmt(r.reqPerSec)} req/s, ${r.succeeded}/${r.done} 2xx, `
      + `p50 ${fmt(sample.p50 / 1000, 2)} p99 ${fmt(sample.p99 / 1000, 2)} ms, total ${fmt(sample.totalUs)} µs/req`);
  }

  // Warm-up, in the first mode measured (a fixed-rate-only run keeps saturation out of Envoy's histograms).
  for (const s of stacks) for (const ep of EPS) await run(s, ep, MODES[0] ?? 'sat', -1);
  sat.clear();
  fixed.clear();
  polled.clear();
  for (let round = 0; round < ROUNDS; round++) {
    const order = round % 2 === 0 ? stacks : [...stacks].reverse();
    for (const ep of EPS) for (const mode of MODES) for (const s of order) await run(s, ep, mode, round);
  }

  // Anything but a 2xx, by Envoy's own counters (non-zero error counters only), for the log.
  const errorStats = /(downstream_rq_[45]xx|upstream_rq_[45]\d\d|upstream_cx_destroy_remote_with_active_rq|upstream_rq_pending_overflow|ext_authz\.(error|denied|failure_mode_allowed)|lua\.errors|rate_limited)/;
  const errors: string[] = [];
  for (const s of stacks) {
    const text = await (await fetch(`http://127.0.0.1:${s.adminPort}/stats`)).text();
    const bad = text.split('\n').filter((l) => errorStats.test(l) && !/: 0$/.test(l));
    log(`${s.label} Envoy error counters: ${bad.length === 0 ? 'none' : bad.join(', ')}`);
    // Investigation (BENCH_KEEP=1): Envoy's own timing histograms (upstream request time per cluster,
    // downstream request time), to tell where a slow request spent its time.
    if (process.env['BENCH_KEEP'] === '1') writeFileSync(join(dir, `envoy-${s.name}-timing.txt`), text.split('\n').filter((l) => /rq_time/.test(l)).join('\n'));
    if (bad.length > 0) errors.push(`${s.label}: ${bad.map((b) => `\`${b}\``).join(', ')}`);
  }
  if (LEG_LOG) {
    // Envoy writes its access log in batches; reopening the logs flushes them.
    for (const s of stacks) await fetch(`http://127.0.0.1:${s.adminPort}/reopen_logs`, { method: 'POST' });
    await sleep(500);
    for (const s of stacks) for (const line of legSummary(join(dir, `access-${s.name}.log`))) log(`legs ${s.label} ${line}`);
  }

  // ── Report ────────────────────────────────────────────────────────────────────────────────
  const med = (m: Map<string, Sample[]>, key: string, f: (x: Sample) => number): number => median((m.get(key) ?? []).map(f));
  /** Median over rounds of f(a-sample, b-sample) for the same round. */
  const pairedAcross = (ma: Map<string, Sample[]>, a: string, mb: Map<string, Sample[]>, b: string, f: (x: Sample, y: Sample) => number): number => {
    const bs = mb.get(b) ?? [];
    return median((ma.get(a) ?? []).flatMap((x) => {
      const y = bs.find((z) => z.round === x.round);
      return y === undefined ? [] : [f(x, y)];
    }));
  };
  const paired = (m: Map<string, Sample[]>, a: string, b: string, f: (x: Sample, y: Sample) => number): number => pairedAcross(m, a, m, b, f);
  const count = (list: readonly Sample[]): string => `${list.reduce((a, x) => a + x.ok, 0)}/${list.reduce((a, x) => a + x.done, 0)}`;
  const satRows: string[][] = [];
  const fixedRows: string[][] = [];
  const targets: string[][] = [];
  const pollRows: string[][] = [];
  const headerRows: string[][] = [];
  for (const ep of EPS) {
    for (const s of stacks) {
      const key = k(s, ep);
      satRows.push([epName(ep), s.label, fmt(med(sat, key, (x) => x.rps)),
        fmt(med(sat, key, (x) => x.envoyUs)), s.authzPid === undefined ? '–' : fmt(med(sat, key, (x) => x.authzUs)),
        servesMarket(s) ? 'in authz' : fmt(med(sat, key, (x) => x.marketUs)),
        fmt(med(sat, key, (x) => x.backendUs)), fmt(med(sat, key, (x) => x.redisUs)), fmt(med(sat, key, (x) => x.totalUs)),
        count(sat.get(key) ?? [])]);
      fixedRows.push([epName(ep), s.label, fmt(med(fixed, key, (x) => x.rps)), fmt(med(fixed, key, (x) => x.p50) / 1000, 2), fmt(med(fixed, key, (x) => x.p99) / 1000, 2),
        fmt(med(fixed, key, (x) => x.envoyUs)), s.authzPid === undefined ? '–' : fmt(med(fixed, key, (x) => x.authzUs)),
        fmt(med(fixed, key, (x) => x.totalUs)), count(fixed.get(key) ?? [])]);
    }
    const ratio = paired(sat, k('3', ep), k('2', ep), (x, y) => x.rps / y.rps);
    const capacity = paired(sat, k('3', ep), k('2', ep), (x, y) => y.totalUs / x.totalUs);
    const addedP99 = paired(fixed, k('3', ep), k('1', ep), (x, y) => x.p99 - y.p99) / 1000;
    const addedP99Floor = paired(fixed, k('2', ep), k('1', ep), (x, y) => x.p99 - y.p99) / 1000;
    targets.push([epName(ep), '(3) ≥ 90 % of (2) req/s at saturation', `${fmt(ratio * 100)} % (by all servers' CPU per request: ${fmt(capacity * 100)} %)`, ratio >= 0.9 ? '**yes**' : '**no**']);
    targets.push([epName(ep), 'p99 added by (3) over (1) at 1,000 req/s ≤ 2 ms', `${fmt(addedP99, 2)} ms (the floor (2) adds ${fmt(addedP99Floor, 2)} ms)`, addedP99 <= 2 ? '**yes**' : '**no**']);
    if (polled.size > 0) {
      const addedPolled = paired(polled, k('3', ep), k('1', ep), (x, y) => x.p99 - y.p99) / 1000;
      const addedPolledFloor = paired(polled, k('2', ep), k('1', ep), (x, y) => x.p99 - y.p99) / 1000;
      targets.push([epName(ep), 'the same, idle CPUs polling (see below)', `${fmt(addedPolled, 2)} ms (the floor (2) adds ${fmt(addedPolledFloor, 2)} ms)`, addedPolled <= 2 ? '**yes**' : '**no**']);
      for (const s of stacks) {
        const key = k(s, ep);
        // Polling minus halting, the same stack in the same round.
        const change = (f: (x: Sample) => number): number => pairedAcross(polled, key, fixed, key, (x, y) => f(x) - f(y)) / 1000;
        pollRows.push([epName(ep), s.label, fmt(med(polled, key, (x) => x.p50) / 1000, 2), fmt(med(polled, key, (x) => x.p99) / 1000, 2),
          fmt(change((x) => x.p50), 2), fmt(change((x) => x.p99), 2), fmt(med(polled, key, (x) => x.totalUs)), count(polled.get(key) ?? [])]);
      }
    }
    // What `allowedHeaders: minimal` buys over `all`: (3*) − (3) in the same round.
    for (const [m, label] of [[fixed, 'at 1,000 req/s'], [sat, 'at saturation']] as const) {
      headerRows.push([epName(ep), label,
        fmt(paired(m, k('3*', ep), k('3', ep), (x, y) => x.authzUs - y.authzUs), 1),
        fmt(paired(m, k('3*', ep), k('3', ep), (x, y) => x.envoyUs - y.envoyUs), 1),
        fmt(paired(m, k('3*', ep), k('3', ep), (x, y) => x.totalUs - y.totalUs), 1),
        m === sat
          ? `req/s ${fmt(100 * paired(m, k('3', ep), k('3*', ep), (x, y) => x.rps / y.rps - 1), 1)} %`
          : `p99 ${fmt(paired(m, k('3*', ep), k('3', ep), (x, y) => x.p99 - y.p99) / 1000, 2)} ms`]);
    }
  }
  const busy = median([...sat.values()].flat().map((x) => x.busy));

  // Where the p99 target is lost: per fixed-rate run, the requests slower than the limit the target
  // sets ((1)'s p99 of the same round + 2 ms; the target holds when at most 1 % are), and how many
  // of them overlapped a GC pause of a Node process on the stack's path (or began within
  // GC_DRAIN_US after one). The pause logs are flushed every 250 ms.
  await sleep(600);
  const tailRows: string[][] = [];
  for (const ep of EPS) {
    for (const s of stacks) {
      const pauses = readGcPauses(...s.gcFiles[ep]);
      const runs = (fixed.get(k(s, ep)) ?? []).flatMap((x) => {
        const base = fixed.get(k('1', ep))?.find((y) => y.round === x.round);
        if (base === undefined || x.startsUs === undefined || x.latenciesUs === undefined) return [];
        const limit = base.p99 + 2000;
        let [over, inGc, first, last] = [0, 0, Infinity, -Infinity];
        for (let i = 0; i < x.latenciesUs.length; i++) {
          const [start, lat] = [x.startsUs[i] as number, x.latenciesUs[i] as number];
          first = Math.min(first, start);
          last = Math.max(last, start + lat);
          if (lat <= limit) continue;
          over++;
          if (duringPause(pauses, start, lat, GC_DRAIN_US)) inGc++;
        }
        const inRun = pauses.filter((p) => p.startUs >= first && p.startUs <= last);
        return [{ n: x.latenciesUs.length, over, inGc, pauses: inRun.length, longest: Math.max(0, ...inRun.map((p) => p.durationUs)) }];
      });
      const m = (f: (r: (typeof runs)[number]) => number): number => median(runs.map(f));
      const pct = (v: number): string => `${fmt(v, 0)} (${fmt((100 * v) / Math.max(1, m((r) => r.n)), 1)} %)`;
      const waits = fixed.get(k(s, ep)) ?? [];
      const wait = (f: (x: Sample) => number): string => (waits.some((x) => Number.isNaN(f(x))) ? '–' : fmt(median(waits.map(f))));
      tailRows.push([epName(ep), s.label, pct(m((r) => r.over)), fmt(m((r) => r.inGc)), pct(m((r) => r.over - r.inGc)),
        fmt(m((r) => r.pauses)), fmt(m((r) => r.longest) / 1000, 1), wait((x) => x.envoyWaitUs), wait((x) => x.authzWaitUs)]);
    }
  }
  const at = (m: Map<string, Sample[]>, key: string, round: number): Sample | undefined => m.get(key)?.find((x) => x.round === round);
  const perRound: string[][] = [];
  for (let round = 0; round < ROUNDS; round++) {
    perRound.push([String(round + 1), ...EPS.flatMap((ep) => {
      const [s2, s3] = [at(sat, k('2', ep), round), at(sat, k('3', ep), round)];
      const [f1, f2, f3] = [at(fixed, k('1', ep), round), at(fixed, k('2', ep), round), at(fixed, k('3', ep), round)];
      return [
        s2 === undefined || s3 === undefined ? '–' : `${fmt(s3.rps)} / ${fmt(s2.rps)} = ${fmt((100 * s3.rps) / s2.rps)} %`,
        f1 === undefined || f2 === undefined || f3 === undefined ? '–' : `${fmt(f1.p99 / 1000, 2)} / ${fmt(f2.p99 / 1000, 2)} / ${fmt(f3.p99 / 1000, 2)}`,
      ];
    })]);
  }

  const pollNote = 'In every round, after the fixed-rate runs of an endpoint, each stack runs the same load again with\n'
    + '`/dev/cpu_dma_latency` held at 0 for that run only (PM QoS, what tuned\'s `latency-performance` profile sets):\n'
    + `an idle CPU then polls instead of halting. This machine's cpuidle driver is \`${cpuidleDriver()}\`. "Change" is\n`
    + 'polling minus halting, same stack, same round (negative = faster when polling). The polling itself is idle\n'
    + 'time, charged to no process.';
  const pollSection = polled.size === 0
    ? `Not measured in this run${POLL_UNAVAILABLE === undefined ? '' : ` (\`/dev/cpu_dma_latency\`: ${POLL_UNAVAILABLE})`}.`
    : `${pollNote}\n\n${markdownTable(['Request', 'Stack', 'p50 ms', 'p99 ms', 'change p50 ms', 'change p99 ms', 'all servers µs/req', '2xx'], pollRows, ['l', 'l', 'r', 'r', 'r', 'r', 'r', 'r'])}`;
  const bodyMd = `Run by \`npm run bench:edge\` (bench/edge.ts) on ${new Date().toISOString().slice(0, 10)}: ${machineLine(h2load)},
Envoy 1.40.0 with \`--concurrency ${ENVOY_CONCURRENCY}\` (${ENVOY_CONCURRENCY === '1' ? 'one worker' : `${ENVOY_CONCURRENCY} workers`} per Envoy; the load generator, Envoy, the TS process, Redis and the backend
share the 2 vCPUs). ${ROUNDS} interleaved rounds of ${SECONDS} s per cell after a warm-up; medians (ratios and differences are
taken within a round, then the median over rounds). CPU from \`/proc/<pid>/stat\` (all threads), divided by the requests of the run.

Load: h2load --h1 with keep-alive from 127.0.0.1, which the default \`GEO_TRUSTED_CIDRS\` (127.0.0.0/8) trusts, so geo
allows it without a GeoIP lookup; every request carries 7 browser-like headers (~560 bytes: user agent, cookie,
accept-*). \`RPS_PER_IP = RATE_BURST = 1000000\` for the run so the per-IP limiter runs on every request but never
throttles the load generator's single address (production defaults are far lower).

| Endpoint | Target | Measured | Met |
| --- | --- | --- | --- |
${targets.map((r) => `| ${r.join(' | ')} |`).join('\n')}

### At saturation (${SAT_CONNECTIONS} keep-alive connections), CPU µs per request

${markdownTable(['Request', 'Stack', 'req/s', 'Envoy', 'authz', 'market (TS)', 'backend', 'Redis', 'all servers', '2xx'], satRows, ['l', 'l', 'r', 'r', 'r', 'r', 'r', 'r', 'r', 'r'])}

"authz" is bench/edge-floor-server.ts for (2) and the TS process for (3)/(3*), which also serves the market
upstream there (one process in production, so its column holds both; "market (TS)" of (1)/(2) is that same
process serving reads only). "all servers" adds every server process (not h2load). Machine busy during the
saturation runs: ${fmt(busy * 100)} % (median).

### Latency at a fixed 1,000 req/s (${FIXED.connections} connections × ${FIXED.rpsPerClient} req/s, staggered), CPU µs per request

${markdownTable(['Request', 'Stack', 'req/s', 'p50 ms', 'p99 ms', 'Envoy', 'authz', 'all servers', '2xx'], fixedRows, ['l', 'l', 'r', 'r', 'r', 'r', 'r', 'r', 'r'])}

At 1,000 req/s every process wakes up for nearly every request, so CPU per request is higher than at
saturation, where each wake-up serves several.

<details><summary>Per round: the targets' inputs</summary>

${markdownTable(['Round', 'reads: req/s (3) / (2)', 'reads: p99 ms (1) / (2) / (3) at 1,000 req/s', 'orders: req/s (3) / (2)', 'orders: p99 ms (1) / (2) / (3) at 1,000 req/s'], perRound, ['l', 'r', 'r', 'r', 'r'])}

</details>

### At 1,000 req/s with idle CPUs polling instead of halting

${pollSection}

### Where the p99 target is lost: slow requests and GC pauses

Per fixed-rate run (${FIXED.connections * FIXED.rpsPerClient * SECONDS} requests), the requests slower than the target's limit, (1)'s p99 in the same
round + 2 ms (the target holds when at most 1 % are), and how many of them overlapped a GC pause of a Node process
the stack's requests pass through, or began within ${GC_DRAIN_US / 1000} ms after one ended (queued behind it). For reads that is
the TS process for (1) (its market upstream) and (3), and the allow-all floor plus the TS process's market service for
(2). For orders it is the order backend (bench/edge-backend.ts), plus the floor for (2) and the TS process for (3).
Every GC pause
is recorded inside each process by a preload (bench/lib/gc-pauses-preload.ts: a \`PerformanceObserver\` for
\`gc\`, main-thread pause, µs since the epoch) and matched against h2load's per-request log. Medians over rounds,
each column on its own.

${markdownTable(['Request', 'Stack', 'over the limit', 'of them during a GC pause', 'over the limit outside GC pauses', 'GC pauses in the run', 'longest pause ms', 'Envoy waited for a CPU, µs/req', 'authz waited for a CPU, µs/req'], tailRows, ['l', 'l', 'r', 'r', 'r', 'r', 'r', 'r', 'r'])}

The last two columns are the time the process's threads were runnable but waiting for a CPU
(\`/proc/<pid>/task/*/schedstat\`), divided by the run's requests. "authz" is the floor for (2) and the TS process for
(3); for (1) it is the TS process as the market upstream of reads, and nothing for orders.

### What \`allowedHeaders: 'minimal'\` (default) buys over \`'all'\` for the full edge

Cost with \`all\` minus cost with \`minimal\`, (3*) − (3) in the same round; positive = \`minimal\` is cheaper.

${markdownTable(['Request', 'Load', 'TS process µs/req', 'Envoy µs/req', 'all servers µs/req', 'throughput / p99 with minimal'], headerRows, ['l', 'l', 'r', 'r', 'r', 'r'])}

With \`minimal\`, authz receives \`x-edge-client-ip\`, \`x-request-id\` (and \`content-type\` on orders) instead of every
header of the request (the browser-like ones, h2load's, Envoy's own \`x-forwarded-*\`).

- Stack (1) is renderEnvoy's production bootstrap parsed back and stripped to the router filter
  (bench/edge.ts \`bare()\`), so listener, routes, clusters, upstream TLS and the access log are identical;
  it forwards the order JSON as is (no order-body filter), the others send the decoded 256 bytes (the preflight checks
  both by the backend's SHA-256).
- Fixed rate: h2load \`--rps ${FIXED.rpsPerClient}\` on each of ${FIXED.connections} connections, opened 1 ms apart (\`-r 1 --rate-period 1ms\`)
  so a request starts every millisecond. Without the stagger all connections' timers fire together and
  the "constant" 1,000 req/s arrives as bursts of ${FIXED.connections} every 10 ms, which multiplies p50 several times over
  (measured: a 0.2 ms server showed p50 2.1 ms instead of 0.36 ms). Latency is measured from the actual send
  (no coordinated-omission correction); at 1,000 req/s no stack is near saturation.
- Each measured fixed-rate run follows ${FIXED_PRELOAD_S} s of the same load on the same stack, which is not measured.
  - Why: while the other stacks run, a stack sits idle for ~10 s. That is longer than the 4-s upstream
    \`idle_timeout\` of the market and backend clusters (kept below Node's 5-s keep-alive), so Envoy has closed
    those connections.
  - Without the pre-load, the first ~60 ms of each run reopened them, including the mTLS handshakes to the backend.
  - On 2026-11-22, that window held 0–15 order requests over the limit for (2)/(3) and none for (1). The target
    allows ~30 per run.
- The access log is formatted and written for every request, to /dev/null instead of stdout.
- Envoy's error counters after the run: ${errors.length === 0 ? 'none' : errors.join('; ')}.

### Findings (measured separately on 2026-11-22 and 2026-11-23, not re-measured by the script)

- **Re-run after session 7's changes, on a slower hour (not kept as the tables above).** Session 7 moved
  header_mutation before the rate limiter and gave the limiter two descriptors (IPv6 per /64, IPv4-mapped
  per address; docs/envoy.md §3). A full run at 19:21 the same day found the host about twice as slow: bare
  Envoy (1) served 4,109 reads/s instead of 7,881, and every process's CPU per request roughly doubled, the
  bare stack's included. Its targets: reads (3)/(2) 103 %, orders 89 % (rounds 81–94 %); p99 added by (3)
  over (1) reads +8.37 ms (floor +10.23), orders +11.85 ms (floor +11.49). A 6-round orders-only saturation
  run straight after gave 106 % (rounds 78–113 %), so the 89 % is the noise of that hour, not the change,
  which touches (2) and (3) alike. The tables above stay those of the quieter run.
- **Idle CPUs that halt, and where each request's time goes (session 6, measured on 2026-11-23).**
  - *This machine's vCPUs halt as soon as they idle.* It is a KVM guest with the \`haltpoll\` cpuidle driver and
    guest halt polling off (\`haltpoll.guest_halt_poll_ns=0\`), so every wake-up goes through the hypervisor. Straight
    to a server (no Envoy; a scratch harness, 3 rounds), one h2load connection back to back against 10 connections
    paced at 1,000 req/s gave p50: node:http 96–104 µs against 226–407 µs, node:http2 122–130 against 779–1,153 µs,
    the grpc-js Check server 161–200 against 1,008–1,821 µs. With \`/dev/cpu_dma_latency\` held at 0 (idle CPUs
    poll), back to back node:http went from 9,070–9,567 to 46,551 req/s and the grpc-js server from 4,425–4,646 to
    ~15,000 Checks/s; paced p50 fell to 134 µs (node:http), 312 µs (node:http2) and 672–901 µs (grpc-js).
    Every hop pays for a wake-up, and (2)/(3) have two more hops than (1).
  - *Per leg, from Envoy's own clocks* (\`BENCH_LEG_LOG=1\`, 2 rounds at 1,000 req/s, idle CPUs halting): the
    ext_authz round trip (whole request received → first byte upstream) had p50 0.63–0.90 ms and p99 4.1–8.6 ms
    in (2) and (3), the upstream leg p50 0.28–0.58 ms and p99 1.9–4.7 ms. In the slowest 1 % of (2)'s and (3)'s
    requests the ext_authz round trip was the longest leg 70–95 % of the time; in (1) the upstream leg was.
    The production access log now carries the same split (\`edge_us\`, \`upstream_us\`; docs/envoy.md §9).
  - *Polling instead of halting* (the table "idle CPUs polling" above, same run, side by side): p50 is lower for
    every stack, by 0.2–0.9 ms, but the p99 target is still missed, and the allow-all floor (2) misses it too.
    Three earlier fixed-rate runs with polling held throughout gave (3) +3.39 / +3.99 ms, +2.71 / +2.90 ms and
    +3.13 / +7.06 ms (reads / orders).
  - *Polling and Node 24.14.1 together.* With polling held and the TS process on Node 24.14.1 ((3b), without the
    GC regression below) side by side for 4 rounds, the medians of p99 were reads 4.11 ms and orders 4.60 ms for
    (3b) against 1.51 and 1.84 ms for (1): +2.6 and +2.8 ms. The floor (2) was +1.7 and +4.4 ms. Neither the idle
    policy nor the Node regression, nor both removed together, brings (3) within 2 ms of (1) on this machine.
  - *Two Envoy workers do not help on 2 vCPUs.* \`BENCH_ENVOY_CONCURRENCY=2\` (3 rounds, run right after a
    concurrency-1 run, not side by side) gave +6.56 / +11.65 ms against +4.17 / +7.72 ms. Not adopted.
  - Hosts that want the lower p50 can keep idle CPUs polling or shallow (docs/operations.md, "Latency").
- **Orders now take one round trip to the TS process, not two (session 3).** The payload is decoded by a Lua
  filter inside Envoy from what the ext_authz Check hands over (docs/envoy.md §5) instead of by ext_proc, a
  second gRPC stream per order. Same session, same machine, \`BENCH_ROUNDS=2 BENCH_ONLY_MODES=fixed\`, before → after,
  orders at 1,000 req/s: p99 (3) 9.5–10.2 → 3.9–4.9 ms, (2) 10.8–13.4 → 5.2 ms, (1) unchanged 1.3–1.7 ms;
  CPU in all servers per order (3) 1,103–1,127 → 783–807 µs. It also ends the one-JavaScript-Error-per-order
  cost of Envoy resetting every finished ext_proc stream (8 % of the TS process's CPU in session 1's profile).
- **Reads: a page cache in the TS process (session 3).** The market service now keeps each read page for
  \`MARKET_CACHE_TTL_MS\`, dropped by every invalidation (docs/market-data.md). Two full runs of this script an hour
  apart (not side by side, so indicative): reads at saturation (1) 8,241 → 15,530 req/s, (3) 4,270 → 6,238; the
  market service's CPU per read 59 → 28 µs and Redis's 14 → 0; p99 at 1,000 req/s (1) 1.77 → 0.83 ms, (3) 5.10 →
  3.40 ms. The bench ingests once, so every read after the first is a cache hit; a live feed invalidates pages
  on every ingest, and reads then cost what they did before.
- **Where the missed p99 target goes (session 5).** Measured with the table "Where the p99 target is lost", which
  is new in this session, over eight runs on 2026-11-22: five full runs of this script (the one above included), one
  2-round fixed-rate run and two 4-round fixed-rate A/B runs. "Over the limit" means slower than (1)'s p99 + 2 ms; the target allows 1 %.
  - *Reads.* (3) had 28–63 reads over the limit per 3,000. Of these, 9–21 overlapped a GC pause of the TS
    process. Only 12–44 (0.4–1.5 %) were outside every GC pause, at most 1 % in seven of the eight runs. So for reads,
    the TS process's pauses are the lever, and the added p99 swings around 2 ms: 1.97–3.04 ms in the full runs.
  - *Orders.* (3) had 45–102 orders (1.5–3.4 %) over the limit outside any GC pause in every run, even with the
    order backend's pauses counted. Orders miss the target even without GC.
  - *The floor is not clearly better on orders.* Outside GC pauses it ranged from 0.5 to 2.8 %, below (3) in six
    of the eight runs.
    - Before the last full run, the table also counted the TS process's pauses against the floor's orders, which
      never reach that process, so the earlier floor figures are lower bounds. In the run above the floor was at
      1.4 % and (3) at 1.5 %.
    - An orders-only fixed-rate run (4 rounds, \`BENCH_ONLY_EPS=orders BENCH_ONLY_MODES=fixed BENCH_KEEP=1\`) put
      them level: p99 5.19 ms for (2) and 5.22 ms for (3), with 1.4 % and 1.6 % over the limit outside GC pauses.
    - Envoy's own histograms from that run (\`envoy-<stack>-timing.txt\`, 1-ms buckets) place the tail on the
      ext_authz leg. Upstream request time P99 was 5.0 ms to the floor and 5.1 ms to the TS process, against
      3.0 and 2.1 ms to the order backend; downstream P99 was 7.1 and 8.0 ms, against 1.1 ms for (1).
    - These are Envoy's running totals over the whole run, including the warm-up and the 0.5-s preloads, so they
      are indicative only.
    - So the orders tail is the round trip to a Node gRPC server, whichever server it is.
  - *What the table cannot see.* Whatever remains outside GC pauses comes in clusters of 5–20 slow requests within
    50 ms. That looks like stalls on 2 shared vCPUs that also run h2load, four Envoys, Redis and the backend. The
    table counts only main-thread pauses, so CPU that V8's concurrent GC threads take from other processes
    counts as "outside".
  - *Waiting for a CPU.* The last two columns of the table are new: run-queue time from
    \`/proc/<pid>/task/*/schedstat\`.
    - In the last two full runs, Envoy's threads waited 61–158 µs per request on average before they got a CPU, and
      the authz process's threads 16–64 µs. That is a sizeable share of a p50 of about 1 ms.
    - The tail of that wait is what the clusters outside GC pauses look like. This fits, but it is not proof.
  - *Node version.* Most of the TS process's pause time comes from a Node regression between 24.14.1 and 24.15.0:
    closed HTTP/2 streams outlive scavenges. On Node 24.14.1 side by side, the longest pause for reads was 2.7 ms
    instead of 9.6 ms. Details are in "Garbage per request" below.
  - *A smaller young generation did not help.* With \`--max-semi-space-size=1\` side by side ((3b), 3 rounds),
    p99 was 3.7–11.4 ms for reads and 11.2–15.7 ms for orders, against 4.1–7.7 and 7.0–12.4 ms for (3).
  - *Fixed-rate runs now start warm.* Since the third full run, each measured fixed-rate run was made to follow
    0.5 s of unmeasured load (see the notes above the findings). The earlier runs counted the first ~60 ms of
    reconnecting as well.
- **What is left of the added p99 is stalls, not per-request cost.** In h2load's per-request logs
  (\`BENCH_KEEP=1\`) the requests slower than 3 ms come in clusters: in a 3-s run at 1,000 req/s they fell into
  15–28 ten-millisecond windows for (2)/(3) (up to 24 requests in one window) against 7–9 for (1), i.e. one
  process stopped for 5–35 ms and everything queued behind it. The TS process (observed with a
  \`PerformanceObserver\` for \`gc\` and \`monitorEventLoopDelay\`) runs one young-generation GC about every second
  at 1,000 reads/s, each 6.5–12 ms of wall time, and its event loop's worst delay per second matches it; the
  allow-all floor process shows the same (14–18 ms). On 2 shared vCPUs a parallel scavenge also waits for CPU.
- **Young-generation GC in the TS process, in detail** (\`--trace-gc-nvp\` on a (3b) copy of the process at 1,000
  reads/s): the new space grows to 64 MB; 45–56 MB are allocated between scavenges, ~26 % survive and 8–10 MB
  are promoted per scavenge; the main thread spends 6–12 ms in the parallel phase while the helper threads
  report 11–37 ms (they wait for a CPU). The market service lives in the same process, so these stalls hit
  reads through the bare Envoy (1) as well: in one run 29 of (1)'s 40 reads slower than 3 ms overlapped a TS
  GC, against 28 of 74 for (3) (the rest of (3)'s tail overlaps no TS stall over 4 ms).
- **No Node GC flag helps here; none was adopted.** Side by side in one run (stack (3b),
  \`BENCH_AUTHZ_B_NODE_ARGS\`, 4 interleaved rounds each), p99 ms at 1,000 req/s, (3) default vs (3b):
  \`--max-semi-space-size=1\` (scavenges of ~0.4 ms, 60+ a second): reads 4.7–9.4 vs 3.8–10.2, orders 4.9–8.5 vs
  6.1–10.3; \`--max-semi-space-size=64\`: reads 4.7–11.9 vs 5.8–9.8, orders 4.9–9.2 vs 5.2–7.8;
  \`--single-threaded-gc\`: reads 4.8–5.7 vs 6.9–11.7 (worse), orders 3.8–10.5 vs 5.6–8.8. In the same rounds (1)
  was 1.4–5.2 (reads) and 1.1–1.9 (orders). The 2 ms target needs to be checked on dedicated cores: on this VM
  the allow-all floor (2) misses it as well, and (3) is within the floor's range.
- **Earlier measurements (sessions 1–2), for the record.** With ext_proc on orders, p99 at 1,000 req/s ranged
  (1) / (2) / (3): reads 2.3–5.0 / 5.8–28 / 8.5–22 ms, orders 1.6–11 / 10.8–34 / 9.7–30 ms, the high ends on a
  busier machine where the floor could not hold 1,000 orders/s (754–991 req/s at 1,400–1,800 µs per order).
  Running the load generator at \`nice 19\` or \`SCHED_IDLE\` changed nothing.
- **Reads: the Redis round trip is about a fifth of the TS process's CPU per read** (ioredis auto-pipelining,
  RESP decoding, the Lua page script call from \`RedisMarketStore.page\`, authz/src/marketdata/redis-store.ts:147)
  plus ~19 µs of Redis CPU, for a page that changes only on ingest; see the market section for an in-process
  page cache (36 µs per 137 KB page in a prototype). Garbage collection is 11 % (reads) and 15 % (orders). Why its scavenges are long (closed HTTP/2 streams and
  grpc-js's call objects outlive them): "Garbage per request" below, \`npm run bench:gc\`.
- **\`allowedHeaders: 'minimal'\` buys ~15–20 µs of CPU per request**, below the noise of the table above: a
  dedicated A/B of (3) against (3*) only (10 paired rounds of 3 s at saturation, same headers) gave, as medians
  of \`all\` − \`minimal\`, reads: TS +10 µs, Envoy +8 µs, throughput with \`minimal\` +6 %; orders: TS +7 µs,
  Envoy +8 µs, +2 %. Per-round differences ranged from −12 to +50 µs.`;
  if (process.env['BENCH_NO_DOCS'] !== '1' && !SUBSET) {
    writeSection(fileURLToPath(new URL('../docs/benchmarks.md', import.meta.url)), '## Edge data plane (Envoy)', bodyMd, '# Benchmarks');
  }
  process.stdout.write(`${bodyMd}\n`);
} finally {
  for (const c of children.reverse()) await c.stop();
  await redis?.stop();
}
