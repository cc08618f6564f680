/**
 * The global rate limit in the rendered config (RATE_LIMIT_SCOPE, RATELIMIT_SERVICE_ADDRESS) and
 * on a live Envoy 1.40 against the real RateLimitService of the TS service (authz/src/ratelimit/,
 * buckets on a private redis-server):
 * - global with the TS service as the limiter (the default with Redis): no ratelimit filter and no
 *   cluster; the routes with an upstream mark their Check (context_extensions `rate_limit:
 *   global`), which takes the bucket; RATELIMIT_SERVICE_ADDRESS: envoy.filters.http.ratelimit right
 *   after the local bucket, the same descriptors, fail open with a 100-ms timeout, its own HTTP/2
 *   cluster; `local` (and no Redis) renders exactly what the edge rendered before the global limit
 *   existed: no ratelimit filter, no cluster;
 * - the envoyproxy/ratelimit config rendered from the same settings (`--ratelimit-config`);
 * - live: two Envoys on one TS service (the bucket taken in Check) hold a client to RATE_BURST in all; a 429 of the global stage
 *   carries what the local stage's does; an allowed request carries one set of x-ratelimit
 *   headers; orders and ingests are limited too; the service slow or stopped → the request passes
 *   on the local limit, which still applies, and Envoy counts it.
 *
 *   scripts/node --test envoy/test/global-rate-limit.test.ts
 */
