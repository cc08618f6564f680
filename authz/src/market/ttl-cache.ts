/**
 * A cache bounded three ways: entries expire after a fixed TTL, and it never holds more than
 * `maxEntries` entries or `maxBytes` estimated bytes. The market store's caches use it; their
 * keys can be chosen by clients (any valid `marketId`, any list of conditionIds), so every
 * bound holds whatever a client sends.
 *
 * Every entry lives for the same TTL, so Map insertion order is expiry order: eviction takes
 * entries from the front, expired ones first, then the oldest until the new entry fits. Each
 * insert does O(1) amortised work; nothing scans the whole map.
 */
export interface TtlCacheLimits {
  readonly maxEntries: number;
  /** Bound on the sum of the entries' `bytes` (the caller's estimate of what an entry retains). */
  readonly maxBytes: number;
}

interface Slot<V> {
  readonly value: V;
  readonly expires: number;
  readonly bytes: number;
}

export class TtlCache<V> {
  readonly #map = new Map<string, Slot<V>>();
  readonly #limits: TtlCacheLimits;
  #bytes = 0;

  constructor(limits: TtlCacheLimits) {
    if (!(limits.maxEntries >= 1) || !(limits.maxBytes >= 0)) throw new RangeError('TtlCache: maxEntries ≥ 1 and maxBytes ≥ 0');
    this.#limits = limits;
  }

  /** The value while it is fresh at `now`; an expired entry is dropped. */
  get(key: string, now: number): V | undefined {
    const slot = this.#map.get(key);
    if (slot === undefined) return undefined;
    if (slot.expires > now) return slot.value;
    this.delete(key);
    return undefined;
  }

  /** When the entry for `key` expires (whether or not that is past), if there is one. */
  expiresAt(key: string): number | undefined {
    return this.#map.get(key)?.expires;
  }

  /**
   * Stores `value` until `expires` (the same TTL for every entry). An entry larger than
   * `maxBytes` on its own is not stored. Returns whether it was stored.
   */
  set(key: string, value: V, expires: number, bytes: number, now: number): boolean {
    this.delete(key);
    if (bytes > this.#limits.maxBytes) return false;
    for (const [k, slot] of this.#map) {
      const full = this.#map.size >= this.#limits.maxEntries || this.#bytes + bytes > this.#limits.maxBytes;
      if (!full && slot.expires > now) break;
      this.#map.delete(k);
      this.#bytes -= slot.bytes;
    }
    this.#map.set(key, { value, expires, bytes });
    this.#bytes += bytes;
    return true;
  }

  delete(key: string): void {
    const slot = this.#map.get(key);
    if (slot === undefined) return;
    this.#map.delete(key);
    this.#bytes -= slot.bytes;
  }

  clear(): void {
    this.#map.clear();
    this.#bytes = 0;
  }

  get size(): number {
    return this.#map.size;
  }

  /** The sum of the stored entries' byte estimates. */
  get bytes(): number {
    return this.#bytes;
  }
}

/**
 * A cache's admission filter ("doorkeeper"): remembers the keys it was asked about in a fixed
 * table of 32-bit hashes, one slot per hash, a newer key overwriting an older one in its slot.
 * `seenBefore(key)` answers whether the key was asked about before (and notes it), so a cache
 * can keep only what is asked for twice: a flood of distinct one-off keys then leaves nothing
 * cached, allocates nothing per key, and does not push out what is in use. A false answer for a
 * key asked before (its slot taken by another key meanwhile) or a true one for a new key (two keys
 * with one hash: ~slots / 2^32) only costs or saves one cache entry; the keys may be chosen by
 * clients, and nothing else depends on the answer.
 */
export class AdmissionFilter {
  readonly #slots: Int32Array;
  readonly #mask: number;

  /** `slots`: a power of two. */
  constructor(slots: number) {
    if (!(slots >= 1) || (slots & (slots - 1)) !== 0) throw new RangeError('AdmissionFilter: slots must be a power of two');
    this.#slots = new Int32Array(slots);
    this.#mask = slots - 1;
  }

  /** Whether `key` was asked about before (its hash is in its slot); notes it either way. */
  seenBefore(key: string): boolean {
    // FNV-1a over the UTF-16 code units; 0 marks an empty slot, so no hash is 0.
    let h = 0x811c9dc5;
    for (let i = 0; i < key.length; i++) h = Math.imul(h ^ key.charCodeAt(i), 0x01000193);
    h = h | 1;
    const slot = ((h >>> 16) ^ h) & this.#mask;
    if (this.#slots[slot] === h) return true;
    this.#slots[slot] = h;
    return false;
  }
}
