/**
 * Nonce stores: Redis (atomic SET NX EX, key prefix `edge:nonce:`) and in-memory
 * (single instance, development only).
 */
import type { Redis } from 'ioredis';
import type { NonceResult, NonceStore } from '../ports.ts';

export const NONCE_PREFIX = 'edge:nonce:';

/** Redis-backed: one round trip, atomic set-if-absent with TTL. Rejects when Redis is unreachable. */
export class RedisNonceStore implements NonceStore {
  readonly #redis: Redis;
  constructor(redis: Redis) {
    this.#redis = redis;
  }
  async recordIfAbsent(nonce: string, ttlSecs: number): Promise<NonceResult> {
    const r = await this.#redis.set(NONCE_PREFIX + nonce, '1', 'EX', ttlSecs, 'NX');
    return r === 'OK' ? 'recorded' : 'replay';
  }
}

/** In-memory: a Map with expiry times, swept lazily. Not shared between processes. */
export class MemoryNonceStore implements NonceStore {
  readonly #seen = new Map<string, number>();
  readonly #now: () => number;
  #lastSweep = 0;
  constructor(nowMs: () => number = Date.now) {
    this.#now = nowMs;
  }
  recordIfAbsent(nonce: string, ttlSecs: number): Promise<NonceResult> {
    const now = this.#now();
    if (now - this.#lastSweep > 1000) this.#sweep(now);
    const exp = this.#seen.get(nonce);
    if (exp !== undefined && exp > now) return Promise.resolve('replay');
    this.#seen.set(nonce, now + ttlSecs * 1000);
    return Promise.resolve('recorded');
  }
  #sweep(now: number): void {
    this.#lastSweep = now;
    for (const [k, exp] of this.#seen) if (exp <= now) this.#seen.delete(k);
  }
  get size(): number {
    return this.#seen.size;
  }
}
