/**
 * The authz core as a benchmark child process, wired like production: createAuthzCore with
 * the real GeoDatabase (default DB), a RedisNonceStore on the real Redis, real metrics and
 * a pino logger on stdout; only the MarketLookup is an in-memory map seeded with the bench
 * market (in production an order's market is an in-process cache hit).
 *
 * Started by bench/authz.ts through forkNode(); reports its port over IPC and answers
 * 'stats' with the decision counters from its own metrics registry.
 * Env: the usual authz settings (EDGE_INGEST_HMAC, EDGE_FEED_ED25519_PUBLIC_KEY,
 * BLOCKED_COUNTRIES, GEO_TRUSTED_CIDRS…) and REDIS_URL.
 */
import { createAuthzCore } from '../authz/src/authz.ts';
import { GeoDatabase } from '../authz/src/adapters/geoip.ts';
import { RedisNonceStore } from '../authz/src/adapters/nonce-store.ts';
import { createRedis } from '../authz/src/adapters/redis.ts';
import { loadConfig } from '../authz/src/config.ts';
import { loadCredentials } from '../authz/src/credentials.ts';
import { createLogger } from '../authz/src/log.ts';
import { createMetrics } from '../authz/src/metrics.ts';
import { systemClock } from '../authz/src/ports.ts';
import { fakeMarkets } from '../authz/test/helpers.ts';
import { MARKET, type DecisionCount } from './lib/authz-scenarios.ts';
import { serveParent } from './lib/serve-parent.ts';

const config = loadConfig();
const credentials = loadCredentials();
const logger = createLogger(config.logLevel);
const geo = new GeoDatabase(config.geoipDb);
const metrics = createMetrics({ geoipBuildEpochSecs: () => geo.buildEpochSecs });
const redis = createRedis(config.redisUrl ?? 'redis://127.0.0.1:6379/0');
await new Promise<void>((resolve, reject) => {
  redis.once('ready', () => resolve());
  redis.once('error', reject);
});

const core = createAuthzCore({
  config, credentials, geo, logger, metrics,
  nonces: new RedisNonceStore(redis),
  markets: fakeMarkets([MARKET]),
  clock: systemClock,
});
const port = await core.grpc.listen('127.0.0.1', 0);
core.grpc.setServing(true);

serveParent(port, {
  async stats(): Promise<DecisionCount[]> {
    const counter = metrics.registry.getSingleMetric('edge_authz_decisions_total');
    if (counter === undefined) return [];
    const { values } = await counter.get();
    return values.map((v) => ({
      route: String(v.labels['route']), outcome: String(v.labels['outcome']), code: String(v.labels['code']), value: v.value,
    }));
  },
}, async () => {
  await core.grpc.close(500);
  redis.disconnect();
});
