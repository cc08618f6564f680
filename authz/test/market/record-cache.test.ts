/**
 * The record cache cursor pages are assembled from (redis-store.ts `#cursorPage`): what it saves
 * (a page over cached markets reads only its ids from Redis), that its entries go with the same
 * invalidations as the other caches (a write through this store, a message from another replica,
 * a reconnect, the TTL), that a newly stored market shows in the next cursor page, that bodies
 * larger than PAGE_BODY_CACHE_MAX_BYTES are not kept by the page cache, and that its bounds hold
 * over more markets than it may keep. Real redis-server, two stores on it as two replicas.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { setTimeout as sleep } from 'node:timers/promises';
import type { Redis } from 'ioredis';
import {
  INDEX_KEY, INVALIDATION_CHANNEL, MARKET_KEY_PREFIX, PAGE_BODY_CACHE_MAX_BYTES, RECORD_CACHE_MAX_BYTES, RECORD_CACHE_MAX_ENTRIES,
  RedisMarketStore,
} from '../../src/market/redis-store.ts';
import { MemoryMarketStore } from '../../src/market/store.ts';
import { PrivateRedis } from '../../../testkit/redis-server.ts';
import { marketDoc } from '../../../testkit/feed.ts';
import { cachingStore, doc, env } from './setup.ts';



/** Script calls Redis has run (the record fetch is the only script a cursor page runs). */
/** Records read from Redis so far: the records script's HMGETs (Redis counts a script's commands too; a cursor page's ids are a script of their own). */
async function recordReads(redis: Redis): Promise<number> {
  return Number(/cmdstat_hmget:calls=(\d+)/.exec(await redis.info('commandstats'))?.[1] ?? 0);
}

const ID = (p: string, i: number): string => `0x${p}-${String(i).padStart(5, '0')}`;

