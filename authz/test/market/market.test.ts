/**
 * Market data service on real Redis (a private redis-server, so Redis can be stopped and the
 * keyspace is ours): the HTTP service called directly, and the store at its interface.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { Writable } from 'node:stream';
import { connect } from 'node:net';
import { setTimeout as sleep } from 'node:timers/promises';
import { Registry } from 'prom-client';
import type { Redis } from 'ioredis';
import { createLogger } from '../../src/common/log.ts';
import { createMarketService, idCountExceeds, MAX_HEADER_BYTES, TOO_MANY_IDS, type MarketService } from '../../src/market/http.ts';
import { LIMIT } from '../../src/common/rules.ts';
import {
  INVALIDATION_CHANNEL, MARKET_KEY_PREFIX, MARKET_MISS_CACHE_MAX_ENTRIES, PAGE_CACHE_MAX_BYTES, PAGE_CACHE_MAX_ENTRIES, RedisMarketStore,
} from '../../src/market/redis-store.ts';
import { MemoryMarketStore, type MarketStore } from '../../src/market/store.ts';
import { PrivateRedis } from '../../../testkit/redis-server.ts';
import { marketDoc } from '../../../testkit/feed.ts';
import { cachingStore, connectRedis, doc, env, feed } from './setup.ts';

const logger = createLogger('silent', new Writable({ write: (_c, _e, cb) => cb() }));

interface Svc { store: MarketStore; svc: MarketService; base: string; redis: Redis }

async function startService(url: string, cacheTtlMs = 2000): Promise<Svc> {
  const { redis, store } = await cachingStore(url, cacheTtlMs);
  const svc = createMarketService({
    store, feedKeys: [feed.publicKey], ingestMaxBytes: 1_048_576, logger, registry: new Registry(),
    readiness: () => ({ authz: true, geoip: true, store: store.ready() }), isSealed: () => false, host: '127.0.0.1', port: 0,
  });
  const port = await svc.listen();
  return { store, svc, base: `http://127.0.0.1:${port}`, redis };
}

async function stopService(s: Svc): Promise<void> {
  await s.svc.close();
  await s.store.close();
  s.redis.disconnect();
}

function ingestBodyOf(d: object & { conditionId: string }): string {
  return JSON.stringify({ conditionId: d.conditionId, ...env(d) });
}

async function post(base: string, body: string): Promise<{ status: number; json: Record<string, unknown> }> {
  const r = await fetch(`${base}/internal/ingest/market`, { method: 'POST', body, headers: { 'content-type': 'application/json' } });
  return { status: r.status, json: (await r.json()) as Record<string, unknown> };
}

describe('market service on Redis', () => {
  let redisProc: PrivateRedis;
  let a: Svc;
  let b: Svc;
  before(async () => {
    redisProc = await PrivateRedis.start();
    a = await startService(redisProc.url);
    b = await startService(redisProc.url);
    await sleep(100); // subscribers ready
  });
  after(async () => {
    await stopService(a);
    await stopService(b);
    await redisProc.stop();
  });

  test('ingest → /v1/markets serves the byte-identical envelope and keeps unknown document fields', async () => {
    const d = marketDoc('0xread1', 4, { venueNote: { tier: 2 }, tags: ['rain'] });
    const envelope = env(d);
    const r = await post(a.base, JSON.stringify({ conditionId: d.conditionId, ...envelope, ignoredExtra: 1 }));
    assert.deepEqual([r.status, r.json], [200, { status: 'stored', conditionId: '0xread1', seq: 4 }]);
    const page = (await (await fetch(`${b.base}/v1/markets?conditionId=0xread1`)).json()) as { markets: Record<string, unknown>[] };
    const m = page.markets[0]!;
    assert.deepEqual(m['envelope'], envelope);
    assert.deepEqual(m['venueNote'], { tier: 2 });
    assert.deepEqual(m['tags'], ['rain']);
    // The served document equals the signed one.
    const { envelope: _e, ...served } = m;
    assert.deepEqual(served, JSON.parse(Buffer.from(envelope.d, 'base64').toString()));
    const quotes = (await (await fetch(`${b.base}/v1/quotes?conditionId=0xread1`)).json()) as { quotes: Record<string, unknown>[] };
    assert.deepEqual(quotes.quotes.map((q) => [q['tokenId'], q['outcome'], q['bid'], q['seq']]), [['1', 'Yes', '0.51', 4], ['2', 'No', '0.47', 4]]);
  });

  test('20 concurrent ingests of seq 1..20 in random order → stored seq 20, each 200 or 409, across two replicas', async () => {
    const seqs = Array.from({ length: 20 }, (_, i) => i + 1).sort(() => Math.random() - 0.5);
    const results = await Promise.all(seqs.map((seq, i) => post(i % 2 === 0 ? a.base : b.base, ingestBodyOf(marketDoc('0xrace', seq)))));
    for (const r of results) assert.ok(r.status === 200 || (r.status === 409 && r.json['error'] === 'stale_document'), JSON.stringify(r));
    const stored = (await (await fetch(`${a.base}/v1/markets?conditionId=0xrace`)).json()) as { markets: { seq: number }[] };
    assert.equal(stored.markets[0]?.seq, 20);
    const accepted = results.filter((r) => r.status === 200).map((r) => r.json['seq'] as number);
    // Every accepted write was newer than every write accepted before it would have been: 20 is among them.
    assert.ok(accepted.includes(20));
    const again = await post(a.base, ingestBodyOf(marketDoc('0xrace', 20)));
    assert.deepEqual([again.status, again.json['error']], [409, 'stale_document']);
  });

  test('cross-replica invalidation: a write through A is seen by B\'s cached order lookup at once (pub/sub)', async () => {
    await a.store.put(doc('0xinv', 1), env(marketDoc('0xinv', 1)));
    // A read in flight when an invalidation arrives is not cached: let a's message reach b first.
    await sleep(20);
    const first = await b.store.get('0xinv');
    assert.equal(first?.closed, false);
    assert.equal((b.store.get('0xinv') as { closed: boolean }).closed, false, 'second read is a synchronous cache hit');
    await a.store.put(doc('0xinv', 2, { closed: true }), env(marketDoc('0xinv', 2, { closed: true })));
    let seen: unknown;
    for (let i = 0; i < 50; i++) {
      const v = await b.store.get('0xinv');
      seen = v?.closed;
      if (seen === true) break;
      await sleep(10);
    }
    assert.equal(seen, true);
  });

  test('lookups of unknown markets (client-chosen ids) are cached within their own bound and never push out real markets', async () => {
    // A TTL longer than the test, so the entry bound (not expiry) is what drops entries.
    const c = await startService(redisProc.url, 600_000);
    try {
      await sleep(50);
      await a.store.put(doc('0xreal', 1), env(marketDoc('0xreal', 1)));
      await sleep(20);
      assert.equal((await c.store.get('0xreal'))?.closed, false);
      const store = c.store as RedisMarketStore;
      const extra = 500;
      const ids = Array.from({ length: MARKET_MISS_CACHE_MAX_ENTRIES + extra }, (_, i) => `0xnone${i}`);
      for (let i = 0; i < ids.length; i += 1000) await Promise.all(ids.slice(i, i + 1000).map((id) => store.get(id)));
      assert.deepEqual(store.cachedLookups, { markets: 1, misses: MARKET_MISS_CACHE_MAX_ENTRIES });
      // The oldest misses were dropped, the newest are answered from memory, and the real market is still a hit.
      assert.ok(store.get(ids[0]!) instanceof Promise, 'the oldest miss was dropped');
      assert.equal(store.get(ids.at(-1)!), undefined, 'the newest miss is a synchronous hit');
      assert.equal((store.get('0xreal') as { closed: boolean }).closed, false, 'the real market is still cached');
    } finally {
      await stopService(c);
    }
  });

  test('expired lookups are evicted: after the TTL a flood of unknown ids leaves only its own recent entries', async () => {
    const c = await startService(redisProc.url, 100);
    try {
      await sleep(50);
      const store = c.store as RedisMarketStore;
      await Promise.all(Array.from({ length: 2_000 }, (_, i) => store.get(`0xold${i}`)));
      assert.equal(store.cachedLookups.misses, 2_000);
      await sleep(150);
      await store.get('0xfresh');
      assert.deepEqual(store.cachedLookups, { markets: 0, misses: 1 }, 'the expired entries were dropped by the next insert');
    } finally {
      await stopService(c);
    }
  });

  test('page cache: a flood of distinct one-off queries caches nothing; a page is cached from its second read', async () => {
    const c = await startService(redisProc.url, 600_000);
    try {
      await sleep(50);
      await a.store.put(doc('0xpc-once', 1), env(marketDoc('0xpc-once', 1)));
      await sleep(20);
      const store = c.store as RedisMarketStore;
      for (let i = 0; i < 10_000; i += 200) {
        await Promise.all(Array.from({ length: 200 }, (_, j) => store.pageBody({ limit: 100, ids: ['0xpc-once', `0xpc-once-none-${i + j}`] }, 'markets')));
      }
      assert.equal(store.cachedPages.entries, 0, 'no one-off query was cached');
      const q = { limit: 100, ids: ['0xpc-once', '0xpc-once-none-0'] };
      const scriptCalls = async (): Promise<number> => Number(/cmdstat_evalsha:calls=(\d+)/.exec(await a.redis.info('commandstats'))?.[1] ?? 0);
      const before = await scriptCalls();
      await store.pageBody(q, 'markets'); // its second read: from Redis, and now cached
      assert.equal(store.cachedPages.entries, 1);
      await store.pageBody(q, 'markets');
      assert.equal(await scriptCalls() - before, 1, 'the third read is answered from memory');
    } finally {
      await stopService(c);
    }
  });

  test('page cache under 100,000 distinct client-chosen queries, each read twice, stays within its entry and byte bounds', async () => {
    // The attack: GET /v1/markets?conditionId=<known>,<unknown-i>, each a distinct page-cache key
    // holding its own copy of the known market, each sent twice so that it is cached (a page is
    // cached from its second read). A TTL longer than the test, so only the bounds act.
    const c = await startService(redisProc.url, 600_000);
    try {
      await sleep(50);
      await a.store.put(doc('0xpc-flood', 1), env(marketDoc('0xpc-flood', 1, { question: 'q'.repeat(2_000) })));
      await sleep(20);
      const store = c.store as RedisMarketStore;
      let maxEntries = 0;
      let maxBytes = 0;
      // 200 reads in flight at a time: each is a Redis script, and a thousand queued at once can
      // outlast the 250 ms command timeout on a busy machine (this tests bounds, not speed).
      for (let i = 0; i < 100_000; i += 200) {
        for (let twice = 0; twice < 2; twice++) {
          const pages = await Promise.all(Array.from({ length: 200 }, (_, j) => store.page({ limit: 100, ids: ['0xpc-flood', `0xpc-none-${i + j}`] })));
          assert.equal(pages[0]?.markets[0]?.conditionId, '0xpc-flood');
        }
        maxEntries = Math.max(maxEntries, store.cachedPages.entries);
        maxBytes = Math.max(maxBytes, store.cachedPages.bytes);
      }
      assert.ok(maxEntries <= PAGE_CACHE_MAX_ENTRIES, `entries ${maxEntries} ≤ ${PAGE_CACHE_MAX_ENTRIES}`);
      assert.ok(maxBytes <= PAGE_CACHE_MAX_BYTES, `bytes ${maxBytes} ≤ ${PAGE_CACHE_MAX_BYTES}`);
      // The bound was reached (so the flood did fill it), and the newest page is still a hit.
      assert.ok(maxEntries === PAGE_CACHE_MAX_ENTRIES || maxBytes > PAGE_CACHE_MAX_BYTES / 2, `filled: ${maxEntries} entries, ${maxBytes} bytes`);
      const last = { limit: 100, ids: ['0xpc-flood', `0xpc-none-${99_999}`] };
      const scriptCalls = async (): Promise<number> => Number(/cmdstat_evalsha:calls=(\d+)/.exec(await a.redis.info('commandstats'))?.[1] ?? 0);
      const before = await scriptCalls();
      await store.page(last);
      assert.equal(await scriptCalls(), before, 'the newest page is answered from memory');
    } finally {
      await stopService(c);
    }
  });

  test('page cache: a repeated read comes from memory; an invalidation (pub/sub from any replica, or a local write) drops it at once', async () => {
    const q = { limit: 10, ids: ['0xpc'] };
    await a.store.put(doc('0xpc', 1), env(marketDoc('0xpc', 1)));
    await sleep(20); // a's invalidation reaches b
    await b.store.page(q); // a page is cached from its second read
    const first = await b.store.page(q);
    assert.equal(first.markets.length, 1);
    // Change the record behind the stores' backs (no invalidation): b keeps serving its page.
    await a.redis.hset(`${MARKET_KEY_PREFIX}0xpc`, 'item', '{"changed":1}');
    assert.equal((await b.store.page(q)).markets[0]?.item, first.markets[0]?.item, 'served from memory');
    assert.equal((await b.store.page({ ...q, limit: 11 })).markets[0]?.item, '{"changed":1}', 'another query is its own entry');
    // An invalidation for any market drops every cached page.
    await a.redis.publish(INVALIDATION_CHANNEL, '0xsomething-else');
    let seen: string | undefined;
    for (let i = 0; i < 50 && seen !== '{"changed":1}'; i++) {
      seen = (await b.store.page(q)).markets[0]?.item;
      if (seen !== '{"changed":1}') await sleep(10);
    }
    assert.equal(seen, '{"changed":1}');
    // A write through b itself: b's next read sees it, with no wait.
    await b.store.page(q);
    await b.store.page(q);
    await b.store.put(doc('0xpc', 2), env(marketDoc('0xpc', 2)));
    assert.match((await b.store.page(q)).markets[0]?.item ?? '', /"seq":2/);
  });

  test('page cache: 20 concurrent misses for one page share one Redis round trip (no stampede after an invalidation)', async () => {
    const q = { limit: 10, ids: ['0xpc-herd'] };
    await a.store.put(doc('0xpc-herd', 1), env(marketDoc('0xpc-herd', 1)));
    await sleep(20); // a's invalidation reaches b: b's page cache is empty
    const scriptCalls = async (): Promise<number> => Number(/cmdstat_evalsha:calls=(\d+)/.exec(await a.redis.info('commandstats'))?.[1] ?? 0);
    const before = await scriptCalls();
    const pages = await Promise.all(Array.from({ length: 20 }, () => b.store.page(q)));
    assert.equal(await scriptCalls() - before, 1, 'one page script for 20 concurrent readers');
    assert.ok(pages.every((p) => p === pages[0]), 'every reader got the same page');
    assert.equal(pages[0]?.markets[0]?.conditionId, '0xpc-herd');
    // After an invalidation, the next readers start a new round trip (and see the new record).
    await b.store.put(doc('0xpc-herd', 2), env(marketDoc('0xpc-herd', 2)));
    const again = await Promise.all(Array.from({ length: 5 }, () => b.store.page(q)));
    assert.match(again[0]?.markets[0]?.item ?? '', /"seq":2/);
    assert.ok(again.every((p) => p === again[0]));
  });

  test('page cache: a lost invalidation is bounded by MARKET_CACHE_TTL_MS', async () => {
    const c = await startService(redisProc.url, 150);
    try {
      await sleep(50);
      const q = { limit: 10, ids: ['0xpc-ttl'] };
      await a.store.put(doc('0xpc-ttl', 1), env(marketDoc('0xpc-ttl', 1)));
      await sleep(20); // a's invalidation reaches c before c reads
      await c.store.page(q);
      await c.store.page(q); // cached from its second read
      await a.redis.hset(`${MARKET_KEY_PREFIX}0xpc-ttl`, 'item', '{"late":1}');
      assert.notEqual((await c.store.page(q)).markets[0]?.item, '{"late":1}');
      await sleep(200);
      assert.equal((await c.store.page(q)).markets[0]?.item, '{"late":1}');
    } finally {
      await stopService(c);
    }
  });

  test('pagination across 10,000 markets visits each exactly once with inserts happening meanwhile', async () => {
    const ids = Array.from({ length: 10_000 }, (_, i) => `0xpage${String(i).padStart(5, '0')}`);
    // This test is about pagination, not write deadlines (those are redis-deadline's, reliability 2's
    // and the 20-ingest test's): the markets are written by a third writer of the same keyspace whose
    // deadline is 10 s, not the service's 250 ms. On a starved host a write past 250 ms is a correct
    // refusal (StoreUnavailableError, nothing stored), seen here at load average ~5 with 500 writes at
    // once and at ~10 with 50 at once (CI beside other agents, 2026-11-27).
    const writerRedis = await connectRedis(redisProc.url);
    const writer = new RedisMarketStore(writerRedis, { cacheTtlMs: 0, writeTimeoutMs: 10_000 });
    for (let i = 0; i < ids.length; i += 50) await Promise.all(ids.slice(i, i + 50).map((id) => writer.put(doc(id, 1), env({ conditionId: id }))));
    const seen = new Map<string, number>();
    let cursor: string | null = null;
    let pages = 0;
    let inserted = 0;
    do {
      const url: string = `${a.base}/v1/markets?limit=500${cursor ? `&cursor=${cursor}` : ''}`;
      const page = (await (await fetch(url)).json()) as { markets: { conditionId: string }[]; nextCursor: string | null };
      for (const m of page.markets) seen.set(m.conditionId, (seen.get(m.conditionId) ?? 0) + 1);
      cursor = page.nextCursor;
      pages++;
      // Inserts during the walk, before and after the cursor.
      await writer.put(doc(`0xpage${String(pages).padStart(5, '0')}x`, 1), env({}));
      await writer.put(doc(`0xpagf-late-${pages}`, 1), env({}));
      inserted += 2;
    } while (cursor !== null);
    await writer.close();
    writerRedis.disconnect();
    for (const id of ids) assert.equal(seen.get(id), 1, id);
    assert.ok([...seen.values()].every((n) => n === 1), 'no market twice');
    assert.ok(inserted > 0);
  });

  test('ETag + If-None-Match → 304; Cache-Control max-age', async () => {
    const r1 = await fetch(`${a.base}/v1/markets?conditionId=0xread1`);
    const etag = r1.headers.get('etag');
    assert.ok(etag);
    assert.match(r1.headers.get('cache-control') ?? '', /max-age=1/);
    const r2 = await fetch(`${a.base}/v1/markets?conditionId=0xread1`, { headers: { 'if-none-match': etag } });
    assert.equal(r2.status, 304);
    await post(a.base, ingestBodyOf(marketDoc('0xread1', 9)));
    const r3 = await fetch(`${a.base}/v1/markets?conditionId=0xread1`, { headers: { 'if-none-match': etag } });
    assert.equal(r3.status, 200, 'a new seq changes the ETag');
  });

  test('bad documents → 400 invalid_envelope; nothing stored', async () => {
    const cases: [string, Record<string, unknown>][] = [
      ['conditionId differs', { ...marketDoc('0xother', 1) }],
      ['negative seq', marketDoc('0xbad', -1)],
      ['float seq', marketDoc('0xbad', 1.5)],
      ['bad decimal', marketDoc('0xbad', 1, { minSize: '1e3' })],
      ['bad outcome price', marketDoc('0xbad', 1, { outcomes: [{ tokenId: '1', name: 'Yes', bid: '.5' }] })],
    ];
    for (const [name, d] of cases) {
      const body = JSON.stringify({ conditionId: '0xbad', ...env(d) });
      const r = await post(a.base, body);
      assert.deepEqual([r.status, r.json['error']], [400, 'invalid_envelope'], name);
    }
    const forged = JSON.stringify({ conditionId: '0xbad', ...env(marketDoc('0xbad', 1)), s: 'ab'.repeat(64) });
    const r = await post(a.base, forged);
    assert.deepEqual([r.status, r.json['error']], [401, 'invalid_content_signature']);
    const page = (await (await fetch(`${a.base}/v1/markets?conditionId=0xbad`)).json()) as { markets: unknown[] };
    assert.equal(page.markets.length, 0);
  });

  test('queries and routes: invalid_query, not_found, method_not_allowed, payload_too_large, invalid_json', async () => {
    const cases: [string, string, number, string][] = [
      ['GET', '/v1/markets?limit=501', 400, 'invalid_query'],
      ['GET', '/v1/markets?limit=abc', 400, 'invalid_query'],
      ['GET', '/v1/markets?active=yes', 400, 'invalid_query'],
      ['GET', '/v1/markets?cursor=!!', 400, 'invalid_query'],
      ['GET', '/v1/markets?cursor=YSBi', 400, 'invalid_query'], // decodes to 'a b', not an id
      ['GET', '/v1/markets?bogus=1', 400, 'invalid_query'],
      ['GET', '/v1/markets?limit=1&limit=2', 400, 'invalid_query'],
      ['GET', '/v1/quotes?active=true', 400, 'invalid_query'],
      ['GET', '/v1/markets?conditionId=a%20b', 400, 'invalid_query'],
      // only plain decimals for limit (ajv alone would coerce these to numbers)
      ['GET', '/v1/quotes?limit=0x10', 400, 'invalid_query'],
      ['GET', '/v1/quotes?limit=1e2', 400, 'invalid_query'],
      ['GET', '/v1/quotes?limit=%2B5', 400, 'invalid_query'],
      ['GET', '/v1/quotes?limit=%205', 400, 'invalid_query'],
      ['GET', '/v1/quotes?limit=1.0', 400, 'invalid_query'],
      ['GET', '/v1/quotes?limit=5', 200, ''],
      // names of Object.prototype's members are unknown parameters like any other
      ['GET', '/v1/markets?__proto__=1', 400, 'invalid_query'],
      ['GET', '/v1/markets?constructor=1', 400, 'invalid_query'],
      ['GET', '/nope', 404, 'not_found'],
      ['POST', '/v1/markets', 405, 'method_not_allowed'],
      ['GET', '/internal/ingest/market', 405, 'method_not_allowed'],
    ];
    for (const [method, path, status, code] of cases) {
      const r = await fetch(`${a.base}${path}`, { method });
      assert.equal(r.status, status, `${method} ${path}`);
      const json = (await r.json()) as { error?: string; message?: string };
      if (code !== '') assert.equal(json.error, code, `${method} ${path}`);
      if (/__proto__|constructor|bogus/.test(path)) assert.match(String(json.message), /^unknown parameter "(__proto__|constructor|bogus)"$/, `${method} ${path}: ${json.message}`);
      assert.equal(r.headers.get('content-type'), 'application/json');
    }
    const big = await fetch(`${a.base}/internal/ingest/market`, { method: 'POST', body: 'x'.repeat(1_048_577) });
    assert.equal(big.status, 413);
    const nj = await post(a.base, '{nope');
    assert.deepEqual([nj.status, nj.json['error']], [400, 'invalid_json']);
  });

  test('a query names at most 100 conditionIds (docs/api.md "Limits"): 100 of the longest are served, 101 are 400 invalid_query naming the bound, never cached', async () => {
    const known = `0x${'k'.repeat(126)}`;
    await a.store.put(doc(known, 1), env(marketDoc(known, 1)));
    const longest = (i: number): string => `${i.toString().padStart(3, '0')}${'x'.repeat(125)}`;
    const hundred = [known, ...Array.from({ length: LIMIT.queryIds - 1 }, (_, i) => longest(i))];
    assert.equal(hundred.length, 100);
    assert.ok(hundred.every((id) => id.length === 128));
    for (const path of ['/v1/markets', '/v1/quotes']) {
      const ok = await fetch(`${a.base}${path}?conditionId=${hundred.join(',')}`);
      const body = (await ok.json()) as { markets?: { conditionId: string }[]; quotes?: { conditionId: string }[] };
      assert.equal(ok.status, 200, path);
      assert.deepEqual([...new Set((body.markets ?? body.quotes ?? []).map((m) => m.conditionId))], [known], path);
      const before = a.store.cachedPages?.entries;
      for (const ids of [[...hundred, 'one-more'], Array.from({ length: 101 }, () => 'a'), Array.from({ length: 500 }, (_, i) => `id${i}`)]) {
        const r = await fetch(`${a.base}${path}?conditionId=${ids.join(',')}`);
        const json = (await r.json()) as { error: string; message: string };
        assert.deepEqual([r.status, json.error, json.message], [400, 'invalid_query', TOO_MANY_IDS], `${path} with ${ids.length} ids`);
        assert.match(json.message, /at most 100 /);
      }
      assert.equal(a.store.cachedPages?.entries, before, 'a refused query leaves the page cache alone');
    }
  });

  const idLists: Record<string, [list: string, exceeds: boolean]> = {
    'empty (one empty entry)': ['', false],
    'one id': ['a', false],
    '100 ids': [Array(100).fill('a').join(','), false],
    '101 ids': [Array(101).fill('a').join(','), true],
    '99 commas (100 empty entries)': [','.repeat(99), false],
    '100 commas (101 empty entries)': [','.repeat(100), true],
  };
  for (const [name, [list, exceeds]] of Object.entries(idLists)) {
    test(`idCountExceeds – ${name} → ${exceeds}`, () => assert.equal(idCountExceeds(list, 100), exceeds));
  }

  test('a client-chosen parameter name is echoed at most 64 characters long, quoted and escaped', async () => {
    const long = 'n'.repeat(10_000);
    const r1 = await fetch(`${a.base}/v1/markets?${long}=1`);
    const m1 = ((await r1.json()) as { message: string }).message;
    assert.equal(r1.status, 400);
    assert.equal(m1, `unknown parameter "${'n'.repeat(64)}…"`);
    // A quote, a line break, a C1 control and U+2028 in the name: none reaches the message raw.
    const nasty = encodeURIComponent('a"b\nc\u0085d\u2028e');
    for (const path of [`/v1/markets?${nasty}=1`, `/v1/markets?limit=1&${nasty}=1&${nasty}=2`]) {
      const r = await fetch(`${a.base}${path}`);
      const text = await r.text();
      assert.equal(r.status, 400, path);
      assert.doesNotMatch(text, /[\n\u0085\u2028]/, `${path}: ${text}`);
      assert.match((JSON.parse(text) as { message: string }).message, /"a\\"b\\nc\\u0085d\\u2028e"/, path);
    }
  });

  test('requests Node refuses to parse get Envoy\'s answers (bad_request, 431), never a query error; headers up to Envoy\'s 60 KiB are served', async () => {
    const raw = (text: string): Promise<string> => new Promise((resolve, reject) => {
      const sock = connect(Number(new URL(a.base).port), '127.0.0.1', () => sock.end(text));
      let got = '';
      sock.on('data', (d: Buffer) => { got += d.toString(); });
      sock.on('end', () => resolve(got));
      sock.on('error', reject);
    });
    const unknownMethod = await raw('FOO / HTTP/1.1\r\nhost: x\r\n\r\n');
    assert.match(unknownMethod, /^HTTP\/1\.1 400 /);
    assert.equal((JSON.parse(unknownMethod.split('\r\n\r\n')[1]!) as { error: string }).error, 'bad_request');
    const huge = await raw(`GET / HTTP/1.1\r\nhost: x\r\nx-big: ${'a'.repeat(MAX_HEADER_BYTES)}\r\n\r\n`);
    assert.match(huge, /^HTTP\/1\.1 431 /);
    assert.equal((JSON.parse(huge.split('\r\n\r\n')[1]!) as { error: string }).error, 'bad_request');
    const expectation = await raw('GET / HTTP/1.1\r\nhost: x\r\nexpect: foo\r\nconnection: close\r\n\r\n');
    assert.match(expectation, /^HTTP\/1\.1 200 /, 'an unknown Expect is ignored, not a bodiless 417');
    const big = await fetch(`${a.base}/`, { headers: { 'x-big': 'a'.repeat(60 * 1024) } });
    assert.equal(big.status, 200, 'a 60 KiB header (what Envoy lets through) is served');
    await big.text();
  });

  test('active filter pages only markets with that active value', async () => {
    await a.store.put(doc('0xact-on', 1), env({}));
    await a.store.put(doc('0xact-off', 1, { active: false }), env({}));
    const on = (await (await fetch(`${a.base}/v1/markets?active=true&conditionId=0xact-on,0xact-off`)).json()) as { markets: { conditionId: string }[] };
    assert.deepEqual(on.markets.map((m) => m.conditionId), ['0xact-on']);
    const off = (await (await fetch(`${a.base}/v1/markets?active=false&limit=500`)).json()) as { markets: { conditionId: string }[] };
    assert.ok(off.markets.some((m) => m.conditionId === '0xact-off'));
    assert.ok(!off.markets.some((m) => m.conditionId === '0xact-on'));
  });

  test('Redis stopped → ingest and reads 503 service_unavailable, nothing half-written; recovers by itself', async () => {
    await redisProc.stop();
    try {
      const r = await post(a.base, ingestBodyOf(marketDoc('0xdown', 1)));
      assert.deepEqual([r.status, r.json['error']], [503, 'service_unavailable']);
      const read = await fetch(`${a.base}/v1/markets`);
      assert.equal(read.status, 503);
      const health = await fetch(`${a.base}/healthz`);
      assert.equal(health.status, 503);
      assert.equal(((await health.json()) as { checks: { store: boolean } }).checks.store, false);
    } finally {
      await redisProc.resume();
    }
    let status = 0;
    for (let i = 0; i < 100 && status !== 200; i++) {
      await sleep(50);
      status = (await post(a.base, ingestBodyOf(marketDoc('0xdown', 1)))).status;
    }
    assert.equal(status, 200);
  });
});

describe('in-memory market store', () => {
  test('compare-and-set, ordering and pagination match the Redis store contract', async () => {
    const s = new MemoryMarketStore();
    assert.equal(await s.put(doc('0xb', 2), env({})), 'stored');
    assert.equal(await s.put(doc('0xb', 2), env({})), 'stale');
    assert.equal(await s.put(doc('0xa', 1), env({})), 'stored');
    assert.equal(await s.put(doc('0xc', 1, { active: false }), env({})), 'stored');
    const p1 = await s.page({ limit: 2 });
    assert.deepEqual(p1.markets.map((m) => m.conditionId), ['0xa', '0xb']);
    assert.equal(p1.next, '0xb');
    const p2 = await s.page({ limit: 2, after: p1.next });
    assert.deepEqual(p2.markets.map((m) => m.conditionId), ['0xc']);
    assert.equal(p2.next, undefined);
    assert.deepEqual((await s.page({ limit: 10, active: false })).markets.map((m) => m.conditionId), ['0xc']);
    assert.equal(s.get('0xb')?.seq, 2);
    assert.equal(s.get('0xz'), undefined);
  });
});
