/**
 * Redis market store with an in-process cache shared by reads and order checks. One concern over
 * ~350 lines: the store's Redis scripts and the caches that must be invalidated with them live
 * together so a write and its invalidation cannot drift apart.
 *
 * Keys (all prefixed `edge:market`):
 *   edge:market:<conditionId>   hash {seq, item, quotes, wid (id of the write that stored it)}
 *   edge:markets                sorted set, score 0, member conditionId (lexicographic order)
 *   edge:markets:active:1|0     the same, split by the document's `active` field
 *   channel edge:market:inv     conditionId published on every write
 *
 * Writes are one Lua script: compare seq, write the hash, move the id between index sets and
 * publish the invalidation — atomic, so concurrent ingests on any replica never lose an update.
 * A write carries a deadline in Redis's clock and is refused after it, so an ingest whose reply
 * was lost can ask Redis afterwards what happened and answer truthfully (see `put`).
 * With REDIS_MIN_REPLICAS ≥ 1 writes run on a connection of their own and are answered only
 * once replicas confirmed them (common/adapters/replica-wait.ts), so a Sentinel failover cannot
 * lose a record the ingest was answered 200 for.
 * A page of listed ids is one Lua script (their items and seqs): one round trip. A page by cursor
 * is its ids by ZRANGE BYLEX, O(log N + limit), in a script that answers them as one string, then
 * one script for the records the record cache lacks (none in steady use). (The scripts touch keys
 * they compute, so they need a non-cluster Redis or Sentinel; see docs/market-data.md.)
 *
 * Cache: `get()` (order checks) and `page()` (reads) answer from memory while an entry is
 * younger than MARKET_CACHE_TTL_MS; a hit in the second half of that time also starts the read
 * that refreshes it (`#dueForRefresh`), so an entry in steady use is replaced before it expires
 * and callers never wait for Redis, and one slow round trip fails nobody. An invalidation message drops the market's entry and every
 * cached page at once (any write may change any page), a local write does the same before it
 * is acknowledged, and a reconnect of the subscriber drops everything. A read that was in
 * flight when an invalidation arrived is answered but not cached (a generation counter), so
 * the cache never holds data older than the last invalidation it saw. Concurrent misses for
 * one market or one page share one round trip; an invalidation also drops those in flight, so
 * a later caller never joins a read that may have seen the old value. Two replicas disagree
 * for at most the pub/sub delay, and never longer than the TTL even if a message is lost.
 * Nothing is cached while the subscriber is not subscribed. The record cache (what cursor pages
 * are assembled from) follows the lookup cache's rules: an entry per market, dropped with it.
 */
import { randomUUID } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import { ReplyError, type Redis } from 'ioredis';
import { neverSent, RedisClock, REDIS_COMMAND_TIMEOUT_MS } from '../common/adapters/redis.ts';
import type { ReplicaWait } from '../common/adapters/replica-wait.ts';
import type { Envelope } from '../common/feed/envelope.ts';
import type { MarketDocument } from '../common/feed/schema.ts';
import type { MarketMeta } from '../common/ports.ts';
import {
  encodeMarket, metaOfItem, pageBodyBytes, pageEtag, pageOfIds, pagePartsBody, StoreOutcomeUnknownError, tagsDigest, StoreUnavailableError,
  type MarketStore, type Page, type PageBody, type PageItem, type PageKind, type PageQuery, type PutResult,
} from './store.ts';
import { AdmissionFilter, TtlCache } from './ttl-cache.ts';

export const MARKET_KEY_PREFIX = 'edge:market:';
/** SHA-1 (hex) of '' : the versions of an empty page, as Redis's sha1hex gives it. */
const EMPTY_VERSIONS = 'da39a3ee5e6b4b0d3255bfef95601890afd80709';
export const INDEX_KEY = 'edge:markets';
export const ACTIVE_INDEX = (active: boolean): string => `edge:markets:active:${active ? 1 : 0}`;
export const INVALIDATION_CHANNEL = 'edge:market:inv';

/**
 * The store's reads, sent as they come rather than through ioredis's auto-pipelining (the client's
 * option autoPipeliningIgnoredCommands): auto-pipelining builds a Pipeline object, with a method
 * per defined command, for every event-loop turn that sends one, and a read rarely shares its
 * turn with another (a page the cache lacks; docs/benchmarks.md "Costly requests").
 */
export const MARKET_READ_COMMANDS = ['edgeMarketRecords', 'edgeMarketMgetBody', 'edgeMarketCursorIds'] as const;

// Redis's clock in ms, as both write scripts compare it with a write's deadline.
const NOW_MS = `local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)`;

