/**
 * Market records: the store interface, the record encoding shared by both implementations,
 * and the in-memory implementation (single instance, development only).
 *
 * What reads serve is serialized once, at write time: `item` is the market record plus its
 * signed envelope as a JSON object text, `quotes` the JSON texts of its quote rows. A page is
 * then string concatenation, O(limit).
 */
import { createHash } from 'node:crypto';
import type { Envelope } from '../common/feed/envelope.ts';
import type { MarketDocument } from '../common/feed/schema.ts';
import type { MarketLookup, MarketMeta } from '../common/ports.ts';

/** One stored market, as reads and order checks use it. */
export interface StoredMarket {
  readonly conditionId: string;
  readonly seq: number;
  readonly active: boolean;
  /** `{...document, "envelope": {d, s, k}}` as JSON text. */
  readonly item: string;
  /** The market's quote rows as JSON object texts joined by ',' ('' when it has none). */
  readonly quotes: string;
  readonly meta: MarketMeta;
}

/** What a page needs: no parsing on the read path. */
export interface PageItem {
  readonly conditionId: string;
  readonly item: string;
  readonly quotes: string;
}

export type PutResult = 'stored' | 'stale';

/**
 * A write that certainly did not happen and never will: the store was unreachable before the
 * command went out, refused it, or ran it too late to apply. Ingest answers 503.
 */
export class StoreUnavailableError extends Error {
  override readonly name = 'StoreUnavailableError';
}

/**
 * A write whose outcome the store could not confirm in time (the connection died after the
 * command went out and the store did not come back within the resolve window). The record may
 * or may not be stored. Ingest answers 504, like an order whose backend timed out.
 */
export class StoreOutcomeUnknownError extends Error {
  override readonly name = 'StoreOutcomeUnknownError';
}

/** The 504 `backend_timeout` message of an ingest whose outcome is unknown. */
export const STORE_OUTCOME_UNKNOWN_MESSAGE =
  'market store did not confirm the write; it may or may not be stored. Re-send it with a new nonce: 200 or 409 stale_document means it is stored';

export interface PageQuery {
  /** Exclusive lower bound (the cursor): only markets with conditionId > after. */
  readonly after?: string | undefined;
  readonly limit: number;
  /** Only these conditionIds. */
  readonly ids?: readonly string[] | undefined;
  /** Only markets whose `active` field is this. */
  readonly active?: boolean | undefined;
}

export interface Page {
  readonly markets: readonly PageItem[];
  /** conditionId of the last market when more may follow, else undefined. */
  readonly next: string | undefined;
}

/** Which answer a page is rendered as: `GET /v1/markets` or `GET /v1/quotes`. */
export type PageKind = 'markets' | 'quotes';

/** A page as served: the whole JSON body as one Buffer (UTF-8) and its weak validator. */
export interface PageBody {
  /** The body; for a page with `parts`, joined on first use (the market service writes the parts instead). */
  readonly body: Buffer;
  readonly etag: string;
  /** A page assembled per request (not cached): its records as held, not joined into one Buffer. */
  readonly parts?: PageParts;
}

/** A page's body as its parts: `head`, the records joined by ',', `tail`. */
export interface PageParts {
  /** `{"markets":[` or `{"quotes":[`. */
  readonly head: Buffer;
  /** The records' texts (`item` for markets, the non-empty `quotes` for quotes), in page order. */
  readonly records: readonly Buffer[];
  /** `],"nextCursor":…}`. */
  readonly tail: Buffer;
  /** The body's length in bytes. */
  readonly length: number;
}

/** The parts of a page's body: the head, `records` (joined by ',' when written) and the tail for `next`. */
export function pageParts(kind: PageKind, records: readonly Buffer[], next: string | undefined): PageParts {
  const head = BODY_HEAD[kind];
  const tail = cursorTail(next);
  let length = head.length + tail.length + Math.max(0, records.length - 1);
  for (const r of records) length += r.length;
  return { head, records, tail, length };
}

/** A PageBody of parts (see PageParts); `body` joins them only if something asks for it. */
export function pagePartsBody(kind: PageKind, records: readonly Buffer[], next: string | undefined, etag: string): PageBody {
  const parts = pageParts(kind, records, next);
  let body: Buffer | undefined;
  return {
    etag, parts,
    get body(): Buffer {
      body ??= writePageParts(parts, Buffer.allocUnsafeSlow(parts.length));
      return body;
    },
  };
}

/**
 * Writes the body of `parts` into `into` (at least `parts.length` bytes) from its start and
 * returns the written slice: the same bytes `pageBodyBytes` makes of the same records.
 */
