/**
 * One subscriber, one budget (issue 26): an IPv6 client draws from its /64's bucket and from its
 * prefix's (RATE_PREFIX_V6, default /48; RPS_PER_PREFIX, PREFIX_BURST), both or neither, in the
 * global limit's Lua script on a private redis-server, in the Check and in RateLimitService; an
 * IPv4 client has its own bucket only. Attack of the finding: 80 /64s of one /56 each took a fresh
 * bucket (80 of 80 allowed).
 */
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { Writable } from 'node:stream';
import type { Redis } from 'ioredis';
import { ConfigError, loadConfig, type Env } from '../src/common/config.ts';
import { createLogger } from '../src/common/log.ts';
import { createMetrics } from '../src/common/metrics.ts';
import {
  clientKeys, descriptorKeys, descriptorPrefix, RATE_LIMIT_KEY_PREFIX, RedisBuckets, TAKE_MANY_MAX_KEYS, tighter, type BucketLimits, type Buckets, type Take,
} from '../src/ratelimit/bucket.ts';
import { createCheckLimiter } from '../src/ratelimit/check-limit.ts';
import { CODE } from '../src/ratelimit/codec.ts';
import { createRateLimitHandler } from '../src/ratelimit/service.ts';
import { privateRedisForSuite } from './helpers.ts';

const logger = createLogger('silent', new Writable({ write: (_c, _e, cb) => cb() }));
const metricsOf = (): ReturnType<typeof createMetrics> => createMetrics({ geoipBuildEpochSecs: () => 0, defaultMetrics: false });
const limits = (env: Env = {}): BucketLimits => loadConfig(env);
/** Buckets that refill one token in 100 s: a sequence's answers cannot depend on how busy the machine is. */
const frozenRates = (rateBurst: number, prefixBurst: number): BucketLimits => ({ rpsPerIp: 0.01, rateBurst, ratePrefixV6: 48, rpsPerPrefix: 0.01, prefixBurst });
const v6 = (masked: string) => ({ entries: [{ key: 'client', value: 'v6' }, { key: 'masked_remote_address', value: masked }], hitsAddend: undefined });
const v6Prefix = (masked: string) => ({ entries: [{ key: 'prefix', value: 'v6' }, { key: 'masked_remote_address', value: masked }], hitsAddend: undefined });

describe('ratelimit prefix – settings', () => {
  test('defaults: /48, 5 × RPS_PER_IP, 5 × RATE_BURST (following them when they are set)', () => {
    const d = loadConfig({});
    assert.deepEqual([d.ratePrefixV6, d.rpsPerPrefix, d.prefixBurst], [48, 100, 200]);
    const s = loadConfig({ RPS_PER_IP: '7', RATE_BURST: '9' });
    assert.deepEqual([s.rpsPerPrefix, s.prefixBurst], [35, 45]);
    const own = loadConfig({ RATE_PREFIX_V6: '56', RPS_PER_PREFIX: '30', PREFIX_BURST: '60' });
    assert.deepEqual([own.ratePrefixV6, own.rpsPerPrefix, own.prefixBurst], [56, 30, 60]);
  });

  const refused: Record<string, [Env, string]> = {
    'a prefix longer than a client': [{ RATE_PREFIX_V6: '65' }, 'RATE_PREFIX_V6: expected an integer in [32, 64], got "65"'],
    'a prefix wider than a /32': [{ RATE_PREFIX_V6: '16' }, 'RATE_PREFIX_V6: expected an integer in [32, 64], got "16"'],
    'not a number': [{ RATE_PREFIX_V6: '/48' }, 'RATE_PREFIX_V6: expected an integer in [32, 64], got "/48"'],
    'a prefix slower than one client': [{ RPS_PER_PREFIX: '19' }, 'RPS_PER_PREFIX: expected an integer in [20, 5000000], got "19"'],
    'a prefix burst below one client\'s': [{ RATE_BURST: '50', PREFIX_BURST: '49' }, 'PREFIX_BURST: expected an integer in [50, 50000000], got "49"'],
  };
  for (const [name, [env, message]] of Object.entries(refused)) {
    test(`refused at start, naming the setting – ${name}`, () => {
      assert.throws(() => loadConfig(env), (e: unknown) => e instanceof ConfigError && e.message === message);
    });
  }
});

