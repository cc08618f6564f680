/**
 * Token leases of the global rate limit (RATE_LEASE_TOKENS, RATE_LEASE_MS; bucket.ts LeasePolicy),
 * on a private redis-server: a busy client's Redis call buys tokens this process then hands out
 * without Redis; a client seen once buys none; leased tokens are void after RATE_LEASE_MS; an
 * IPv6 client's lease takes every token from its /64 and its prefix alike (both or neither); and
 * across N processes (N RedisBuckets on one Redis) a client gets at most
 * burst + rate × t + min(N × RATE_LEASE_TOKENS, rate × RATE_LEASE_MS).
 */
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { Writable } from 'node:stream';
import { setTimeout as sleep } from 'node:timers/promises';
import type { Redis } from 'ioredis';
import { ConfigError, loadConfig } from '../src/common/config.ts';
import { createLogger } from '../src/common/log.ts';
import { createMetrics } from '../src/common/metrics.ts';
import { BATCH, RATE_LIMIT_KEY_PREFIX, RedisBuckets, type BucketLimits, type LeasePolicy, type Take } from '../src/ratelimit/bucket.ts';
import { createCheckLimiter, TRIPLES_MAX, withGlobalLimit } from '../src/ratelimit/check-limit.ts';
import { ALLOW, type Decision } from '../src/authz/decision.ts';
import { encodeDecision } from '../src/authz/codec/response.ts';
import { encodeAllowWithMetadata } from '../src/authz/codec/allow-encoder.ts';
import type { AuthzInput } from '../src/authz/codec/request.ts';
import { privateRedisForSuite } from './helpers.ts';

const logger = createLogger('silent', new Writable({ write: (_c, _e, cb) => cb() }));
/** Buckets that refill one token in 100 s: a sequence's answers cannot depend on how busy the machine is. */
const frozen = (rateBurst: number, prefixBurst: number): BucketLimits => ({ rpsPerIp: 0.01, rateBurst, ratePrefixV6: 48, rpsPerPrefix: 0.01, prefixBurst });
const LEASE: LeasePolicy = { tokens: 32, ms: 100 };

describe('ratelimit leases – settings', () => {
  test('defaults 64 tokens and 100 ms; 0 turns leases off; out of range is refused naming the setting', () => {
    const d = loadConfig({});
    assert.deepEqual([d.rateLeaseTokens, d.rateLeaseMs], [64, 100]);
    assert.equal(loadConfig({ RATE_LEASE_TOKENS: '0' }).rateLeaseTokens, 0);
    assert.throws(() => loadConfig({ RATE_LEASE_TOKENS: '1025' }), (e: unknown) => e instanceof ConfigError && e.message === 'RATE_LEASE_TOKENS: expected an integer in [0, 1024], got "1025"');
    assert.throws(() => loadConfig({ RATE_LEASE_MS: '5' }), (e: unknown) => e instanceof ConfigError && e.message === 'RATE_LEASE_MS: expected an integer in [10, 1000], got "5"');
  });
});

