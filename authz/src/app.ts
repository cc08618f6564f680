/**
 * Composition root: builds every adapter from the config and wires the authz core, the
 * market service and the seal. Used by process.ts (and by the e2e suite via `npm run authz`).
 */
import cluster from 'node:cluster';
import { getHeapStatistics } from 'node:v8';
import { listenAs } from './common/listen-error.ts';
import { listenAtSocket, ownSocket, prepareSocket, removeOwnSocket, removeOwnSocketsAtExit, socketSettings } from './common/unix-socket.ts';
import type { Redis } from 'ioredis';
import { GeoDatabase, regionRuleOf } from './common/adapters/geoip.ts';
import { AnonymizerDatabase } from './common/adapters/anonymizer.ts';
import { MemoryNonceStore, RedisNonceStore } from './common/adapters/nonce-store.ts';
import { createRedis } from './common/adapters/redis.ts';
import { ReplicaWait } from './common/adapters/replica-wait.ts';
import { createAuthzCore } from './authz/core.ts';
import { initialPolicy, LiveGeoPolicy } from './authz/geo-policy.ts';
import { policyRegionRule, policyWarnings } from './common/geo-policy-file.ts';
import { configWarnings, type Config } from './common/config.ts';
import { loadCredentials, noCredentials } from './common/credentials.ts';
import { throttledWarn, type Logger } from './common/log.ts';
import { createMarketStore, writeTimeoutMs } from './market/wiring.ts';
import { createMarketService } from './market/http.ts';
import { MARKET_READ_COMMANDS } from './market/redis-store.ts';
import { createMetrics, type AuthzMetrics } from './common/metrics.ts';
import { systemClock } from './common/ports.ts';
import { createSealState } from './common/seal.ts';
import { checkSealFileWritable, readSealFile, unsealHint } from './common/seal-file.ts';
import { readTokenFile } from './common/token.ts';
import { HEAP_GROWING_PERCENT } from './common/runtime-env.ts';
import { BATCH, RedisBuckets } from './ratelimit/bucket.ts';
import { rateLimitService } from './ratelimit/service.ts';
import { createCheckLimiter } from './ratelimit/check-limit.ts';

export interface App {
  readonly metrics: AuthzMetrics;
  start(): Promise<void>;
  seal(reason: string): void;
  /** Milliseconds since the seal or the last request refused as sealed (0 before the seal). */
  quietMs(): number;
  stop(): Promise<void>;
  onStop(fn: () => Promise<void>): void;
}

/** Why a replacement database was refused: the check's one line, or the reader's error. */
const reasonOf = (err: unknown): string => (err instanceof Error ? err.message : String(err));
/** A connection's errors, one line per 10 s while it keeps failing (it retries every ≤ 1 s); at once again after it was ready. */
function onRedisError(redis: Redis, logger: Logger, msg: string): void {
  const log = throttledWarn(logger, msg);
  redis.on('error', (err: Error) => log.warn({ err: err.message }));
  redis.on('ready', () => log.reset());
}

