/**
 * Acknowledgements across a Sentinel failover (REDIS_MIN_REPLICAS; docs/operations.md "Redis").
 *
 * On real processes: a private redis-server without replicas, then a Sentinel deployment on
 * loopback (a master, a replica, three Sentinels; testkit/sentinel.ts). The failover test
 * runs the stores both ways side by side: with REDIS_MIN_REPLICAS=0 (the master's
 * acknowledgement is enough) and =1. While the replica lags (its link frozen) the master is
 * killed and Sentinel promotes the replica: with 0, nonces and records acknowledged meanwhile
 * are gone and those nonces are accepted again (the fault); with 1, nothing was acknowledged
 * while no replica confirmed, and everything acknowledged survives.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import type { Redis } from 'ioredis';
import { createRedis, REDIS_COMMAND_TIMEOUT_MS } from '../src/common/adapters/redis.ts';
import { ReplicaWait, ReplicaWaitError } from '../src/common/adapters/replica-wait.ts';
import { NONCE_PREFIX, RedisNonceStore } from '../src/common/adapters/nonce-store.ts';
import { MARKET_KEY_PREFIX, RedisMarketStore } from '../src/market/redis-store.ts';
import { StoreOutcomeUnknownError, StoreUnavailableError } from '../src/market/store.ts';
import { validateDocument, type MarketDocument } from '../src/common/feed/schema.ts';
import type { Envelope } from '../src/common/feed/envelope.ts';
import { ConfigError, configWarnings, loadConfig } from '../src/common/config.ts';
import { PrivateRedis } from '../../testkit/redis-server.ts';
import { SentinelDeployment } from '../../testkit/sentinel.ts';
import { envelopeFor, marketDoc, newFeedKey } from '../../testkit/feed.ts';

const WAIT_MS = 100;
const feed = newFeedKey();

function doc(id: string, seq: number): { document: MarketDocument; envelope: Envelope } {
  const raw = marketDoc(id, seq);
  const r = validateDocument(raw);
  assert.ok(r.ok);
  return { document: r.document, envelope: envelopeFor(raw, feed) as Envelope };
}

async function ready(...rs: Redis[]): Promise<void> {
  const end = Date.now() + 15_000;
  for (const r of rs) {
    while (r.status !== 'ready') {
      assert.ok(Date.now() < end, `Redis client still ${r.status}`);
      await new Promise((res) => setTimeout(res, 20));
    }
  }
}

const nonce = (): string => randomBytes(16).toString('hex');

/** The writes of one setting: its stores on their connections. */
interface Side {
  readonly main: Redis;
  readonly writes: Redis | undefined;
  readonly replicas: ReplicaWait | undefined;
  readonly nonces: RedisNonceStore;
  readonly store: RedisMarketStore;
}

function side(url: string, minReplicas: number): Side {
  const main = createRedis(url);
  main.on('error', () => {});
  if (minReplicas === 0) {
    return { main, writes: undefined, replicas: undefined, nonces: new RedisNonceStore(main), store: new RedisMarketStore(main, { cacheTtlMs: 0 }) };
  }
  const writes = createRedis(url, { commandTimeout: REDIS_COMMAND_TIMEOUT_MS + WAIT_MS });
  writes.on('error', () => {});
  const replicas = new ReplicaWait(writes, { minReplicas, waitMs: WAIT_MS });
  return {
    main, writes, replicas, nonces: new RedisNonceStore(main, replicas),
    store: new RedisMarketStore(main, { cacheTtlMs: 0, replicas, writeTimeoutMs: REDIS_COMMAND_TIMEOUT_MS + WAIT_MS }),
  };
}

async function closeSide(s: Side): Promise<void> {
  await s.store.close();
  s.replicas?.close();
  s.main.disconnect();
}

