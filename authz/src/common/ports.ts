/**
 * Side effects behind small interfaces, injected at start-up. Decision stages import
 * only these types, never ioredis or maxmind.
 */

/** What the geo stage needs to know about an address. */
export interface GeoRecord {
  /** ISO 3166-1 alpha-2, upper case; undefined when the database has no country. */
  readonly country: string | undefined;
  /** ISO 3166-2 codes ("CA-ON"), upper case; empty when the database has no subdivisions. */
  readonly regions: readonly string[];
  /**
   * ISO 3166-1 alpha-2 of the country the network's users represent (GeoIP2 `represented_country`:
   * an overseas military base, an embassy), upper case; absent for most records. Judged beside
   * `country`, the stricter tier wins (docs/api.md "Which country a record gives").
   */
  readonly represented?: string | undefined;
}

/** Looks up an address in the current GeoIP database. `null` = no record for it. */
export interface GeoLookup {
  lookup(ip: string): GeoRecord | null;
  /** Unix seconds the loaded database was built (its metadata), for the decision log; absent in test doubles. */
  readonly buildEpochSecs?: number;
}

/**
 * The GeoIP2 Anonymous IP flags, in bit order (bit i of AnonymizerLookup.flags = flag i).
 * MaxMind sets `is_anonymous` when any of VPN, hosting provider, public proxy or Tor exit is set.
 */
export const ANONYMIZER_FLAGS = ['is_anonymous', 'is_anonymous_vpn', 'is_hosting_provider', 'is_public_proxy', 'is_tor_exit_node', 'is_residential_proxy'] as const;
export type AnonymizerFlag = (typeof ANONYMIZER_FLAGS)[number];

/** Looks up an address in the anonymizer database: its flags as a bit set, 0 for no record. */
export interface AnonymizerLookup {
  flags(ip: string): number;
  /** The record's provider name (GeoIP Anonymous Plus provider_name), for the decision log; undefined when none. */
  provider?(ip: string): string | undefined;
}

/** Outcome of recording a nonce. */
export type NonceResult = 'recorded' | 'replay';

/** Short-lived nonce dedup store (docs/api.md "POST /internal/ingest/market" step 5). */
export interface NonceStore {
  /**
   * Atomically records `nonce` for `ttlSecs` unless present. Rejects (throws) when the store
   * is unreachable: the caller fails closed.
   */
  recordIfAbsent(nonce: string, ttlSecs: number): Promise<NonceResult>;
}

/** The fields of a market record the order checks need. */
export interface MarketMeta {
  readonly conditionId: string;
  readonly seq: number;
  readonly active: boolean;
  readonly closed: boolean;
  /** Decimal strings as in the feed document, or undefined. */
  readonly minSize: string | undefined;
  readonly maxSize: string | undefined;
  /** Unix seconds after which the market takes no orders (optional in the feed). */
  readonly endTime?: number | undefined;
}

/**
 * Read access to market records for order checks. `get` returns synchronously from the
 * in-process cache when it can (no Redis round trip per order on the hot path), and a
 * Promise only on a cache miss. `undefined` = no such market.
 */
export interface MarketLookup {
  get(conditionId: string): MarketMeta | undefined | Promise<MarketMeta | undefined>;
}

/** Wall clock in unix seconds (integer) and milliseconds; injected so tests control time. */
export interface Clock {
  nowSecs(): number;
  nowMs(): number;
}

export const systemClock: Clock = {
  nowSecs: () => Math.floor(Date.now() / 1000),
  nowMs: () => Date.now(),
};
