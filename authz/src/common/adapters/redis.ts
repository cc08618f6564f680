/**
 * The Redis client. Fail fast when Redis is down (no offline queue, short command timeout)
 * so a request is denied 503 at once instead of queueing; reconnect forever in the background.
 *
 * REDIS_URL forms: redis://[:pass@]host:port[/db], rediss://… (TLS), and
 * redis+sentinel://[:pass@]host1:26379,host2:26379/<master-name>[/db] for Sentinel.
 */
import { Redis, type Command, type RedisOptions } from 'ioredis';

export const REDIS_COMMAND_TIMEOUT_MS = 250;

/** A command's deadline timer (on the command object: no map to look it up in). */
const DEADLINE = Symbol('edge.redis.deadline');
type Timed = Command & { [DEADLINE]?: NodeJS.Timeout };

/**
 * ioredis with a command timeout that a stalled event loop cannot trip. ioredis's own
 * `commandTimeout` rejects from a timer; after the process stalls (a GC pause, a long callback,
 * the process descheduled on a busy host) Node runs due timers before it reads the sockets, so a
 * reply that arrived in time, waiting in the socket, lost to the timer: the command failed
 * ("Command timed out") though Redis had answered in a millisecond, and the request was denied
 * 503 (an ingest in reliability 7's soak, CI 2026-11-26; reproduced by
 * authz/test/redis-deadline.test.ts). Here the timer only schedules the verdict for the check
 * phase (setImmediate), which comes after the poll phase has read every socket that is ready: a
 * reply that is there wins; a Redis that has not answered still fails the command, at most one
 * loop turn later than the timeout.
 */
export class EdgeRedis extends Redis {
  readonly #timeoutMs: number | undefined;

  constructor(target: string | RedisOptions, options: RedisOptions = {}) {
    const { commandTimeout, ...rest } = typeof target === 'string' ? options : { ...target, ...options };
    // This project reads replies in ioredis's default (legacy) mapping only.
    const own = { ...rest, commandTimeout: undefined } as RedisOptions & { replyMapping?: 'legacy' };
    // ioredis parses its arguments by type: a URL string, then an options object.
    if (typeof target === 'string') super(target, own);
    else super(own);
    this.#timeoutMs = commandTimeout;
  }

  override sendCommand(command: Command, stream?: Parameters<Redis['sendCommand']>[1]): unknown {
    const result = super.sendCommand(command, stream);
    const ms = this.#timeoutMs;
    const c = command as Timed;
    if (ms !== undefined && !c.isSettled && c[DEADLINE] === undefined) {
      const timer = setTimeout(() => setImmediate(() => {
        if (!c.isSettled) c.reject(new Error('Command timed out'));
      }), ms);
      c[DEADLINE] = timer;
      c.promise.then(() => clearTimeout(timer), () => clearTimeout(timer));
    }
    return result;
  }
}

/**
 * Redis's clock as seen from this process: `now()` ≈ Redis `TIME` in ms. The offset is sampled
 * on every (re)connect and every `intervalMs`; a sample whose round trip took over 50 ms is
 * dropped (too imprecise). Used to give a write a deadline in Redis's own time (see the
 * market store), so only its precision, never its correctness, depends on the sample.
 */
export class RedisClock {
  #offsetMs = 0;
  readonly #redis: Redis;
  readonly #timer: NodeJS.Timeout;
  readonly #onReady = (): void => void this.#sample();

  constructor(redis: Redis, intervalMs = 5000) {
    this.#redis = redis;
    redis.on('ready', this.#onReady);
    if (redis.status === 'ready') this.#onReady();
    this.#timer = setInterval(this.#onReady, intervalMs);
    this.#timer.unref();
  }

  now(): number {
    return Date.now() + this.#offsetMs;
  }

  /** One TIME round trip; a failed or slow one keeps the previous offset. */
  async #sample(): Promise<void> {
    try {
      const t0 = Date.now();
      const [sec, usec] = await this.#redis.time();
      const t1 = Date.now();
      if (t1 - t0 <= 50) this.#offsetMs = Number(sec) * 1000 + Math.floor(Number(usec) / 1000) - Math.round((t0 + t1) / 2);
    } catch {
      // Redis unreachable: sampled again on the next 'ready'.
    }
  }

  close(): void {
    clearInterval(this.#timer);
    this.#redis.off('ready', this.#onReady);
  }
}

/** True when ioredis rejected a command without sending it (not connected, offline queue off). */
export function neverSent(err: unknown): boolean {
  return err instanceof Error && err.message.includes('enableOfflineQueue options is false');
}

const BASE: RedisOptions = {
  enableOfflineQueue: false,
  maxRetriesPerRequest: 0,
  commandTimeout: REDIS_COMMAND_TIMEOUT_MS,
  connectTimeout: 2000,
  enableAutoPipelining: true,
  retryStrategy: (times: number) => Math.min(50 * times, 1000),
};

/** Parses a redis+sentinel:// URL into ioredis Sentinel options. Exported for tests. */
export function sentinelOptions(url: string): RedisOptions {
  const m = /^redis\+sentinel:\/\/(?:(?::([^@]*))@)?([^/]+)\/([^/]+)(?:\/([0-9]+))?$/.exec(url);
  if (m === null) throw new Error('REDIS_URL: expected redis+sentinel://[:password@]host:port[,host:port…]/<master>[/db]');
  const [, password, hosts = '', name = '', db] = m;
  return {
    sentinels: hosts.split(',').map((h) => {
      const i = h.lastIndexOf(':');
      return i === -1 ? { host: h, port: 26379 } : { host: h.slice(0, i), port: Number(h.slice(i + 1)) };
    }),
    name,
    ...(password === undefined ? {} : { password: decodeURIComponent(password) }),
    ...(db === undefined ? {} : { db: Number(db) }),
  };
}

/** Creates a client. `extra` is merged in (e.g. a subscriber needs the offline queue). */
export function createRedis(url: string, extra: RedisOptions = {}): Redis {
  if (url.startsWith('redis+sentinel://')) return new EdgeRedis({ ...BASE, ...sentinelOptions(url), ...extra });
  return new EdgeRedis(url, { ...BASE, ...extra });
}