describe('record cache: cursor pages assembled from cached records', () => {
  let redisProc: PrivateRedis;
  let a: { redis: Redis; store: RedisMarketStore };
  let b: { redis: Redis; store: RedisMarketStore };
  before(async () => {
    redisProc = await PrivateRedis.start();
    a = await cachingStore(redisProc.url, 600_000);
    b = await cachingStore(redisProc.url, 600_000);
  });
  after(async () => {
    for (const s of [a, b]) {
      await s.store.close();
      s.redis.disconnect();
    }
    await redisProc.stop();
  });

  test('a second cursor page over the same markets fetches no record; a page over 256 KiB is not kept by the page cache', async () => {
    // 200 markets of ~2.4 KB: a 200-market page is ~480 KB, over PAGE_BODY_CACHE_MAX_BYTES.
    const ids = Array.from({ length: 200 }, (_, i) => ID('big', i));
    const mem = new MemoryMarketStore();
    for (const id of ids) {
      const extra = { question: `${id} ${'q'.repeat(2_000)}?` };
      assert.equal(await a.store.put(doc(id, 1, extra), env(marketDoc(id, 1, extra))), 'stored');
      await mem.put(doc(id, 1, extra), env(marketDoc(id, 1, extra)));
    }
    await sleep(50); // a's invalidations reach b
    const q = { limit: 200, after: '0xbig' };
    const first = await b.store.pageBody(q, 'markets');
    assert.ok(first.body.length > PAGE_BODY_CACHE_MAX_BYTES, `a page of ${first.body.length} bytes`);
    const expected = await mem.pageBody(q, 'markets');
    assert.ok(first.body.equals(expected.body), 'the same bytes as the memory store');
    assert.equal(first.etag, expected.etag, 'the same ETag as the memory store');
    assert.equal(b.store.cachedPages.entries, 0, 'the large body is not kept');
    assert.ok(b.store.cachedRecords.entries >= 200, `records cached: ${b.store.cachedRecords.entries}`);
    const calls = await recordReads(a.redis);
    const shifted = { limit: 199, after: ids[0]! };
    const second = await b.store.pageBody(shifted, 'markets');
    assert.equal(await recordReads(a.redis), calls, 'no record fetched: every one came from the record cache');
    assert.ok(second.body.equals((await mem.pageBody(shifted, 'markets')).body));
    const quotes = await b.store.pageBody(q, 'quotes');
    assert.equal(await recordReads(a.redis), calls, 'quotes pages use the same records');
    assert.ok(quotes.body.equals((await mem.pageBody(q, 'quotes')).body));
  });

  test('a write through another replica (pub/sub) drops the record; a change behind the stores\' backs does not', async () => {
    const id = ID('inv', 0);
    await a.store.put(doc(id, 1), env(marketDoc(id, 1)));
    await sleep(20);
    const q = { limit: 5, after: '0xinv' };
    assert.match((await b.store.pageBody(q, 'markets')).body.toString(), /"seq":1/);
    // Behind the stores' backs (no invalidation), with the page cache dropped by a message for
    // another market: the page is assembled anew, its record still the cached one.
    await a.redis.hset(`${MARKET_KEY_PREFIX}${id}`, 'item', '{"changed":1}');
    await a.redis.publish(INVALIDATION_CHANNEL, '0xsomething-else');
    await sleep(20);
    assert.doesNotMatch((await b.store.pageBody(q, 'markets')).body.toString(), /"changed":1/, 'served from the record cache');
    // A write through a: its message drops b's record, and b's next page has the new one.
    await a.store.put(doc(id, 2), env(marketDoc(id, 2)));
    let body = '';
    for (let i = 0; i < 50 && !body.includes('"seq":2'); i++) {
      body = (await b.store.pageBody(q, 'markets')).body.toString();
      if (!body.includes('"seq":2')) await sleep(10);
    }
    assert.match(body, /"seq":2/);
    // A write through b itself: no wait.
    await b.store.put(doc(id, 3), env(marketDoc(id, 3)));
    assert.match((await b.store.pageBody(q, 'markets')).body.toString(), /"seq":3/);
  });

  test('a newly stored market is in the next cursor page at once, on the replica that stored it and on another', async () => {
    const q = { limit: 10, after: '0xnew' };
    await a.store.put(doc(ID('new', 1), 1), env(marketDoc(ID('new', 1), 1)));
    await sleep(20);
    assert.deepEqual(conditionIds(await b.store.pageBody(q, 'markets')), [ID('new', 1)]);
    await a.store.put(doc(ID('new', 0), 1), env(marketDoc(ID('new', 0), 1)));
    assert.deepEqual(conditionIds(await a.store.pageBody(q, 'markets')), [ID('new', 0), ID('new', 1)]);
    let seen: string[] = [];
    for (let i = 0; i < 50 && seen.length < 2; i++) {
      seen = conditionIds(await b.store.pageBody(q, 'markets'));
      if (seen.length < 2) await sleep(10);
    }
    assert.deepEqual(seen, [ID('new', 0), ID('new', 1)]);
  });

  test('a lost invalidation is bounded by MARKET_CACHE_TTL_MS', async () => {
    const c = await cachingStore(redisProc.url, 150);
    try {
      const id = ID('ttl', 0);
      await a.store.put(doc(id, 1), env(marketDoc(id, 1)));
      await sleep(20);
      const q = { limit: 5, after: '0xttl' };
      await c.store.pageBody(q, 'markets');
      await c.redis.hset(`${MARKET_KEY_PREFIX}${id}`, 'item', '{"late":1}');
      await sleep(200);
      assert.match((await c.store.pageBody(q, 'markets')).body.toString(), /"late":1/);
    } finally {
      await c.store.close();
      c.redis.disconnect();
    }
  });

  test(`over ${(RECORD_CACHE_MAX_ENTRIES + 5_000).toLocaleString('en')} markets the record cache stays within its entry and byte bounds, and every page is whole`, async () => {
    const c = await cachingStore(redisProc.url, 600_000);
    try {
      // Written straight into Redis's layout (the put script's fields): quicker than 25,000 puts.
      const n = RECORD_CACHE_MAX_ENTRIES + 5_000;
      const item = (i: number): string => JSON.stringify({ conditionId: ID('bound', i), seq: 1 });
      for (let from = 0; from < n; from += 1_000) {
        const p = a.redis.pipeline();
        for (let i = from; i < Math.min(n, from + 1_000); i++) {
          p.hset(`${MARKET_KEY_PREFIX}${ID('bound', i)}`, 'seq', '1', 'item', item(i), 'quotes', '');
          p.zadd(INDEX_KEY, 0, ID('bound', i));
        }
        await p.exec();
      }
      let after = '0xbound';
      let seen = 0;
      let maxEntries = 0;
      let maxBytes = 0;
      for (;;) {
        const page = await c.store.pageBody({ limit: 500, after }, 'markets');
        const got = (JSON.parse(page.body.toString()) as { markets: { conditionId: string }[]; nextCursor: string | null }).markets
          .filter((m) => m.conditionId?.startsWith('0xbound-'));
        for (const [k, m] of got.entries()) assert.equal(m.conditionId, ID('bound', seen + k), 'in order, none skipped');
        seen += got.length;
        maxEntries = Math.max(maxEntries, c.store.cachedRecords.entries);
        maxBytes = Math.max(maxBytes, c.store.cachedRecords.bytes);
        if (got.length < 500) break;
        after = got.at(-1)!.conditionId;
      }
      assert.equal(seen, n);
      assert.ok(maxEntries <= RECORD_CACHE_MAX_ENTRIES, `entries ${maxEntries} ≤ ${RECORD_CACHE_MAX_ENTRIES}`);
      assert.ok(maxBytes <= RECORD_CACHE_MAX_BYTES, `bytes ${maxBytes} ≤ ${RECORD_CACHE_MAX_BYTES}`);
      assert.equal(maxEntries, RECORD_CACHE_MAX_ENTRIES, 'the bound was reached');
    } finally {
      await c.store.close();
      c.redis.disconnect();
    }
  });

  test('a reconnect of the subscriber drops every cached record', async () => {
    const id = ID('rec', 0);
    await a.store.put(doc(id, 1), env(marketDoc(id, 1)));
    await sleep(20);
    await b.store.pageBody({ limit: 5, after: '0xrec' }, 'markets');
    assert.ok(b.store.cachedRecords.entries > 0);
    await a.redis.call('CLIENT', 'KILL', 'TYPE', 'pubsub');
    for (let i = 0; i < 100 && b.store.cachedRecords.entries > 0; i++) await sleep(10);
    assert.equal(b.store.cachedRecords.entries, 0);
  });
});

function conditionIds(page: { body: Buffer }): string[] {
  return (JSON.parse(page.body.toString()) as { markets: { conditionId: string }[] }).markets.map((m) => m.conditionId);
}
