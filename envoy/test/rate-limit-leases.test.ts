/**
 * Token leases of the global rate limit (RATE_LEASE_TOKENS, RATE_LEASE_MS; authz/src/ratelimit/
 * bucket.ts) through a live Envoy 1.40: the TS service's Check takes the bucket (as in production,
 * RATELIMIT_SERVICE_ADDRESS unset) on a private redis-server, one busy client sends through Envoy.
 * Most of its Checks are answered from the process's lease (they never reach a Redis call), every
 * answer still carries the global budget's x-ratelimit headers, and `x-ratelimit-remaining` never
 * counts a leased-but-unspent token as spent.
 *
 *   scripts/node --test envoy/test/rate-limit-leases.test.ts
 */
import assert from 'node:assert/strict';
import { existsSync, mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { Writable } from 'node:stream';
import { after, before, describe, test } from 'node:test';
import { createRedis } from '../../authz/src/common/adapters/redis.ts';
import { loadConfig } from '../../authz/src/common/config.ts';
import { createLogger } from '../../authz/src/common/log.ts';
import { createMetrics } from '../../authz/src/common/metrics.ts';
import { ALLOW } from '../../authz/src/authz/decision.ts';
import { createGrpcServer, type AuthzGrpcServer } from '../../authz/src/authz/grpc-server.ts';
import { BATCH, RedisBuckets } from '../../authz/src/ratelimit/bucket.ts';
import { createCheckLimiter, withGlobalLimit } from '../../authz/src/ratelimit/check-limit.ts';
import { PrivateRedis } from '../../testkit/redis-server.ts';
import { envoyBinary } from '../envoy-bin.ts';
import { renderEnvoy } from '../render.ts';
import { request, startEnvoy, startMarketStub, tempDir, type LiveEnvoy, type Upstream } from './helpers.ts';

const work = tempDir('edge-envoy-leases-');

describe('live Envoy 1.40: token leases of the global rate limit', { skip: existsSync(envoyBinary()) ? false : 'no Envoy binary' }, () => {
  const logger = createLogger('silent', new Writable({ write: (_c, _e, cb) => cb() }));
  // A large bucket refilled slowly (1/s): 400 requests fit, and x-ratelimit-remaining tracks what was spent.
  const limits = loadConfig({ RPS_PER_IP: '1', RATE_BURST: '1000' });
  let redis: PrivateRedis;
  let redisClient: ReturnType<typeof createRedis>;
  let ts: AuthzGrpcServer;
  let market: Upstream<import('node:http').Server>;
  let envoy: LiveEnvoy;
  /** Checks that went to Redis in a script call (the rest were answered from a lease). */
  let viaRedis = 0;
  let calls = 0;
  const metrics = createMetrics({ geoipBuildEpochSecs: () => 0, defaultMetrics: false });
  const failedOpen = async (): Promise<number> => Number(/edge_ratelimit_decisions_total\{code="fail_open"\} (\d+)/.exec(await metrics.registry.metrics())?.[1] ?? 0);

  before(async () => {
    redis = await PrivateRedis.start();
    redisClient = createRedis(redis.url);
    await new Promise((r) => redisClient.once('ready', r));
    // RATE_LEASE_MS 1000 rather than the default 100: a loaded test machine may leave more than
    // 100 ms between one client's calls, which would (correctly) keep its lease from growing.
    const buckets = new RedisBuckets(redisClient, limits, (n) => { calls++; viaRedis += n; }, BATCH, { tokens: 32, ms: 1000 });
    ts = createGrpcServer({ evaluate: withGlobalLimit(createCheckLimiter({ buckets, limits, metrics, logger }), () => ALLOW), observe: () => {}, onError: () => {} });
    const tsPort = await ts.listen('127.0.0.1', 0);
    ts.setServing(true);
    market = await startMarketStub();
    const dir = join(work.dir, 'edge');
    mkdirSync(dir, { recursive: true });
    const r = renderEnvoy(loadConfig({
      EDGE_PORT: '0', ENVOY_ADMIN_PORT: '0', AUTHZ_GRPC_PORT: String(tsPort), MARKET_PORT: String(market.port),
      XFF_NUM_TRUSTED_HOPS: '1', RPS_PER_IP: '1', RATE_BURST: '1000', REDIS_URL: redis.url,
    }), { sdsPath: join(dir, 'sds.yaml'), accessLogPath: join(dir, 'access.log') });
    writeFileSync(join(dir, 'envoy.yaml'), r.bootstrap);
    envoy = await startEnvoy(join(dir, 'envoy.yaml'), dir);
    // Each Envoy worker opens its HTTP/2 connection to authz on first use, and a cold process
    // answers its first Checks slowly (past the Check's timeout on a loaded machine): warm up
    // from other addresses before anything is measured.
    for (let round = 0; round < 3; round++) {
      await Promise.all(Array.from({ length: 8 }, (_, i) => request(envoy.edgePort, 'GET', '/healthz', { 'x-forwarded-for': `198.51.100.${i + 1}` })));
    }
    [viaRedis, calls] = [0, 0];
  });

  after(async () => {
    await envoy?.stop();
    await Promise.all([ts?.close(0), market?.close()]);
    redisClient?.disconnect();
    await redis?.stop();
    work.cleanup();
  });

  test('one busy client (8 streams × 50 requests): most Checks answered from the lease, every answer with the global budget\'s headers, remaining never below what it really spent', async (t) => {
    const me = { 'x-forwarded-for': '203.0.113.77' };
    const total = 400;
    const t0 = performance.now();
    const remaining: number[] = [];
    let bare = 0;
    const open0 = await failedOpen();
    await Promise.all(Array.from({ length: 8 }, async () => {
      for (let i = 0; i < total / 8; i++) {
        const r = await request(envoy.edgePort, 'GET', '/healthz', me);
        assert.equal(r.status, 200, r.body);
        // An answer without headers failed open (the bucket slower than 100 ms on a loaded machine): counted below.
        if (r.headers['x-ratelimit-limit'] === undefined) {
          bare++;
          continue;
        }
        assert.equal(r.headers['x-ratelimit-limit'], '1000');
        remaining.push(Number(r.headers['x-ratelimit-remaining']));
      }
    }));
    assert.equal(bare, (await failedOpen()) - open0, 'every answer carries the global budget\'s headers unless it failed open (counted)');
    // Every answer reports at least what is left after all 400 (a leased token still held by the
    // process is the client's; refill only adds). Without counting held tokens, an answer from a
    // lease would report up to 32 fewer. And at most the 32 a lease holds more than was spent (plus the refill meanwhile).
    assert.ok(Math.min(...remaining) >= limits.rateBurst - total, `lowest x-ratelimit-remaining ${Math.min(...remaining)}`);
    const refill = Math.ceil((performance.now() - t0) / 1000) * limits.rpsPerIp;
    assert.ok(Math.min(...remaining) <= limits.rateBurst - total + refill + 32, `the last answers report what was spent: lowest ${Math.min(...remaining)}`);
    t.diagnostic(`${viaRedis} of ${total} Checks in ${calls} Redis calls, the rest from leases; failed open ${bare}`);
    assert.ok(viaRedis * 2 < total, `${viaRedis} of ${total} Checks went to Redis (${calls} calls); the rest were answered from leases`);
  });
});