// Both scripts answer with the same codes: 1 = this write is stored, 0 = an equal or newer seq
// is stored (409), -1 = not stored and never will be; RESOLVE adds -2 = ask again later.
// PUT: ARGV[6] = deadline, ms in Redis's clock: a write that reaches Redis later than that is
// refused, so a write the client already gave up on cannot land afterwards.
// ARGV[7] = write id, random per write, so the write can be recognised afterwards.
const PUT_SCRIPT = `
${NOW_MS}
if now > tonumber(ARGV[6]) then return -1 end
local cur = redis.call('HGET', KEYS[1], 'seq')
if cur and tonumber(cur) >= tonumber(ARGV[1]) then return 0 end
redis.call('HSET', KEYS[1], 'seq', ARGV[1], 'item', ARGV[2], 'quotes', ARGV[3], 'wid', ARGV[7])
redis.call('ZADD', KEYS[2], 0, ARGV[4])
redis.call('ZADD', KEYS[3], 0, ARGV[4])
redis.call('ZREM', KEYS[4], ARGV[4])
redis.call('PUBLISH', ARGV[5], ARGV[4])
return 1
`;

// RESOLVE, after a write whose reply never came: once Redis's clock is past the write's deadline
// the write can no longer land, so what is stored now is final (-2 until then).
// KEYS[1] = market key; ARGV = deadline, seq, write id
const RESOLVE_SCRIPT = `
${NOW_MS}
if now <= tonumber(ARGV[1]) then return -2 end
local v = redis.call('HMGET', KEYS[1], 'seq', 'wid')
if not v[1] or tonumber(v[1]) < tonumber(ARGV[2]) then return -1 end
if v[2] == ARGV[3] then return 1 end
return 0
`;

// Records by id: per id its seq, item and quotes, or false × 3 when its hash is gone. Lookups
// (order checks) and page() read it as strings; cursor pages (pageBody) read the records the
// record cache lacks as Buffers, so the service decodes no string per record.
// ARGV = key prefix, ids…
const RECORDS_SCRIPT = `
local out = {}
for i = 2, #ARGV do
  local v = redis.call('HMGET', ARGV[1] .. ARGV[i], 'seq', 'item', 'quotes')
  if v[2] then
    out[#out + 1] = v[1] or ''
    out[#out + 1] = v[2]
    out[#out + 1] = v[3] or ''
  else
    out[#out + 1] = false
    out[#out + 1] = false
    out[#out + 1] = false
  end
end
return out
`;

// The same for listed ids (already sorted, deduplicated and cut to the page by the service).
// ARGV = key prefix, 'item' | 'quotes', active index key or '' (no filter), ids…
// Reply: {versions, count, record…}.
const MGET_BODY_SCRIPT = `
local quotes = ARGV[2] == 'quotes'
local out, tags = {false, 0}, {}
local n = 0
for i = 4, #ARGV do
  local v
  if quotes then v = redis.call('HMGET', ARGV[1] .. ARGV[i], 'item', 'seq', 'quotes')
  else v = redis.call('HMGET', ARGV[1] .. ARGV[i], 'item', 'seq') end
  if v[1] and (ARGV[3] == '' or redis.call('ZSCORE', ARGV[3], ARGV[i])) then
    n = n + 1
    tags[n] = ARGV[i] .. ':' .. (v[2] or '')
    local r = v[1]
    if quotes then r = v[3] or '' end
    if r ~= '' then out[#out + 1] = r end
  end
end
out[1] = redis.sha1hex(table.concat(tags, ','))
out[2] = n
return out
`;

// A cursor page's ids: up to ARGV[2] ids of the index KEYS[1] after ARGV[1] (ZRANGE BYLEX), joined
// by ',' (conditionIds never hold one): one bulk string, not one reply item per id.
const CURSOR_IDS_SCRIPT = `
return table.concat(redis.call('ZRANGE', KEYS[1], ARGV[1], '+', 'BYLEX', 'LIMIT', 0, tonumber(ARGV[2])), ',')
`;

type Row = string | null;

/**
 * Joins the read of `key` already in `inflight`, else starts one with `start` and registers it
 * until it settles. An invalidation that drops or replaces the entry first is left alone.
 */
function shareInFlight<T>(inflight: Map<string, Promise<T>>, key: string, start: () => Promise<T>): Promise<T> {
  const joined = inflight.get(key);
  if (joined !== undefined) return joined;
  const p = start();
  inflight.set(key, p);
  const drop = (): void => {
    if (inflight.get(key) === p) inflight.delete(key);
  };
  p.then(drop, drop);
  return p;
}

/** How long an ingest whose write went unanswered waits for Redis to tell what happened. */
export const STORE_RESOLVE_MS = 2000;
const RESOLVE_POLL_MS = 100;

