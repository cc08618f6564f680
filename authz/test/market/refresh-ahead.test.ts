/**
 * Issue 27: one Redis reply later than REDIS_COMMAND_TIMEOUT_MS (a busy host) failed every order
 * in flight for a market with 503 service_unavailable, because they all joined the one lookup
 * that replaced the expired cache entry (reliability 5: 20 orders at once). A hit in the second
 * half of the entry's life now refreshes it in the background. A real redis-server behind a
 * fault-injecting proxy ('hold' = Redis stalled); the store's clock is the test's.
 */
import { after, before, beforeEach, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { setTimeout as sleep } from 'node:timers/promises';
import type { Redis } from 'ioredis';
import { createRedis, REDIS_COMMAND_TIMEOUT_MS } from '../../src/common/adapters/redis.ts';
import { MARKET_KEY_PREFIX, RedisMarketStore } from '../../src/market/redis-store.ts';
import type { MarketMeta } from '../../src/common/ports.ts';
import { encodeMarket, type Page } from '../../src/market/store.ts';
import { validateDocument } from '../../src/common/feed/schema.ts';
import { FaultProxy } from '../fault-proxy.ts';
import { PrivateRedis } from '../../../testkit/redis-server.ts';
import { envelopeFor, marketDoc, newFeedKey } from '../../../testkit/feed.ts';

const feed = newFeedKey();
const TTL = 2000;

describe('cache entries in use are refreshed before they expire (issue 27)', () => {
  let redisProc: PrivateRedis;
  let proxy: FaultProxy;
  let direct: Redis;
  let viaProxy: Redis;
  let store: RedisMarketStore;
  let t = 0;

  /**
   * Writes market `id` (seq 1) straight into Redis, as an ingest would but without the
   * invalidation message: its delivery time is not the subject here, and a late one would drop
   * the entry under test.
   */
  async function seed(id: string): Promise<void> {
    const raw = marketDoc(id, 1);
    const r = validateDocument(raw);
    assert.ok(r.ok);
    const m = encodeMarket(r.document, envelopeFor(raw, feed) as { d: string; s: string; k: 'ed25519-sha256' });
    await direct.hset(MARKET_KEY_PREFIX + id, 'seq', '1', 'item', m.item, 'quotes', m.quotes);
  }

  /** Changes what Redis holds for `id` without an invalidation (as if the message were lost). */
  async function changeSilently(id: string): Promise<void> {
    const item = JSON.parse(String(await direct.hget(MARKET_KEY_PREFIX + id, 'item'))) as Record<string, unknown>;
    await direct.hset(MARKET_KEY_PREFIX + id, 'item', JSON.stringify({ ...item, closed: true }));
  }

  /** Polls until `done` (a cache hit shows the refreshed value); 5 s for a round trip of ~1 ms: a busy host's margin. */
  async function until(done: () => boolean | Promise<boolean>, what: string): Promise<void> {
    for (const end = Date.now() + 5000; Date.now() < end; await sleep(10)) if (await done()) return;
    assert.fail(`not within 5 s: ${what}`);
  }

  before(async () => {
    redisProc = await PrivateRedis.start();
    proxy = await FaultProxy.start(redisProc.port);
    direct = createRedis(redisProc.url);
    viaProxy = createRedis(proxy.url);
    viaProxy.on('error', () => {}); // the stalls below are deliberate
    store = new RedisMarketStore(viaProxy, { cacheTtlMs: TTL, now: () => t });
    await until(() => store.caching, 'the store subscribed to invalidations');
  });
  beforeEach(() => {
    proxy.mode = 'pass';
  });
  after(async () => {
    await store.close();
    viaProxy.disconnect();
    direct.disconnect();
    await proxy.close();
    await redisProc.stop();
  });

  test('a market looked up at least once per half TTL is answered from memory through a Redis stall, and kept current', async () => {
    t = 0;
    await seed('0xra-order');
    assert.equal((await store.get('0xra-order'))?.closed, false, 'first lookup: Redis');
    await changeSilently('0xra-order');
    proxy.mode = 'hold';
    t = 0.6 * TTL; // second half: the hit answers and starts a refresh, which the stall times out
    const during = store.get('0xra-order');
    assert.ok(!(during instanceof Promise), 'a hit is answered from memory');
    assert.equal(during?.closed, false);
    await sleep(REDIS_COMMAND_TIMEOUT_MS + 250); // the refresh's command timeout has passed (margin 250 ms)
    t = 0.95 * TTL;
    assert.equal((store.get('0xra-order') as MarketMeta).closed, false, 'still answered from memory after the failed refresh');
    proxy.mode = 'pass';
    // The next hits retry the refresh; the entry takes Redis's value before it would have expired.
    await until(() => (store.get('0xra-order') as MarketMeta).closed, 'a hit shows the refreshed value');
    proxy.mode = 'hold';
    t = 1.5 * TTL; // past the first entry's expiry: without the refresh, this lookup would wait for the stalled Redis
    const later = store.get('0xra-order');
    assert.ok(!(later instanceof Promise), 'answered from memory past the first entry\'s expiry');
    assert.equal(later?.closed, true);
  });

  test('an entry nobody could refresh for half the TTL expires: the lookup goes to Redis and fails closed', async () => {
    t = 10 * TTL;
    await seed('0xra-down');
    assert.equal((await store.get('0xra-down'))?.closed, false);
    proxy.mode = 'hold';
    t = 10.6 * TTL;
    assert.ok(!(store.get('0xra-down') instanceof Promise), 'still fresh: from memory');
    t = 11.1 * TTL;
    const miss = store.get('0xra-down');
    assert.ok(miss instanceof Promise, 'expired: the lookup waits for Redis');
    await assert.rejects(miss, /timed out/);
  });

  test('a cached page in use is refreshed in its second half too (reads)', async () => {
    t = 20 * TTL;
    await seed('0xra-page');
    const q = { limit: 10, ids: ['0xra-page'] };
    const closedIn = (p: Page): boolean => (JSON.parse(p.markets[0]?.item ?? '{}') as { closed?: boolean }).closed === true;
    assert.equal(closedIn(await store.page(q)), false);
    await changeSilently('0xra-page');
    t = 20.6 * TTL;
    await until(async () => closedIn(await store.page(q)), 'a page read shows the refreshed value');
    proxy.mode = 'hold';
    t = 21.5 * TTL; // past the first page's expiry
    const started = Date.now();
    assert.equal(closedIn(await store.page(q)), true);
    assert.ok(Date.now() - started < REDIS_COMMAND_TIMEOUT_MS, 'from memory, not a stalled Redis (which would have rejected after the command timeout)');
  });
});
