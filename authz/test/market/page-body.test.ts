/**
 * Pages rendered by the store as one Buffer (`pageBody`, what the market service sends) against
 * the body the records of `page()` make the way the service built it until 2026-11-26 (a string
 * join of the stored texts per request): byte for byte the same, for every query shape, both
 * stores, markets and quotes, non-ASCII text included. And the ETag follows the records' seq.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { Writable } from 'node:stream';
import { setTimeout as sleep } from 'node:timers/promises';
import type { Redis } from 'ioredis';
import { Registry } from 'prom-client';
import { createLogger } from '../../src/common/log.ts';
import { BODY_POOL_BUFFERS, BODY_POOL_MAX_BYTES, BodyBuffers, createMarketService, type MarketService } from '../../src/market/http.ts';
import { createRedis } from '../../src/common/adapters/redis.ts';
import { MARKET_READ_COMMANDS, PAGE_BODY_CACHE_MAX_BYTES, RedisMarketStore } from '../../src/market/redis-store.ts';
import { encodeCursor, MemoryMarketStore, type MarketStore, type Page, type PageKind, type PageQuery } from '../../src/market/store.ts';
import { PrivateRedis } from '../../../testkit/redis-server.ts';
import { marketDoc } from '../../../testkit/feed.ts';
import { cachingStore, connectRedis, doc, env, feed } from './setup.ts';


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

  test('reads on a client that lists MARKET_READ_COMMANDS as autoPipeliningIgnoredCommands (as the service\'s) wait in no auto-pipeline; without the list they do', async () => {
    for (const ignored of [true, false]) {
      const client = createRedis(redisProc.url, ignored ? { autoPipeliningIgnoredCommands: [...MARKET_READ_COMMANDS] } : {});
      await new Promise<void>((res) => client.once('ready', () => res()));
      // TTL 0: every read goes to Redis (no cache in front).
      const direct = new RedisMarketStore(client, { cacheTtlMs: 0 });
      try {
        // The store's own clock sample (TIME, not a read) may be waiting: count from here.
        await sleep(20);
        const before = client.autoPipelineQueueSize;
        // Each read kind the store sends: listed ids (its page script), a cursor page (its ids script, then the records script).
        const reads = [direct.pageBody({ limit: 5, ids: IDS.slice(0, 5) }, 'markets'), direct.pageBody({ limit: 5 }, 'markets'), direct.page({ limit: 5 })];
        const queued = client.autoPipelineQueueSize - before;
        await Promise.all(reads);
        const cursorRecords = direct.pageBody({ limit: 5, after: IDS[9] }, 'quotes');
        // The records script is sent after the ids script's reply: count what waits once that reply is in.
        await sleep(20);
        const queuedAfter = client.autoPipelineQueueSize;
        await cursorRecords;
        if (ignored) assert.deepEqual([queued, queuedAfter], [0, 0], 'no read waits in an auto-pipeline');
        else assert.ok(queued >= 3, `without the list the same reads are auto-pipelined: ${queued}`);
      } finally {
        await direct.close();
        client.disconnect();
      }
    }
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

describe('a page over PAGE_BODY_CACHE_MAX_BYTES is written from its parts', () => {
  let redisProc: PrivateRedis;
  let redis: Redis;
  let store: RedisMarketStore;
  let svc: MarketService;
  let base: string;
  const mem = new MemoryMarketStore();
  // 300 markets of ~2.4 KB with non-ASCII text: a 300-market page is ~700 KB.
  const BIG = Array.from({ length: 300 }, (_, i) => `0xpp-${String(i).padStart(3, '0')}`);
  before(async () => {
    redisProc = await PrivateRedis.start();
    redis = createRedis(redisProc.url);
    await new Promise<void>((res) => redis.once('ready', () => res()));
    store = new RedisMarketStore(redis, { cacheTtlMs: 60_000 });
    for (const end = Date.now() + 5_000; !store.caching && Date.now() < end;) await sleep(10);
    for (const [i, id] of BIG.entries()) {
      const extra = { question: `${id} ${'ü'.repeat(1_000)} ✓ ${i}?`, ...(i % 5 === 0 ? { outcomes: [] } : {}) };
      assert.equal(await store.put(doc(id, 1 + (i % 3), extra), env(marketDoc(id, 1 + (i % 3), extra))), 'stored');
      await mem.put(doc(id, 1 + (i % 3), extra), env(marketDoc(id, 1 + (i % 3), extra)));
    }
    svc = createMarketService({
      store, feedKeys: [feed.publicKey], ingestMaxBytes: 1_048_576, logger: createLogger('silent', new Writable({ write: (_c, _e, cb) => cb() })),
      registry: new Registry(), readiness: () => ({ store: true }), isSealed: () => false, host: '127.0.0.1', port: 0,
    });
    base = `http://127.0.0.1:${await svc.listen()}`;
  });
  after(async () => {
    await svc.close();
    await store.close();
    redis.disconnect();
    await redisProc.stop();
  });

  test('over HTTP: the same bytes, length and ETag as the joined body, 8 at a time, markets and quotes, with and without a next cursor', async () => {
    // Markets pages are over the bound (written from parts), the quotes page under it (one Buffer).
    const queries: { path: string; q: PageQuery; kind: PageKind }[] = [
      { path: '/v1/markets?limit=500', q: { limit: 500 }, kind: 'markets' },
      { path: `/v1/markets?limit=250&cursor=${encodeCursor(BIG[10]!)}`, q: { limit: 250, after: BIG[10] }, kind: 'markets' },
      { path: '/v1/quotes?limit=500', q: { limit: 500 }, kind: 'quotes' },
    ];
    for (const { path, q, kind } of queries) {
      const expected = await mem.pageBody(q, kind);
      const fromStore = await store.pageBody(q, kind);
      assert.equal(fromStore.parts !== undefined, expected.body.length > PAGE_BODY_CACHE_MAX_BYTES, `${path}: parts iff over the bound (${expected.body.length} bytes)`);
      assert.ok(fromStore.body.equals(expected.body), `${path}: the joined parts are the memory store's body`);
      for (let round = 0; round < 3; round++) {
        const answers = await Promise.all(Array.from({ length: 8 }, async () => {
          const r = await fetch(`${base}${path}`);
          return { status: r.status, length: r.headers.get('content-length'), etag: r.headers.get('etag'), body: Buffer.from(await r.arrayBuffer()) };
        }));
        for (const a of answers) {
          assert.equal(a.status, 200);
          assert.equal(a.length, String(expected.body.length));
          assert.equal(a.etag, expected.etag);
          assert.ok(a.body.equals(expected.body), `${path}: the bytes served are the joined body's`);
        }
      }
    }
    // A client that has the page gets 304 without a body.
    const r = await fetch(`${base}/v1/markets?limit=500`, { headers: { 'if-none-match': (await mem.pageBody({ limit: 500 }, 'markets')).etag } });
    assert.equal(r.status, 304);
  });
});

test('BodyBuffers: a buffer given back is reused; at most BODY_POOL_BUFFERS are kept, none over BODY_POOL_MAX_BYTES', () => {
  const pool = new BodyBuffers();
  const a = pool.take(700_000);
  assert.ok(a.length >= 700_000);
  pool.give(a);
  assert.equal(pool.take(600_000), a, 'reused for a smaller body');
  assert.notEqual(pool.take(600_000), a, 'not handed out twice');
  const many = Array.from({ length: BODY_POOL_BUFFERS + 3 }, () => pool.take(100_000));
  for (const b of many) pool.give(b);
  assert.equal(pool.size, BODY_POOL_BUFFERS);
  pool.give(Buffer.allocUnsafeSlow(BODY_POOL_MAX_BYTES + 1));
  assert.ok(pool.size <= BODY_POOL_BUFFERS);
  for (let i = 0; i < BODY_POOL_BUFFERS; i++) assert.ok(pool.take(1).length <= BODY_POOL_MAX_BYTES);
});