describe('ratelimit prefix – keys (the values Envoy\'s masked_remote_address writes)', () => {
  const cases: Record<string, [number, string, string | undefined, string | undefined]> = {
    '/48 of an address': [48, '2001:db8:3:ffff::1', '2001:db8:3:ffff::/64', '2001:db8:3::/48'],
    '/56 masks inside a group': [56, '2001:db8:3:ffff:1::1', '2001:db8:3:ffff::/64', '2001:db8:3:ff00::/56'],
    '/50 masks inside a group': [50, '2001:db8:3:ffff::1', '2001:db8:3:ffff::/64', '2001:db8:3:c000::/50'],
    '/32': [32, '2001:db8:3:ffff::1', '2001:db8:3:ffff::/64', '2001:db8::/32'],
    'zero groups in the prefix': [48, '2600:0:0:5::9', '2600:0:0:5::/64', '2600::/48'],
    // An IPv6 address that embeds an IPv4 (common/ip.ts) is that IPv4's client, with no prefix bucket.
    '6to4: its IPv4, no prefix': [48, '2002:c000:207:5::9', '192.0.2.7', undefined],
    'NAT64 (64:ff9b::/96): its IPv4': [48, '64:ff9b::192.0.2.7', '192.0.2.7', undefined],
    'NAT64 local-use (64:ff9b:1::/48, RFC 6052 /48 layout): its IPv4': [48, '64:ff9b:1:c000:2:700::', '192.0.2.7', undefined],
    'SIIT (::ffff:0:0:0/96): its IPv4': [48, '::ffff:0:c000:207', '192.0.2.7', undefined],
    'Teredo (2001::/32): the client IPv4, de-obfuscated': [48, '2001:0:4136:e378:8000:63bf:3fff:fdf8', '192.0.2.7', undefined],
    'a masked value as Envoy sends it': [48, '2001:db8:3:ffff::/64', '2001:db8:3:ffff::/64', '2001:db8:3::/48'],
    'upper case and leading zeros': [48, '2001:0DB8:0003:FFFF:1:2:3:4', '2001:db8:3:ffff::/64', '2001:db8:3::/48'],
    'IPv4: its own bucket only': [48, '192.0.2.7', '192.0.2.7', undefined],
    'IPv4-mapped: its IPv4, no prefix': [48, '::ffff:192.0.2.7', '192.0.2.7', undefined],
    '64: no prefix bucket': [64, '2001:db8:3:ffff::1', '2001:db8:3:ffff::/64', undefined],
  };
  for (const [name, [length, address, client, prefix]] of Object.entries(cases)) {
    test(`clientKeys – ${name}`, () => {
      const value = address.includes('/') ? address.slice(0, address.indexOf('/')) : address;
      assert.deepEqual(clientKeys(length)(value), { client, prefix });
    });
  }

  test('clientKeys – not an address: undefined', () => {
    for (const bad of ['', 'unknown', '1.2.3.4:80', '[::1]', '2001:db8::1::2']) assert.equal(clientKeys(48)(bad), undefined, bad);
  });

  test('descriptors: a client descriptor takes its prefix too; a prefix descriptor is re-masked to RATE_PREFIX_V6; IPv4 has none', () => {
    assert.deepEqual(descriptorKeys(v6('2001:db8:3:ffff::/64').entries, 48), { client: '2001:db8:3:ffff::/64', prefix: '2001:db8:3::/48' });
    assert.deepEqual(descriptorKeys([{ key: 'client', value: 'v4' }, { key: 'client_ip', value: '192.0.2.7' }], 48), { client: '192.0.2.7', prefix: undefined });
    assert.deepEqual(descriptorKeys(v6('2001:db8:3:ffff::/64').entries, 64), { client: '2001:db8:3:ffff::/64', prefix: undefined });
    assert.equal(descriptorPrefix(v6Prefix('2001:db8:3::/48').entries, 48), '2001:db8:3::/48');
    assert.equal(descriptorPrefix(v6Prefix('2001:db8:3:ffff::1/48').entries, 48), '2001:db8:3::/48', 'whatever Envoy writes, the same key');
    assert.equal(descriptorPrefix(v6Prefix('2001:db8:3::/48').entries, 64), undefined);
    assert.equal(descriptorPrefix(v6Prefix('::ffff:192.0.2.7/48').entries, 48), undefined);
    assert.equal(descriptorPrefix(v6('2001:db8:3::/48').entries, 48), undefined, 'a client descriptor is no prefix descriptor');
    assert.equal(descriptorKeys(v6Prefix('2001:db8:3::/48').entries, 48), undefined, 'and the other way round');
  });
});

