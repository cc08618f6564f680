/**
 * The Redis client. Fail fast when Redis is down (no offline queue, short command timeout)
 * so a request is denied 503 at once instead of queueing; reconnect forever in the background.
 *
 * REDIS_URL forms: redis://[:pass@]host:port[/db], rediss://… (TLS), and
 * redis+sentinel://[:pass@]host1:26379,host2:26379/<master-name>[/db] for Sentinel.
 */
import { Redis, type RedisOptions } from 'ioredis';

export const REDIS_COMMAND_TIMEOUT_MS = 250;

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
  if (url.startsWith('redis+sentinel://')) return new Redis({ ...BASE, ...sentinelOptions(url), ...extra });
  return new Redis(url, { ...BASE, ...extra });
}