export async function createApp(config: Config, logger: Logger, hooks: { onSealed?: () => void } = {}): Promise<App> {
  const warnings: string[] = [];
  // AUTHZ_SEAL_FILE present: a seal through the admin port is in force (docs/api.md "Seal"). The
  // process starts sealed and never reads a key.
  if (config.sealFile !== undefined) checkSealFileWritable(config.sealFile);
  const marker = config.sealFile === undefined ? undefined : readSealFile(config.sealFile);
  const credentials = marker !== undefined ? noCredentials() : loadCredentials(process.env, { warnings });
  for (const w of [...configWarnings(config), ...warnings]) logger.warn(w);
  if (marker !== undefined && config.sealFile !== undefined) {
    logger.warn({ sealFile: config.sealFile, sealedAt: marker.record?.sealedAt, reason: marker.record?.reason },
      `SEALED: ${config.sealFile} is present, so this process starts sealed: no key was loaded, every request is answered 503 sealed `
      + `and gRPC health is NOT_SERVING; ${unsealHint(config.sealFile)}`);
  }
  // RateLimitService only where Envoy asks it (RATELIMIT_SERVICE_ADDRESS naming this service, with its token).
  const rateLimitToken = config.rateLimitTokenFile === undefined ? undefined : readTokenFile('RATELIMIT_SERVICE_TOKEN_FILE', config.rateLimitTokenFile);

  // The geo policy: GEO_POLICY_FILE, read and validated now (a bad file ends start-up with one
  // line), else the settings. The databases' region check asks the policy in force when it runs.
  const first = initialPolicy(config);
  const live: { policy?: LiveGeoPolicy } = {};
  const regionRule = (): string | undefined => (config.geoPolicyFile === undefined ? regionRuleOf(config) : (live.policy?.current.regionRule ?? policyRegionRule(first.doc)));
  let geoReady = false;
  // Metrics first (the GeoIP reload callback counts into them); the age gauge reads geo lazily.
  let geo: GeoDatabase | undefined = undefined;
  const metrics = createMetrics({ geoipBuildEpochSecs: () => geo?.buildEpochSecs ?? 0 });
  // Checked before it serves, here and on every reload: a country or city database, with
  // subdivisions when a region rule is in force (adapters/geoip.ts); a refusal ends start-up.
  geo = new GeoDatabase(config.geoipDb, {
    regionRule,
    onReload: (ok, path, err) => {
      metrics.geoipReload(ok);
      if (ok) logger.info({ path }, 'GeoIP database reloaded');
      else logger.error({ path, err: reasonOf(err) }, 'GeoIP database replacement refused (unreadable, or not a database GEOIP_DB accepts); the previous database keeps serving');
    },
  });
  geoReady = true;
  geo.watch(config.geoipReloadIntervalMs);
  // GEOIP_DB_SECONDARY: checked and reloaded like GEOIP_DB; the stricter tier of the two wins.
  const geoSecondary = config.geoipDbSecondary === undefined ? undefined : new GeoDatabase(config.geoipDbSecondary, {
    regionRule,
    setting: 'GEOIP_DB_SECONDARY',
    onReload: (ok, path, err) => {
      metrics.geoipSecondaryReload(ok);
      if (ok) logger.info({ path }, 'secondary GeoIP database reloaded');
      else logger.error({ path, err: reasonOf(err) }, 'secondary GeoIP database replacement refused (unreadable, or not a database GEOIP_DB_SECONDARY accepts); the previous database keeps serving');
    },
  });
  if (geoSecondary !== undefined) {
    geoSecondary.watch(config.geoipReloadIntervalMs);
    logger.info({ path: config.geoipDbSecondary }, 'secondary GeoIP database on: each address is looked up in both, the stricter tier wins');
  }
  // ANONYMIZER_DB (GeoIP2 Anonymous IP or Anonymous Plus, boolean flags: adapters/anonymizer.ts
  // checks it here and on every reload): reloaded on replace like GEOIP_DB.
  const anonymizer = config.anonymizer === undefined ? undefined : new AnonymizerDatabase(config.anonymizer.db, {
    minConfidence: config.anonymizer.minConfidence,
    onReload: (ok, path, err) => {
      metrics.anonymizerReload(ok);
      if (ok) logger.info({ path }, 'anonymizer database reloaded');
      else logger.error({ path, err: reasonOf(err) }, 'anonymizer database replacement refused (unreadable, or not a database ANONYMIZER_DB accepts); the previous database keeps serving');
    },
  });
  if (anonymizer !== undefined && config.anonymizer !== undefined) {
    anonymizer.watch(config.geoipReloadIntervalMs);
    const rules = first.doc.anonymizer ?? config.anonymizer;
    logger.info({ path: config.anonymizer.db, flags: rules.flags, policy: rules.actions }, 'anonymizer rule on');
  }
  // Compiled once per version; with GEO_POLICY_FILE polled and swapped live (authz/geo-policy.ts).
  // regionUnknownTiers: what a record without subdivision gets in each country that has a region
  // rule (GEO_REGION_UNKNOWN; counted as the unknown_region verdict).
  const policy = new LiveGeoPolicy({ config, geo, geoSecondary, anonymizer, metrics, logger }, first);
  live.policy = policy;
  policy.watch();
  logger.info(policy.describe(), config.geoPolicyFile === undefined ? 'geo policy in force (from the settings)' : 'geo policy in force (GEO_POLICY_FILE, watched)');
  // The settings' own are among configWarnings above.
  if (config.geoPolicyFile !== undefined) for (const w of policyWarnings(first.doc)) logger.warn(w);

  let redis: Redis | undefined;
  if (config.redisUrl !== undefined) {
    redis = createRedis(config.redisUrl, { autoPipeliningIgnoredCommands: [...MARKET_READ_COMMANDS] });
    onRedisError(redis, logger, 'redis error');
  } else {
    logger.warn('REDIS_URL is not set: using IN-MEMORY nonce and market stores. Single instance, development only — ' +
      'nonces and markets are not shared between processes and are lost on restart.');
  }
  // The global rate limit's buckets, on a connection of their own without auto-pipelining: they
  // batch their own calls (one batch at Redis at a time, bucket.ts), and ioredis's auto-pipeline
  // would wrap each call in a pipeline of one (a call cost ~66 µs of CPU with it, ~38 µs without,
  // profiled under bench:edge).
  // The scripts are defined before the connection's first command.
  let limiterRedis: Redis | undefined;
  if (config.redisUrl !== undefined) {
    limiterRedis = createRedis(config.redisUrl, { enableAutoPipelining: false });
    onRedisError(limiterRedis, logger, 'redis error (rate limit connection)');
  }
  // Token leases (RATE_LEASE_TOKENS, RATE_LEASE_MS): a busy client's Redis call also buys tokens
  // this process then hands out without Redis (bucket.ts LeasePolicy; docs/envoy.md §3).
  const buckets = limiterRedis !== undefined
    ? new RedisBuckets(limiterRedis, config, metrics.rateLimitRedisCall, BATCH, { tokens: config.rateLeaseTokens, ms: config.rateLeaseMs }) : undefined;
  // REDIS_MIN_REPLICAS ≥ 1: nonces and market records are written on a connection of their own
  // and count only once that many replicas confirmed them (docs/operations.md "Redis").
  let replicas: ReplicaWait | undefined;
  if (config.redisUrl !== undefined && config.redisMinReplicas > 0) {
    const writes = createRedis(config.redisUrl, { commandTimeout: writeTimeoutMs(config) });
    onRedisError(writes, logger, 'redis error (write connection)');
    replicas = new ReplicaWait(writes, { minReplicas: config.redisMinReplicas, waitMs: config.redisReplicaWaitMs });
    logger.info({ minReplicas: config.redisMinReplicas, waitMs: config.redisReplicaWaitMs }, 'nonces and market records count once replicas confirm them');
  }
  const nonces = redis !== undefined ? new RedisNonceStore(redis, replicas) : new MemoryNonceStore();
  const store = createMarketStore(config, redis, systemClock, logger, replicas);

  // One seal state for both services: the moment it is set, Checks and market answers are `sealed`.
  const sealState = createSealState();
  if (marker !== undefined) sealState.set();
  // Traces (OTEL_EXPORTER_OTLP_ENDPOINT): the OpenTelemetry SDK is imported here and only here,
  // so a service without the setting never loads it (authz/tracing.ts).
  const tracer = config.tracing === undefined ? undefined : await (await import('./authz/tracing.ts')).startTracing(config.tracing, logger);
  const core = createAuthzCore({
    config, credentials, geo, geoSecondary, nonces, markets: store, clock: systemClock, logger, metrics, sealState, policy, tracer,
    ...(anonymizer === undefined ? {} : { anonymizer }),
    // RateLimitService: served only for an Envoy pointed at it (RATELIMIT_SERVICE_ADDRESS) with the
    // token it sends; otherwise not at all (UNIMPLEMENTED), so nothing else can drain a client's bucket.
    grpcServices: rateLimitToken === undefined ? [] : [rateLimitService({ buckets, limits: config, metrics, logger, token: rateLimitToken })],
    // The global limit in Check: this service is the limiter (no RATELIMIT_SERVICE_ADDRESS), so the
    // Check Envoy already makes takes the bucket (docs/envoy.md §3).
    ...(buckets !== undefined && config.rateLimitScope === 'global' && config.rateLimitService === undefined
      ? { globalLimit: createCheckLimiter({ buckets, limits: config, metrics, logger }) } : {}),
  });
  const market = createMarketService({
    store,
    feedKeys: credentials.feedKeys,
    ingestMaxBytes: config.ingestMaxBytes,
    logger,
    registry: metrics.registry,
    readiness: () => ({ authz: !sealState.sealed, geoip: geoReady, store: store.ready() }),
    isSealed: () => sealState.refuses(),
    // GET /v1/geoblock: the authz classifier's answer (same settings, same GeoDatabase object),
    // and "blocked" for an address the anonymizer rule refuses orders (what a trader asks).
    geoblock: (ip) => policy.current.geoblock(ip),
    host: config.marketBindAddress,
    port: config.marketPort,
    ...(config.marketSocket === undefined ? {} : { socket: config.marketSocket, tcp: config.marketTcp }),
  });

  if (marker !== undefined) metrics.setSealed(true);
  const stops: (() => Promise<void>)[] = [];
  let exiting = false;
  return {
    metrics,
    async start() {
      // Unix sockets (AUTHZ_GRPC_SOCKET, MARKET_SOCKET): a stale file from a crashed run is
      // removed first (unless a cluster primary did so before forking), 0660 once listening,
      // removed at exit (common/unix-socket.ts).
      if (!cluster.isWorker) {
        for (const [setting, path] of socketSettings(config)) await listenAtSocket(setting, path, () => prepareSocket(path).then((stale) => {
          if (stale) logger.warn({ socket: path }, 'removed a stale socket file (a previous run did not exit cleanly)');
        }));
      }
      const grpcPort = config.authzGrpcTcp
        ? await listenAs('AUTHZ_GRPC_PORT', config.bindAddress, config.authzGrpcPort, () => core.grpc.listen(config.bindAddress, config.authzGrpcPort))
        : 0;
      if (config.authzGrpcSocket !== undefined) {
        const path = config.authzGrpcSocket;
        await listenAtSocket('AUTHZ_GRPC_SOCKET', path, () => core.grpc.listenSocket(path));
      }
      const marketPort = await (config.marketTcp
        ? listenAs('MARKET_PORT', config.marketBindAddress, config.marketPort, () => market.listen())
        : listenAtSocket('MARKET_SOCKET', config.marketSocket ?? '', () => market.listen()));
      // A cluster worker's sockets are the primary's (it holds the listening handle): made 0660
      // here, removed by the primary.
      if (!cluster.isWorker) removeOwnSocketsAtExit();
      for (const [, path] of socketSettings(config)) ownSocket(path, !cluster.isWorker);
      core.grpc.setServing(!sealState.sealed);
      logger.info({
        grpcPort: config.authzGrpcTcp ? grpcPort : undefined, marketPort: config.marketTcp ? marketPort : undefined,
        grpcSocket: config.authzGrpcSocket, marketSocket: config.marketSocket, adminPort: config.authzAdminPort, redis: redis !== undefined,
        heapLimitMb: Math.round(getHeapStatistics().heap_size_limit / 1_048_576), heapGrowingPercent: HEAP_GROWING_PERCENT,
      }, sealState.sealed ? 'edge authz started SEALED' : 'edge authz ready');
    },
    quietMs: () => sealState.quietMs(),
    seal(reason) {
      // Zeroes and denies the first time; a process already sealed (at start) still stops.
      core.seal(reason);
      if (exiting) return;
      exiting = true;
      hooks.onSealed?.();
    },
    onStop(fn) {
      stops.push(fn);
    },
    async stop() {
      await core.grpc.close(1000);
      await market.close();
      for (const [, path] of socketSettings(config)) removeOwnSocket(path);
      await store.close();
      for (const fn of stops) await fn();
      // The spans still queued go out (the exporter's timeout bounds it); a failure is only logged.
      await tracer?.shutdown().catch((err: unknown) => logger.warn({ err: String(err) }, 'trace export at stop failed'));
      policy.close();
      geo?.close();
      geoSecondary?.close();
      anonymizer?.close();
      replicas?.close();
      limiterRedis?.disconnect();
      redis?.disconnect();
    },
  };
}
