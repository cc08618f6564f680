/**
 * The processes of `npm run bench:edge`, started, given one market and checked end to end
 * before anything is measured. Five stacks, each its own Envoy (one worker: the machine has
 * 2 vCPUs for everything, the load generator included):
 *   (1) bare Envoy: renderEnvoy's production bootstrap with every HTTP filter but the router and
 *       every per-route filter config removed (`bare()`): same listener, routes, clusters,
 *       upstream mTLS and access log; no rate limit, no ext_authz, no order-body filter;
 *   (2) the production bootstrap (rate limit, client-address header, ext_authz, the order-body Lua
 *       filter on orders) with the `authz` cluster pointed at the allow-all floor
 *       (bench/edge-floor-server.ts), which hands an order's payload over as metadata;
 *   (3) the full edge: the production bootstrap against the real TS process (authz/src/main.ts on
 *       Redis, with the service's runtime settings), `allowedHeaders: 'minimal'` (the default);
 *   (3*) as (3) with `allowedHeaders: 'all'` (every request header sent to authz);
 *   (4) as (3) with the global rate limit (RATE_LIMIT_SCOPE=global, the TS process the limiter):
 *       after its local bucket Envoy's Check to the same TS process takes the client's bucket, a Lua
 *       token bucket in the same Redis (no ratelimit filter, no second gRPC call), with token
 *       leases at their defaults (RATE_LEASE_TOKENS, RATE_LEASE_MS);
 *   (4−) as (4) without leases (RATE_LEASE_TOKENS=0): a second TS process of its own (its Checks
 *       and its market upstream, as (4)'s one process does both), on the same Redis.
 *   (3u) as (3) with Envoy reaching the TS process over Unix domain sockets (AUTHZ_GRPC_SOCKET,
 *       MARKET_SOCKET: the TS process listens on both its TCP ports and the sockets), for the
 *       side-by-side comparison with loopback TCP (docs/envoy.md "Unix domain sockets").
 *   (3o) as (3) with traces on (OTEL_EXPORTER_OTLP_ENDPOINT, the default sampler: every request):
 *       Envoy's OpenTelemetry tracer and a third TS process of its own with the SDK, both exporting
 *       to a local OTLP receiver that drops what it gets (e2e/lib/otlp.ts); started only when
 *       BENCH_STACKS names it.
 *   (1t), (2t), (3t): (1), (2), (3) with TLS on the client listener (EDGE_TLS_CERT_FILE and
 *       EDGE_TLS_KEY_FILE: a P-256 development certificate, scripts/dev/edge-server-cert.ts), the
 *       production DownstreamTlsContext (envoy/render/tls.ts); bench/lib/edge-tls.ts measures them.
 * (1)–(3*) are rendered with RATE_LIMIT_SCOPE=local (the default with REDIS_URL is global).
 * Shared upstreams: the TS process's market service (its MARKET_PORT, also (3)'s authz) and the
 * demo mTLS order backend (bench/edge-backend.ts). RPS_PER_IP = RATE_BURST = 10^6, so the limiter
 * runs on every request but never throttles the one load-generator address.
 */
import { createHash, generateKeyPairSync, randomBytes } from 'node:crypto';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { fileURLToPath } from 'node:url';
import YAML from 'yaml';
import { loadConfig } from '../../authz/src/common/config.ts';
import { withServiceRuntime } from '../../authz/src/common/runtime-env.ts';
import { freePort, PrivateRedis } from '../../testkit/redis-server.ts';
import { envoyBinary } from '../../envoy/envoy-bin.ts';
import { renderEnvoy } from '../../envoy/render.ts';
import { generateDevPki } from '../../scripts/dev/certs.ts';
import { ensureEdgeServerCert } from '../../scripts/dev/edge-server-cert.ts';
import { signedIngest } from '../../scripts/edge-client.ts';
import { forkNode, spawnProgram, type Child } from './child.ts';
import { edgeRequest, TLS_STACKS } from './edge-tls.ts';
import { redisPid } from './env.ts';
import { startOtlpReceiver, type OtlpReceiver } from '../../e2e/lib/otlp.ts';

export type Ep = 'markets' | 'orders';
export const MARKETS_PATH = '/v1/markets';
export const ORDERS_PATH = '/v1/orders';

/**
 * What a browser-like client sends besides the request line: 7 headers, ~560 bytes (a session
 * cookie, user agent, accept-*). The same on every stack; it is what `allowedHeaders: 'all'`
 * forwards to authz and `'minimal'` keeps out.
 */
