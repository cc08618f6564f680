/**
 * The global rate limit taken in the ext_authz Check (authz/src/ratelimit/check-limit.ts), on the
 * real authz core over gRPC with its buckets on a private redis-server (RATE_LIMIT_SCOPE=global,
 * RATELIMIT_SERVICE_ADDRESS unset): only Checks Envoy marks (context_extensions `rate_limit:
 * global`) take a token; an ingest (header phase, marked, + body phase) is charged once; a refused request
 * reaches no stage (its nonce is not recorded); the 429 is Envoy's local 429 byte for byte with
 * the global budget's headers; an allow carries those headers as response_headers_to_add; the
 * client key is the one Envoy computes; Redis stopped or slow fails open to the local limit,
 * within the 100-ms bound, counted in the rate limit metrics.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { Writable } from 'node:stream';
import { setTimeout as sleep } from 'node:timers/promises';
import { Redis } from 'ioredis';
import { createLogger } from '../src/common/log.ts';
import { createMetrics, type AuthzMetrics } from '../src/common/metrics.ts';
import { configWarnings, loadConfig } from '../src/common/config.ts';
import { RATE_LIMIT_KEY_PREFIX, type BucketLimits, type Buckets } from '../src/ratelimit/bucket.ts';
import { createCheckLimiter, REMAINING_TABLE_MAX, resetSeconds, withGlobalLimit } from '../src/ratelimit/check-limit.ts';
import { ALLOW, deny } from '../src/authz/decision.ts';
import { decodeCheckRequest, type AuthzInput } from '../src/authz/codec/request.ts';
import { encodeCheckRequest, type CheckSpec } from '../../testkit/check-request.ts';
import { fakeMarkets, hmacHeaders } from './helpers.ts';
import { ingestBody, marketDoc } from '../../testkit/feed.ts';
import { startFixture, type Fixture } from './server-fixture.ts';
import { PrivateRedis } from '../../testkit/redis-server.ts';

/** The buckets' settings for these limits, the prefix's at their defaults (RATE_PREFIX_V6 48, 5 × each). */
const limitsOf = (rps: number, burst: number): BucketLimits => loadConfig({ RPS_PER_IP: String(rps), RATE_BURST: String(burst) });

const logger = createLogger('silent', new Writable({ write: (_c, _e, cb) => cb() }));
const MARK = { route: 'read', rate_limit: 'global' } as const;
const REQUEST_ID = '4b1c1a9e-3f0e-4a53-9d4e-7a3b2f1e0c11';
const BODY_429 = `{"error":"too many requests","message":"rate limit exceeded for this client address","requestId":"${REQUEST_ID}"}\n`;

type Raw = Awaited<ReturnType<Fixture['check']>>['raw'] & {
  ok_response?: { response_headers_to_add?: { header: { key: string; value: string }; append_action?: unknown }[]; headers?: unknown[] };
};
const pairs = (list: { header?: { key: string; value: string } }[] | undefined): [string, string][] => (list ?? []).map((h) => [h.header!.key, h.header!.value]);
const rlHeaders = (raw: Raw): [string, string][] => pairs(raw.ok_response?.response_headers_to_add).filter(([k]) => k.startsWith('x-ratelimit-'));

async function metric(text: Promise<string>, line: string): Promise<number> {
  const found = (await text).split('\n').find((l) => l.startsWith(`${line} `));
  return Number(found?.split(' ').at(-1) ?? NaN);
}