describe('ratelimit prefix – which bucket the headers describe (tighter)', () => {
  const l = limits();
  const t = (allowed: boolean, client: [number, number], prefix?: [number, number]): Take => ({
    allowed, remaining: client[0], untilFullUs: client[1], ...(prefix === undefined ? {} : { prefix: { remaining: prefix[0], untilFullUs: prefix[1] } }),
  });
  const cases: Record<string, [Take, 'client' | 'prefix']> = {
    'IPv4: the client': [t(false, [0, 100_000]), 'client'],
    'granted, the prefix has fewer left': [t(true, [30, 500_000], [12, 1_880_000]), 'prefix'],
    'granted, the client has fewer left': [t(true, [3, 1_850_000], [150, 500_000]), 'client'],
    'granted, a tie: the client': [t(true, [5, 1_750_000], [5, 1_950_000]), 'client'],
    'refused by the prefix': [t(false, [39, 50_000], [0, 1_995_000]), 'prefix'],
    'refused by the client': [t(false, [0, 1_990_000], [180, 200_000]), 'client'],
    // Both empty: the request needs both; the prefix's next token (in 3 ms) comes before the client's (in 40 ms).
    'refused by both, the client\'s token later': [t(false, [0, 1_990_000], [0, 1_993_000]), 'client'],
    'refused by both, the prefix\'s token later': [t(false, [0, 1_955_000], [0, 1_999_000]), 'prefix'],
  };
  for (const [name, [take, want]] of Object.entries(cases)) test(name, () => assert.equal(tighter(take, 1, l), want));
});

