/**
 * Market records: the store interface, the record encoding shared by both implementations,
 * and the in-memory implementation (single instance, development only).
 *
 * What reads serve is serialized once, at write time: `item` is the market record plus its
 * signed envelope as a JSON object text, `quotes` the JSON texts of its quote rows. A page is
 * then string concatenation, O(limit).
 */
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

export interface MarketStore extends MarketLookup {
  /**
   * Compare-and-set on seq: stores only when seq > the stored seq. Rejects with
   * StoreUnavailableError when nothing was stored, StoreOutcomeUnknownError when that is unknown.
   */
  put(doc: MarketDocument, envelope: Envelope): Promise<PutResult>;
  /** Markets ordered by conditionId. Rejects when the store is down. */
  page(q: PageQuery): Promise<Page>;
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

  ready(): boolean {
    return true;
  }

  close(): Promise<void> {
    return Promise.resolve();
  }
}