describe('global rate limit in Check – on the real core and a private redis-server', () => {
  let redis: PrivateRedis;
  let fx: Fixture;
  let admin: Redis;
  let n = 0;
  const ip = (): string => `198.51.100.${++n}`;
  const read = (clientIp: string, ext: Record<string, string> = MARK): CheckSpec => ({ headers: { 'x-edge-client-ip': clientIp }, contextExtensions: ext });
  const text = (): Promise<string> => fx.core.metricsText();

  before(async () => {
    redis = await PrivateRedis.start();
    admin = new Redis(redis.url);
    fx = await startFixture({
      env: { REDIS_URL: redis.url, RPS_PER_IP: '1', RATE_BURST: '3' },
      redisUrl: redis.url,
      markets: fakeMarkets([]),
    });
  });
  after(async () => {
    await fx?.close();
    admin?.disconnect();
    await redis?.stop();
  });

  test('a marked read: RATE_BURST allowed, each with the global budget\'s x-ratelimit headers (one set), then 429 byte for byte Envoy\'s local 429', async () => {
    const me = ip();
    const allowed: [string, string][][] = [];
    for (let i = 0; i < 3; i++) {
      const r = await fx.check(read(me));
      assert.equal(r.status, 200);
      allowed.push(rlHeaders(r.raw as Raw));
      assert.equal(((r.raw as Raw).ok_response?.headers ?? []).length, 0, 'nothing added upstream');
    }
    assert.deepEqual(allowed, [2, 1, 0].map((left) => [['x-ratelimit-limit', '3'], ['x-ratelimit-remaining', String(left)], ['x-ratelimit-reset', '1']]));
    const overBefore = await metric(text(), 'edge_ratelimit_decisions_total{code="over_limit"}');
    const r = await fx.check(read(me));
    assert.equal(r.status, 429);
    assert.equal(r.raw.denied_response?.body, BODY_429, 'the json_format local reply: the API error JSON, requestId, a newline');
    // Retry-After (issue 31): the seconds until the refusing bucket has a token, x-ratelimit-reset's value.
    assert.deepEqual(pairs(r.raw.denied_response?.headers), [['content-type', 'application/json'], ['x-ratelimit-limit', '3'], ['x-ratelimit-remaining', '0'], ['x-ratelimit-reset', '1'], ['retry-after', '1']]);
    assert.equal(await metric(text(), 'edge_ratelimit_decisions_total{code="over_limit"}'), overBefore + 1);
    assert.ok(await metric(text(), 'edge_authz_decisions_total{route="read",outcome="deny",code="too many requests"}') >= 1);
  });

  test('unmarked Checks (a route Envoy answers itself, a hand-made Check) take nothing: no key, no headers', async () => {
    const me = ip();
    for (let i = 0; i < 6; i++) {
      const r = await fx.check(read(me, { route: 'read' }));
      assert.equal(r.status, 200);
      assert.deepEqual(rlHeaders(r.raw as Raw), []);
    }
    assert.equal(await admin.exists(RATE_LIMIT_KEY_PREFIX + me), 0);
  });

  test('an ingest is charged once, in its header phase (marked), before its body exists; the body phase takes nothing; a refused ingest records no nonce', async () => {
    const me = ip();
    const body = ingestBody(marketDoc('0xabc', 1), fx.feed);
    // As Envoy sends them: the header phase marked, the body phase not.
    const ingest = (phase: boolean, headers: Record<string, string>): Promise<Awaited<ReturnType<Fixture['check']>>> => fx.check({
      method: 'POST', path: '/internal/ingest/market', headers: { ...headers, 'x-edge-client-ip': me, 'x-request-id': `${me}-${Math.random()}` },
      ...(phase ? {} : { body }),
      contextExtensions: phase ? { route: 'ingest', phase: 'headers', rate_limit: 'global' } : { route: 'ingest' },
    });
    const h1 = hmacHeaders(body, fx.hmacKey, Math.floor(Date.now() / 1000));
    const phase1 = await ingest(true, h1);
    assert.equal(phase1.status, 200);
    assert.deepEqual(rlHeaders(phase1.raw as Raw), [['x-ratelimit-limit', '3'], ['x-ratelimit-remaining', '2'], ['x-ratelimit-reset', '1']], 'the token, before the body');
    const first = await ingest(false, h1);
    assert.equal(first.status, 200, JSON.stringify(first.body));
    assert.deepEqual(rlHeaders(first.raw as Raw), [], 'no second token for the body phase');
    // Spend the rest with reads, then an ingest is refused on its headers: no body, no stage, its nonce stays free.
    for (let i = 0; i < 2; i++) assert.equal((await fx.check(read(me))).status, 200);
    const h2 = hmacHeaders(body, fx.hmacKey, Math.floor(Date.now() / 1000));
    assert.equal((await ingest(true, h2)).status, 429);
    await sleep(1100);
    assert.equal((await ingest(true, h2)).status, 200);
    const again = await ingest(false, h2);
    assert.notEqual(again.error, 'ingest_replay', 'the refused ingest\'s nonce was not recorded');
    assert.equal(again.status, 200);
  });

  test('a denial after the bucket let the request on carries the budget\'s headers among its own', async () => {
    const me = ip();
    const r = await fx.check({ method: 'POST', path: '/v1/orders', body: Buffer.from('{}'), headers: { 'x-edge-client-ip': me }, contextExtensions: { route: 'order', rate_limit: 'global' } });
    assert.equal(r.status, 400);
    const h = pairs(r.raw.denied_response?.headers);
    assert.ok(h.some(([k]) => k === 'content-type'));
    assert.deepEqual(h.filter(([k]) => k.startsWith('x-ratelimit-')), [['x-ratelimit-limit', '3'], ['x-ratelimit-remaining', '2'], ['x-ratelimit-reset', '1']]);
  });

  test('the client key is Envoy\'s: an IPv4-mapped address is its IPv4, any address of an IPv6 /64 is that /64', async () => {
    for (let i = 0; i < 3; i++) assert.equal((await fx.check(read(i % 2 === 0 ? '192.0.2.77' : '::ffff:192.0.2.77'))).status, 200);
    assert.equal((await fx.check(read('::ffff:c000:24d'))).status, 429, '::ffff:192.0.2.77 in hex');
    assert.equal(await admin.exists(`${RATE_LIMIT_KEY_PREFIX}192.0.2.77`), 1);
    for (let i = 0; i < 3; i++) assert.equal((await fx.check(read(`2001:db8:7:8::${i + 1}`))).status, 200);
    assert.equal((await fx.check(read('2001:db8:7:8:ffff::9'))).status, 429);
    assert.equal((await fx.check(read('2001:db8:7:9::1'))).status, 200, 'the next /64 is another client');
    assert.equal(await admin.exists(`${RATE_LIMIT_KEY_PREFIX}2001:db8:7:8::/64`), 1);
  });

  test('Redis stopped: every marked Check answered at once on its own policy (fail open, no headers), counted; Redis back: limited again', async () => {
    const me = ip();
    const [errors0, open0] = [await metric(text(), 'edge_ratelimit_redis_errors_total'), await metric(text(), 'edge_ratelimit_decisions_total{code="fail_open"}')];
    await redis.stop();
    try {
      for (let i = 0; i < 6; i++) {
        const t0 = Date.now();
        const r = await fx.check(read(me));
        assert.equal(r.status, 200, 'never failed closed because of the rate limit');
        assert.deepEqual(rlHeaders(r.raw as Raw), []);
        assert.ok(Date.now() - t0 < 100, `answered in ${Date.now() - t0} ms`);
      }
      assert.equal(await metric(text(), 'edge_ratelimit_redis_errors_total'), errors0 + 6);
      assert.equal(await metric(text(), 'edge_ratelimit_decisions_total{code="fail_open"}'), open0 + 6);
    } finally {
      await redis.resume();
    }
    for (let i = 0; i < 100 && fx.redis?.status !== 'ready'; i++) await sleep(50);
    const statuses: number[] = [];
    for (let i = 0; i < 4; i++) statuses.push((await fx.check(read(me))).status);
    assert.deepEqual(statuses, [200, 200, 200, 429]);
  });
});