describe('ratelimit prefix – the Lua buckets on Redis', () => {
  let client: Redis;
  privateRedisForSuite((_redis, c) => { client = c; });

  test('attack: 1,000 /64s of one /48 at once get the prefix\'s burst (plus its refill meanwhile), not 1,000 bursts; one /64 of another /48 is unchanged', async () => {
    const l = limits();
    const b = new RedisBuckets(client, l);
    const t0 = performance.now();
    const takes = await Promise.all(Array.from({ length: 1000 }, (_, i) => b.take(`2001:db8:a:${i.toString(16)}::/64`, 1, '2001:db8:a::/48')));
    const seconds = (performance.now() - t0) / 1000;
    const allowed = takes.filter((t) => t.allowed).length;
    assert.ok(allowed >= l.prefixBurst && allowed <= l.prefixBurst + Math.ceil(l.rpsPerPrefix * seconds), `${allowed} of 1,000 in ${seconds.toFixed(3)} s`);
    assert.ok(takes.filter((t) => !t.allowed).every((t) => t.remaining === l.rateBurst && t.prefix?.remaining === 0), 'refused by the prefix; their own buckets untouched');
    // One /64 of a fresh /48: its own burst, exactly as before the prefix bucket.
    const one = await Promise.all(Array.from({ length: 80 }, () => b.take('2001:db8:b:1::/64', 1, '2001:db8:b::/48')));
    assert.equal(one.filter((t) => t.allowed).length, l.rateBurst);
    assert.equal(one.at(-1)!.prefix!.remaining, l.prefixBurst - l.rateBurst, 'the prefix lost only what was granted');
  });

  test('all or nothing: a request the prefix refuses takes nothing from its client; one its client refuses takes nothing from the prefix', async () => {
    const b = new RedisBuckets(client, frozenRates(3, 4));
    const p = '2001:db8:c::/48';
    // Client A over its own burst: 3 granted, 2 refused by A's bucket; the prefix lost 3, not 5.
    const a = await Promise.all(Array.from({ length: 5 }, () => b.take('2001:db8:c:a::/64', 1, p)));
    assert.deepEqual(a.map((t) => t.allowed), [true, true, true, false, false]);
    assert.deepEqual(a.map((t) => t.prefix?.remaining), [3, 2, 1, 1, 1]);
    // So B still gets the last prefix token; C is refused by the prefix and its own key is never written.
    const [bb, c] = await Promise.all([b.take('2001:db8:c:b::/64', 1, p), b.take('2001:db8:c:c::/64', 1, p)]);
    assert.deepEqual([bb.allowed, c.allowed, c.remaining, c.prefix?.remaining], [true, false, 3, 0]);
    assert.equal(await client.exists(`${RATE_LIMIT_KEY_PREFIX}2001:db8:c:c::/64`), 0, 'the refused request took nothing from C');
    assert.equal(await client.exists(`${RATE_LIMIT_KEY_PREFIX}2001:db8:c:b::/64`), 1);
    // hits_addend: all or nothing across both too.
    const big = await b.take('2001:db8:d:1::/64', 3, '2001:db8:d::/48');
    assert.deepEqual([big.allowed, big.remaining, big.prefix?.remaining], [true, 0, 1]);
    assert.equal((await b.take('2001:db8:d:2::/64', 2, '2001:db8:d::/48')).allowed, false, 'two more than the prefix\'s one');
    assert.equal((await b.take('2001:db8:d:2::/64', 1, '2001:db8:d::/48')).allowed, true, 'the refused 2 took nothing');
  });

  test('a batch answers exactly what one call per request gives, the prefix shared across clients in arrival order', async () => {
    const l = frozenRates(3, 7);
    const seq = (i: number): [string, string] => [`2001:db8:${i < 100 ? 'e' : 'f'}:${(i % 4).toString(16)}::/64`, `2001:db8:${i < 100 ? 'e' : 'f'}::/48`];
    const order = [0, 1, 0, 2, 0, 0, 3, 1, 1, 2, 3, 3, 2, 1];
    const one = new RedisBuckets(client, l);
    const sequential: Take[] = [];
    for (const i of order) sequential.push(await one.take(seq(i)[0], 1, seq(i)[1]));
    let calls = 0;
    const batched = new RedisBuckets(client, l, () => { calls++; });
    const together = await Promise.all(order.map((i) => batched.take(seq(100 + i)[0], 1, seq(100 + i)[1])));
    assert.equal(calls, 1);
    const view = (t: Take): unknown => [t.allowed, t.remaining, t.prefix?.remaining];
    assert.deepEqual(together.map(view), sequential.map(view));
    assert.equal(together.filter((t) => t.allowed).length, 7, 'the prefix\'s burst');
  });

  test('a batch with more distinct buckets than one call carries is split; a request\'s client and prefix stay in one call', async () => {
    let calls = 0;
    const b = new RedisBuckets(client, frozenRates(1, 5), () => { calls++; });
    const n = TAKE_MANY_MAX_KEYS + 20;
    const takes = await Promise.all(Array.from({ length: n }, (_, i) => b.take(`2001:db8:${(0x100 + (i >> 1)).toString(16)}:${i.toString(16)}::/64`, 1, `2001:db8:${(0x100 + (i >> 1)).toString(16)}::/48`)));
    assert.equal(calls, 2, `${n} clients and ${n / 2} prefixes`);
    // Two /64s per /48: the second of each pair finds one token fewer in the shared prefix, in whichever call it went.
    assert.deepEqual(takes.map((t, i) => [t.allowed, t.remaining, t.prefix?.remaining, i % 2]), takes.map((_, i) => [true, 0, i % 2 === 0 ? 4 : 3, i % 2]));
  });
});

