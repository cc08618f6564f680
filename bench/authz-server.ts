/**
 * The authz core as a benchmark child process, wired like production: createAuthzCore with
 * the real GeoDatabase (default DB), a RedisNonceStore on the real Redis, real metrics, a
 * pino logger on stdout, and the real in-memory market store (MemoryMarketStore; with Redis,
 * an order's market is an in-process cache hit too), filled by the parent's 'ingest' call.
 *
 * Started by bench/authz.ts through forkNode(); reports its port over IPC, answers 'ingest'
 * (a signed ingest body, base64) through the market service's write path, and 'stats' with
 * the decision counters from its own metrics registry.
 * Env: the usual authz settings (EDGE_INGEST_HMAC, EDGE_FEED_ED25519_PUBLIC_KEY,
 * BLOCKED_COUNTRIES, GEO_TRUSTED_CIDRS…) and REDIS_URL.
 */
import { createAuthzCore } from '../authz/src/authz/core.ts';
import { GeoDatabase } from '../authz/src/common/adapters/geoip.ts';
import { AnonymizerDatabase } from '../authz/src/common/adapters/anonymizer.ts';
import { RedisNonceStore } from '../authz/src/common/adapters/nonce-store.ts';
import { createRedis } from '../authz/src/common/adapters/redis.ts';
import { loadConfig } from '../authz/src/common/config.ts';
import { loadCredentials } from '../authz/src/common/credentials.ts';
import { createLogger } from '../authz/src/common/log.ts';
import { createMetrics } from '../authz/src/common/metrics.ts';
import { systemClock } from '../authz/src/common/ports.ts';
import { MemoryMarketStore } from '../authz/src/market/store.ts';
import type { DecisionCount } from './lib/authz-scenarios.ts';
import { ingestInto } from './lib/market-service.ts';
import { serveParent } from './lib/serve-parent.ts';

const config = loadConfig();
const credentials = loadCredentials();
const logger = createLogger(config.logLevel);
const geo = new GeoDatabase(config.geoipDb);
const anonymizer = config.anonymizer === undefined ? undefined : new AnonymizerDatabase(config.anonymizer.db);
const metrics = createMetrics({ geoipBuildEpochSecs: () => geo.buildEpochSecs });
const redis = createRedis(config.redisUrl ?? 'redis://127.0.0.1:6379/0');
await new Promise<void>((resolve, reject) => {
  redis.once('ready', () => resolve());
  redis.once('error', reject);
});

const markets = new MemoryMarketStore();
const core = createAuthzCore({
  config, credentials, geo, logger, metrics,
  nonces: new RedisNonceStore(redis),
  markets,
  clock: systemClock,
  ...(anonymizer === undefined ? {} : { anonymizer }),
});
const port = await core.grpc.listen('127.0.0.1', 0);
core.grpc.setServing(true);

serveParent(port, {
  ingest: (body) => ingestInto(markets, credentials.feedKeys, Buffer.from(String(body), 'base64')),
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