describe('global rate limit in Check – the limiter alone', () => {
  const metricsOf = (): AuthzMetrics => createMetrics({ geoipBuildEpochSecs: () => 0, defaultMetrics: false });
  const input = (spec: CheckSpec): AuthzInput => decodeCheckRequest(encodeCheckRequest(spec));

  test('Redis slower than the 100-ms bound: the Check goes on after ~100 ms without headers, counted late and fail_open', async () => {
    const metrics = metricsOf();
    const slow: Buckets = { take: async () => { await sleep(400); return { allowed: false, remaining: 0, untilFullUs: 1 }; } };
    const evaluate = withGlobalLimit(createCheckLimiter({ buckets: slow, limits: limitsOf(1, 3), metrics, logger }), () => ALLOW);
    const t0 = Date.now();
    const d = await evaluate(input({ headers: { 'x-edge-client-ip': '192.0.2.1' }, contextExtensions: MARK }));
    const took = Date.now() - t0;
    assert.equal(d, ALLOW, 'the decision as without the limit');
    assert.ok(took >= 95 && took < 250, `after ${took} ms`);
    const t = await metrics.registry.metrics();
    assert.match(t, /edge_ratelimit_late_total 1\n/);
    assert.match(t, /edge_ratelimit_decisions_total\{code="fail_open"\} 1\n/);
    assert.match(t, /edge_ratelimit_redis_errors_total 0\n/);
  });

  test('a reply already in the socket when a stalled event loop wakes wins over the due 100-ms bound (no fail_open): the verdict is given in the check phase', async () => {
    // Real Redis (127.0.0.1:6379, PING only): the reply arrives in ~1 ms while this process is
    // busy for 150 ms; when the loop turns, the bound's timer is due and the reply is waiting.
    const redis = new Redis('redis://127.0.0.1:6379', { lazyConnect: true, maxRetriesPerRequest: 0 });
    await redis.connect();
    try {
      await redis.ping();
      const metrics = metricsOf();
      const buckets: Buckets = { take: async () => { await redis.ping(); return { allowed: true, remaining: 2, untilFullUs: 1_000_000 }; } };
      const evaluate = withGlobalLimit(createCheckLimiter({ buckets, limits: limitsOf(1, 3), metrics, logger }), () => ALLOW);
      const pending = evaluate(input({ headers: { 'x-edge-client-ip': '192.0.2.7' }, contextExtensions: MARK }));
      const until = Date.now() + 150;
      while (Date.now() < until) { /* a stall: GC, a long callback, the process descheduled */ }
      const d = await pending;
      assert.notEqual(d, ALLOW, 'the answer carries the bucket\'s headers: it came from Redis, not the fail-open path');
      const t = await metrics.registry.metrics();
      assert.match(t, /edge_ratelimit_late_total 0\n/);
      assert.match(t, /edge_ratelimit_decisions_total\{code="ok"\} 1\n/);
    } finally {
      redis.disconnect();
    }
  });

  test('unmarked (a body phase, a route Envoy answers itself) or no address: `decide` directly (synchronous stays synchronous); a marked Check, a header phase included, asks first', async () => {
    let takes = 0;
    const buckets: Buckets = { take: async () => { takes++; return { allowed: true, remaining: 5, untilFullUs: 2_500_000 }; } };
    const evaluate = withGlobalLimit(createCheckLimiter({ buckets, limits: limitsOf(2, 10), metrics: metricsOf(), logger }), () => deny('not_found'));
    assert.equal(evaluate(input({ headers: { 'x-edge-client-ip': '192.0.2.1' }, contextExtensions: { route: 'read' } })), deny('not_found'));
    assert.equal(evaluate(input({ headers: { 'x-edge-client-ip': '192.0.2.1' }, contextExtensions: { route: 'ingest' } })), deny('not_found'));
    assert.equal(evaluate(input({ headers: { 'x-edge-client-ip': 'unknown' }, contextExtensions: MARK })), deny('not_found'));
    assert.equal(takes, 0);
    const d = await evaluate(input({ headers: { 'x-edge-client-ip': '192.0.2.1' }, contextExtensions: MARK }));
    assert.equal(takes, 1);
    await evaluate(input({ headers: { 'x-edge-client-ip': '192.0.2.1' }, contextExtensions: { route: 'order', phase: 'headers', rate_limit: 'global' } }));
    assert.equal(takes, 2, 'a marked header phase takes its token');
    assert.deepEqual(d.headers.slice(-3), [['x-ratelimit-limit', '10'], ['x-ratelimit-remaining', '5'], ['x-ratelimit-reset', '1']]);
    assert.equal(d.code, 'not_found');
  });

  test('AUTHZ_TIMEOUT_MS too short for the bucket\'s 100 ms is warned about, only when the Check takes it', () => {
    const warned = (env: Record<string, string>): boolean => configWarnings(loadConfig(env)).some((w) => w.startsWith('AUTHZ_TIMEOUT_MS='));
    assert.equal(warned({ REDIS_URL: 'redis://127.0.0.1:6379/0', AUTHZ_TIMEOUT_MS: '150' }), true);
    assert.equal(warned({ REDIS_URL: 'redis://127.0.0.1:6379/0' }), false);
    assert.equal(warned({ REDIS_URL: 'redis://127.0.0.1:6379/0', AUTHZ_TIMEOUT_MS: '150', RATELIMIT_SERVICE_ADDRESS: 'rl:8081' }), false);
    assert.equal(warned({ AUTHZ_TIMEOUT_MS: '150' }), false);
  });

  test('x-ratelimit-reset: seconds to the next whole token, 0 when full', () => {
    assert.equal(resetSeconds({ remaining: 3, untilFullUs: 0 }, 20), 0);
    assert.equal(resetSeconds({ remaining: 3, untilFullUs: 50_000 }, 20), 1);
    assert.equal(resetSeconds({ remaining: 3, untilFullUs: 2_500_000 }, 0.25), 3);
    assert.equal(resetSeconds({ remaining: 3, untilFullUs: 8_000_000 }, 0.25), 4);
  });
});

test('a RATE_BURST far above the start-up header table still answers the true remaining budget (the table is bounded, not sized by the setting)', async () => {
  const metrics = createMetrics({ geoipBuildEpochSecs: () => 0, defaultMetrics: false });
  const remaining = [1_000_000 - 1, REMAINING_TABLE_MAX, 5];
  const buckets: Buckets = { take: async () => ({ allowed: true, remaining: remaining.shift() ?? 0, untilFullUs: 1 }) };
  const limiter = createCheckLimiter({ buckets, limits: limitsOf(1_000_000, 1_000_000), metrics, logger });
  for (const want of ['999999', String(REMAINING_TABLE_MAX), '5']) {
    const v = await limiter('192.0.2.1')!;
    assert.deepEqual(v.headers?.find(([k]) => k === 'x-ratelimit-remaining'), ['x-ratelimit-remaining', want]);
  }
});