test('REDIS_MIN_REPLICAS and REDIS_REPLICA_WAIT_MS: defaults, bounds, REDIS_URL required, the warnings', () => {
  const sentinel = 'redis+sentinel://127.0.0.1:26379/edge';
  assert.equal(loadConfig({}).redisMinReplicas, 0);
  assert.equal(loadConfig({}).redisReplicaWaitMs, 200);
  assert.equal(loadConfig({ REDIS_URL: sentinel, REDIS_MIN_REPLICAS: '2', REDIS_REPLICA_WAIT_MS: '50' }).redisMinReplicas, 2);
  for (const [env, variable] of [
    [{ REDIS_MIN_REPLICAS: '1' }, 'REDIS_MIN_REPLICAS'],
    [{ REDIS_URL: sentinel, REDIS_MIN_REPLICAS: '-1' }, 'REDIS_MIN_REPLICAS'],
    [{ REDIS_URL: sentinel, REDIS_MIN_REPLICAS: '17' }, 'REDIS_MIN_REPLICAS'],
    [{ REDIS_URL: sentinel, REDIS_MIN_REPLICAS: 'one' }, 'REDIS_MIN_REPLICAS'],
    [{ REDIS_REPLICA_WAIT_MS: '0' }, 'REDIS_REPLICA_WAIT_MS'],
    [{ REDIS_REPLICA_WAIT_MS: '10001' }, 'REDIS_REPLICA_WAIT_MS'],
  ] as const) {
    assert.throws(() => loadConfig(env), (err: unknown) => err instanceof ConfigError && err.variable === variable, JSON.stringify(env));
  }
  assert.match(configWarnings(loadConfig({ REDIS_URL: sentinel })).join('\n'), /REDIS_URL names Sentinels but REDIS_MIN_REPLICAS=0/);
  assert.deepEqual(configWarnings(loadConfig({ REDIS_URL: sentinel, REDIS_MIN_REPLICAS: '1' })), []);
  assert.deepEqual(configWarnings(loadConfig({ REDIS_URL: 'redis://127.0.0.1:6379' })), [], 'one Redis without Sentinel: nothing to fail over');
  assert.match(configWarnings(loadConfig({ REDIS_URL: sentinel, REDIS_MIN_REPLICAS: '1', REDIS_REPLICA_WAIT_MS: '250' })).join('\n'), /REDIS_REPLICA_WAIT_MS=250 is too long for AUTHZ_TIMEOUT_MS=1000/);
  assert.deepEqual(configWarnings(loadConfig({ REDIS_URL: sentinel, REDIS_MIN_REPLICAS: '1', REDIS_REPLICA_WAIT_MS: '250', AUTHZ_TIMEOUT_MS: '2000' })), []);
});

describe('ReplicaWait on a Redis without replicas', () => {
  let redis: PrivateRedis;
  let s: Side;
  let direct: Redis;
  before(async () => {
    redis = await PrivateRedis.start();
    s = side(redis.url, 1);
    direct = createRedis(redis.url);
    await ready(s.main, s.writes as Redis, direct);
  });
  after(async () => {
    await closeSide(s);
    direct.disconnect();
    await redis.stop();
  });

  test('no replica confirms: 100 concurrent nonces are all refused after two waits, sharing two WAITs; the master keeps them', async () => {
    const replicas = s.replicas as ReplicaWait;
    const before = replicas.barriers;
    const ns = Array.from({ length: 100 }, nonce);
    const t0 = Date.now();
    const results = await Promise.allSettled(ns.map((n) => s.nonces.recordIfAbsent(n, 600)));
    const took = Date.now() - t0;
    for (const r of results) {
      assert.equal(r.status, 'rejected');
      assert.ok(r.reason instanceof ReplicaWaitError, String(r.reason));
      assert.match(String(r.reason), /0 of 1 replica\(s\) confirmed within 100 ms/);
    }
    // Two WAITs, each ending on Redis's clock tick (hz 10: up to 100 ms past its timeout): ~400 ms,
    // 674 ms seen at load 11. The bound only has to tell shared waits from one wait per nonce
    // (100 × 100 ms = 10 s); the WAIT count below is the exact check.
    assert.ok(took < 2000, `${took} ms`);
    assert.ok(replicas.barriers - before <= 2, `${replicas.barriers - before} WAITs`);
    // Refused, yet on the master (docs/api.md: a nonce in flight may be recorded after a 503).
    assert.equal(await direct.exists(NONCE_PREFIX + ns[0]), 1);
    // Its replay is refused without waiting for anything.
    assert.equal(await s.nonces.recordIfAbsent(ns[0] as string, 600), 'replay');
  });

  test('a record the master stored but no replica confirmed is outcome-unknown (504); an unconfirmed stale one stored nothing (503)', async () => {
    const d = doc('0xrw-unconfirmed', 3);
    await assert.rejects(s.store.put(d.document, d.envelope), (err: unknown) => err instanceof StoreOutcomeUnknownError && /not confirmed by a replica/.test(String(err)));
    assert.equal(await direct.hget(MARKET_KEY_PREFIX + '0xrw-unconfirmed', 'seq'), '3');
    await assert.rejects(s.store.put(d.document, d.envelope), (err: unknown) => err instanceof StoreUnavailableError);
  });

  test('the connection changed between a write and its confirmation: refused (the barrier would vouch for another server)', async () => {
    const replicas = s.replicas as ReplicaWait;
    const epoch = replicas.epoch;
    const closed = new Promise((res) => replicas.redis.once('close', res));
    replicas.redis.disconnect(true);
    await closed;
    await assert.rejects(replicas.confirm(epoch), (err: unknown) => err instanceof ReplicaWaitError && /connection changed/.test(String(err)));
    await ready(replicas.redis);
  });
});