export const CLIENT_HEADERS: Readonly<Record<string, string>> = {
  'user-agent': 'Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 Safari/537.36',
  accept: 'application/json, text/plain, */*',
  'accept-language': 'en-US,en;q=0.9,de;q=0.8',
  'accept-encoding': 'gzip, deflate, br, zstd',
  cookie: `session=${randomBytes(32).toString('hex')}; theme=dark; _ga=GA1.1.${randomBytes(6).readUIntBE(0, 6)}.1763700000; consent=${randomBytes(48).toString('base64url')}`,
  referer: 'https://app.example.com/markets/trending?tab=all&sort=volume',
  origin: 'https://app.example.com',
};

export interface Stack {
  readonly name: '1' | '2' | '3' | '3*' | '4' | '4-' | '3u' | '3o' | '1t' | '2t' | '3t';
  readonly label: string;
  readonly port: number;
  /** The client listener's scheme and address: `https://127.0.0.1:<port>` for (1t)–(3t), else http. */
  readonly origin: string;
  /** TLS on the client listener ((1t), (2t), (3t)). */
  readonly tls: boolean;
  readonly envoy: Child;
  readonly adminPort: number;
  /** The ext_authz process: the floor for (2), the TS process for (3)/(3*)/(4)/(4−), none for (1). */
  readonly authzPid: number | undefined;
  /** The TS process whose market service is this stack's upstream (and, but for (1)/(2), its authz). */
  readonly tsPid: number;
  /** That TS process's admin port (its /metrics). */
  readonly tsAdminPort: number;
}

export interface Edge {
  readonly stacks: readonly Stack[];
  /** The processes every stack shares. */
  readonly pids: { readonly ts: number; readonly floor: number; readonly backend: number; readonly redis: number };
  /** The order request body (256-byte payload) as a file for h2load. */
  readonly orderFile: string;
  /** Bytes of the read's response (one market). */
  readonly readBytes: number;
  /** The TS process's admin port (its /metrics). */
  readonly authzAdminPort: number;
  /** The CA that issued the TLS stacks' server certificate (undefined when none of them runs). */
  readonly tlsCaFile: string | undefined;
  stop(): Promise<void>;
}

/** Removes every HTTP filter but the router, and every per-route filter config: stack (1). */
function bare(node: unknown): unknown {
  if (Array.isArray(node)) return node.map(bare);
  if (node === null || typeof node !== 'object') return node;
  const out: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(node)) {
    if (k === 'typed_per_filter_config') continue;
    out[k] = k === 'http_filters' && Array.isArray(v) ? v.filter((f: { name?: string }) => f.name === 'envoy.filters.http.router') : bare(v);
  }
  return out;
}

async function waitHttp(url: string, ca?: string): Promise<void> {
  for (let i = 0; i < 300; i++) {
    try {
      if ((await edgeRequest(url, { ca })).status < 500) return;
    } catch { /* not yet */ }
    await sleep(50);
  }
  throw new Error(`not up: ${url}`);
}