import assert from 'node:assert/strict';
import { existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { Writable } from 'node:stream';
import { after, before, describe, test } from 'node:test';
import { parse } from 'yaml';
import { createRedis } from '../../authz/src/common/adapters/redis.ts';
import { loadConfig, type Env } from '../../authz/src/common/config.ts';
import { createLogger } from '../../authz/src/common/log.ts';
import { createMetrics } from '../../authz/src/common/metrics.ts';
import { ALLOW } from '../../authz/src/authz/decision.ts';
import { createGrpcServer, type AuthzGrpcServer } from '../../authz/src/authz/grpc-server.ts';
import { RedisBuckets, type Buckets } from '../../authz/src/ratelimit/bucket.ts';
import { rateLimitService } from '../../authz/src/ratelimit/service.ts';
import { readTokenFile } from '../../authz/src/common/token.ts';
import { tokenFile } from '../../authz/test/helpers.ts';
import { createCheckLimiter, withGlobalLimit } from '../../authz/src/ratelimit/check-limit.ts';
import { PrivateRedis } from '../../testkit/redis-server.ts';
import { envoyBinary, validateBootstrap } from '../envoy-bin.ts';
import { main as renderCli } from '../render-cli.ts';
import { CLUSTER, FILTER, RATE_LIMIT_SERVICE_TIMEOUT_MS, rateLimitServiceConfig, renderEnvoy, type JsonObject } from '../render.ts';
import { RATE_LIMIT_TOKEN_SECRET } from '../render/names.ts';
import { at, certPaths, clusterNamed, httpFilters, makeCerts, request, startEnvoy, startMarketStub, tempDir, type LiveEnvoy, type Upstream } from './helpers.ts';

const work = tempDir('edge-envoy-grl-');
/** The RateLimitService token (RATELIMIT_SERVICE_TOKEN_FILE) Envoy sends and the service requires. */
const rlToken = tokenFile();
after(() => {
  work.cleanup();
  rlToken.remove();
});
type Obj = Record<string, unknown>;

function render(env: Env): { bootstrap: JsonObject; text: string; file: string } {
  const dir = join(work.dir, `r-${Math.random().toString(36).slice(2)}`);
  mkdirSync(dir);
  const text = renderEnvoy(loadConfig(env), { sdsPath: '/etc/envoy/sds-client-cert.yaml' }).bootstrap;
  const file = join(dir, 'envoy.yaml');
  writeFileSync(file, text);
  return { bootstrap: parse(text) as JsonObject, text, file };
}
const filterNames = (b: JsonObject): unknown[] => httpFilters(b).map((f) => f['name']);
const filterNamed = (b: JsonObject, name: string): Obj => httpFilters(b).find((f) => f['name'] === name)!;
const REDIS = 'redis://127.0.0.1:6379/0';
/** A route's Check mark (context_extensions rate_limit) for the given filter, undefined when none. */
const markOf = (per: Obj, filter: string): unknown => (per[filter] === undefined ? undefined : (at(per[filter], 'check_settings.context_extensions') as Obj)['rate_limit']);

describe('rendered: RATE_LIMIT_SCOPE', () => {
  test('global (the default with REDIS_URL): no ratelimit filter, no rate limit cluster; one Check of every route with an upstream takes the bucket (an ingest\'s or order\'s header phase, before its body), never a route Envoy answers itself', () => {
    const { bootstrap, file } = render({ REDIS_URL: REDIS, XFF_NUM_TRUSTED_HOPS: '1', AUTHZ_GRPC_PORT: '9300' });
    assert.deepEqual(filterNames(bootstrap), [FILTER.headerMutation, FILTER.rateLimit, FILTER.xffGuard, FILTER.headerPhase,
      FILTER.extAuthz, FILTER.lua, FILTER.router]);
    assert.equal(clusterNamed(bootstrap, CLUSTER.rateLimit), undefined);
    const routes = at(bootstrap, 'static_resources.listeners[0].filter_chains[0].filters[0].typed_config.route_config.virtual_hosts[0].routes') as Obj[];
    const marks = routes.map((r) => {
      const per = r['typed_per_filter_config'] as Obj;
      return [r['name'], markOf(per, FILTER.extAuthz), markOf(per, FILTER.headerPhase)];
    });
    assert.deepEqual(marks, [
      ['ingest_payload_too_large', undefined, undefined], ['ingest', undefined, 'global'], ['ingest_method_not_allowed', undefined, undefined],
      ['internal_not_found', undefined, undefined], ['orders_payload_too_large', undefined, undefined], ['orders_no_backend', undefined, undefined], ['orders_method_not_allowed', undefined, undefined], ['geoblock', 'global', undefined], ['read', 'global', undefined],
    ]);
    // With an order backend the orders route has an upstream: its header phase takes the bucket.
    const withBackend = render({
      REDIS_URL: REDIS, ORDER_BACKEND_URL: 'https://orders.example:9443', ORDER_BACKEND_CA_FILE: '/x/ca.pem', EDGE_CLIENT_CERT_FILE: '/x/c.crt', EDGE_CLIENT_KEY_FILE: '/x/c.key',
    }).bootstrap;
    const orders = (at(withBackend, 'static_resources.listeners[0].filter_chains[0].filters[0].typed_config.route_config.virtual_hosts[0].routes') as Obj[])
      .find((r) => r['name'] === 'orders')!['typed_per_filter_config'] as Obj;
    assert.deepEqual([markOf(orders, FILTER.extAuthz), markOf(orders, FILTER.headerPhase)], [undefined, 'global']);
    assert.ok(routes.every((r) => (r['typed_per_filter_config'] as Obj)[FILTER.bodyBuffer] === undefined), 'nothing waits before ext_authz: no body buffer');
    // The local stage writes its headers on its own 429s only (values as Envoy's own for a 1-s fill);
    // the Check writes the global budget's.
    const local = filterNamed(bootstrap, FILTER.rateLimit)['typed_config'] as Obj;
    assert.equal(local['enable_x_ratelimit_headers'], undefined, 'off');
    assert.deepEqual((local['response_headers_to_add'] as Obj[]).map((h) => [at(h, 'header.key'), at(h, 'header.value')]),
      [['x-ratelimit-limit', '40'], ['x-ratelimit-remaining', '0'], ['x-ratelimit-reset', '1'], ['retry-after', '1']]);
    const v = validateBootstrap(file);
    assert.equal(v.exitCode, 0, v.output);
    assert.doesNotMatch(v.output, /deprecated/i);
  });

  test('RATELIMIT_SERVICE_ADDRESS: ratelimit filter after the local bucket (and the XFF guard), same descriptors, fail open within 100 ms, bodies buffered first, no Check takes a bucket', () => {
    const { bootstrap, file } = render({ REDIS_URL: REDIS, XFF_NUM_TRUSTED_HOPS: '1', RATELIMIT_SERVICE_ADDRESS: '127.0.0.1:8081' });
    assert.deepEqual(filterNames(bootstrap), [FILTER.headerMutation, FILTER.rateLimit, FILTER.xffGuard, FILTER.headerPhase,
      FILTER.bodyBuffer, FILTER.globalRateLimit, FILTER.extAuthz, FILTER.lua, FILTER.router]);
    // Bodies are whole before the service is asked: the buffer filter, off in the chain, on for the
    // ingest and orders routes with their limits (a body over it is 413 before anything waits).
    assert.equal(filterNamed(bootstrap, FILTER.bodyBuffer)['disabled'], true);
    const routes = at(bootstrap, 'static_resources.listeners[0].filter_chains[0].filters[0].typed_config.route_config.virtual_hosts[0].routes') as Obj[];
    const buffered = routes.filter((r) => (r['typed_per_filter_config'] as Obj)[FILTER.bodyBuffer] !== undefined)
      .map((r) => [r['name'], at((r['typed_per_filter_config'] as Obj)[FILTER.bodyBuffer], 'buffer.max_request_bytes')]);
    assert.deepEqual(buffered, [['ingest', 1_048_576]], 'no order backend here: the orders route answers 502 itself');
    assert.ok(routes.every((r) => markOf(r['typed_per_filter_config'] as Obj, FILTER.extAuthz) === undefined));
    const local = filterNamed(bootstrap, FILTER.rateLimit)['typed_config'] as Obj;
    const global = filterNamed(bootstrap, FILTER.globalRateLimit)['typed_config'] as Obj;
    assert.deepEqual(global['rate_limits'], local['rate_limits'], 'the same descriptors');
    assert.equal(global['domain'], 'edge');
    assert.equal(global['failure_mode_deny'], false);
    assert.equal(global['timeout'], `${RATE_LIMIT_SERVICE_TIMEOUT_MS / 1000}s`);
    assert.equal(global['disable_x_envoy_ratelimited_header'], true);
    assert.equal(at(global, 'rate_limit_service.grpc_service.envoy_grpc.cluster_name'), CLUSTER.rateLimit);
    assert.equal(at(global, 'rate_limit_service.transport_api_version'), 'V3');
    assert.equal(local['enable_x_ratelimit_headers'], undefined, 'off');
    const v = validateBootstrap(file);
    assert.equal(v.exitCode, 0, v.output);
    assert.doesNotMatch(v.output, /deprecated/i);
  });

  test('RATELIMIT_SERVICE_ADDRESS: the cluster names that service (by DNS: re-resolved), Envoy writes draft-03 headers from its statuses; global without Redis', () => {
    const { bootstrap, file } = render({ RATELIMIT_SERVICE_ADDRESS: 'ratelimit.internal:8081' });
    assert.ok(filterNames(bootstrap).includes(FILTER.globalRateLimit));
    assert.equal(at(filterNamed(bootstrap, FILTER.globalRateLimit), 'typed_config.enable_x_ratelimit_headers'), 'DRAFT_VERSION_03');
    const cluster = clusterNamed(bootstrap, CLUSTER.rateLimit)!;
    assert.deepEqual(at(cluster, 'load_assignment.endpoints[0].lb_endpoints[0].endpoint.address.socket_address'), { address: 'ratelimit.internal', port_value: 8081 });
    assert.equal(at(cluster, 'cluster_type.typed_config.dns_refresh_rate'), '1s');
    assert.equal(validateBootstrap(file).exitCode, 0);
    const v6 = render({ RATELIMIT_SERVICE_ADDRESS: '[::1]:8081' }).bootstrap;
    assert.equal(at(clusterNamed(v6, CLUSTER.rateLimit), 'load_assignment.endpoints[0].lb_endpoints[0].endpoint.address.socket_address.address'), '::1');
  });

  test('RATELIMIT_SERVICE_TOKEN_FILE: every call to the rate limit service carries authorization: Bearer <token>, which Envoy reads from the file (in no rendered file); without it, no injector and no secret', () => {
    const { bootstrap, text, file } = render({ REDIS_URL: REDIS, RATELIMIT_SERVICE_ADDRESS: '127.0.0.1:8081', RATELIMIT_SERVICE_TOKEN_FILE: rlToken.file });
    assert.ok(!text.includes(rlToken.token), 'the token is not in the config');
    assert.deepEqual(at(bootstrap, 'static_resources.secrets'), [{ name: RATE_LIMIT_TOKEN_SECRET, generic_secret: { secret: { filename: rlToken.file } } }]);
    const upstreamFilters = (b: JsonObject): Obj[] | undefined => ((clusterNamed(b, CLUSTER.rateLimit)?.['typed_extension_protocol_options'] as Obj)['envoy.extensions.upstreams.http.v3.HttpProtocolOptions'] as Obj)['http_filters'] as Obj[] | undefined;
    const filters = upstreamFilters(bootstrap) ?? [];
    assert.deepEqual(filters.map((f) => f['name']), ['envoy.filters.http.credential_injector', 'envoy.filters.http.upstream_codec']);
    assert.deepEqual(at(filters[0], 'typed_config.credential.typed_config'), {
      '@type': 'type.googleapis.com/envoy.extensions.http.injected_credentials.generic.v3.Generic',
      credential: { name: RATE_LIMIT_TOKEN_SECRET }, header: 'authorization', header_value_prefix: 'Bearer ',
    });
    assert.equal(at(filters[0], 'typed_config.allow_request_without_credential'), false, 'a call is never sent without it');
    const v = validateBootstrap(file);
    assert.equal(v.exitCode, 0, v.output);
    const plain = render({ REDIS_URL: REDIS, RATELIMIT_SERVICE_ADDRESS: '127.0.0.1:8081' }).bootstrap;
    assert.equal((plain['static_resources'] as Obj)['secrets'], undefined);
    assert.equal(upstreamFilters(plain), undefined);
    assert.throws(() => loadConfig({ REDIS_URL: REDIS, RATELIMIT_SERVICE_TOKEN_FILE: rlToken.file }), /RATELIMIT_SERVICE_TOKEN_FILE: expected to be set only with RATELIMIT_SERVICE_ADDRESS/);
  });

  test('local (and no Redis): byte for byte the config without the global limit — no ratelimit filter, no rate limit cluster, the local bucket writes its headers', () => {
    const plain = render({});
    const local = render({ REDIS_URL: REDIS, RATE_LIMIT_SCOPE: 'local' });
    assert.equal(local.text, plain.text);
    for (const b of [plain.bootstrap, local.bootstrap]) {
      assert.ok(!filterNames(b).includes(FILTER.globalRateLimit));
      assert.equal(clusterNamed(b, CLUSTER.rateLimit), undefined);
      const rl = filterNamed(b, FILTER.rateLimit)['typed_config'] as Obj;
      assert.equal(rl['enable_x_ratelimit_headers'], 'DRAFT_VERSION_03');
      // Its 429s also carry Retry-After (the next token is at most 1 s away: rate-limit.ts LOCAL_RETRY_AFTER).
      assert.deepEqual((rl['response_headers_to_add'] as Obj[]).map((h) => [at(h, 'header.key'), at(h, 'header.value')]), [['retry-after', '1']]);
    }
    // The same for a backend and trusted hops: the scope is the only difference global makes.
    const withBackend = { ORDER_BACKEND_URL: 'https://10.0.0.1:8443', ORDER_BACKEND_CA_FILE: '/a', EDGE_CLIENT_CERT_FILE: '/b/c', EDGE_CLIENT_KEY_FILE: '/b/k', XFF_NUM_TRUSTED_HOPS: '2' };
    assert.equal(render({ ...withBackend, REDIS_URL: REDIS, RATE_LIMIT_SCOPE: 'local' }).text, render(withBackend).text);
  });

  test('settings: global needs Redis or another service; local refuses a service address; bad values name the setting', () => {
    assert.equal(loadConfig({}).rateLimitScope, 'local');
    assert.equal(loadConfig({ REDIS_URL: REDIS }).rateLimitScope, 'global');
    assert.equal(loadConfig({ REDIS_URL: REDIS, RATE_LIMIT_SCOPE: 'LOCAL' }).rateLimitScope, 'local');
    assert.throws(() => loadConfig({ RATE_LIMIT_SCOPE: 'global' }), /RATE_LIMIT_SCOPE: expected "local" without REDIS_URL/);
    assert.throws(() => loadConfig({ RATE_LIMIT_SCOPE: 'cluster' }), /RATE_LIMIT_SCOPE: expected "global" or "local", got "cluster"/);
    assert.throws(() => loadConfig({ RATE_LIMIT_SCOPE: 'local', RATELIMIT_SERVICE_ADDRESS: 'rl:8081' }), /RATELIMIT_SERVICE_ADDRESS: expected unset with RATE_LIMIT_SCOPE=local/);
    for (const bad of ['rl', 'rl:0', 'rl:65536', '::1:8081', '[rl]:8081', 'http://rl:8081']) {
      assert.throws(() => loadConfig({ RATELIMIT_SERVICE_ADDRESS: bad }), /RATELIMIT_SERVICE_ADDRESS: expected host:port/, bad);
    }
    assert.deepEqual(loadConfig({ RATELIMIT_SERVICE_ADDRESS: '10.0.0.5:8081' }).rateLimitService, { host: '10.0.0.5', port: 8081 });
  });
});

describe('rendered: the envoyproxy/ratelimit config (--ratelimit-config)', () => {
  test('domain edge, both client descriptors at RPS_PER_IP per second, the IPv6 prefix\'s at RPS_PER_PREFIX', () => {
    const doc = parse(rateLimitServiceConfig(loadConfig({ RPS_PER_IP: '7', RATE_BURST: '9', RPS_PER_PREFIX: '30' }))) as Obj;
    assert.deepEqual(doc, {
      domain: 'edge',
      descriptors: [
        { key: 'client', value: 'v4', descriptors: [{ key: 'client_ip', rate_limit: { unit: 'second', requests_per_unit: 7 } }] },
        { key: 'client', value: 'v6', descriptors: [{ key: 'masked_remote_address', rate_limit: { unit: 'second', requests_per_unit: 7 } }] },
        { key: 'prefix', value: 'v6', descriptors: [{ key: 'masked_remote_address', rate_limit: { unit: 'second', requests_per_unit: 30 } }] },
      ],
    });
  });

  test('render-cli --ratelimit-config writes it beside the bootstrap', () => {
    const out = join(work.dir, 'cli');
    const file = join(work.dir, 'rls', 'config', 'edge.yaml');
    assert.equal(renderCli([out, '--ratelimit-config', file], { RATELIMIT_SERVICE_ADDRESS: '127.0.0.1:8091', RPS_PER_IP: '20' }), 0);
    assert.ok(existsSync(join(out, 'envoy.yaml')));
    assert.equal(at(parse(readFileSync(file, 'utf8')), 'descriptors[0].descriptors[0].rate_limit.requests_per_unit'), 20);
  });
});

const envoyAvailable = existsSync(envoyBinary());

describe('live Envoy 1.40: the global rate limit', { skip: envoyAvailable ? false : 'no Envoy binary' }, () => {
  const logger = createLogger('silent', new Writable({ write: (_c, _e, cb) => cb() }));
  const limits = loadConfig({ RPS_PER_IP: '1', RATE_BURST: '3' });
  let redis: PrivateRedis;
  let redisClient: ReturnType<typeof createRedis>;
  let ts: AuthzGrpcServer;
  let other: AuthzGrpcServer;
  let otherDelayMs = 0;
  let market: Upstream<import('node:http').Server>;
  let a: LiveEnvoy;
  let b: LiveEnvoy;
  let external: LiveEnvoy;
  let ip = 0;
  let checks = 0;
  const client = (): Record<string, string> => ({ 'x-forwarded-for': `203.0.113.${++ip}` });
  const metrics = createMetrics({ geoipBuildEpochSecs: () => 0, defaultMetrics: false });
  const otherMetrics = createMetrics({ geoipBuildEpochSecs: () => 0, defaultMetrics: false });
  let unsigned: LiveEnvoy;
  let localOnly: LiveEnvoy;
  /** Takes `n` tokens of `ip`'s bucket in the RateLimitService's buckets (as if other replicas had spent them). */
  let drainOther: (ip: string, n: number) => Promise<unknown>;
  const rateLimited = async (): Promise<number> => Number(/edge_ratelimit_decisions_total\{code="over_limit"\} (\d+)/.exec(await metrics.registry.metrics())?.[1]);

  before(async () => {
    redis = await PrivateRedis.start();
    redisClient = createRedis(redis.url);
    await new Promise((r) => redisClient.once('ready', r));
    const buckets = new RedisBuckets(redisClient, limits);
    // The TS service as in production: ext_authz Check taking the bucket (check-limit.ts); no
    // RateLimitService on its port (app.ts serves it only with RATELIMIT_SERVICE_TOKEN_FILE).
    const evaluate = withGlobalLimit(createCheckLimiter({ buckets, limits, metrics, logger }), () => { checks++; return ALLOW; });
    ts = createGrpcServer({ evaluate, observe: () => {}, onError: () => {} });
    const tsPort = await ts.listen('127.0.0.1', 0);
    ts.setServing(true);
    // The TS service's RateLimitService at RATELIMIT_SERVICE_ADDRESS (requiring the token Envoy
    // sends from RATELIMIT_SERVICE_TOKEN_FILE), slowed or stopped at will.
    const slow: Buckets = { take: async (c, h) => { if (otherDelayMs > 0) await sleep(otherDelayMs); return buckets.take(`other:${c}`, h); } };
    drainOther = (c, n) => buckets.take(`other:${c}`, n);
    other = createGrpcServer({ evaluate: () => ALLOW, observe: () => {}, onError: () => {}, services: [rateLimitService({
      buckets: slow, limits, metrics: otherMetrics, logger, token: readTokenFile('RATELIMIT_SERVICE_TOKEN_FILE', rlToken.file),
    })] });
    const otherPort = await other.listen('127.0.0.1', 0);
    other.setServing(true);
    market = await startMarketStub();
    // An order backend is configured (nothing listens there): the orders route then has a cluster.
    const certDir = join(work.dir, 'certs');
    mkdirSync(certDir);
    makeCerts(certDir);
    const certs = certPaths(certDir);
    const base: Env = {
      EDGE_PORT: '0', ENVOY_ADMIN_PORT: '0', AUTHZ_GRPC_PORT: String(tsPort), MARKET_PORT: String(market.port),
      XFF_NUM_TRUSTED_HOPS: '1', RPS_PER_IP: String(limits.rpsPerIp), RATE_BURST: String(limits.rateBurst),
      ORDER_BACKEND_URL: 'https://127.0.0.1:9', ORDER_BACKEND_CA_FILE: certs.caFile, EDGE_CLIENT_CERT_FILE: certs.clientCert, EDGE_CLIENT_KEY_FILE: certs.clientKey,
    };
    const start = async (name: string, env: Env): Promise<LiveEnvoy> => {
      const dir = join(work.dir, name);
      mkdirSync(dir, { recursive: true });
      const r = renderEnvoy(loadConfig(env), { sdsPath: join(dir, 'sds.yaml'), accessLogPath: join(dir, 'access.log') });
      writeFileSync(join(dir, 'envoy.yaml'), r.bootstrap);
      if (r.sds !== undefined) writeFileSync(join(dir, 'sds.yaml'), r.sds);
      return startEnvoy(join(dir, 'envoy.yaml'), dir);
    };
    [a, b, external, unsigned, localOnly] = await Promise.all([
      start('replica-a', { ...base, REDIS_URL: redis.url }),
      start('replica-b', { ...base, REDIS_URL: redis.url }),
      start('external', { ...base, RATELIMIT_SERVICE_ADDRESS: `127.0.0.1:${otherPort}`, RATELIMIT_SERVICE_TOKEN_FILE: rlToken.file }),
      // An Envoy without the token, standing for any caller that reaches the port.
      start('unsigned', { ...base, RATELIMIT_SERVICE_ADDRESS: `127.0.0.1:${otherPort}` }),
      // RATE_LIMIT_SCOPE=local (no Redis): the local bucket alone, its own draft-03 headers.
      start('local-only', base),
    ]);
  });

  after(async () => {
    await Promise.all([a?.stop(), b?.stop(), external?.stop(), unsigned?.stop(), localOnly?.stop()]);
    await Promise.all([ts?.close(0), other?.close(0), market?.close()]);
    redisClient?.disconnect();
    await redis?.stop();
  });

  test('two Envoys on one TS service (the bucket taken in Check): a client alternating between them gets RATE_BURST in all (each Envoy alone would allow it); another client is unaffected', async () => {
    const me = client();
    const statuses: number[] = [];
    for (let i = 0; i < 6; i++) statuses.push((await request((i % 2 === 0 ? a : b).edgePort, 'GET', '/healthz', me)).status);
    assert.deepEqual(statuses, [200, 200, 200, 429, 429, 429]);
    assert.equal((await request(b.edgePort, 'GET', '/healthz', client())).status, 200);
  });

  test('a 429 of the global stage is what the local stage answers: status, JSON body, the three x-ratelimit headers, Retry-After, no x-envoy-ratelimited', async () => {
    const me = client();
    for (let i = 0; i < 3; i++) assert.equal((await request(a.edgePort, 'GET', '/healthz', me)).status, 200);
    const localStage = await request(a.edgePort, 'GET', '/healthz', me);
    const before = await rateLimited();
    const globalStage = await request(b.edgePort, 'GET', '/healthz', me);
    assert.equal(await rateLimited(), before + 1, 'B\'s own bucket was full: the global stage refused it');
    // The body names each answer's own x-request-id (docs/api.md "Errors"); apart from it they are the same bytes.
    const view = (r: typeof localStage): unknown => [r.status, r.body.replace(String(r.headers['x-request-id']), '<id>'), r.headers['content-type'],
      r.headers['x-ratelimit-limit'], r.headers['x-ratelimit-remaining'], r.headers['x-ratelimit-reset'], r.headers['x-envoy-ratelimited'], r.headers['retry-after']];
    assert.deepEqual(view(globalStage), view(localStage));
    // Retry-After (issue 31): once, ≥ 1, the value of x-ratelimit-reset, from either stage.
    assert.deepEqual(view(localStage), [429, '{"error":"too many requests","message":"rate limit exceeded for this client address","requestId":"<id>"}\n', 'application/json', '3', '0', '1', undefined, '1']);
  });

  test('an allowed request carries one set of x-ratelimit headers: the global budget\'s', async () => {
    const me = client();
    await request(a.edgePort, 'GET', '/healthz', me);
    const r = await request(b.edgePort, 'GET', '/healthz', me);
    assert.equal(r.status, 200);
    assert.deepEqual([r.headers['x-ratelimit-limit'], r.headers['x-ratelimit-remaining'], r.headers['x-ratelimit-reset'], r.headers['retry-after']], ['3', '1', '1', undefined]);
  });

  test('RATE_LIMIT_SCOPE=local: the local bucket\'s 429 carries Retry-After equal to its own x-ratelimit-reset (≥ 1); an allowed answer carries none', async () => {
    const me = client();
    const replies = [];
    for (let i = 0; i < 4; i++) replies.push(await request(localOnly.edgePort, 'GET', '/healthz', me));
    assert.deepEqual(replies.map((r) => r.status), [200, 200, 200, 429]);
    assert.deepEqual(replies.slice(0, 3).map((r) => r.headers['retry-after']), [undefined, undefined, undefined]);
    const refused = replies[3]!;
    assert.equal(refused.headers['retry-after'], '1');
    assert.equal(refused.headers['retry-after'], refused.headers['x-ratelimit-reset'], 'the same number as Envoy\'s own reset');
    assert.equal(JSON.parse(refused.body).error, 'too many requests');
  });

  test('RATELIMIT_SERVICE_ADDRESS (the TS RateLimitService): one set of x-ratelimit headers, not two (the review\'s `x-ratelimit-remaining: 39, 39`); its 429 carries Retry-After = x-ratelimit-reset', async () => {
    const me = client();
    const ok = await request(external.edgePort, 'GET', '/healthz', me);
    assert.equal(ok.status, 200);
    // A duplicated header reaches Node joined with ", ": one value each proves one header each.
    assert.deepEqual([ok.headers['x-ratelimit-limit'], ok.headers['x-ratelimit-remaining'], ok.headers['x-ratelimit-reset'], ok.headers['retry-after']], ['3', '2', '1', undefined]);
    // The global budget spent elsewhere (the external Envoy's own bucket still has 2 tokens): the service refuses.
    const ip_ = me['x-forwarded-for']!;
    await drainOther(ip_, 2);
    const refused = await request(external.edgePort, 'GET', '/healthz', me);
    assert.equal(refused.status, 429);
    assert.deepEqual([refused.headers['x-ratelimit-limit'], refused.headers['x-ratelimit-remaining'], refused.headers['x-ratelimit-reset'], refused.headers['retry-after']], ['3', '0', '1', '1']);
    assert.equal(JSON.parse(refused.body).error, 'too many requests');
  });

  test('orders and ingests are limited by the global stage too; a route Envoy answers itself (no upstream) meets the local stage only', async () => {
    const me = client();
    for (let i = 0; i < 3; i++) await request(a.edgePort, 'GET', '/healthz', me);
    const before = await rateLimited();
    const order = await request(b.edgePort, 'POST', '/v1/orders', { ...me, 'content-type': 'application/json' }, '{}');
    const ingest = await request(b.edgePort, 'POST', '/internal/ingest/market', { ...me, 'content-type': 'application/json' }, '{}');
    assert.deepEqual([order.status, ingest.status], [429, 429]);
    assert.equal(await rateLimited(), before + 2);
    // Only the routes with a cluster take the global bucket (as Envoy's ratelimit filter asks only
    // for them): the 404/405 direct responses are held by each Envoy's own bucket (here: B's, one token left).
    assert.equal((await request(b.edgePort, 'GET', '/internal/other', me)).status, 404);
    assert.equal(await rateLimited(), before + 2, 'not asked');
  });

  test('an order body declared over ORDER_MAX_BYTES is 413 at once (even to a client that sends its whole body before reading): no token taken, authz asked for geo only, never with the body', async () => {
    const before = (await metrics.registry.getSingleMetric('edge_ratelimit_decisions_total')?.get())?.values.reduce((n, v) => n + v.value, 0);
    const checksBefore = checks;
    const r = await fetch(`http://127.0.0.1:${b.edgePort}/v1/orders`, {
      method: 'POST', body: JSON.stringify({ payload: 'A'.repeat(70_000) }), headers: { ...client(), 'content-type': 'application/json' }, signal: AbortSignal.timeout(5000),
    });
    assert.deepEqual([r.status, ((await r.json()) as Obj)['error']], [413, 'payload_too_large']);
    const after = (await metrics.registry.getSingleMetric('edge_ratelimit_decisions_total')?.get())?.values.reduce((n, v) => n + v.value, 0);
    assert.equal(after, before, 'the bucket was not taken (Envoy answers the route itself)');
    assert.equal(checks, checksBefore + 1, 'one Check, geo only: no header phase, no body phase');
  });

  test('RATELIMIT_SERVICE_ADDRESS + RATELIMIT_SERVICE_TOKEN_FILE: Envoy\'s calls carry the token and are answered (the global stage refuses past RATE_BURST); an Envoy without it is refused UNAUTHENTICATED, counted as an error, and its requests meet its local limit only', async () => {
    const decisions = async (): Promise<number> => ((await otherMetrics.registry.getSingleMetric('edge_ratelimit_decisions_total')?.get())?.values ?? []).reduce((n, v) => n + v.value, 0);
    const me = client();
    const before = await decisions();
    for (let i = 0; i < 3; i++) assert.equal((await request(external.edgePort, 'GET', '/healthz', me)).status, 200);
    assert.equal(await decisions(), before + 3, 'each call with the token was decided');
    const errorsBefore = Number((await unsigned.stats('ratelimit')).get('cluster.market.ratelimit.error') ?? 0);
    const other = client();
    const statuses: number[] = [];
    for (let i = 0; i < 4; i++) statuses.push((await request(unsigned.edgePort, 'GET', '/healthz', other)).status);
    assert.deepEqual(statuses, [200, 200, 200, 429], 'the local bucket (RATE_BURST 3) still holds');
    assert.equal(await decisions(), before + 3, 'no call without the token reached a bucket');
    assert.equal(Number((await unsigned.stats('ratelimit')).get('cluster.market.ratelimit.error')), errorsBefore + 3, 'refused, counted by Envoy');
  });

  test('the service slower than its 100-ms timeout: the request passes after ~100 ms on the local limit; Envoy counts the error', async () => {
    otherDelayMs = 300;
    try {
      const me = client();
      const t0 = Date.now();
      const r = await request(external.edgePort, 'GET', '/healthz', me);
      const took = Date.now() - t0;
      assert.equal(r.status, 200);
      assert.ok(took >= RATE_LIMIT_SERVICE_TIMEOUT_MS - 5 && took < 250, `answered after ${took} ms`);
      const stats = await external.stats('ratelimit');
      assert.ok(Number(stats.get('cluster.market.ratelimit.error')) >= 1, JSON.stringify([...stats]));
      assert.ok(Number(stats.get('cluster.market.ratelimit.failure_mode_allowed')) >= 1);
    } finally {
      otherDelayMs = 0;
    }
  });

  test('the service stopped: requests pass, the local limit still applies (RATE_BURST, then 429), Envoy counts every failure', async () => {
    await other.close(0);
    const me = client();
    const errorsBefore = Number((await external.stats('ratelimit')).get('cluster.market.ratelimit.failure_mode_allowed'));
    const statuses: number[] = [];
    for (let i = 0; i < 5; i++) statuses.push((await request(external.edgePort, 'GET', '/healthz', me)).status);
    assert.deepEqual(statuses, [200, 200, 200, 429, 429]);
    const stats = await external.stats('ratelimit');
    assert.equal(Number(stats.get('cluster.market.ratelimit.failure_mode_allowed')), errorsBefore + 3, 'each request the local bucket let through');
    assert.ok(Number(stats.get('cluster.market.ratelimit.error')) >= 3);
  });
});
