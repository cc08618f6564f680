/**
 * The global rate limit's service (authz/src/ratelimit/): the client key (the one Envoy's local
 * limiter uses), the lean codec against the real protos, the Lua token bucket on a private
 * redis-server (burst, refill, hits_addend, refusals take nothing, keys expire, nothing in the
 * AOF), and RateLimitService/ShouldRateLimit over gRPC as Envoy calls it: headers from the real
 * budget, other domains and descriptors unlimited, fail open when Redis is down (counted), late
 * answers counted, UNAVAILABLE and NOT_SERVING without Redis, health and reflection covering it.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { Writable } from 'node:stream';
import * as grpc from '@grpc/grpc-js';
import type { MethodDefinition } from '@grpc/proto-loader';
import protobuf from 'protobufjs/minimal.js';
import { Redis } from 'ioredis';
import { HealthImplementation } from 'grpc-health-check';
import { loadPackageDefinition, SERVICE_NAMES } from '../../proto/index.ts';
import { createGrpcServer, type AuthzGrpcServer } from '../src/authz/grpc-server.ts';
import { ALLOW } from '../src/authz/decision.ts';
import { createRedis } from '../src/common/adapters/redis.ts';
import { createLogger } from '../src/common/log.ts';
import { createMetrics, type AuthzMetrics } from '../src/common/metrics.ts';
import { clientOf, descriptorClient, printfRound, RATE_LIMIT_KEY_PREFIX, RedisBuckets, TAKE_MANY_MAX_KEYS, type BucketLimits, type Buckets, type Take } from '../src/ratelimit/bucket.ts';
import { loadConfig } from '../src/common/config.ts';
import { CODE, decodeRateLimitRequest, encodeRateLimitResponse } from '../src/ratelimit/codec.ts';
import { createRateLimitHandler, rateLimitService } from '../src/ratelimit/service.ts';
import { PrivateRedis } from '../../testkit/redis-server.ts';
import { privateRedisForSuite } from './helpers.ts';
import { tokenCheck } from '../src/common/token.ts';
import { createHash, randomBytes } from 'node:crypto';

/** The buckets' settings for these limits, the prefix's at their defaults (RATE_PREFIX_V6 48, 5 × each). */
const limitsOf = (rps: number, burst: number): BucketLimits => loadConfig({ RPS_PER_IP: String(rps), RATE_BURST: String(burst) });

const logger = createLogger('silent', new Writable({ write: (_c, _e, cb) => cb() }));
const pd = loadPackageDefinition();
const method = (pd[SERVICE_NAMES.rateLimit] as Record<string, MethodDefinition<object, object>>)['ShouldRateLimit']!;
const v4 = (ip: string) => ({ entries: [{ key: 'client', value: 'v4' }, { key: 'client_ip', value: ip }] });
const v6 = (masked: string) => ({ entries: [{ key: 'client', value: 'v6' }, { key: 'masked_remote_address', value: masked }] });
/** The token Envoy sends (RATELIMIT_SERVICE_TOKEN_FILE), and the service's check of it. */
const TOKEN = randomBytes(32).toString('hex');
const token = tokenCheck(createHash('sha256').update(TOKEN).digest());
/** Call metadata as Envoy's credential injector sends it. */
const asEnvoy = (): grpc.Metadata => {
  const md = new grpc.Metadata();
  md.set('authorization', `Bearer ${TOKEN}`);
  return md;
};

async function metricValue(metrics: AuthzMetrics, line: string): Promise<number> {
  const found = (await metrics.registry.metrics()).split('\n').find((l) => l.startsWith(`${line} `));
  return Number(found?.split(' ').at(-1) ?? NaN);
}

