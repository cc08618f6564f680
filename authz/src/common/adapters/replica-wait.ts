/**
 * Acknowledgements that survive a failover (REDIS_MIN_REPLICAS, REDIS_REPLICA_WAIT_MS;
 * docs/operations.md "Redis").
 *
 * Redis replicates asynchronously: a write the master acknowledged can be missing on the
 * replica Sentinel promotes. So with REDIS_MIN_REPLICAS = N ≥ 1, a nonce or a market record
 * counts as recorded only once N replicas have confirmed it (`WAIT N <REDIS_REPLICA_WAIT_MS>`);
 * otherwise the request is refused (docs/api.md: 503 for a nonce, 504 for a record the master
 * took but no replica confirmed).
 *
 * How:
 * - Every durable write goes through one dedicated connection (`redis`), because WAIT blocks
 *   the connection it runs on: reads and order checks keep their own connection and never
 *   queue behind a WAIT.
 * - A confirmation is a barrier sent *after* the write's reply arrived, on the same TCP
 *   connection: a `PUBLISH` (a propagated write, so the barrier covers everything the master
 *   held at that moment, whichever client wrote it) then `WAIT N timeout`. A replica that
 *   acknowledged that offset holds every earlier write of the master's stream, the one we
 *   observed included.
 * - Group commit: at most one barrier is in flight; the writes that finish meanwhile share the
 *   next one. So a slow or absent replica costs every waiter at most two waits (the one in
 *   flight, then its own), never a queue of them, and a healthy one costs one round trip per
 *   batch, not per write.
 * - The connection may have been replaced (a reconnect, perhaps to a promoted replica) between
 *   the write and its barrier: the barrier would then vouch for another server. Each write
 *   records the connection epoch it ran on; a waiter whose epoch is no longer current is refused.
 */
import type { Redis } from 'ioredis';

/** The channel the barrier publishes to (nobody subscribes; the write only moves the offset). */
export const BARRIER_CHANNEL = 'edge:replication-barrier';

/** No replica confirmed in time, or the connection changed: the write may not survive a failover. */
export class ReplicaWaitError extends Error {
  override readonly name = 'ReplicaWaitError';
}

export interface ReplicaWaitOptions {
  /** Replicas that must confirm (≥ 1). */
  readonly minReplicas: number;
  /** The WAIT timeout, ms. */
  readonly waitMs: number;
}

interface Waiter {
  readonly epoch: number;
  readonly resolve: () => void;
  readonly reject: (err: Error) => void;
}

export class ReplicaWait {
  /** The connection every durable write runs on (its own, see the header). */
  readonly redis: Redis;
  readonly minReplicas: number;
  readonly waitMs: number;
  #epoch = 0;
  #inFlight = false;
  #next: Waiter[] = [];
  readonly #onClose = (): void => {
    this.#epoch++;
  };
  /** Barriers sent (for tests and the bench: one per batch, not per write). */
  barriers = 0;

  constructor(redis: Redis, opts: ReplicaWaitOptions) {
    if (!Number.isInteger(opts.minReplicas) || opts.minReplicas < 1) throw new RangeError('minReplicas must be ≥ 1');
    this.redis = redis;
    this.minReplicas = opts.minReplicas;
    this.waitMs = opts.waitMs;
    redis.on('close', this.#onClose);
  }

  /**
   * The connection's epoch: take it in the same tick as the write is issued on `redis`, and pass
   * it to confirm() once the write has answered.
   */
  get epoch(): number {
    return this.#epoch;
  }

  /**
   * Resolves once `minReplicas` replicas hold everything the master held when this was called
   * (so the write issued at `epoch`, which has answered); rejects with ReplicaWaitError when they
   * do not within the wait, or the connection changed since `epoch`, and with the Redis error
   * when the barrier itself fails.
   */
  confirm(epoch: number): Promise<void> {
    if (epoch !== this.#epoch) return Promise.reject(new ReplicaWaitError('the Redis connection changed after the write; it cannot be confirmed'));
    return new Promise<void>((resolve, reject) => {
      this.#next.push({ epoch, resolve, reject });
      if (!this.#inFlight) this.#flush();
    });
  }

  #flush(): void {
    const batch = this.#next;
    this.#next = [];
    if (batch.length === 0) return;
    const epoch = this.#epoch;
    const waiters = batch.filter((w) => {
      if (w.epoch === epoch) return true;
      w.reject(new ReplicaWaitError('the Redis connection changed after the write; it cannot be confirmed'));
      return false;
    });
    if (waiters.length === 0) return;
    this.#inFlight = true;
    this.barriers++;
    // Both go out together, in this order, on this connection.
    const touched = this.redis.publish(BARRIER_CHANNEL, '');
    const waited = this.redis.wait(this.minReplicas, this.waitMs);
    void Promise.all([touched, waited]).then(
      ([, acked]) => {
        const err = acked >= this.minReplicas
          ? undefined
          : new ReplicaWaitError(`${acked} of ${this.minReplicas} replica(s) confirmed within ${this.waitMs} ms (REDIS_MIN_REPLICAS, REDIS_REPLICA_WAIT_MS)`);
        for (const w of waiters) if (err === undefined) w.resolve(); else w.reject(err);
      },
      (err: unknown) => {
        const e = err instanceof Error ? err : new Error(String(err));
        for (const w of waiters) w.reject(e);
      },
    ).finally(() => {
      this.#inFlight = false;
      this.#flush();
    });
  }

  close(): void {
    this.redis.off('close', this.#onClose);
    this.redis.disconnect();
  }
}