interface Scripts {
  edgeMarketPut(...a: string[]): Promise<number>;
  edgeMarketResolve(...a: string[]): Promise<number>;
  edgeMarketRecords(...a: string[]): Promise<Row[]>;
  // defineCommand's Buffer variants: bulk strings as Buffers, never decoded to strings.
  edgeMarketRecordsBuffer(...a: string[]): Promise<(Buffer | null)[]>;
  edgeMarketMgetBodyBuffer(...a: string[]): Promise<(Buffer | number | null)[]>;
  edgeMarketCursorIdsBuffer(...a: (string | number)[]): Promise<Buffer>;
}

/**
 * Bounds on the page cache. Its keys are chosen by clients (any cursor, any list of up to 100
 * conditionIds: LIMIT.queryIds), so it is bounded by entries and by an estimate of the bytes an
 * entry retains: the key, the page's item and quote strings (fresh copies per Redis reply, so two cached pages
 * that share a market hold it twice), the two bodies rendered from them (markets and quotes,
 * cached beside the page by the HTTP layer), each counted at two bytes per character (V8 keeps a
 * string with any non-Latin-1 character in UTF-16), plus fixed overheads for the Map entry, the
 * page object and its array. Expired pages are dropped before anything else.
 */
export const PAGE_CACHE_MAX_ENTRIES = 2_000;
export const PAGE_CACHE_MAX_BYTES = 32 * 1_048_576;
const PAGE_ENTRY_OVERHEAD_BYTES = 512;
const PAGE_MARKET_OVERHEAD_BYTES = 96;

/**
 * Page-cache admission: a page read from Redis is cached only if its key was read before (it is
 * in an AdmissionFilter of this many slots, 4 bytes each), or it is a refresh of a cached page.
 * A popular page is cached from its second read on; a flood of distinct one-off queries (the
 * page-cache attack: `conditionId=<known>,<unknown-i>`) is cached not at all, so it neither pushes
 * out the pages in use nor leaves entries that outlive V8's young generation (what made RSS grow by
 * ~70 MB over 10^5 such queries: docs/benchmarks.md, "Market service memory"). The table is not
 * cleared by invalidations: a page read before one is cached again from its next read.
 */
export const PAGE_ADMISSION_SLOTS = 16_384;

/** The bytes a cached page is charged (see PAGE_CACHE_MAX_BYTES). */
export function pageCacheBytes(key: string, page: Page): number {
  let chars = 0;
  for (const m of page.markets) chars += m.item.length + m.quotes.length;
  // ×2 for UTF-16, and the page's strings twice: as fetched and inside the rendered bodies.
  return PAGE_ENTRY_OVERHEAD_BYTES + 2 * key.length + 4 * chars + PAGE_MARKET_OVERHEAD_BYTES * page.markets.length;
}

/**
 * The bytes a cached page body is charged: the key (Latin-1 here: ids, cursors and digits), the
 * body Buffer (its own allocation, see pageBodyBytes) and the fixed overheads.
 */
export function pageBodyCacheBytes(key: string, page: PageBody): number {
  return PAGE_ENTRY_OVERHEAD_BYTES + 2 * key.length + page.body.length + page.etag.length * 2;
}

/** The page-cache key of a rendered page (distinct from `page()`'s keys, which start with '['). */
export function pageBodyKey(q: PageQuery, kind: PageKind): string {
  return `${kind === 'markets' ? 'm' : 'q'}${q.active === undefined ? '' : q.active ? 't' : 'f'}|${q.limit}|${q.after ?? ''}|${q.ids === undefined ? '' : `=${q.ids.join(',')}`}`;
}

/**
 * A cursor page's body is cached only up to this size. A larger one (`limit` up to 500: ~800 KB
 * of records) is assembled from the record cache per request instead: kept in the page cache it
 * would live long enough to reach V8's old space, and its ArrayBuffer would be freed only by a
 * full collection, which the churn of such bodies then triggered every few requests.
 */
export const PAGE_BODY_CACHE_MAX_BYTES = 256 * 1024;

/**
 * Bounds on the record cache: markets' stored records (seq, item and quotes texts as Buffers of
 * their own) that cursor pages are assembled from, so a page the page cache lacks reads only its
 * ids from Redis and then just the records not held here. Filled by page reads only; a record
 * is dropped by the same invalidations as the lookup cache's entry for its market and lives at
 * most MARKET_CACHE_TTL_MS. Charged at its bytes plus a fixed overhead; oldest dropped first.
 */
export const RECORD_CACHE_MAX_ENTRIES = 20_000;
export const RECORD_CACHE_MAX_BYTES = 16 * 1_048_576;
const RECORD_OVERHEAD_BYTES = 320;

/** One market's stored record as the record cache holds it. */
interface MarketRecord {
  /** `<conditionId>:<seq>` (ids and digits: one byte a character), the record's part of the ETag's versions digest. */
  readonly tag: string;
  readonly item: Buffer;
  readonly quotes: Buffer;
}