describe('ratelimit – client key (the key Envoy computes)', () => {
  test('IPv4 as is; IPv4-mapped (dotted and hex) is its IPv4; IPv6 is its /64 in Envoy\'s form; masked values too', () => {
    assert.equal(clientOf('192.0.2.7'), '192.0.2.7');
    assert.equal(clientOf('::ffff:192.0.2.7'), '192.0.2.7');
    assert.equal(clientOf('::FFFF:c000:0207'), '192.0.2.7');
    assert.equal(clientOf('2001:db8:3:ffff::1'), '2001:db8:3:ffff::/64');
    assert.equal(clientOf('2001:0DB8:0003:FFFF:1:2:3:4'), '2001:db8:3:ffff::/64');
    assert.equal(clientOf('2001:db8:3:ffff::/64'), '2001:db8:3:ffff::/64', 'what Envoy sends');
    assert.equal(clientOf('2001:db8::1'), '2001:db8::/64');
    assert.equal(clientOf('2600:0:0:5::9'), '2600:0:0:5::/64');
    assert.equal(clientOf('2001:0:0:5::9'), '255.255.255.246', 'Teredo (2001::/32): its client IPv4, the last 32 bits inverted');
    assert.equal(clientOf('::1'), '::/64');
    assert.equal(clientOf('fe80::1%eth0'), 'fe80::/64');
    assert.equal(clientOf('::ffff:0:c000:207'), '192.0.2.7', 'IPv4-translated (SIIT, ::ffff:0:…) is its IPv4 (Envoy\'s local stage keys it on ::/64: docs/api.md)');
    assert.equal(clientOf('2002:c000:207::1'), '192.0.2.7', '6to4 is its IPv4');
    assert.equal(clientOf('2002:c000:207::/64'), '2002:c000:207::/64', 'a masked value is kept as Envoy sent it');
    for (const bad of ['', 'unknown', '1.2.3.4:80', '[::1]', '2001:db8::1::2']) assert.equal(clientOf(bad), undefined, bad);
  });

  test('descriptors: exactly [client=v4, client_ip] and [client=v6, masked_remote_address]; anything else is not limited here', () => {
    assert.equal(descriptorClient(v4('192.0.2.7').entries), '192.0.2.7');
    assert.equal(descriptorClient(v6('2001:db8:3:ffff::/64').entries), '2001:db8:3:ffff::/64');
    assert.equal(descriptorClient(v4('::ffff:192.0.2.7').entries), '192.0.2.7', 'an address and its mapped form: one bucket');
    assert.equal(descriptorClient([{ key: 'client', value: 'v4' }]), undefined);
    assert.equal(descriptorClient([{ key: 'generic_key', value: 'x' }, { key: 'client_ip', value: '192.0.2.7' }]), undefined);
    assert.equal(descriptorClient([{ key: 'client', value: 'v6' }, { key: 'client_ip', value: '192.0.2.7' }]), undefined);
  });
});

describe('ratelimit – codec against the real rls.proto', () => {
  test('a RateLimitRequest proto-loader encodes is decoded (domain, descriptors, hits_addend); a descriptor\'s own hits_addend too', () => {
    const bytes = method.requestSerialize({ domain: 'edge', descriptors: [v4('192.0.2.7'), v6('2001:db8::/64')], hits_addend: 3 });
    const req = decodeRateLimitRequest(bytes);
    assert.equal(req.domain, 'edge');
    assert.equal(req.hitsAddend, 3);
    assert.deepEqual(req.descriptors.map((d) => d.entries), [v4('192.0.2.7').entries, v6('2001:db8::/64').entries]);
    // RateLimitDescriptor.hits_addend (field 3, a UInt64Value; newer than the packaged proto).
    const w = protobuf.Writer.create();
    w.uint32(18).fork().uint32(10).fork().uint32(10).string('client').uint32(18).string('v4').ldelim()
      .uint32(26).fork().uint32(8).uint32(7).ldelim().ldelim();
    assert.equal(decodeRateLimitRequest(Buffer.from(w.finish())).descriptors[0]?.hitsAddend, 7);
  });

  test('the encoded RateLimitResponse reads back through proto-loader: overall code, statuses, headers', () => {
    const bytes = encodeRateLimitResponse({
      overall: CODE.OVER_LIMIT,
      statuses: [{ code: CODE.OVER_LIMIT, limitPerSecond: 20, remaining: 0, resetMs: 1250 }, { code: CODE.OK }],
      headers: [['x-ratelimit-limit', '40'], ['x-ratelimit-remaining', '0']],
    });
    const res = method.responseDeserialize(bytes) as Record<string, unknown>;
    assert.equal(res['overall_code'], 2);
    assert.deepEqual(res['statuses'], [
      { code: 2, current_limit: { requests_per_unit: 20, unit: 1 }, duration_until_reset: { seconds: '1', nanos: 250_000_000 } },
      { code: 1 },
    ]);
    assert.deepEqual(res['response_headers_to_add'], [{ key: 'x-ratelimit-limit', value: '40' }, { key: 'x-ratelimit-remaining', value: '0' }]);
  });
});

