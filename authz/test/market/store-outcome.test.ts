/**
 * An ingest whose Redis write goes out but whose reply does not come back is the one case where
 * "503 = nothing stored" could silently break. These tests put a real redis-server behind a
 * fault-injecting TCP proxy and prove every answer is the truth: 200 only when stored, 503 only
 * when nothing is (and nothing will be), 504 backend_timeout when Redis cannot say in time.
 */
import { after, before, beforeEach, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { Writable } from 'node:stream';
import { setTimeout as sleep } from 'node:timers/promises';
import { Registry } from 'prom-client';
import type { Redis } from 'ioredis';
import { createRedis } from '../../src/common/adapters/redis.ts';
import { createLogger } from '../../src/common/log.ts';
import { createMarketService, type MarketService } from '../../src/market/http.ts';
import { MARKET_KEY_PREFIX, RedisMarketStore, STORE_RESOLVE_MS } from '../../src/market/redis-store.ts';
import { STORE_OUTCOME_UNKNOWN_MESSAGE, StoreUnavailableError } from '../../src/market/store.ts';
import { validateDocument, type MarketDocument } from '../../src/common/feed/schema.ts';
import { FaultProxy } from '../fault-proxy.ts';
import { PrivateRedis } from '../../../testkit/redis-server.ts';
import { envelopeFor, marketDoc, newFeedKey } from '../../../testkit/feed.ts';

const feed = newFeedKey();
const logger = createLogger('silent', new Writable({ write: (_c, _e, cb) => cb() }));

function doc(id: string, seq: number): { document: MarketDocument; envelope: { d: string; s: string; k: 'ed25519-sha256' } } {
  const raw = marketDoc(id, seq);
  const r = validateDocument(raw);
  assert.ok(r.ok);
  return { document: r.document, envelope: envelopeFor(raw, feed) as { d: string; s: string; k: 'ed25519-sha256' } };
}

async function ready(r: Redis): Promise<void> {
  if (r.status !== 'ready') await new Promise<void>((res) => r.once('ready', () => res()));
}

describe('ingest writes whose reply is lost', () => {
  let redisProc: PrivateRedis;
  let proxy: FaultProxy;
  let direct: Redis;
  let viaProxy: Redis;
  let store: RedisMarketStore;
  let svc: MarketService;
  let base: string;

  before(async () => {
    redisProc = await PrivateRedis.start();
    proxy = await FaultProxy.start(redisProc.port);
    direct = createRedis(redisProc.url);
    viaProxy = createRedis(proxy.url);
    viaProxy.on('error', () => {}); // the faults below are deliberate
    await Promise.all([ready(direct), ready(viaProxy)]);
    store = new RedisMarketStore(viaProxy, { cacheTtlMs: 1000 });
    svc = createMarketService({
      store, feedKeys: [feed.publicKey], ingestMaxBytes: 1_048_576, logger, registry: new Registry(),
      readiness: () => ({ store: store.ready() }), isSealed: () => false, host: '127.0.0.1', port: 0,
    });
    base = `http://127.0.0.1:${await svc.listen()}`;
    // Load the scripts into Redis first: a cut NOSCRIPT reply would only test EVALSHA's retry.
    await store.put(doc('0xwarm-up', 1).document, doc('0xwarm-up', 1).envelope);
    await direct.call('HGET', MARKET_KEY_PREFIX + '0xwarm-up', 'seq');
  });
  beforeEach(async () => {
    proxy.mode = 'pass';
    await ready(viaProxy);
  });
  after(async () => {
    await svc.close();
    await store.close();
    viaProxy.disconnect();
    direct.disconnect();
    await proxy.close();
    await redisProc.stop();
  });

  const storedSeq = async (id: string): Promise<string | null> => direct.hget(MARKET_KEY_PREFIX + id, 'seq');

  test('reply cut after Redis ran the write → 200 stored once Redis answers again (not a false 503)', async () => {
    const d = doc('0xcut-stored', 1);
    proxy.mode = 'cut-reply';
    const res = fetch(`${base}/internal/ingest/market`, { method: 'POST', body: JSON.stringify({ conditionId: '0xcut-stored', ...d.envelope }) });
    await sleep(400);
    assert.equal(await storedSeq('0xcut-stored'), '1', 'Redis ran the write although the reply was cut');
    proxy.mode = 'pass';
    const r = await res;
    assert.equal(r.status, 200, await r.clone().text());
    assert.deepEqual(await r.json(), { status: 'stored', conditionId: '0xcut-stored', seq: 1 });
  });

  test('reply cut and an equal seq already stored → 409 stale_document, the stored record untouched', async () => {
    await store.put(doc('0xcut-stale', 5).document, doc('0xcut-stale', 5).envelope);
    const before = await direct.hget(MARKET_KEY_PREFIX + '0xcut-stale', 'item');
    proxy.mode = 'cut-reply';
    const p = store.put(doc('0xcut-stale', 5).document, doc('0xcut-stale', 5).envelope);
    await sleep(300);
    proxy.mode = 'pass';
    // Byte-identical record (Ed25519 is deterministic), yet not this write: 409 as without the fault.
    assert.equal(await p, 'stale');
    assert.equal(await direct.hget(MARKET_KEY_PREFIX + '0xcut-stale', 'item'), before);
    proxy.mode = 'cut-reply';
    const q = store.put(doc('0xcut-stale', 4).document, doc('0xcut-stale', 4).envelope);
    await sleep(300);
    proxy.mode = 'pass';
    assert.equal(await q, 'stale');
  });

  test('Redis stalled past the write deadline → 503 and nothing stored, even after the stall ends', async () => {
    proxy.mode = 'hold';
    const d = doc('0xstalled', 1);
    const res = fetch(`${base}/internal/ingest/market`, { method: 'POST', body: JSON.stringify({ conditionId: '0xstalled', ...d.envelope }) });
    await sleep(700);
    proxy.mode = 'pass'; // the held write reaches Redis now, after its deadline
    const r = await res;
    assert.equal(r.status, 503, await r.clone().text());
    assert.equal(((await r.json()) as { error: string }).error, 'service_unavailable');
    await sleep(200);
    assert.equal(await storedSeq('0xstalled'), null, 'a write answered 503 must never land');
  });

  test('a write that reaches Redis before its deadline is stored although its reply is late', async () => {
    proxy.mode = 'hold';
    const d = doc('0xlate-reply', 1);
    const p = store.put(d.document, d.envelope);
    await sleep(100); // shorter than the deadline: the write lands in time, its reply after the client timeout
    proxy.mode = 'pass';
    assert.equal(await p, 'stored');
    assert.equal(await storedSeq('0xlate-reply'), '1');
  });

  test(`Redis gone longer than ${STORE_RESOLVE_MS} ms after the write went out → 504 backend_timeout (outcome unknown)`, async () => {
    const d = doc('0xunknown', 1);
    proxy.mode = 'cut-reply';
    const started = Date.now();
    const res = fetch(`${base}/internal/ingest/market`, {
      method: 'POST', body: JSON.stringify({ conditionId: '0xunknown', ...d.envelope }), headers: { 'x-request-id': 'req-outcome-unknown' },
    });
    await sleep(300);
    proxy.mode = 'refuse';
    const r = await res;
    assert.equal(r.status, 504);
    assert.deepEqual(await r.json(), { error: 'backend_timeout', message: STORE_OUTCOME_UNKNOWN_MESSAGE, requestId: 'req-outcome-unknown' });
    assert.ok(Date.now() - started >= STORE_RESOLVE_MS, 'it waited for Redis before giving up');
    proxy.mode = 'pass';
    // The honest "unknown": here the write did land, and a re-send says so with 409.
    assert.equal(await storedSeq('0xunknown'), '1');
  });

  test('Redis unreachable before the write went out → 503 at once, nothing stored', async () => {
    proxy.mode = 'refuse';
    await sleep(100);
    const d = doc('0xnever-sent', 1);
    const t0 = Date.now();
    await assert.rejects(store.put(d.document, d.envelope), StoreUnavailableError);
    assert.ok(Date.now() - t0 < 100, 'no resolve wait for a write that never left');
    proxy.mode = 'pass';
    await ready(viaProxy);
    assert.equal(await storedSeq('0xnever-sent'), null);
  });
});