describe('ratelimit prefix – the Check and RateLimitService answers', () => {
  const l = limits({ RPS_PER_IP: '1', RATE_BURST: '3' });
  /** In-memory buckets with the script's semantics at one instant (no refill): enough for the answers' shape. */
  const frozen = (): Buckets & { calls: [string, number, string | undefined][] } => {
    const used = new Map<string, number>();
    const calls: [string, number, string | undefined][] = [];
    return {
      calls,
      take: async (c, hits, p) => {
        calls.push([c, hits, p]);
        const [uc, up] = [used.get(c) ?? 0, p === undefined ? 0 : used.get(p) ?? 0];
        const allowed = uc + hits <= l.rateBurst && (p === undefined || up + hits <= l.prefixBurst);
        if (allowed) {
          used.set(c, uc + hits);
          if (p !== undefined) used.set(p, up + hits);
        }
        const [nc, np] = allowed ? [uc + hits, up + hits] : [uc, up];
        const take: Take = { allowed, remaining: l.rateBurst - nc, untilFullUs: nc * 1_000_000 };
        return p === undefined ? take : { ...take, prefix: { remaining: l.prefixBurst - np, untilFullUs: np * 1_000_000 } };
      },
    };
  };

  test('Check: the headers of the tighter bucket (x-ratelimit-limit PREFIX_BURST once the prefix has fewer left), one 429 whichever bucket refused', async () => {
    const buckets = frozen();
    const limiter = createCheckLimiter({ buckets, limits: l, metrics: metricsOf(), logger });
    const header = (h: readonly (readonly [string, string])[] | undefined): string => (h ?? []).filter(([k]) => k.startsWith('x-ratelimit-')).map(([, v]) => v).join('/');
    const answers: string[] = [];
    for (let i = 0; i < 16; i++) {
      const v = await limiter(`2001:db8:3:${i.toString(16)}::1`)!;
      answers.push(v.denial === undefined ? header(v.headers) : `429 ${header(v.denial.headers)}`);
    }
    // Each /64 sends one: 2 of its 3 left; the prefix (15) falls below that after the 13th.
    assert.deepEqual(answers, [...Array<string>(12).fill('3/2/1'), '3/2/1', '15/1/1', '15/0/1', '429 15/0/1']);
    const byClient = await Promise.all(Array.from({ length: 4 }, () => limiter('2001:db8:4:1::1')!));
    const refused = byClient[3]!.denial!;
    assert.equal(header(refused.headers), '3/0/1');
    const byPrefix = (await limiter('2001:db8:3:99::1')!).denial!;
    assert.equal(byPrefix.body, refused.body, 'the same body whichever bucket refused');
    assert.equal(byPrefix.httpStatus, 429);
    assert.deepEqual(buckets.calls.at(-1), ['2001:db8:3:99::/64', 1, '2001:db8:3::/48']);
    assert.deepEqual((await limiter('192.0.2.7')!).headers?.map(([, v]) => v), ['3', '2', '1']);
    assert.deepEqual(buckets.calls.at(-1), ['192.0.2.7', 1, undefined], 'IPv4: no prefix bucket');
  });

  test('RateLimitService: the client descriptor takes both buckets once; the prefix descriptor is answered from that take; alone it is not limited', async () => {
    const buckets = frozen();
    const decide = createRateLimitHandler({ buckets, limits: l, metrics: metricsOf(), logger });
    const ask = (masked: string) => decide({ domain: 'edge', descriptors: [v6(`${masked}/64`), v6Prefix(`${masked}/48`)], hitsAddend: 0 });
    const answers = [];
    for (let i = 0; i < 16; i++) answers.push(await ask(`2001:db8:5:${i.toString(16)}::`));
    assert.equal(buckets.calls.length, 16, 'one take per request, not one per descriptor');
    assert.deepEqual(answers.map((a) => a.overall), [...Array<number>(15).fill(CODE.OK), CODE.OVER_LIMIT]);
    const last = answers.at(-1)!;
    // No current_limit: Envoy would write its own draft-03 headers beside these (service.ts statusOf).
    assert.deepEqual(last.statuses.map((s) => [s.code, s.limitPerSecond, s.remaining]), [[CODE.OK, undefined, 3], [CODE.OVER_LIMIT, undefined, 0]]);
    assert.deepEqual(last.headers, [['x-ratelimit-limit', '15'], ['x-ratelimit-remaining', '0'], ['x-ratelimit-reset', '1'], ['retry-after', '1']]);
    assert.deepEqual(answers[0]!.headers, [['x-ratelimit-limit', '3'], ['x-ratelimit-remaining', '2'], ['x-ratelimit-reset', '1']]);
    const alone = await decide({ domain: 'edge', descriptors: [v6Prefix('2001:db8:5::/48')], hitsAddend: 0 });
    assert.deepEqual([alone.overall, alone.statuses, alone.headers, buckets.calls.length], [CODE.OK, [{ code: CODE.OK }], [], 16]);
  });
});