export function writePageParts(parts: PageParts, into: Buffer): Buffer {
  into.set(parts.head, 0);
  let at = parts.head.length;
  const records = parts.records;
  for (let i = 0; i < records.length; i++) {
    if (i > 0) into[at++] = 0x2c; // ','
    const r = records[i] as Buffer;
    into.set(r, at);
    at += r.length;
  }
  into.set(parts.tail, at);
  at += parts.tail.length;
  if (at !== parts.length) throw new Error(`page body of ${at} bytes, ${parts.length} expected`);
  return into.subarray(0, at);
}

/** `],"nextCursor":null}` or `],"nextCursor":"<cursor>"}`. */
function cursorTail(next: string | undefined): Buffer {
  return next === undefined ? NO_CURSOR_TAIL : Buffer.from(`],"nextCursor":"${encodeCursor(next)}"}`);
}

const BODY_HEAD: Record<PageKind, Buffer> = { markets: Buffer.from('{"markets":['), quotes: Buffer.from('{"quotes":[') };
const NO_CURSOR_TAIL = Buffer.from('],"nextCursor":null}');

/** Opaque cursor: base64url of the last conditionId of the page. */
export function encodeCursor(id: string): string {
  return Buffer.from(id, 'utf8').toString('base64url');
}

/**
 * The body of a page from its records already joined by ',' (`joined`: the `item` texts for
 * markets, the non-empty `quotes` texts for quotes), as UTF-8 bytes: the same bytes as
 * `{"markets":[item,…],"nextCursor":<cursor JSON or null>}` (resp. `{"quotes":[…],…}`).
 * One allocation of the exact size; the result shares no memory with `joined`.
 */
export function pageBodyBytes(kind: PageKind, joined: Buffer | readonly Buffer[], next: string | undefined): Buffer {
  // Its own allocation, never a slice of Node's shared 8 KiB pool (Buffer.concat's choice below
  // 4 KiB): a cached page would keep the whole pool chunk, and what else was cut from it, alive.
  const parts = pageParts(kind, Buffer.isBuffer(joined) ? [joined] : joined, next);
  return writePageParts(parts, Buffer.allocUnsafeSlow(parts.length));
}

/**
 * The weak ETag of a page: kind, next cursor and `versions`, the SHA-1 (hex) of the page's
 * `<conditionId>:<seq>` pairs joined by ',' (computed where the page is read: in Redis's page
 * script, or by `versionsDigest`). `seq` grows on every write, so the same ETag means the same body.
 */
export function pageEtag(kind: PageKind, next: string | undefined, versions: string): string {
  const h = createHash('sha1').update(kind).update('\u0000').update(next ?? '').update('\u0000').update(versions);
  return `W/"${h.digest('base64url')}"`;
}

/** Where `tagsDigest` joins a page's tags: reused (the digest is computed synchronously), grown when a page needs more. */
let tagScratch = Buffer.allocUnsafeSlow(64 * 1024);

/**
 * `versions` of `pageEtag` from a page's `<conditionId>:<seq>` tags (one byte a character: the
 * conditionId pattern and digits): SHA-1 (hex) of the tags joined by ',', written into one reused
 * buffer and hashed once, with no joined string per page.
 */
export function tagsDigest(tags: readonly string[]): string {
  let size = Math.max(0, tags.length - 1);
  for (const t of tags) size += t.length;
  if (size > tagScratch.length) tagScratch = Buffer.allocUnsafeSlow(Math.ceil(size / 65_536) * 65_536);
  let at = 0;
  for (let i = 0; i < tags.length; i++) {
    if (i > 0) tagScratch[at++] = 0x2c; // ','
    at += tagScratch.write(tags[i] as string, at, 'latin1');
  }
  return createHash('sha1').update(tagScratch.subarray(0, at)).digest('hex');
}

/** `versions` of `pageEtag` for records held in memory. */
export function versionsDigest(markets: readonly { readonly conditionId: string; readonly seq: number | string }[]): string {
  return tagsDigest(markets.map((m) => `${m.conditionId}:${m.seq}`));
}

export interface MarketStore extends MarketLookup {
  /**
   * Compare-and-set on seq: stores only when seq > the stored seq. Rejects with
   * StoreUnavailableError when nothing was stored, StoreOutcomeUnknownError when that is unknown.
   */
  put(doc: MarketDocument, envelope: Envelope): Promise<PutResult>;
  /** Markets ordered by conditionId. Rejects when the store is down. */
  page(q: PageQuery): Promise<Page>;
  /**
   * The same page rendered as `kind`'s answer (what the market service sends): byte for byte the
   * body `page(q)`'s records make, without a string per record. Rejects when the store is down.
   */
  pageBody(q: PageQuery, kind: PageKind): Promise<PageBody>;
  ready(): boolean;
  close(): Promise<void>;
  /** What an in-process page cache holds (entries and their byte estimate), if the store has one. */
  readonly cachedPages?: { readonly entries: number; readonly bytes: number };
}

