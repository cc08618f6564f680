/**
 * Wires the market data service into the process: store (Redis with the shared in-process
 * cache, or in-memory) + HTTP service. app.ts sees only this seam.
 */
import type { Redis } from 'ioredis';
import type { Registry } from 'prom-client';
import type { Config } from './config.ts';
import type { Credentials } from './credentials.ts';
import type { Logger } from './log.ts';
import { createMarketService, type MarketService } from './marketdata/http.ts';
import { RedisMarketStore } from './marketdata/redis-store.ts';
import { MemoryMarketStore, type MarketStore } from './marketdata/store.ts';
import type { Clock, MarketLookup } from './ports.ts';

export interface MarketParts {
  readonly lookup: MarketLookup;
  readonly store: MarketStore;
  storeReady(): boolean;
  attach(hooks: { readiness: () => Record<string, boolean>; isSealed: () => boolean }): void;
  listen(): Promise<number>;
  close(): Promise<void>;
}

export async function createMarketParts(deps: {
  config: Config; credentials: Credentials; logger: Logger; registry: Registry; redis: Redis | undefined; clock: Clock;
}): Promise<MarketParts> {
  const { config, logger } = deps;
  const store: MarketStore = deps.redis !== undefined
    ? new RedisMarketStore(deps.redis, {
      cacheTtlMs: config.marketCacheTtlMs,
      now: deps.clock.nowMs,
      onError: (op, err) => logger.warn({ op, err: String(err) }, 'market store subscriber error'),
    })
    : new MemoryMarketStore();
  let hooks: { readiness: () => Record<string, boolean>; isSealed: () => boolean } = { readiness: () => ({ authz: false }), isSealed: () => false };
  let service: MarketService | undefined;
  return {
    lookup: store,
    store,
    storeReady: () => store.ready(),
    attach(h) {
      hooks = h;
    },
    async listen() {
      service = createMarketService({
        store,
        feedKeys: deps.credentials.feedKeys,
        ingestMaxBytes: config.ingestMaxBytes,
        logger,
        registry: deps.registry,
        readiness: () => hooks.readiness(),
        isSealed: () => hooks.isSealed(),
        host: config.marketBindAddress,
        port: config.marketPort,
      });
      return service.listen();
    },
    async close() {
      await service?.close();
      await store.close();
    },
  };
}