/** Starts Redis, the backend, the floor, the TS process and the five Envoys in `dir`; ingests one market through (3). */
export async function startEdge(dir: string, log: (m: string) => void): Promise<Edge> {
  const children: Child[] = [];
  const redis = await PrivateRedis.start();
  let receiver: OtlpReceiver | undefined;
  const stop = async (): Promise<void> => {
    for (const c of children.reverse()) await c.stop();
    await receiver?.stop();
    await redis.stop();
  };
  try {
    const pki = generateDevPki(join(dir, 'pki'));
    const backend = await forkNode(fileURLToPath(new URL('../edge-backend.ts', import.meta.url)), {
      env: { ...process.env, PORT: String(await freePort()), CERT: pki.backendCertFile, KEY: pki.backendKeyFile, CLIENT_CA: pki.clientCaFile },
      logFile: join(dir, 'backend.log'),
    });
    children.push(backend);
    const floor = await forkNode(fileURLToPath(new URL('../edge-floor-server.ts', import.meta.url)), { logFile: join(dir, 'floor.log') });
    children.push(floor);

    const hmacKey = randomBytes(32);
    const feed = generateKeyPairSync('ed25519');
    const feedPub = Buffer.from(feed.publicKey.export({ format: 'jwk' }).x ?? '', 'base64url').toString('hex');
    const [grpcPort, marketPort, adminPort] = [await freePort(), await freePort(), await freePort()];
    const sockets = { AUTHZ_GRPC_SOCKET: join(dir, 'sockets', 'authz.sock'), MARKET_SOCKET: join(dir, 'sockets', 'market.sock') };
    const base: Record<string, string> = {
      AUTHZ_GRPC_PORT: String(grpcPort), MARKET_PORT: String(marketPort), AUTHZ_ADMIN_PORT: String(adminPort),
      REDIS_URL: redis.url, RPS_PER_IP: '1000000', RATE_BURST: '1000000', LOG_LEVEL: 'warn',
      ORDER_BACKEND_URL: `https://localhost:${backend.port}`, ORDER_BACKEND_CA_FILE: pki.backendCaFile,
      EDGE_CLIENT_CERT_FILE: pki.clientCertFile, EDGE_CLIENT_KEY_FILE: pki.clientKeyFile,
    };
    const ts = spawnProgram(fileURLToPath(new URL('../../scripts/node', import.meta.url)), [fileURLToPath(new URL('../../authz/src/main.ts', import.meta.url))], {
      // Both TCP ports (set) and both sockets: (3u) uses the sockets, every other stack the ports.
      env: withServiceRuntime({ ...process.env, ...base, ...sockets, EDGE_INGEST_HMAC: `hex:${hmacKey.toString('hex')}`, EDGE_FEED_ED25519_PUBLIC_KEY: feedPub }),
      logFile: join(dir, 'authz.log'),
    });
    children.push(ts);
    // (4−): a second TS process, the same settings without token leases.
    const [grpcPort2, marketPort2, adminPort2] = [await freePort(), await freePort(), await freePort()];
    const ts2 = spawnProgram(fileURLToPath(new URL('../../scripts/node', import.meta.url)), [fileURLToPath(new URL('../../authz/src/main.ts', import.meta.url))], {
      env: withServiceRuntime({ ...process.env, ...base, AUTHZ_GRPC_PORT: String(grpcPort2), MARKET_PORT: String(marketPort2), AUTHZ_ADMIN_PORT: String(adminPort2),
        RATE_LEASE_TOKENS: '0', EDGE_INGEST_HMAC: `hex:${hmacKey.toString('hex')}`, EDGE_FEED_ED25519_PUBLIC_KEY: feedPub }),
      logFile: join(dir, 'authz-no-leases.log'),
    });
    children.push(ts2);
    await waitHttp(`http://127.0.0.1:${marketPort}/`);
    await waitHttp(`http://127.0.0.1:${marketPort2}/`);
    // BENCH_STACKS: a subset (bench/edge.ts); (3) always, the market is ingested through it.
    const only = process.env['BENCH_STACKS']?.split(',').map((x) => x.trim());
    const wanted = (name: Stack['name']): boolean => only === undefined || name === '3' || only.includes(name);
    // (3o): the OTLP receiver and a TS process with traces on, only when BENCH_STACKS names it (a
    // full run measures what it measured before).
    const [grpcPort3, marketPort3, adminPort3] = [await freePort(), await freePort(), await freePort()];
    let ts3: Child | undefined;
    const traced: Record<string, string> = {};
    if (only?.includes('3o') === true) {
      receiver = await startOtlpReceiver({ discard: true });
      traced['OTEL_EXPORTER_OTLP_ENDPOINT'] = receiver.endpoint;
      ts3 = spawnProgram(fileURLToPath(new URL('../../scripts/node', import.meta.url)), [fileURLToPath(new URL('../../authz/src/main.ts', import.meta.url))], {
        env: withServiceRuntime({ ...process.env, ...base, ...traced, AUTHZ_GRPC_PORT: String(grpcPort3), MARKET_PORT: String(marketPort3), AUTHZ_ADMIN_PORT: String(adminPort3),
          EDGE_INGEST_HMAC: `hex:${hmacKey.toString('hex')}`, EDGE_FEED_ED25519_PUBLIC_KEY: feedPub }),
        logFile: join(dir, 'authz-traces.log'),
      });
      children.push(ts3);
      await waitHttp(`http://127.0.0.1:${marketPort3}/`);
    }

    const stacks: Stack[] = [];
    const sdsPath = join(dir, 'sds.yaml');
    const variants = [
      ['1', '(1) bare Envoy', grpcPort, undefined],
      ['2', '(2) filters + allow-all authz (floor)', floor.port, floor.pid],
      ['3', '(3) full edge', grpcPort, ts.pid],
      ['3*', '(3*) full edge, `allowedHeaders: all`', grpcPort, ts.pid],
      ['4', '(4) full edge + global rate limit (leases)', grpcPort, ts.pid],
      ['4-', '(4−) full edge + global rate limit, no leases', grpcPort2, ts2.pid],
      ['3u', '(3u) full edge, Unix sockets', grpcPort, ts.pid],
      ['3o', '(3o) full edge, traces on', grpcPort3, ts3?.pid],
      ['1t', '(1t) bare Envoy, TLS', grpcPort, undefined],
      ['2t', '(2t) floor, TLS', floor.port, floor.pid],
      ['3t', '(3t) full edge, TLS', grpcPort, ts.pid],
    ] as const;
    const server = TLS_STACKS.some(wanted) ? ensureEdgeServerCert(join(dir, 'edge-tls')) : undefined;
    const serverSdsPath = join(dir, 'sds-server-cert.yaml');
    for (const [name, label, authzPort, authzPid] of variants) {
      if (!wanted(name) || (name === '3o' && ts3 === undefined)) continue;
      const [port, envoyAdmin] = [await freePort(), await freePort()];
      const own = name === '4-';
      const withTraces = name === '3o';
      const tls = (TLS_STACKS as readonly string[]).includes(name) && server !== undefined;
      const config = loadConfig({
        ...base, EDGE_PORT: String(port), ENVOY_ADMIN_PORT: String(envoyAdmin), AUTHZ_GRPC_PORT: String(authzPort),
        ...(own ? { MARKET_PORT: String(marketPort2) } : {}),
        ...(withTraces ? { ...traced, MARKET_PORT: String(marketPort3) } : {}),
        RATE_LIMIT_SCOPE: name === '4' || name === '4-' ? 'global' : 'local',
        ...(name === '3u' ? sockets : {}),
        ...(tls ? { EDGE_TLS_CERT_FILE: server.certFile, EDGE_TLS_KEY_FILE: server.keyFile } : {}),
      });
      // The access log is formatted and written as in production, to /dev/null instead of stdout.
      const rendered = renderEnvoy(config, { sdsPath, serverSdsPath, allowedHeaders: name === '3*' ? 'all' : 'minimal', accessLogPath: '/dev/null' });
      const file = join(dir, `envoy-${port}.yaml`);
      if (rendered.serverSds !== undefined) writeFileSync(serverSdsPath, rendered.serverSds);
      writeFileSync(file, name === '1' || name === '1t' ? YAML.stringify(bare(YAML.parse(rendered.bootstrap))) : rendered.bootstrap);
      if (rendered.sds !== undefined) writeFileSync(sdsPath, rendered.sds);
      const envoy = spawnProgram(envoyBinary(), ['-c', file, '--disable-hot-restart', '--concurrency', '1', '-l', 'error'], { logFile: join(dir, `envoy-${name}.log`) });
      children.push(envoy);
      stacks.push({ name, label, port, origin: `${tls ? 'https' : 'http'}://127.0.0.1:${port}`, tls, envoy, adminPort: envoyAdmin, authzPid, tsPid: own ? ts2.pid : withTraces && ts3 !== undefined ? ts3.pid : ts.pid,
        tsAdminPort: own ? adminPort2 : withTraces ? adminPort3 : adminPort });
    }
    const ca = server?.caFile;
    for (const s of stacks) await waitHttp(`${s.origin}/healthz`, ca);

    // One market, ingested (HMAC + Ed25519 signed, as the feed does) through the full edge.
    const market = '0xbench';
    const doc = Buffer.from(JSON.stringify({
      conditionId: market, seq: 1, question: 'bench?', active: true, closed: false, minSize: '1', maxSize: '1000',
      outcomes: [{ tokenId: '1', name: 'Yes', bid: '0.5', ask: '0.6', last: '0.55' }], updatedAt: 1,
    }));
    const ingest = signedIngest(doc, market, hmacKey, feed.privateKey);
    const through = stacks.find((s) => s.name === '3') as Stack;
    const ing = await fetch(`http://127.0.0.1:${through.port}/internal/ingest/market`, { method: 'POST', body: new Uint8Array(ingest.body), headers: ingest.headers });
    if (ing.status !== 200) throw new Error(`ingest failed: ${ing.status} ${await ing.text()}`);
    const payload = randomBytes(256);
    const orderJson = JSON.stringify({ marketId: market, deadline: Math.floor(Date.now() / 1000) + 3600, size: '10', payload: payload.toString('base64') });
    const orderFile = join(dir, 'order.json');
    writeFileSync(orderFile, orderJson);

    // Preflight through every stack: the read returns the market; the backend receives the decoded
    // 256 payload bytes when the order-body filter runs, (1) forwards the JSON untouched.
    const sha = (b: string | Buffer): string => createHash('sha256').update(b).digest('hex');
    let readBytes = 0;
    for (const s of stacks) {
      const r = await edgeRequest(`${s.origin}${MARKETS_PATH}`, { ca, headers: CLIENT_HEADERS });
      const { text } = r;
      if (r.status !== 200 || !text.includes(market)) throw new Error(`preflight ${s.label} read: ${r.status} ${text.slice(0, 200)}`);
      readBytes = Buffer.byteLength(text);
      const o = await edgeRequest(`${s.origin}${ORDERS_PATH}`, { ca, method: 'POST', body: orderJson, headers: { ...CLIENT_HEADERS, 'content-type': 'application/json' } });
      const got = JSON.parse(o.text) as { bytes?: number; sha256?: string };
      const want = s.name === '1' || s.name === '1t' ? { bytes: Buffer.byteLength(orderJson), sha256: sha(orderJson) } : { bytes: 256, sha256: sha(payload) };
      if (o.status !== 200 || got.bytes !== want.bytes || got.sha256 !== want.sha256) throw new Error(`preflight ${s.label} order: ${o.status} ${JSON.stringify(got)}`);
    }
    log('preflight ok: every stack reads the market and delivers the order as expected');
    const redisProc = redisPid(redis.url);
    if (redisProc === undefined) throw new Error('the private redis-server has no /proc entry');
    return { stacks, pids: { ts: ts.pid, floor: floor.pid, backend: backend.pid, redis: redisProc }, orderFile, readBytes, authzAdminPort: adminPort, tlsCaFile: ca, stop };
  } catch (err) {
    await stop();
    throw err;
  }
}