/** RedisBuckets whose script calls are counted (calls, and the requests they carried) through its onCall. */
function countedBuckets(redis: Redis, limits: BucketLimits, policy?: { busy: number; full: number; lingerMs: number }): { b: RedisBuckets; batches: number; batched: number } {
  const counts = { b: undefined as unknown as RedisBuckets, batches: 0, batched: 0 };
  counts.b = new RedisBuckets(redis, limits, (requests) => {
    counts.batches++;
    counts.batched += requests;
  }, policy);
  return counts;
}

describe('ratelimit – the Lua token bucket on Redis', () => {
  let redis: PrivateRedis;
  let client: Redis;
  privateRedisForSuite((r, c) => { redis = r; client = c; });

  test('burst, then refused (a refusal takes nothing), refilled at the rate; hits_addend takes that many', async () => {
    // 2/s: a token every 500 ms, so the timing below has 400 ms of slack on a busy host (at 10/s
    // and 250 ms, a third take 50 ms late found a third token: seen at load 15).
    const b = new RedisBuckets(client, limitsOf(2, 5));
    const takes = [];
    for (let i = 0; i < 7; i++) takes.push(await b.take('192.0.2.1', 1));
    assert.deepEqual(takes.map((t) => t.allowed), [true, true, true, true, true, false, false]);
    assert.deepEqual(takes.slice(0, 5).map((t) => t.remaining), [4, 3, 2, 1, 0]);
    assert.ok(takes[6]!.untilFullUs > 2_000_000 && takes[6]!.untilFullUs <= 2_500_000, `full again in ${takes[6]!.untilFullUs} µs`);
    await sleep(600);
    // 2/s for 0.6–1 s: one token back (had the two refusals taken theirs, none), the next at 1 s.
    // Both takes in one event-loop turn: one batch, run back to back in Redis.
    const again = await Promise.all([b.take('192.0.2.1', 1), b.take('192.0.2.1', 1)]);
    assert.deepEqual(again.map((t) => t.allowed), [true, false]);
    const other = await b.take('192.0.2.2', 4);
    assert.deepEqual([other.allowed, other.remaining], [true, 1], 'another client, 4 tokens at once');
    assert.equal((await b.take('192.0.2.2', 2)).allowed, false, 'two more than the one left: refused');
    assert.equal((await b.take('192.0.2.2', 1)).allowed, true, 'the refused 2 took nothing');
    assert.equal((await b.take('192.0.2.3', 6)).allowed, false, 'more than the burst at once: never');
  });

  test('keys expire on their own when the bucket is full again; microsecond TAT survives Lua\'s number printing', async () => {
    const b = new RedisBuckets(client, limitsOf(20, 40));
    await b.take('192.0.2.9', 1);
    const pttl = await client.pttl(`${RATE_LIMIT_KEY_PREFIX}192.0.2.9`);
    assert.ok(pttl > 0 && pttl <= 50, `expires when full again (50 ms): ${pttl}`);
    const tat = await client.get(`${RATE_LIMIT_KEY_PREFIX}192.0.2.9`);
    assert.match(tat ?? '', /^[0-9]{16}$/, `TAT in µs, all digits: ${tat}`);
    await sleep(80);
    assert.equal(await client.exists(`${RATE_LIMIT_KEY_PREFIX}192.0.2.9`), 0);
  });

  test('the requests of one event-loop turn go to Redis as one batch and get exactly what one call each would have given, in arrival order', async () => {
    // One token a second: the seven calls one by one, and the sleep below, have a whole interval
    // of margin on a starved machine (at 10/s a run 50 ms late saw a token more: CI, 2026-11-27).
    const cb = countedBuckets(client, limitsOf(1, 5));
    const b = cb.b;
    const counted = countedBuckets(client, limitsOf(1, 5));
    const one = counted.b;
    // One by one (each awaited: seven calls), against the same seven sent in one turn.
    const sequential: Take[] = [];
    for (let i = 0; i < 7; i++) sequential.push(await one.take('192.0.2.50', 1));
    assert.equal(counted.batches, 7);
    const before = cb.batches;
    const [a, c, big] = await Promise.all([
      Promise.all(Array.from({ length: 7 }, () => b.take('192.0.2.51', 1))),
      Promise.all(Array.from({ length: 3 }, () => b.take('192.0.2.52', 1))),
      b.take('192.0.2.53', 2),
    ]);
    assert.equal(cb.batches - before, 1, 'three clients\' eleven requests, the two-token one included: one script call');
    assert.equal(cb.batched, 11);
    assert.deepEqual(a.map((t) => t.allowed), sequential.map((t) => t.allowed));
    assert.deepEqual(a.map((t) => t.remaining), sequential.map((t) => t.remaining));
    assert.deepEqual(a.map((t) => t.remaining), [4, 3, 2, 1, 0, 0, 0]);
    for (const [i, t] of a.entries()) {
      // One by one, later calls see the time the earlier ones took (ms); a token is 1 s.
      assert.ok(Math.abs(t.untilFullUs - sequential[i]!.untilFullUs) < 500_000, `request ${i}: ${t.untilFullUs} µs to full, one by one ${sequential[i]!.untilFullUs}`);
    }
    assert.ok(a[6]!.untilFullUs > 4_950_000 && a[6]!.untilFullUs <= 5_000_000, `refused after the burst: full again in ${a[6]!.untilFullUs} µs`);
    assert.deepEqual(c.map((t) => [t.allowed, t.remaining]), [[true, 4], [true, 3], [true, 2]]);
    assert.deepEqual([big.allowed, big.remaining], [true, 3]);
    // The refusals took nothing: after 1 s one token is back, no more (the next is 1 s away).
    await sleep(1000);
    const later = await Promise.all(Array.from({ length: 2 }, () => b.take('192.0.2.51', 1)));
    assert.deepEqual(later.map((t) => t.allowed), [true, false]);
    const tat = await client.get(`${RATE_LIMIT_KEY_PREFIX}192.0.2.51`);
    assert.match(tat ?? '', /^[0-9]{16}$/, `the batch writes the TAT as the single script does: ${tat}`);
  });

  test('requests arriving while a batch is at Redis wait and go together as the next batch when it returns', async () => {
    const c = countedBuckets(client, limitsOf(10, 100));
    const b = c.b;
    const admin = createRedis(redis.url);
    try {
      await new Promise((r) => admin.once('ready', r));
      await admin.call('CLIENT', 'PAUSE', '150', 'ALL');
      const first = b.take('192.0.2.70', 1);
      await new Promise((r) => setImmediate(r));
      assert.equal(c.batches, 1, 'the first request went at the end of its turn');
      // Five more, each in a turn of its own, while the first batch waits on the paused server.
      const more: Promise<Take>[] = [];
      for (let i = 0; i < 5; i++) {
        more.push(b.take(i % 2 === 0 ? '192.0.2.70' : '192.0.2.71', 1));
        await new Promise((r) => setImmediate(r));
      }
      assert.equal(c.batches, 1, 'nothing more is sent while a batch is at Redis');
      const all = await Promise.all([first, ...more]);
      assert.equal(c.batches, 2, 'the five went as one batch when the first returned');
      assert.equal(c.batched, 6, 'onCall is told of each script call and the requests it carried');
      // Per client in arrival order: .70 had the first (99 left), then .70 .71 .70 .71 .70.
      assert.deepEqual(all.map((t) => t.remaining), [99, 98, 99, 97, 98, 96]);
    } finally {
      admin.disconnect();
    }
  });

  test('under load (the previous call carried BATCH.busy or more) the next call waits for BATCH.full requests or BATCH.lingerMs; after a small call nothing waits', async () => {
    const policy = { busy: 4, full: 8, lingerMs: 300 };
    const c = countedBuckets(client, limitsOf(100, 1000), policy);
    const b = c.b;
    const turn = (): Promise<unknown> => new Promise((r) => setImmediate(r));
    // A small call: the next request goes at the end of its turn.
    await b.take('192.0.2.80', 1);
    let t0 = performance.now();
    await b.take('192.0.2.80', 1);
    assert.ok(performance.now() - t0 < 150, `after a call of one, no wait: ${performance.now() - t0} ms`);
    // A busy call (5 ≥ busy): the next one lingers.
    await Promise.all(Array.from({ length: 5 }, () => b.take('192.0.2.80', 1)));
    const calls = c.batches;
    t0 = performance.now();
    const lone = b.take('192.0.2.81', 1);
    await turn();
    await turn();
    assert.equal(c.batches, calls, 'held while fewer than `full` wait');
    await lone;
    const waited = performance.now() - t0;
    assert.ok(waited >= 250, `sent when the linger ran out: ${waited} ms after`);
    assert.equal(c.batches, calls + 1);
    // That call carried one request: the next goes at once again. Make it busy, then fill a call.
    await Promise.all(Array.from({ length: 5 }, () => b.take('192.0.2.80', 1)));
    const before = c.batches;
    t0 = performance.now();
    const filling: Promise<Take>[] = [];
    for (let i = 0; i < policy.full; i++) {
      filling.push(b.take(`192.0.2.${90 + (i % 3)}`, 1));
      await turn();
      if (i < policy.full - 1) assert.equal(c.batches, before, `held at ${i + 1} waiting`);
    }
    const got = await Promise.all(filling);
    assert.equal(c.batches, before + 1, 'sent as the call filled, in one');
    assert.ok(performance.now() - t0 < 250, `without waiting for the linger: ${performance.now() - t0} ms`);
    assert.ok(got.every((t) => t.allowed));
  });

  test('printfRound rounds as Lua\'s string.format(\'%.0f\') does (ties to even), checked against Redis\'s Lua', async () => {
    const xs = [0.5, 1.5, 2.5, 3.5, 0.25, 0.75, 7812.5, 15624.5, 333333.3333333333, 1764000000000000.5, 1764000000000001.5, 1764000000000000.25, 1764000000000000.75];
    const lua = await client.eval("local o = {} for i, x in ipairs(ARGV) do o[i] = string.format('%.0f', tonumber(x)) end return o", 0, ...xs.map(String)) as string[];
    assert.deepEqual(xs.map((x) => String(printfRound(x))), lua);
  });

  test('a fractional interval (RPS_PER_IP 128: 7,812.5 µs): a batch leaves the TAT one-by-one takes leave, rounded after each grant', async () => {
    const limits = limitsOf(128, 1000);
    const [secs, micros] = (await client.time()) as [string | number, string | number];
    // Far enough ahead that `now` never clamps it: the TAT then depends on the grants alone.
    let t = Number(secs) * 1_000_000 + Number(micros) + 3_000_000;
    if (t % 2 !== 0) t++;
    for (const k of ['192.0.2.100', '192.0.2.101']) await client.set(`${RATE_LIMIT_KEY_PREFIX}${k}`, String(t), 'PX', 60_000);
    const one = new RedisBuckets(client, limits);
    for (let i = 0; i < 7; i++) assert.equal((await one.take('192.0.2.100', 1)).allowed, true);
    const counted = countedBuckets(client, limits);
    const takes = await Promise.all(Array.from({ length: 7 }, () => counted.b.take('192.0.2.101', 1)));
    assert.equal(counted.batches, 1);
    assert.ok(takes.every((x) => x.allowed));
    const sequential = await client.get(`${RATE_LIMIT_KEY_PREFIX}192.0.2.100`);
    const batched = await client.get(`${RATE_LIMIT_KEY_PREFIX}192.0.2.101`);
    assert.equal(batched, sequential);
    assert.notEqual(Number(sequential), printfRound(t + 7 * 7812.5), 'the ties make rounding once differ from rounding each time');
    // Each request's remaining budget follows from the TAT it left (7,812 µs a token here).
    const ms = takes.map((x) => x.untilFullUs);
    for (let i = 1; i < ms.length; i++) assert.ok(Math.abs(ms[i]! - ms[i - 1]! - 7812) <= 1, `steps of one interval: ${ms.join(', ')}`);
  });

  test('a turn with more distinct clients than one call carries is split, each client still answered', async () => {
    const c = countedBuckets(client, limitsOf(1, 1));
    const b = c.b;
    const n = TAKE_MANY_MAX_KEYS + 10;
    const takes = await Promise.all(Array.from({ length: n }, (_, i) => b.take(`198.51.${i >> 8}.${i & 255}`, 1)));
    assert.equal(c.batches, 2);
    assert.equal(c.batched, n);
    assert.ok(takes.every((t) => t.allowed && t.remaining === 0));
    const again = await Promise.all([b.take('198.51.0.0', 1), b.take('198.51.1.9', 1)]);
    assert.deepEqual(again.map((t) => t.allowed), [false, false]);
  });

  test('Redis refusing the batch rejects every request in it (the caller fails open)', async () => {
    const broken = createRedis('redis://127.0.0.1:1', { maxRetriesPerRequest: 0 });
    broken.on('error', () => {});
    try {
      const b = new RedisBuckets(broken, limitsOf(10, 5));
      const outcomes = await Promise.allSettled([b.take('192.0.2.60', 1), b.take('192.0.2.60', 1), b.take('192.0.2.61', 1)]);
      assert.deepEqual(outcomes.map((o) => o.status), ['rejected', 'rejected', 'rejected']);
    } finally {
      broken.disconnect();
    }
  });

  test('buckets are neither in the append-only file nor replicated (REPL_NONE)', async () => {
    const b = new RedisBuckets(client, limitsOf(1, 100));
    for (let i = 0; i < 20; i++) await b.take('192.0.2.200', 1);
    await client.set('edge:test:marker', '1');
    const aofDir = join(redis.dir, 'appendonlydir');
    const aof = readdirSync(aofDir).filter((f) => f.includes('.incr.')).map((f) => readFileSync(join(aofDir, f), 'latin1')).join('');
    assert.ok(aof.includes('edge:test:marker'), 'the AOF records ordinary writes');
    assert.ok(!aof.includes('192.0.2.200'), 'but no bucket');
  });
});