describe('Sentinel failover (a master, a replica, three Sentinels on loopback)', () => {
  let d: SentinelDeployment;
  let off: Side;
  let on: Side;
  before(async () => {
    d = await SentinelDeployment.start({ replicas: 1 });
    off = side(d.url, 0);
    on = side(d.url, 1);
    await ready(off.main, on.main, on.writes as Redis);
  });
  after(async () => {
    await closeSide(off);
    await closeSide(on);
    await d?.stop();
  });

  test('healthy replica: every nonce and record is confirmed; 200 concurrent nonces share a few WAITs', async () => {
    const replicas = on.replicas as ReplicaWait;
    const before = replicas.barriers;
    const results = await Promise.all(Array.from({ length: 200 }, () => on.nonces.recordIfAbsent(nonce(), 600)));
    assert.deepEqual(new Set(results), new Set(['recorded']));
    assert.ok(replicas.barriers - before <= 10, `${replicas.barriers - before} WAITs for 200 nonces`);
    const x = doc('0xrw-healthy', 1);
    assert.equal(await on.store.put(x.document, x.envelope), 'stored');
    assert.equal(await on.store.put(x.document, x.envelope), 'stale');
  });

  test('master killed while the replica lags: with REDIS_MIN_REPLICAS=0 acknowledged nonces and records are lost and the nonces accepted again; with 1, none', async () => {
    // Acknowledged while replication works: both settings keep these.
    const early = { off: Array.from({ length: 20 }, nonce), on: Array.from({ length: 20 }, nonce) };
    for (const n of early.off) assert.equal(await off.nonces.recordIfAbsent(n, 600), 'recorded');
    for (const n of early.on) assert.equal(await on.nonces.recordIfAbsent(n, 600), 'recorded');
    const e1 = doc('0xrw-early-off', 1);
    const e2 = doc('0xrw-early-on', 1);
    assert.equal(await off.store.put(e1.document, e1.envelope), 'stored');
    assert.equal(await on.store.put(e2.document, e2.envelope), 'stored');
    // Replicas confirmed `on`'s writes, and `off`'s came first on the same master: all replicated.

    d.freezeReplication();
    const late = { off: Array.from({ length: 20 }, nonce), on: Array.from({ length: 20 }, nonce) };
    const ackedOff: string[] = [];
    for (const n of late.off) if (await off.nonces.recordIfAbsent(n, 600) === 'recorded') ackedOff.push(n);
    const lateRecordOff = doc('0xrw-late-off', 1);
    assert.equal(await off.store.put(lateRecordOff.document, lateRecordOff.envelope), 'stored', 'REDIS_MIN_REPLICAS=0 acknowledges on the master alone');
    assert.equal(ackedOff.length, 20);
    const onResults = await Promise.allSettled(late.on.map((n) => on.nonces.recordIfAbsent(n, 600)));
    assert.equal(onResults.filter((r) => r.status === 'fulfilled').length, 0, 'REDIS_MIN_REPLICAS=1 acknowledged a nonce no replica holds');
    const lateRecordOn = doc('0xrw-late-on', 1);
    await assert.rejects(on.store.put(lateRecordOn.document, lateRecordOn.envelope), StoreOutcomeUnknownError);

    const old = await d.master();
    assert.ok(old !== undefined);
    await d.kill(old);
    const promoted = await d.promotion(old);
    const direct = createRedis(`redis://127.0.0.1:${promoted}/0`);
    try {
      await ready(direct, off.main, on.main, on.writes as Redis);
      const present = async (ns: string[]): Promise<number> => (ns.length === 0 ? 0 : direct.exists(...ns.map((n) => NONCE_PREFIX + n)));
      // REDIS_MIN_REPLICAS=0: everything acknowledged after the freeze is gone …
      assert.equal(await present(early.off), 20);
      assert.equal(await present(ackedOff), 0, 'nonces acknowledged with REDIS_MIN_REPLICAS=0 survived (the replica did not lag?)');
      assert.equal(await direct.exists(MARKET_KEY_PREFIX + '0xrw-late-off'), 0, 'an acknowledged record is lost');
      // … and the signed ingest those nonces carried is accepted a second time.
      const replayed = await Promise.all(ackedOff.map((n) => off.nonces.recordIfAbsent(n, 600)));
      assert.equal(replayed.filter((r) => r === 'recorded').length, 20, 'every lost nonce is accepted again: a replay');
      // REDIS_MIN_REPLICAS=1: nothing acknowledged is missing, no acknowledged nonce is accepted again.
      assert.equal(await present(early.on), 20);
      assert.equal(await direct.hget(MARKET_KEY_PREFIX + '0xrw-early-on', 'seq'), '1');
      const again = await Promise.all(early.on.map((n) => on.nonces.recordIfAbsent(n, 600)));
      assert.deepEqual(new Set(again), new Set(['replay']));
    } finally {
      direct.disconnect();
    }
  });
});