/**
 * The TS process's global-limit answers given without the bucket (Redis failed or slower than the
 * 100-ms bound: the request went on unlimited), as `name: value` lines; they would flatter (4).
 */
export async function failedOpenChecks(edge: Edge): Promise<string[]> {
  const out: string[] = [];
  for (const port of new Set(edge.stacks.map((s) => s.tsAdminPort))) {
    const text = await (await fetch(`http://127.0.0.1:${port}/metrics`)).text();
    out.push(...text.split('\n').filter((l) => /^edge_ratelimit_(redis_errors|late)_total /.test(l) && !/ 0$/.test(l)));
  }
  return out;
}

/** A stack's TS process's global-limit takes so far and the Redis script calls that answered them (leased takes need none). */
export async function bucketCalls(s: Stack): Promise<{ takes: number; calls: number }> {
  const text = await (await fetch(`http://127.0.0.1:${s.tsAdminPort}/metrics`)).text();
  const value = (re: RegExp): number => [...text.matchAll(re)].reduce((a, m) => a + Number(m[1]), 0);
  return {
    takes: value(/^edge_ratelimit_decisions_total\{code="(?:ok|over_limit)"\} (\S+)$/gm),
    calls: value(/^edge_ratelimit_redis_calls_total (\S+)$/gm),
  };
}

/** Envoy's non-zero error counters (anything but a 2xx, by its own stats), as `name: value` lines. */
export async function envoyErrors(s: Stack): Promise<string[]> {
  // ratelimit.failure_mode_allowed: a request the global limit let through unasked (the service
  // slower than its timeout; only with a ratelimit filter): it would flatter (4)'s throughput, so it
  // is reported; the Check's own fail-open answers are counted by the TS process (failedOpenChecks).
  const bad = /(downstream_rq_[45]xx|upstream_rq_[45]\d\d|upstream_cx_destroy_remote_with_active_rq|upstream_rq_pending_overflow|ext_authz\.(error|denied|failure_mode_allowed)|ratelimit\.(error|over_limit|failure_mode_allowed)|lua\.errors|rate_limited)/;
  const text = await (await fetch(`http://127.0.0.1:${s.adminPort}/stats`)).text();
  return text.split('\n').filter((l) => bad.test(l) && !/: 0$/.test(l));
}