/** The bytes a cached record is charged: the key (Latin-1), its Buffers and the fixed overhead. */
export function recordCacheBytes(id: string, r: MarketRecord): number {
  return RECORD_OVERHEAD_BYTES + 2 * id.length + r.tag.length + r.item.length + r.quotes.length;
}

/**
 * The ids of CURSOR_IDS_SCRIPT's reply: each its own one-byte string (conditionIds are ASCII), not
 * a slice of one joined string, which a record-cache key would keep alive whole.
 */
function splitIds(joined: Buffer): string[] {
  const ids: string[] = [];
  for (let at = 0; at < joined.length;) {
    let end = joined.indexOf(0x2c, at); // ','
    if (end === -1) end = joined.length;
    ids.push(joined.toString('latin1', at, end));
    at = end + 1;
  }
  return ids;
}

/** A copy in an allocation of its own: a cached record must not keep a socket read's chunk (or the 8 KiB pool) alive. */
function ownCopy(b: Buffer): Buffer {
  const c = Buffer.allocUnsafeSlow(b.length);
  b.copy(c);
  return c;
}

/**
 * Bounds on the market lookup cache (order checks), oldest entry dropped first, expired ones
 * before anything else. Markets that exist are bounded by what the feed stored; markets that do
 * not are chosen by clients (any valid `marketId` of an order), so their entries have a bound of
 * their own and cannot push out the real ones.
 */
export const MARKET_CACHE_MAX_ENTRIES = 200_000;
export const MARKET_MISS_CACHE_MAX_ENTRIES = 10_000;
/** A lookup entry: the id (key and meta), the frozen meta object, the Map slot. */
const LOOKUP_ENTRY_BYTES = (id: string): number => 256 + 4 * id.length;
const MARKET_CACHE_MAX_BYTES = 64 * 1_048_576;
const MARKET_MISS_CACHE_MAX_BYTES = 4 * 1_048_576;

export interface RedisStoreOptions {
  readonly cacheTtlMs: number;
  /**
   * REDIS_MIN_REPLICAS ≥ 1: writes go through this connection and count only once the replicas
   * confirmed them (see `put`).
   */
  readonly replicas?: ReplicaWait;
  /** The write connection's command timeout (default REDIS_COMMAND_TIMEOUT_MS): a write's deadline. */
  readonly writeTimeoutMs?: number;
  readonly now?: () => number;
  readonly onError?: (op: string, err: unknown) => void;
}

export class RedisMarketStore implements MarketStore {
  readonly #redis: Redis;
  readonly #sub: Redis;
  readonly #cache = new TtlCache<MarketMeta>({ maxEntries: MARKET_CACHE_MAX_ENTRIES, maxBytes: MARKET_CACHE_MAX_BYTES });
  /** Lookups of markets that do not exist (client-chosen ids): a separate, smaller bound. */
  readonly #misses = new TtlCache<null>({ maxEntries: MARKET_MISS_CACHE_MAX_ENTRIES, maxBytes: MARKET_MISS_CACHE_MAX_BYTES });
  readonly #pages = new TtlCache<Page | PageBody>({ maxEntries: PAGE_CACHE_MAX_ENTRIES, maxBytes: PAGE_CACHE_MAX_BYTES });
  /** Which page keys were read before: a page is cached from its second read (see PAGE_ADMISSION_SLOTS). */
  readonly #seenPages = new AdmissionFilter(PAGE_ADMISSION_SLOTS);
  /** Records cursor pages are assembled from (see RECORD_CACHE_MAX_BYTES). */
  readonly #records = new TtlCache<MarketRecord>({ maxEntries: RECORD_CACHE_MAX_ENTRIES, maxBytes: RECORD_CACHE_MAX_BYTES });
  /** Bumped by every invalidation; a read started before one is not cached after it. */
  #generation = 0;
  readonly #inflight = new Map<string, Promise<MarketMeta | undefined>>();
  /** Page reads in flight, by page-cache key: concurrent misses for one page share one round trip. */
  readonly #pageInflight = new Map<string, Promise<Page | PageBody>>();
  readonly #opts: RedisStoreOptions;
  readonly #now: () => number;
  readonly #clock: RedisClock;
  readonly #cmd: Scripts;
  /** Where writes go: the main connection, or the replica-confirmed one. */
  readonly #write: Scripts;
  readonly #replicas: ReplicaWait | undefined;
  /** How long after a write's deadline it may land at the latest (its command timeout). */
  readonly #putDeadlineMs: number;
  #subscribed = false;