describe('ratelimit leases – on a private redis-server', () => {
  let client: Redis;
  let n = 0;
  const ip = (): string => `198.51.100.${++n}`;
  /** Tokens taken from a frozen bucket so far, read from its TAT in Redis (interval 100 s). */
  const taken = async (key: string): Promise<number> => {
    const [tat, [s, us]] = await Promise.all([client.get(RATE_LIMIT_KEY_PREFIX + key), client.time()]);
    if (tat === null) return 0;
    return Math.ceil((Number(tat) - (Number(s) * 1e6 + Number(us))) / 100e6 - 1e-9);
  };
  privateRedisForSuite((_redis, c) => { client = c; });

  test('a busy client: 2,000 takes cost under half the Redis calls they cost without leases, and grant the same', async () => {
    const limits: BucketLimits = { rpsPerIp: 1_000_000, rateBurst: 1_000_000, ratePrefixV6: 48, rpsPerPrefix: 5_000_000, prefixBurst: 5_000_000 };
    const calls = { with: 0, without: 0 };
    const leased = new RedisBuckets(client, limits, () => { calls.with++; }, BATCH, LEASE);
    const plain = new RedisBuckets(client, limits, () => { calls.without++; });
    // 16 concurrent streams of one client, as bench:edge's 16 connections.
    const run = async (b: RedisBuckets, who: string): Promise<Take[]> => (await Promise.all(Array.from({ length: 16 }, async () => {
      const out: Take[] = [];
      for (let i = 0; i < 125; i++) out.push(await b.take(who, 1));
      return out;
    }))).flat();
    const a = await run(leased, ip());
    const b = await run(plain, ip());
    assert.equal(a.filter((t) => t.allowed).length, 2000);
    assert.equal(b.filter((t) => t.allowed).length, 2000);
    assert.ok(calls.with * 2 < calls.without, `Redis calls: ${calls.with} with leases, ${calls.without} without`);
  });

  test('a client seen once buys nothing extra: its bucket is charged exactly its requests', async () => {
    const b = new RedisBuckets(client, frozen(10, 50), () => {}, BATCH, LEASE);
    const me = ip();
    const t = await b.take(me, 1);
    assert.deepEqual([t.allowed, t.remaining], [true, 9]);
    assert.equal(await taken(me), 1);
    assert.equal(b.takeLeased(me), undefined, 'no lease held');
  });

  test('a client calling again within RATE_LEASE_MS buys 1, 2, 4 … extra tokens (never more than RATE_LEASE_TOKENS held); its answers count held tokens as its own', async () => {
    const b = new RedisBuckets(client, frozen(40, 200), () => {}, BATCH, { tokens: 4, ms: 1000 });
    const me = ip();
    const remaining: number[] = [];
    const charged: number[] = [];
    for (let i = 0; i < 12; i++) {
      remaining.push((await b.take(me, 1)).remaining);
      charged.push(await taken(me));
    }
    // Calls 1 (0 extra), 2 (+1), 3 (+2), 4 (+4), then +4 each time the lease runs out.
    assert.deepEqual(charged, [1, 3, 3, 6, 6, 6, 11, 11, 11, 11, 11, 16]);
    // Each answer: 40 minus the requests so far, as without leases (held tokens count as left).
    assert.deepEqual(remaining, Array.from({ length: 12 }, (_, i) => 39 - i));
  });

  test('leased tokens are void RATE_LEASE_MS after the call that bought them was sent', async () => {
    const b = new RedisBuckets(client, frozen(40, 200), () => {}, BATCH, { tokens: 8, ms: 50 });
    const me = ip();
    await b.take(me, 1);
    await b.take(me, 1); // within 50 ms of the first (a loaded machine may miss it: then nothing is held, see below)
    const held = await taken(me) - 2;
    await sleep(60);
    assert.equal(b.takeLeased(me), undefined, `the ${held} held token(s) are void`);
    assert.equal(await taken(me), 2 + held, 'nothing given back, nothing taken');
  });

  test('an IPv6 client\'s lease takes every token from its /64 and its prefix alike; a prefix emptied by leases refuses a sibling /64 (both or neither)', async () => {
    const b = new RedisBuckets(client, frozen(40, 12), () => {}, BATCH, { tokens: 16, ms: 1000 });
    const a = '2001:db8:77:1::/64';
    const s = '2001:db8:77:2::/64';
    const p = '2001:db8:77::/48';
    const grantsA: boolean[] = [];
    for (let i = 0; i < 5; i++) grantsA.push((await b.take(a, 1, p)).allowed);
    assert.deepEqual(grantsA, [true, true, true, true, true]);
    const takenA = await taken(a);
    assert.equal(await taken(p), takenA, 'each token of the lease came from both buckets');
    assert.equal(takenA, 6, 'a lease of one token is held (1 + 2 + 3 bought for 5 requests)');
    const sibling = await Promise.all(Array.from({ length: 12 }, () => b.take(s, 1, p)));
    const allowedS = sibling.filter((t) => t.allowed).length;
    assert.equal(allowedS, 12 - takenA, 'the sibling got what the prefix had left');
    assert.equal(await taken(s), allowedS, 'its refused requests cost its /64 nothing');
    assert.equal(await taken(p), 12);
    assert.ok(sibling.filter((t) => !t.allowed).every((t) => t.prefix?.remaining === 0), 'refused by the prefix');
  });

  test('N = 2 processes, one client alternating at full speed for 1 s: at most burst + rate × t + min(N × tokens, rate × ms), at least burst + rate × t − N × tokens', async () => {
    const limits: BucketLimits = { rpsPerIp: 200, rateBurst: 20, ratePrefixV6: 48, rpsPerPrefix: 1000, prefixBurst: 100 };
    const lease: LeasePolicy = { tokens: 16, ms: 100 };
    const procs = [new RedisBuckets(client, limits, () => {}, BATCH, lease), new RedisBuckets(client, limits, () => {}, BATCH, lease)];
    const me = ip();
    const t0 = performance.now();
    let allowed = 0;
    let i = 0;
    while (performance.now() - t0 < 1000) {
      const batch = await Promise.all(Array.from({ length: 8 }, () => procs[i++ % 2]!.take(me, 1)));
      allowed += batch.filter((t) => t.allowed).length;
    }
    const seconds = (performance.now() - t0) / 1000;
    const over = Math.min(2 * lease.tokens, Math.ceil(limits.rpsPerIp * lease.ms / 1000));
    const upper = limits.rateBurst + Math.ceil(limits.rpsPerIp * seconds) + over;
    // Lower bound: the tokens two processes may hold unspent at the end, and void leases, are lost to the client.
    const lower = limits.rateBurst + Math.floor(limits.rpsPerIp * seconds) - 2 * lease.tokens * Math.ceil(seconds * 1000 / lease.ms);
    assert.ok(allowed <= upper, `${allowed} allowed in ${seconds.toFixed(3)} s; bound ${upper}`);
    assert.ok(allowed >= Math.min(lower, limits.rateBurst), `${allowed} allowed; at least ${lower}`);
  });

  test('the Check limiter answers a leased token at once: withGlobalLimit returns a decision, not a promise', async () => {
    const limits: BucketLimits = { rpsPerIp: 1000, rateBurst: 1000, ratePrefixV6: 48, rpsPerPrefix: 5000, prefixBurst: 5000 };
    const b = new RedisBuckets(client, limits, () => {}, BATCH, { tokens: 8, ms: 1000 });
    const metrics = createMetrics({ geoipBuildEpochSecs: () => 0, defaultMetrics: false });
    const evaluate = withGlobalLimit(createCheckLimiter({ buckets: b, limits, metrics, logger }), () => ALLOW);
    const input = { globalLimit: true, clientIp: ip() } as AuthzInput;
    // Two calls in a row (the second buys a lease), then answers from it.
    await evaluate(input);
    await evaluate(input);
    const d = evaluate(input);
    assert.ok(!(d instanceof Promise), 'a leased token needs no await');
    assert.equal(d.allow, true);
    assert.ok(d.responseHeaders?.some(([k]) => k === 'x-ratelimit-remaining'), 'with the global budget\'s headers');
  });

  test('an allow with the global budget\'s headers is one object per header triple, encoded once: the same bytes as the encoder writes per request', async () => {
    const limits: BucketLimits = { rpsPerIp: 0.01, rateBurst: 1000, ratePrefixV6: 48, rpsPerPrefix: 0.01, prefixBurst: 5000 };
    const b = new RedisBuckets(client, limits, () => {}, BATCH, { tokens: 8, ms: 1000 });
    const metrics = createMetrics({ geoipBuildEpochSecs: () => 0, defaultMetrics: false });
    const limiter = createCheckLimiter({ buckets: b, limits, metrics, logger });
    const evaluate = withGlobalLimit(limiter, () => ALLOW);
    // Two clients seen for the first time: the same triple (limit, 999 left, reset), the same object.
    const first = await evaluate({ globalLimit: true, clientIp: ip() } as AuthzInput);
    const second = await evaluate({ globalLimit: true, clientIp: ip() } as AuthzInput);
    assert.deepEqual(second.responseHeaders, first.responseHeaders);
    assert.equal(second, first, 'the same triple: the same decision');
    const a = { globalLimit: true, clientIp: ip() } as AuthzInput;
    const seen = new Map<string, Decision>();
    for (let i = 0; i < 30; i++) {
      const d = await evaluate(a);
      seen.set(JSON.stringify(d.responseHeaders), d);
      const bytes = encodeDecision(d, () => { throw new Error('not the serializer'); });
      assert.deepEqual(bytes, encodeAllowWithMetadata([], undefined, d.responseHeaders), `remaining ${d.responseHeaders?.[1]?.[1]}`);
      assert.equal(encodeDecision(d, () => Buffer.alloc(0)), bytes, 'encoded once, then the cached bytes');
    }
    // A frozen bucket: each Check leaves one token fewer, so 30 distinct triples.
    assert.equal(seen.size, 30);
    // A decision with its own payload (an order's allow) is never shared.
    const order: Decision = { ...ALLOW, metadata: { payload: 'x' } };
    const withPayload = withGlobalLimit(limiter, () => order);
    const o1 = await withPayload(a);
    const o2 = await withPayload(a);
    assert.notEqual(o1, o2);
    assert.equal(o1.metadata, order.metadata);
    assert.ok(TRIPLES_MAX >= 1024);
  });
});