/** Serializes a market for storage (done once per write). */
export function encodeMarket(doc: MarketDocument, envelope: Envelope): StoredMarket {
  const item = JSON.stringify({ ...doc, envelope: { d: envelope.d, s: envelope.s, k: envelope.k } });
  const quotes = doc.outcomes.map((o) =>
    JSON.stringify({
      conditionId: doc.conditionId, tokenId: o.tokenId, outcome: o.name,
      bid: o.bid ?? null, ask: o.ask ?? null, last: o.last ?? null,
      seq: doc.seq, updatedAt: doc.updatedAt,
    }),
  ).join(',');
  return { conditionId: doc.conditionId, seq: doc.seq, active: doc.active, item, quotes, meta: metaOf(doc) };
}

export function metaOf(doc: Pick<MarketDocument, 'conditionId' | 'seq' | 'active' | 'closed' | 'minSize' | 'maxSize' | 'endTime'>): MarketMeta {
  return Object.freeze({
    conditionId: doc.conditionId, seq: doc.seq, active: doc.active, closed: doc.closed,
    minSize: doc.minSize, maxSize: doc.maxSize, endTime: doc.endTime,
  });
}

/** The order-check fields of a stored item (parsed only when the cache is filled). */
export function metaOfItem(item: string): MarketMeta {
  return metaOf(JSON.parse(item) as MarketDocument);
}

/** Binary search: index of the first element > `key` in a sorted array. */
export function upperBound(sorted: readonly string[], key: string): number {
  let lo = 0;
  let hi = sorted.length;
  while (lo < hi) {
    const mid = (lo + hi) >>> 1;
    if ((sorted[mid] as string) <= key) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

/** Pages over explicitly listed ids: sort, dedupe, skip ≤ after, fetch up to limit + 1. */
export function pageOfIds(ids: readonly string[], q: PageQuery): { want: string[]; more: boolean } {
  const sorted = [...new Set(ids)].sort();
  const start = q.after === undefined ? 0 : upperBound(sorted, q.after);
  const want = sorted.slice(start, start + q.limit + 1);
  return { want: want.slice(0, q.limit), more: want.length > q.limit };
}

/** The in-memory store: a Map plus a sorted id array (binary-search insert). */
export class MemoryMarketStore implements MarketStore {
  readonly #byId = new Map<string, StoredMarket>();
  readonly #sorted: string[] = [];

  get(conditionId: string): MarketMeta | undefined {
    return this.#byId.get(conditionId)?.meta;
  }

  put(doc: MarketDocument, envelope: Envelope): Promise<PutResult> {
    const cur = this.#byId.get(doc.conditionId);
    if (cur !== undefined && cur.seq >= doc.seq) return Promise.resolve('stale');
    if (cur === undefined) this.#sorted.splice(upperBound(this.#sorted, doc.conditionId), 0, doc.conditionId);
    this.#byId.set(doc.conditionId, encodeMarket(doc, envelope));
    return Promise.resolve('stored');
  }

  page(q: PageQuery): Promise<Page> {
    const out: PageItem[] = [];
    let more = false;
    if (q.ids !== undefined) {
      const { want } = pageOfIds(q.ids, { ...q, limit: Number.MAX_SAFE_INTEGER });
      for (const id of want) {
        const m = this.#byId.get(id);
        if (m === undefined || (q.active !== undefined && m.active !== q.active)) continue;
        if (out.length === q.limit) { more = true; break; }
        out.push(m);
      }
    } else {
      let i = q.after === undefined ? 0 : upperBound(this.#sorted, q.after);
      for (; i < this.#sorted.length; i++) {
        const m = this.#byId.get(this.#sorted[i] as string) as StoredMarket;
        if (q.active !== undefined && m.active !== q.active) continue;
        if (out.length === q.limit) { more = true; break; }
        out.push(m);
      }
    }
    return Promise.resolve({ markets: out, next: more ? out.at(-1)?.conditionId : undefined });
  }

  async pageBody(q: PageQuery, kind: PageKind): Promise<PageBody> {
    const { markets, next } = await this.page(q);
    const joined = kind === 'markets'
      ? markets.map((m) => m.item).join(',')
      : markets.map((m) => m.quotes).filter((x) => x !== '').join(',');
    const seqs = markets.map((m) => ({ conditionId: m.conditionId, seq: this.#byId.get(m.conditionId)?.seq ?? '' }));
    return { body: pageBodyBytes(kind, Buffer.from(joined), next), etag: pageEtag(kind, next, versionsDigest(seqs)) };
  }

  ready(): boolean {
    return true;
  }

  close(): Promise<void> {
    return Promise.resolve();
  }
}