  constructor(redis: Redis, opts: RedisStoreOptions) {
    this.#redis = redis;
    this.#opts = opts;
    this.#now = opts.now ?? Date.now;
    this.#cmd = redis as unknown as Scripts;
    redis.defineCommand('edgeMarketPut', { numberOfKeys: 4, lua: PUT_SCRIPT });
    redis.defineCommand('edgeMarketResolve', { numberOfKeys: 1, lua: RESOLVE_SCRIPT });
    redis.defineCommand('edgeMarketRecords', { numberOfKeys: 0, lua: RECORDS_SCRIPT });
    redis.defineCommand('edgeMarketMgetBody', { numberOfKeys: 0, lua: MGET_BODY_SCRIPT });
    redis.defineCommand('edgeMarketCursorIds', { numberOfKeys: 1, lua: CURSOR_IDS_SCRIPT });
    this.#replicas = opts.replicas;
    this.#write = this.#cmd;
    if (opts.replicas !== undefined) {
      opts.replicas.redis.defineCommand('edgeMarketPut', { numberOfKeys: 4, lua: PUT_SCRIPT });
      opts.replicas.redis.defineCommand('edgeMarketResolve', { numberOfKeys: 1, lua: RESOLVE_SCRIPT });
      this.#write = opts.replicas.redis as unknown as Scripts;
    }
    this.#putDeadlineMs = opts.writeTimeoutMs ?? REDIS_COMMAND_TIMEOUT_MS;
    // After defineCommand: an auto-pipeline opened by an earlier command would lack the scripts.
    this.#clock = new RedisClock(redis);
    // The subscriber keeps its own connection; it queues while disconnected and re-subscribes.
    // ioredis's own re-subscribe on reconnect leaves its promise unhandled: if the connection
    // drops again before SUBSCRIBE is answered, that rejection would end the process. So
    // subscribing is done here, on every 'ready', with the rejection handled.
    this.#sub = redis.duplicate({ enableOfflineQueue: true, maxRetriesPerRequest: null, commandTimeout: undefined, autoResubscribe: false });
    this.#sub.on('message', (_channel: string, id: string) => this.#invalidate(id));
    this.#sub.on('ready', () => {
      // Messages may have been missed while disconnected: forget everything.
      this.#invalidate(undefined);
      this.#sub.subscribe(INVALIDATION_CHANNEL).then(
        () => {
          // A read sent before the subscription took effect may have missed an invalidation:
          // neither cached nor joined by later callers.
          this.#generation++;
          this.#inflight.clear();
          this.#pageInflight.clear();
          this.#subscribed = true;
        },
        (err: unknown) => opts.onError?.('subscribe', err),
      );
    });
    this.#sub.on('close', () => {
      this.#subscribed = false;
      this.#invalidate(undefined);
    });
    this.#sub.on('error', (err: unknown) => opts.onError?.('subscribe', err));
  }

  /** Drops `id`'s cached meta (every entry when undefined) and every cached page. */
  #invalidate(id: string | undefined): void {
    this.#generation++;
    // A lookup already in flight may have read the old value: later callers must not join it.
    if (id === undefined) {
      this.#cache.clear();
      this.#misses.clear();
      this.#records.clear();
      this.#inflight.clear();
    } else {
      this.#cache.delete(id);
      this.#misses.delete(id);
      this.#records.delete(id);
      this.#inflight.delete(id);
    }
    // Any write may change any page: a read already in flight must not be joined either.
    this.#pageInflight.clear();
    this.#pages.clear();
  }

  /**
   * Whether a hit on `key` should also start the read that replaces it: less than half of
   * MARKET_CACHE_TTL_MS left, and no read of it in flight. Without this, the first caller after
   * expiry waited for Redis and every concurrent caller joined that one round trip: on a busy
   * host one reply later than REDIS_COMMAND_TIMEOUT_MS failed every order in flight for the
   * market (20 at once in reliability 5, issue 27). Now a failed refresh is retried by the next
   * hit, and the entry keeps answering meanwhile; it is never older than the TTL, and with Redis
   * unreachable for half the TTL it expires and callers fail closed as before.
   */
  #dueForRefresh(cache: TtlCache<unknown>, inflight: ReadonlyMap<string, unknown>, key: string, now: number): boolean {
    const expires = cache.expiresAt(key);
    return expires !== undefined && expires - now < this.#opts.cacheTtlMs / 2 && !inflight.has(key);
  }

  /**
   * Synchronous on a fresh cache hit (one in the second half of its life also refreshes it in the
   * background); a Promise (one Redis round trip, shared by concurrent callers) on a miss.
   */
  get(conditionId: string): MarketMeta | undefined | Promise<MarketMeta | undefined> {
    if (this.#subscribed) {
      const now = this.#now();
      const hit = this.#cache.get(conditionId, now);
      if (hit !== undefined) {
        if (this.#dueForRefresh(this.#cache, this.#inflight, conditionId, now)) {
          this.#lookup(conditionId).catch((err: unknown) => this.#opts.onError?.('lookup refresh', err));
        }
        return hit;
      }
      // A market that does not exist is not refreshed ahead: its id is the client's choice, and
      // an order for it is refused either way.
      if (this.#misses.get(conditionId, now) === null) return undefined;
    }
    return this.#lookup(conditionId);
  }

  /** One Redis round trip for `conditionId`, shared by concurrent callers; cached unless an invalidation came first. */
  #lookup(conditionId: string): Promise<MarketMeta | undefined> {
    const generation = this.#generation;
    return shareInFlight(this.#inflight, conditionId, () => this.#fetch([conditionId]).then(([m]) => {
      const meta = m === undefined ? undefined : metaOfItem(m.item);
      if (this.#subscribed && generation === this.#generation) this.#remember(conditionId, meta);
      return meta;
    }));
  }

  /** Caches a lookup in the map for markets that exist, or the one for those that do not. */
  #remember(conditionId: string, meta: MarketMeta | undefined): void {
    const now = this.#now();
    const expires = now + this.#opts.cacheTtlMs;
    this.#cache.delete(conditionId);
    this.#misses.delete(conditionId);
    if (meta === undefined) this.#misses.set(conditionId, null, expires, LOOKUP_ENTRY_BYTES(conditionId), now);
    else this.#cache.set(conditionId, meta, expires, LOOKUP_ENTRY_BYTES(conditionId), now);
  }

  /** Entries held by the lookup cache (markets that exist, and lookups of ids that do not). */
  get cachedLookups(): { readonly markets: number; readonly misses: number } {
    return { markets: this.#cache.size, misses: this.#misses.size };
  }

  /** What the record cache holds: entries and their byte estimate (see RECORD_CACHE_MAX_BYTES). */
  get cachedRecords(): { readonly entries: number; readonly bytes: number } {
    return { entries: this.#records.size, bytes: this.#records.bytes };
  }

  /** What the page cache holds: entries and their byte estimate (see PAGE_CACHE_MAX_BYTES). */
  get cachedPages(): { readonly entries: number; readonly bytes: number } {
    return { entries: this.#pages.size, bytes: this.#pages.bytes };
  }

  /**
   * Stores when seq is greater than the stored one. Every outcome is definite except one:
   * - rejected before sending, or an error reply from Redis → StoreUnavailableError (nothing stored);
   * - no reply (timeout, connection lost) → ask Redis, for up to STORE_RESOLVE_MS, whether this
   *   record is stored; the write carries a deadline in Redis's clock, so once that passed the
   *   answer is final: 'stored', 'stale', or StoreUnavailableError;
   * - Redis did not answer within the window → StoreOutcomeUnknownError.
   * With `replicas` (REDIS_MIN_REPLICAS ≥ 1), 'stored' and 'stale' are answered only once the
   * replicas confirmed what the master holds: a record the master stored but no replica
   * confirmed is StoreOutcomeUnknownError (a failover may lose it), an unconfirmed 'stale' is
   * StoreUnavailableError (this write stored nothing).
   */
  async put(doc: MarketDocument, envelope: Envelope): Promise<PutResult> {
    const m = encodeMarket(doc, envelope);
    const key = MARKET_KEY_PREFIX + doc.conditionId;
    const seq = String(doc.seq);
    const deadline = String(this.#clock.now() + this.#putDeadlineMs);
    const wid = randomUUID();
    let r: number;
    // The connection epoch of the command whose answer is final (see ReplicaWait).
    let epoch = this.#replicas?.epoch ?? 0;
    try {
      r = await this.#write.edgeMarketPut(
        key, INDEX_KEY, ACTIVE_INDEX(doc.active), ACTIVE_INDEX(!doc.active),
        seq, m.item, m.quotes, doc.conditionId, INVALIDATION_CHANNEL, deadline, wid,
      );
    } catch (err) {
      if (neverSent(err) || err instanceof ReplyError) throw new StoreUnavailableError(String(err));
      this.#opts.onError?.('put (resolving)', err);
      [r, epoch] = await this.#resolve(key, seq, wid, deadline);
    } finally {
      this.#invalidate(doc.conditionId);
    }
    if (r !== 1 && r !== 0) throw new StoreUnavailableError('the write did not reach Redis before its deadline; nothing was stored');
    if (this.#replicas !== undefined) {
      try {
        await this.#replicas.confirm(epoch);
      } catch (err) {
        if (r === 1) throw new StoreOutcomeUnknownError(`stored on the master, not confirmed by a replica: ${String(err)}`);
        throw new StoreUnavailableError(`an equal or newer record is on the master, not confirmed by a replica: ${String(err)}`);
      }
    }
    return r === 1 ? 'stored' : 'stale';
  }

  /** Asks Redis what became of a write; returns the final answer and the epoch it came on. */
  async #resolve(key: string, seq: string, wid: string, deadline: string): Promise<[number, number]> {
    const giveUp = Date.now() + STORE_RESOLVE_MS;
    for (;;) {
      const untilDeadline = Number(deadline) - this.#clock.now();
      await sleep(Math.max(RESOLVE_POLL_MS, untilDeadline + 1));
      try {
        const epoch = this.#replicas?.epoch ?? 0;
        const v = await this.#write.edgeMarketResolve(key, deadline, seq, wid);
        if (v !== -2) return [v, epoch];
      } catch {
        // Still unreachable: try again until the window closes.
      }
      if (Date.now() >= giveUp) throw new StoreOutcomeUnknownError(`no answer from Redis within ${STORE_RESOLVE_MS} ms`);
    }
  }

  /**
   * A page, from the page cache while it is fresh (see the header), else from Redis. Concurrent
   * misses for the same page (say, every reader right after an ingest dropped the cache) share
   * one Redis round trip; an invalidation while it is in flight makes later callers start anew.
   */
  page(q: PageQuery): Promise<Page> {
    if (this.#opts.cacheTtlMs === 0) return this.#pageFromRedis(q);
    const key = JSON.stringify([q.active, q.limit, q.after, q.ids]);
    return this.#cachedRead(key, () => this.#pageFromRedis(q), pageCacheBytes);
  }

  /**
   * The page rendered as `kind`'s answer, cached (and shared in flight, refreshed ahead) like
   * `page()`: a hit returns the same PageBody, so nothing is rendered or hashed per request.
   */
  pageBody(q: PageQuery, kind: PageKind): Promise<PageBody> {
    if (this.#opts.cacheTtlMs === 0) return this.#bodyFromRedis(q, kind);
    return this.#cachedRead(pageBodyKey(q, kind), () => this.#bodyFromRedis(q, kind), pageBodyCacheBytes);
  }

  #cachedRead<T extends Page | PageBody>(key: string, read: () => Promise<T>, bytes: (key: string, v: T) => number): Promise<T> {
    if (this.#subscribed) {
      const now = this.#now();
      const hit = this.#pages.get(key, now) as T | undefined;
      if (hit !== undefined) {
        if (this.#dueForRefresh(this.#pages, this.#pageInflight, key, now)) {
          this.#loadPage(key, read, bytes, true).catch((err: unknown) => this.#opts.onError?.('page refresh', err));
        }
        return Promise.resolve(hit);
      }
    }
    return this.#loadPage(key, read, bytes, false);
  }

  /**
   * One Redis round trip for the page `key`, shared by concurrent callers; cached unless an
   * invalidation came first, and (a miss) only from the second read of the key (PAGE_ADMISSION_SLOTS).
   */
  #loadPage<T extends Page | PageBody>(key: string, read: () => Promise<T>, bytes: (key: string, v: T) => number, refresh: boolean): Promise<T> {
    const now = this.#now();
    const generation = this.#generation;
    return shareInFlight(this.#pageInflight, key, () => {
      const admit = this.#seenPages.seenBefore(key) || refresh;
      return read().then((page) => {
        // Kept until `now` + TTL (aged from before the fetch: never longer than the TTL).
        const worth = admit && (!('etag' in page) || (page.parts === undefined && page.body.length <= PAGE_BODY_CACHE_MAX_BYTES));
        if (worth && this.#subscribed && generation === this.#generation) this.#pages.set(key, page, now + this.#opts.cacheTtlMs, bytes(key, page), this.#now());
        return page;
      });
    }) as Promise<T>;
  }

  /** A page as served: by cursor from the record cache and Redis (`#cursorPage`); listed ids by one script, its records as Buffers. */
  async #bodyFromRedis(q: PageQuery, kind: PageKind): Promise<PageBody> {
    if (q.ids === undefined) return this.#cursorPage(q, kind);
    const { want, more } = pageOfIds(q.ids, q);
    const next = more ? want.at(-1) : undefined;
    if (want.length === 0) return { body: pageBodyBytes(kind, [], next), etag: pageEtag(kind, next, EMPTY_VERSIONS) };
    const active = q.active === undefined ? '' : ACTIVE_INDEX(q.active);
    const reply = await this.#cmd.edgeMarketMgetBodyBuffer(MARKET_KEY_PREFIX, kind === 'markets' ? 'item' : 'quotes', active, ...want);
    return { body: pageBodyBytes(kind, reply.slice(2) as Buffer[], next), etag: pageEtag(kind, next, (reply[0] as Buffer).toString('latin1')) };
  }

  /**
   * A page by cursor: its ids (up to limit + 1) by ZRANGE BYLEX (CURSOR_IDS_SCRIPT: one bulk string, as
   * decoding 501 reply items cost ioredis ~0.5 ms a `limit=500` page), then the records the record
   * cache lacks by one script. As the page script before it: ids whose hash is gone are skipped,
   * and more follow when the (limit + 1)th id has a record. The ETag's versions digest is the
   * same SHA-1 of `<id>:<seq>` pairs, computed here.
   */
  async #cursorPage(q: PageQuery, kind: PageKind): Promise<PageBody> {
    const generation = this.#generation;
    const ids = await this.#cursorIds(q);
    const caching = this.#opts.cacheTtlMs > 0 && this.#subscribed;
    const now = this.#now();
    const records = new Array<MarketRecord | undefined>(ids.length);
    const lacking: string[] = [];
    for (let i = 0; i < ids.length; i++) {
      const r = caching ? this.#records.get(ids[i] as string, now) : undefined;
      records[i] = r;
      if (r === undefined) lacking.push(ids[i] as string);
    }
    if (lacking.length > 0) {
      const rows = await this.#cmd.edgeMarketRecordsBuffer(MARKET_KEY_PREFIX, ...lacking);
      const keep = caching && this.#subscribed && generation === this.#generation;
      const expires = now + this.#opts.cacheTtlMs;
      const fetched = new Map<string, MarketRecord>();
      for (let i = 0; i < lacking.length; i++) {
        const [seq, item, quotes] = [rows[3 * i], rows[3 * i + 1], rows[3 * i + 2]];
        if (!Buffer.isBuffer(seq) || !Buffer.isBuffer(item) || !Buffer.isBuffer(quotes)) continue;
        const id = lacking[i] as string;
        const tag = `${id}:${seq.toString('latin1')}`;
        const r = keep ? { tag, item: ownCopy(item), quotes: ownCopy(quotes) } : { tag, item, quotes };
        fetched.set(id, r);
        if (keep) this.#records.set(id, r, expires, recordCacheBytes(id, r), this.#now());
      }
      for (let i = 0; i < ids.length; i++) records[i] ??= fetched.get(ids[i] as string);
    }
    const parts: Buffer[] = [];
    const tags: string[] = [];
    let bytes = 0;
    let n = 0;
    let last: string | undefined;
    let more = false;
    for (let i = 0; i < ids.length; i++) {
      const r = records[i];
      if (r === undefined) continue;
      if (n === q.limit) { more = true; break; }
      tags.push(r.tag);
      n++;
      last = ids[i] as string;
      const part = kind === 'markets' ? r.item : r.quotes;
      if (part.length > 0) {
        parts.push(part);
        bytes += part.length + 1;
      }
    }
    const next = more ? last : undefined;
    const etag = pageEtag(kind, next, tagsDigest(tags));
    // A body the page cache would not keep is not joined either: the market service writes its parts.
    if (bytes > PAGE_BODY_CACHE_MAX_BYTES) return pagePartsBody(kind, parts, next, etag);
    return { body: pageBodyBytes(kind, parts, next), etag };
  }

  /** A cursor page's ids, up to `limit` + 1 (the last tells whether more follow), in index order. */
  async #cursorIds(q: PageQuery): Promise<string[]> {
    const index = q.active === undefined ? INDEX_KEY : ACTIVE_INDEX(q.active);
    const start = q.after === undefined ? '-' : `(${q.after}`;
    return splitIds(await this.#cmd.edgeMarketCursorIdsBuffer(index, start, q.limit + 1));
  }

  async #pageFromRedis(q: PageQuery): Promise<Page> {
    if (q.ids !== undefined) {
      const { want, more } = pageOfIds(q.ids, q);
      let found = (await this.#fetch(want)).filter((m): m is PageItem => m !== undefined);
      if (q.active !== undefined) found = found.filter((m) => metaOfItem(m.item).active === q.active);
      return { markets: found, next: more ? want.at(-1) : undefined };
    }
    const markets = (await this.#fetch(await this.#cursorIds(q))).filter((m): m is PageItem => m !== undefined);
    const more = markets.length > q.limit;
    const page = markets.slice(0, q.limit);
    return { markets: page, next: more ? page.at(-1)?.conditionId : undefined };
  }

  async #fetch(ids: readonly string[]): Promise<(PageItem | undefined)[]> {
    if (ids.length === 0) return [];
    const rows = await this.#cmd.edgeMarketRecords(MARKET_KEY_PREFIX, ...ids);
    return ids.map((conditionId, i) => {
      const item = rows[3 * i + 1];
      return item ? { conditionId, item, quotes: rows[3 * i + 2] ?? '' } : undefined;
    });
  }

  ready(): boolean {
    return this.#redis.status === 'ready' && (this.#replicas === undefined || this.#replicas.redis.status === 'ready');
  }

  /** Whether the in-process caches are on (the invalidation subscription has taken effect). */
  get caching(): boolean {
    return this.#subscribed;
  }

  async close(): Promise<void> {
    this.#clock.close();
    this.#sub.disconnect();
  }
}