describe('ratelimit – RateLimitService/ShouldRateLimit over gRPC', () => {
  let redis: PrivateRedis;
  let redisClient: Redis;
  let server: AuthzGrpcServer;
  let port: number;
  let metrics: AuthzMetrics;
  let client: grpc.Client;
  const call = (req: object, deadlineMs = 2000): Promise<Record<string, unknown>> => new Promise((resolve, reject) => {
    client.makeUnaryRequest(method.path, method.requestSerialize, method.responseDeserialize, req, asEnvoy(), { deadline: Date.now() + deadlineMs },
      (err, res) => (err ? reject(err) : resolve(res as Record<string, unknown>)));
  });
  const headers = (res: Record<string, unknown>): Record<string, string> =>
    Object.fromEntries(((res['response_headers_to_add'] ?? []) as { key: string; value: string }[]).map((h) => [h.key, h.value]));

  before(async () => {
    redis = await PrivateRedis.start();
    redisClient = createRedis(redis.url);
    await new Promise((r) => redisClient.once('ready', r));
    metrics = createMetrics({ geoipBuildEpochSecs: () => 0, defaultMetrics: false });
    // 1 token per second: the sequences below finish well inside one refill.
    const limits = limitsOf(1, 40);
    server = createGrpcServer({
      evaluate: () => ALLOW, observe: () => {}, onError: () => {},
      services: [rateLimitService({ buckets: new RedisBuckets(redisClient, limits), limits, metrics, logger, token })],
    });
    port = await server.listen('127.0.0.1', 0);
    server.setServing(true);
    client = new grpc.Client(`127.0.0.1:${port}`, grpc.credentials.createInsecure());
  });
  after(async () => {
    client?.close();
    await server?.close(0);
    redisClient?.disconnect();
    await redis?.stop();
  });

  test('as Envoy asks: a burst of 40 answered OK with the x-ratelimit headers of the global budget, then OVER_LIMIT', async () => {
    const answers = await Promise.all(Array.from({ length: 42 }, () => call({ domain: 'edge', descriptors: [v4('198.51.100.1')] })));
    answers.sort((a, b) => Number(headers(b)['x-ratelimit-remaining']) - Number(headers(a)['x-ratelimit-remaining']) || Number(a['overall_code']) - Number(b['overall_code']));
    assert.deepEqual(answers.map((a) => a['overall_code']), [...Array<number>(40).fill(1), 2, 2]);
    assert.deepEqual(headers(answers[0]!), { 'x-ratelimit-limit': '40', 'x-ratelimit-remaining': '39', 'x-ratelimit-reset': '1' });
    // The 429's Retry-After (issue 31): the refusing bucket's x-ratelimit-reset.
    assert.deepEqual(headers(answers[41]!), { 'x-ratelimit-limit': '40', 'x-ratelimit-remaining': '0', 'x-ratelimit-reset': '1', 'retry-after': '1' });
    const status = (answers[41]!['statuses'] as Record<string, unknown>[])[0]!;
    assert.equal(status['code'], 2);
    // No current_limit: Envoy writes its draft-03 headers from the statuses that have one, beside
    // these (the duplicated `x-ratelimit-remaining: 39, 39`); envoy/test/global-rate-limit.test.ts checks it live.
    assert.equal(status['current_limit'], undefined);
    assert.ok(await metricValue(metrics, 'edge_ratelimit_decisions_total{code="over_limit"}') >= 2);
  });

  test('only Envoy may ask (issue 26): no token, a wrong one or another scheme → UNAUTHENTICATED, and no bucket is touched', async () => {
    const ask = (md: grpc.Metadata): Promise<grpc.ServiceError | null> => new Promise((resolve) => {
      client.makeUnaryRequest(method.path, method.requestSerialize, method.responseDeserialize, { domain: 'edge', descriptors: [v4('198.51.100.9')], hits_addend: 40 }, md, (e) => resolve(e));
    });
    const md = (...values: string[]): grpc.Metadata => {
      const m = new grpc.Metadata();
      for (const v of values) m.add('authorization', v);
      return m;
    };
    const wrong = randomBytes(32).toString('hex');
    for (const [name, m] of [['none', md()], ['wrong token', md(`Bearer ${wrong}`)], ['token without scheme', md(TOKEN)], ['Basic', md(`Basic ${TOKEN}`)],
      ['token with a suffix', md(`Bearer ${TOKEN}x`)]] as const) {
      const err = await ask(m);
      assert.equal(err?.code, grpc.status.UNAUTHENTICATED, `${name}: ${err?.details}`);
    }
    const after = await call({ domain: 'edge', descriptors: [v4('198.51.100.9')] });
    assert.equal(headers(after)['x-ratelimit-remaining'], '39', 'the victim\'s bucket is full: the refused calls took nothing');
  });

  test('an IPv6 client is its /64 and a mapped address is its IPv4, whichever descriptor carries it; hits_addend is honoured', async () => {
    assert.equal(headers(await call({ domain: 'edge', descriptors: [v6('2001:db8:7:1::/64')] }))['x-ratelimit-remaining'], '39');
    assert.equal(headers(await call({ domain: 'edge', descriptors: [v6('2001:db8:7:1::abcd/128')] }))['x-ratelimit-remaining'], '38');
    assert.equal(headers(await call({ domain: 'edge', descriptors: [v4('198.51.100.2')], hits_addend: 10 }))['x-ratelimit-remaining'], '30');
    assert.equal(headers(await call({ domain: 'edge', descriptors: [v6('::ffff:198.51.100.2/64')] }))['x-ratelimit-remaining'], '29');
  });

  test('another domain or an unknown descriptor: OK with no limit and no headers', async () => {
    const other = await call({ domain: 'other', descriptors: [v4('198.51.100.1')] });
    assert.equal(other['overall_code'], 1);
    assert.deepEqual(headers(other), {});
    const unknown = await call({ domain: 'edge', descriptors: [{ entries: [{ key: 'generic_key', value: 'x' }] }] });
    assert.deepEqual([unknown['overall_code'], unknown['statuses']], [1, [{ code: 1 }]]);
  });

  test('health and reflection cover it: SERVING while the server serves, NOT_SERVING when sealed', async () => {
    const healthPd = loadPackageDefinition()['grpc.health.v1.Health'] as Record<string, MethodDefinition<object, object>>;
    const check = healthPd['Check']!;
    const ask = (service: string): Promise<number> => new Promise((resolve, reject) => {
      client.makeUnaryRequest(check.path, check.requestSerialize, check.responseDeserialize, { service }, (err, res) => (err ? reject(err) : resolve((res as { status: number }).status)));
    });
    assert.equal(await ask(SERVICE_NAMES.rateLimit), 1);
    server.setServing(false);
    assert.equal(await ask(SERVICE_NAMES.rateLimit), 2);
    server.setServing(true);
    assert.ok(server.health instanceof HealthImplementation);
  });

  test('Redis down: answered OK at once without headers (fail open), counted; back: limited again', async () => {
    const errorsBefore = await metricValue(metrics, 'edge_ratelimit_redis_errors_total');
    await redis.stop();
    const t0 = Date.now();
    const down = await call({ domain: 'edge', descriptors: [v4('198.51.100.1')] });
    assert.ok(Date.now() - t0 < 50, 'no wait for Redis');
    assert.deepEqual([down['overall_code'], headers(down)], [1, {}]);
    assert.equal(await metricValue(metrics, 'edge_ratelimit_redis_errors_total'), errorsBefore + 1);
    assert.ok(await metricValue(metrics, 'edge_ratelimit_decisions_total{code="fail_open"}') >= 1);
    await redis.resume();
    const end = Date.now() + 10_000;
    while (redisClient.status !== 'ready' && Date.now() < end) await sleep(50);
    const back = await call({ domain: 'edge', descriptors: [v4('198.51.100.3')] });
    assert.equal(headers(back)['x-ratelimit-remaining'], '39');
  });
});

