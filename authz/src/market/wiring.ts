/**
 * The market store the process runs on: Redis (with the in-process caches, shared by the order
 * checks and the market service) when REDIS_URL is set, else in memory (development only).
 */
import type { Redis } from 'ioredis';
import { REDIS_COMMAND_TIMEOUT_MS } from '../common/adapters/redis.ts';
import type { ReplicaWait } from '../common/adapters/replica-wait.ts';
import type { Config } from '../common/config.ts';
import { throttledWarn, type Logger } from '../common/log.ts';
import { RedisMarketStore } from './redis-store.ts';
import { MemoryMarketStore, type MarketStore } from './store.ts';
import type { Clock } from '../common/ports.ts';

export function createMarketStore(config: Config, redis: Redis | undefined, clock: Clock, logger: Logger, replicas?: ReplicaWait): MarketStore {
  if (redis === undefined) return new MemoryMarketStore();
  // Its reconnects fail as often as the other connections' while Redis is down: one line per 10 s.
  const subscriberError = throttledWarn(logger, 'market store error (subscriber, background refresh or a write being resolved)');
  return new RedisMarketStore(redis, {
    cacheTtlMs: config.marketCacheTtlMs,
    ...(replicas === undefined ? {} : { replicas, writeTimeoutMs: writeTimeoutMs(config) }),
    now: clock.nowMs,
    onError: (op, err) => subscriberError.warn({ op, err: String(err) }),
  });
}

/**
 * The command timeout of the connection durable writes use (REDIS_MIN_REPLICAS ≥ 1): a write
 * there can queue behind one WAIT, so it gets REDIS_REPLICA_WAIT_MS more than the others.
 */
export function writeTimeoutMs(config: Config): number {
  return REDIS_COMMAND_TIMEOUT_MS + config.redisReplicaWaitMs;
}
