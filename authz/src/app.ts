/**
 * Composition root: builds every adapter from the config and wires the authz core, the
 * market service and the seal. Used by process.ts (and by the e2e suite via `npm run authz`).
 */
import type { Redis } from 'ioredis';
import { GeoDatabase } from './adapters/geoip.ts';
import { MemoryNonceStore, RedisNonceStore } from './adapters/nonce-store.ts';
import { createRedis } from './adapters/redis.ts';
import { createAuthzCore } from './authz.ts';
import { configWarnings, type Config } from './config.ts';
import { loadCredentials } from './credentials.ts';
import type { Logger } from './log.ts';
import { createMarketParts, type MarketParts } from './market-wiring.ts';
import { createMetrics, type AuthzMetrics } from './metrics.ts';
import { systemClock } from './ports.ts';

export interface App {
  readonly metrics: AuthzMetrics;
  start(): Promise<void>;
  seal(reason: string): void;
  isSealed(): boolean;
  stop(): Promise<void>;
  onStop(fn: () => Promise<void>): void;
}

export async function createApp(config: Config, logger: Logger, hooks: { onSealed?: () => void } = {}): Promise<App> {
  const warnings: string[] = [];
  const credentials = loadCredentials(process.env, { warnings });
  for (const w of [...configWarnings(config), ...warnings]) logger.warn(w);

  let geoReady = false;
  // Metrics first (the GeoIP reload callback counts into them); the age gauge reads geo lazily.
  let geo: GeoDatabase | undefined = undefined;
  const metrics = createMetrics({ geoipBuildEpochSecs: () => geo?.buildEpochSecs ?? 0 });
  geo = new GeoDatabase(config.geoipDb, {
    onReload: (ok, path, err) => {
      metrics.geoipReload(ok);
      if (ok) logger.info({ path }, 'GeoIP database reloaded');
      else logger.error({ path, err: String(err) }, 'GeoIP database replacement refused (corrupt?); the previous database keeps serving');
    },
  });
  geoReady = true;
  geo.watch(config.geoipReloadIntervalMs);

  let redis: Redis | undefined;
  if (config.redisUrl !== undefined) {
    redis = createRedis(config.redisUrl);
    redis.on('error', (err: Error) => logger.warn({ err: err.message }, 'redis error'));
  } else {
    logger.warn('REDIS_URL is not set: using IN-MEMORY nonce and market stores. Single instance, development only — ' +
      'nonces and markets are not shared between processes and are lost on restart.');
  }
  const nonces = redis !== undefined ? new RedisNonceStore(redis) : new MemoryNonceStore();
  const market: MarketParts = await createMarketParts({ config, credentials, logger, registry: metrics.registry, redis, clock: systemClock });

  let sealed = false;
  const core = createAuthzCore({ config, credentials, geo, nonces, markets: market.lookup, clock: systemClock, logger, metrics });
  market.attach({
    readiness: () => ({ authz: !sealed, geoip: geoReady, store: market.storeReady() }),
    isSealed: () => sealed,
  });

  const stops: (() => Promise<void>)[] = [];
  return {
    metrics,
    async start() {
      const grpcPort = await core.grpc.listen(config.bindAddress, config.authzGrpcPort);
      const marketPort = await market.listen();
      core.grpc.setServing(true);
      logger.info({ grpcPort, marketPort, adminPort: config.authzAdminPort, redis: redis !== undefined }, 'edge authz ready');
    },
    seal(reason) {
      if (sealed) return;
      sealed = true;
      core.seal(reason);
      hooks.onSealed?.();
    },
    isSealed: () => sealed,
    onStop(fn) {
      stops.push(fn);
    },
    async stop() {
      await core.grpc.close(1000);
      await market.close();
      for (const fn of stops) await fn();
      geo?.close();
      redis?.disconnect();
    },
  };
}
