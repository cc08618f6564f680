/**
 * Nonce stores: Redis (atomic SET NX EX, key prefix `edge:nonce:`) and in-memory
 * (single instance, development only).
 */
import type { Redis } from 'ioredis';
import type { NonceResult, NonceStore } from '../ports.ts';
import type { ReplicaWait } from './replica-wait.ts';

export const NONCE_PREFIX = 'edge:nonce:';

/**
 * Redis-backed: one round trip, atomic set-if-absent with TTL. Rejects when Redis is unreachable.
 * With `replicas` (REDIS_MIN_REPLICAS ≥ 1) a new nonce counts as recorded only once that many
 * replicas confirmed it (one more round trip, shared by concurrent ingests); otherwise it rejects
 * with ReplicaWaitError, and the request is refused although the master may keep the nonce.
 */
export class RedisNonceStore implements NonceStore {
  readonly #redis: Redis;
  readonly #replicas: ReplicaWait | undefined;
  constructor(redis: Redis, replicas?: ReplicaWait) {
    this.#redis = replicas?.redis ?? redis;
    this.#replicas = replicas;
  }
  async recordIfAbsent(nonce: string, ttlSecs: number): Promise<NonceResult> {
    const epoch = this.#replicas?.epoch ?? 0;
    const r = await this.#redis.set(NONCE_PREFIX + nonce, '1', 'EX', ttlSecs, 'NX');
    // A replay is refused whatever the replicas hold: nothing to confirm.
    if (r !== 'OK') return 'replay';
    await this.#replicas?.confirm(epoch);
    return 'recorded';
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
