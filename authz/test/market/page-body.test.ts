/**
 * Pages rendered by the store as one Buffer (`pageBody`, what the market service sends) against
 * the body the records of `page()` make the way the service built it until 2026-11-26 (a string
 * join of the stored texts per request): byte for byte the same, for every query shape, both
 * stores, markets and quotes, non-ASCII text included. And the ETag follows the records' seq.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import type { Redis } from 'ioredis';
import { RedisMarketStore } from '../../src/market/redis-store.ts';
import { encodeCursor, MemoryMarketStore, type MarketStore, type Page, type PageKind, type PageQuery } from '../../src/market/store.ts';
import { PrivateRedis } from '../../../testkit/redis-server.ts';
import { marketDoc } from '../../../testkit/feed.ts';
import { cachingStore, connectRedis, doc, env } from './setup.ts';


/** The body as the service rendered it before pageBody: string joins of page()'s records. */
function oldBody(kind: PageKind, page: Page): Buffer {
  const next = JSON.stringify(page.next === undefined ? null : encodeCursor(page.next));
  return Buffer.from(kind === 'markets'
    ? `{"markets":[${page.markets.map((m) => m.item).join(',')}],"nextCursor":${next}}`
    : `{"quotes":[${page.markets.map((m) => m.quotes).filter((x) => x !== '').join(',')}],"nextCursor":${next}}`);
}

const IDS = Array.from({ length: 40 }, (_, i) => `0xpb-${String(i).padStart(3, '0')}`);

async function fill(store: MarketStore): Promise<void> {
  for (const [i, id] of IDS.entries()) {
    // Non-ASCII text (two- to four-byte UTF-8), markets with and without outcomes, both `active` values.
    const extra = { active: i % 3 !== 0, question: `Ünïcödé ${i} — 市場 ✓ 🎲?`, ...(i % 7 === 0 ? { outcomes: [] } : {}) };
    assert.equal(await store.put(doc(id, 1 + (i % 4), extra), env(marketDoc(id, 1 + (i % 4), extra))), 'stored');
  }
}

const QUERIES: PageQuery[] = [
  { limit: 100 }, { limit: 500 }, { limit: 1 }, { limit: 7 }, { limit: 7, after: IDS[5] }, { limit: 10, after: IDS[35] },
  { limit: 10, after: IDS[39] }, { limit: 5, active: true }, { limit: 5, active: false, after: IDS[9] },
  { limit: 100, ids: IDS }, { limit: 3, ids: [IDS[4]!, IDS[1]!, IDS[4]!, IDS[30]!, IDS[2]!] }, { limit: 2, ids: IDS.slice(0, 9), after: IDS[3] },
  { limit: 100, ids: ['0xpb-none', IDS[7]!] }, { limit: 100, ids: ['0xpb-none'] }, { limit: 4, ids: IDS.slice(0, 20), active: false },
  { limit: 100, ids: IDS.slice(10, 30), active: true }, { limit: 100, ids: [IDS[1]!], after: IDS[1] },
];

async function assertIdentical(store: MarketStore): Promise<void> {
  for (const q of QUERIES) {
    for (const kind of ['markets', 'quotes'] as const) {
      const fresh = await store.pageBody(q, kind);
      const expected = oldBody(kind, await store.page(q));
      assert.ok(fresh.body.equals(expected), `${kind} ${JSON.stringify(q)}:\n${fresh.body.toString().slice(0, 300)}\nvs\n${expected.toString().slice(0, 300)}`);
      // A second read (a page-cache hit on Redis) answers the same bytes and ETag.
      const again = await store.pageBody(q, kind);
      assert.ok(again.body.equals(expected));
      assert.equal(again.etag, fresh.etag);
    }
  }
}

describe('page bodies as one Buffer are byte-identical to the joined records', () => {
  let redisProc: PrivateRedis;
  let redis: Redis;
  let store: RedisMarketStore;
  before(async () => {
    redisProc = await PrivateRedis.start();
    ({ redis, store } = await cachingStore(redisProc.url, 60_000));
    await fill(store);
  });
  after(async () => {
    await store.close();
    redis.disconnect();
    await redisProc.stop();
  });

  test('Redis store: every query shape, markets and quotes, UTF-8 text included', async () => {
    await assertIdentical(store);
  });

  test('Redis store without the page cache (MARKET_CACHE_TTL_MS=0): the same bytes', async () => {
    const conn = await connectRedis(redisProc.url);
    const direct = new RedisMarketStore(conn, { cacheTtlMs: 0 });
    try {
      await assertIdentical(direct);
    } finally {
      await direct.close();
      conn.disconnect();
    }
  });

  test('memory store: the same bytes', async () => {
    const mem = new MemoryMarketStore();
    await fill(mem);
    await assertIdentical(mem);
  });

  test('ETag: the same on both stores for the same records; a new seq of one market changes it, an unrelated write does not', async () => {
    const mem = new MemoryMarketStore();
    await fill(mem);
    const q = { limit: 3, ids: [IDS[1]!, IDS[2]!] };
    const before1 = await store.pageBody(q, 'markets');
    assert.equal(before1.etag, (await mem.pageBody(q, 'markets')).etag);
    assert.notEqual(before1.etag, (await store.pageBody(q, 'quotes')).etag, 'markets and quotes differ');
    await store.put(doc(IDS[20]!, 9), env(marketDoc(IDS[20]!, 9)));
    assert.equal((await store.pageBody(q, 'markets')).etag, before1.etag, 'a write to another market keeps the ETag');
    await store.put(doc(IDS[2]!, 9), env(marketDoc(IDS[2]!, 9)));
    const after1 = await store.pageBody(q, 'markets');
    assert.notEqual(after1.etag, before1.etag);
    assert.match(after1.body.toString(), /"seq":9/);
  });
});