describe('ratelimit – without Redis, and late answers', () => {
  test('no Redis: UNAVAILABLE (Envoy lets the request through) and health NOT_SERVING for the service', async () => {
    const metrics = createMetrics({ geoipBuildEpochSecs: () => 0, defaultMetrics: false });
    const server = createGrpcServer({
      evaluate: () => ALLOW, observe: () => {}, onError: () => {},
      services: [rateLimitService({ buckets: undefined, limits: limitsOf(20, 40), metrics, logger, token })],
    });
    const port = await server.listen('127.0.0.1', 0);
    server.setServing(true);
    const client = new grpc.Client(`127.0.0.1:${port}`, grpc.credentials.createInsecure());
    try {
      const err = await new Promise<grpc.ServiceError | null>((resolve) => {
        client.makeUnaryRequest(method.path, method.requestSerialize, method.responseDeserialize, { domain: 'edge', descriptors: [v4('192.0.2.1')] }, asEnvoy(), (e) => resolve(e));
      });
      assert.equal(err?.code, grpc.status.UNAVAILABLE);
      assert.match(err?.details ?? '', /REDIS_URL/);
      const health = (loadPackageDefinition()['grpc.health.v1.Health'] as Record<string, MethodDefinition<object, object>>)['Check']!;
      const status = await new Promise<number>((resolve, reject) => {
        client.makeUnaryRequest(health.path, health.requestSerialize, health.responseDeserialize, { service: SERVICE_NAMES.rateLimit }, (e, r) => (e ? reject(e) : resolve((r as { status: number }).status)));
      });
      assert.equal(status, 2, 'NOT_SERVING');
    } finally {
      client.close();
      await server.close(0);
    }
  });

  test('an answer ready after the caller\'s deadline is counted as late', async () => {
    const metrics = createMetrics({ geoipBuildEpochSecs: () => 0, defaultMetrics: false });
    const slow: Buckets = { take: async () => { await sleep(150); return { allowed: true, remaining: 1, untilFullUs: 1 }; } };
    const server = createGrpcServer({
      evaluate: () => ALLOW, observe: () => {}, onError: () => {},
      services: [rateLimitService({ buckets: slow, limits: limitsOf(20, 40), metrics, logger, token })],
    });
    const port = await server.listen('127.0.0.1', 0);
    server.setServing(true);
    const client = new grpc.Client(`127.0.0.1:${port}`, grpc.credentials.createInsecure());
    try {
      const err = await new Promise<grpc.ServiceError | null>((resolve) => {
        client.makeUnaryRequest(method.path, method.requestSerialize, method.responseDeserialize, { domain: 'edge', descriptors: [v4('192.0.2.1')] },
          asEnvoy(), { deadline: Date.now() + 50 }, (e) => resolve(e));
      });
      assert.equal(err?.code, grpc.status.DEADLINE_EXCEEDED);
      await sleep(200);
      assert.equal(await metricValue(metrics, 'edge_ratelimit_late_total'), 1);
    } finally {
      client.close();
      await server.close(0);
    }
  });

  test('the handler alone: several descriptors, the tightest one writes the headers; over limit wins', async () => {
    const metrics = createMetrics({ geoipBuildEpochSecs: () => 0, defaultMetrics: false });
    const buckets: Buckets = { take: async (client) => (client === '192.0.2.1' ? { allowed: true, remaining: 30, untilFullUs: 500_000 } : { allowed: false, remaining: 0, untilFullUs: 2_000_000 }) };
    const decide = createRateLimitHandler({ buckets, limits: limitsOf(20, 40), metrics, logger });
    const res = await decide({ domain: 'edge', descriptors: [{ ...v4('192.0.2.1'), hitsAddend: undefined }, { ...v4('192.0.2.2'), hitsAddend: undefined }], hitsAddend: 0 });
    assert.equal(res.overall, CODE.OVER_LIMIT);
    assert.deepEqual(res.headers, [['x-ratelimit-limit', '40'], ['x-ratelimit-remaining', '0'], ['x-ratelimit-reset', '1'], ['retry-after', '1']]);
  });
});
