/**
 * loadConfig: defaults → parse env → validate → freeze. Assembles the Config from the per-setting
 * parsers (parse.ts) and checks the settings that constrain one another; nothing here reads a secret.
 */
import { isIP } from 'node:net';
import { RE } from '../rules.ts';
import {
  ConfigError, DEFAULT_GEOIP_DB, DEFAULT_GEO_NOTICE, ENVOY_NON_HEAP_MB, type Config, type Env,
} from './types.ts';
import {
  anonymizerSettings, countries, edgeTlsSettings, geoPolicyFileSetting, geoRegionUnknownSetting, geoUnknownSetting, hostPort,
  ingestListener, int, isLogDecisions, list, oneTier, parseBackend, port, rateLimitScope, regions, shadowPolicy, socketSetting, statsPort, str,
  tracingSettings,
} from './parse.ts';

/** Parses and validates every non-secret setting. Throws ConfigError on the first bad one. */
export function loadConfig(env: Env = process.env): Config {
  const blockedCountries = countries(env, 'BLOCKED_COUNTRIES');
  const blockedRegions = regions(env, 'BLOCKED_REGIONS');
  const closeOnlyCountries = countries(env, 'CLOSE_ONLY_COUNTRIES');
  const closeOnlyRegions = regions(env, 'CLOSE_ONLY_REGIONS');
  oneTier('CLOSE_ONLY_COUNTRIES', closeOnlyCountries, 'BLOCKED_COUNTRIES', blockedCountries);
  oneTier('CLOSE_ONLY_REGIONS', closeOnlyRegions, 'BLOCKED_REGIONS', blockedRegions);
  const geoUnknown = geoUnknownSetting(env, 'GEO_UNKNOWN');
  const geoRegionUnknown = geoRegionUnknownSetting(env, 'GEO_REGION_UNKNOWN');
  const shadow = shadowPolicy(env, {
    blockedCountries: new Set(blockedCountries), blockedRegions: new Set(blockedRegions),
    closeOnlyCountries: new Set(closeOnlyCountries), closeOnlyRegions: new Set(closeOnlyRegions), geoUnknown, geoRegionUnknown,
  });
  const trusted = str(env, 'GEO_TRUSTED_CIDRS') === undefined && env['GEO_TRUSTED_CIDRS'] === undefined
    ? ['127.0.0.0/8', '::1/128']
    : list(env, 'GEO_TRUSTED_CIDRS');
  for (const cidr of trusted) {
    const m = /^([0-9a-fA-F:.]+)\/([0-9]{1,3})$/.exec(cidr);
    const family = m === null ? 0 : isIP(m[1] ?? '');
    if (m === null || family === 0 || Number(m[2]) > (family === 4 ? 32 : 128)) {
      throw new ConfigError('GEO_TRUSTED_CIDRS', 'CIDR blocks like 10.0.0.0/8 or ::1/128, comma-separated', cidr);
    }
  }
  const orderMaxSize = str(env, 'ORDER_MAX_SIZE');
  if (orderMaxSize !== undefined && !RE.decimal.test(orderMaxSize)) {
    throw new ConfigError('ORDER_MAX_SIZE', 'a positive decimal string', orderMaxSize);
  }
  const blockedBy = str(env, 'GEO_BLOCKED_BY_URL');
  if (blockedBy !== undefined) {
    let ok = false;
    try {
      ok = ['http:', 'https:'].includes(new URL(blockedBy).protocol) && !/[<>\s]/.test(blockedBy);
    } catch { /* reported below */ }
    if (!ok) throw new ConfigError('GEO_BLOCKED_BY_URL', 'an absolute http(s) URL', blockedBy);
  }
  const redisUrl = str(env, 'REDIS_URL');
  if (redisUrl !== undefined && !/^(rediss?|redis\+sentinel):\/\//.test(redisUrl)) {
    throw new ConfigError('REDIS_URL', 'redis://, rediss:// or redis+sentinel:// URL', redisUrl);
  }
  const redisMinReplicas = int(env, 'REDIS_MIN_REPLICAS', 0, 0, 16);
  if (redisMinReplicas > 0 && redisUrl === undefined) {
    throw new ConfigError('REDIS_MIN_REPLICAS', '0 without REDIS_URL (the in-memory stores have no replicas)', String(redisMinReplicas));
  }
  const rpsPerIp = int(env, 'RPS_PER_IP', 20, 1, 1_000_000);
  const rateBurst = int(env, 'RATE_BURST', 40, 1, 10_000_000);
  // A prefix holds many clients: its bucket is never smaller than one client's (a smaller one
  // would make the client's own bucket never the one that refuses).
  const rpsPerPrefix = int(env, 'RPS_PER_PREFIX', 5 * rpsPerIp, rpsPerIp, 5_000_000);
  const prefixBurst = int(env, 'PREFIX_BURST', 5 * rateBurst, rateBurst, 50_000_000);
  const rateLimitService = hostPort(env, 'RATELIMIT_SERVICE_ADDRESS');
  const scope = rateLimitScope(env, redisUrl, rateLimitService);
  const rateLimitTokenFile = str(env, 'RATELIMIT_SERVICE_TOKEN_FILE');
  if (rateLimitTokenFile !== undefined && rateLimitService === undefined) {
    throw new ConfigError('RATELIMIT_SERVICE_TOKEN_FILE', 'to be set only with RATELIMIT_SERVICE_ADDRESS (nothing asks a rate limit service otherwise)', rateLimitTokenFile);
  }
  const adminTokenFile = str(env, 'AUTHZ_ADMIN_TOKEN_FILE');
  const sealFile = str(env, 'AUTHZ_SEAL_FILE');
  if (adminTokenFile !== undefined && sealFile === undefined) {
    // A seal through the admin port must outlive a restart of the process (docs/api.md "Seal").
    throw new ConfigError('AUTHZ_SEAL_FILE', 'a file path when AUTHZ_ADMIN_TOKEN_FILE is set (a seal by POST /admin/seal is kept there across restarts)');
  }
  const bindAddress = str(env, 'AUTHZ_BIND_ADDRESS') ?? '127.0.0.1';
  const workers = int(env, 'AUTHZ_WORKERS', 1, 1, 64);
  if (workers > 1 && redisUrl === undefined) {
    // Each worker would keep its own in-memory nonces and markets: a replay sent to another worker passes.
    throw new ConfigError('AUTHZ_WORKERS', '1 without REDIS_URL (workers share nonces and markets only through Redis)', String(workers));
  }
  const logLevel = str(env, 'LOG_LEVEL') ?? 'info';
  if (!['trace', 'debug', 'info', 'warn', 'error', 'fatal', 'silent'].includes(logLevel)) {
    throw new ConfigError('LOG_LEVEL', 'trace|debug|info|warn|error|fatal|silent', logLevel);
  }
  const logDecisions = (str(env, 'LOG_DECISIONS') ?? 'denials').toLowerCase();
  if (!isLogDecisions(logDecisions)) throw new ConfigError('LOG_DECISIONS', 'all|denials|off', logDecisions);
  const geoNotice = str(env, 'GEO_NOTICE') ?? DEFAULT_GEO_NOTICE;
  const replayWindowSecs = int(env, 'REPLAY_WINDOW_SECS', 300, 1, 86_400);
  const nonceTtlSecs = int(env, 'NONCE_TTL_SECS', 600, 1, 7 * 86_400);
  if (nonceTtlSecs < 2 * replayWindowSecs) {
    // A timestamp may be up to a window ahead of the clock, so a nonce must outlive 2 × window.
    throw new ConfigError('NONCE_TTL_SECS', `at least 2 × REPLAY_WINDOW_SECS (${2 * replayWindowSecs})`, String(nonceTtlSecs));
  }

  const edgePort = port(env, 'EDGE_PORT', 8080);
  const envoyAdminPort = port(env, 'ENVOY_ADMIN_PORT', 9901);
  const ingest = ingestListener(env, { EDGE_PORT: edgePort, ENVOY_ADMIN_PORT: envoyAdminPort });
  const envoyStatsPort = statsPort(env, { EDGE_PORT: edgePort, ENVOY_ADMIN_PORT: envoyAdminPort, INGEST_PORT: ingest.port });
  const authzTimeoutMs = int(env, 'AUTHZ_TIMEOUT_MS', 1000, 10, 60_000);
  const xffNumTrustedHops = int(env, 'XFF_NUM_TRUSTED_HOPS', 0, 0, 10);
  const edgeTls = edgeTlsSettings(env, xffNumTrustedHops);
  const authzGrpcSocket = socketSetting(env, 'AUTHZ_GRPC_SOCKET', 'AUTHZ_ADDRESS');
  const marketSocket = socketSetting(env, 'MARKET_SOCKET', 'MARKET_ADDRESS');
  if (authzGrpcSocket !== undefined && authzGrpcSocket === marketSocket) {
    throw new ConfigError('MARKET_SOCKET', 'a path other than AUTHZ_GRPC_SOCKET', marketSocket);
  }

  return Object.freeze({
    edgePort,
    authzGrpcPort: port(env, 'AUTHZ_GRPC_PORT', 9191),
    marketPort: port(env, 'MARKET_PORT', 8081),
    authzAdminPort: port(env, 'AUTHZ_ADMIN_PORT', 9464),
    envoyAdminPort,
    envoyStatsPort,
    bindAddress,
    marketBindAddress: str(env, 'MARKET_BIND_ADDRESS') ?? bindAddress,
    adminBindAddress: str(env, 'ADMIN_BIND_ADDRESS') ?? '127.0.0.1',
    adminTokenFile,
    sealFile,
    authzAddress: str(env, 'AUTHZ_ADDRESS') ?? '127.0.0.1',
    marketAddress: str(env, 'MARKET_ADDRESS') ?? '127.0.0.1',
    authzGrpcSocket,
    marketSocket,
    authzGrpcTcp: authzGrpcSocket === undefined || str(env, 'AUTHZ_GRPC_PORT') !== undefined,
    marketTcp: marketSocket === undefined || str(env, 'MARKET_PORT') !== undefined,

    xffNumTrustedHops,
    rpsPerIp,
    rateBurst,
    ratePrefixV6: int(env, 'RATE_PREFIX_V6', 48, 32, 64),
    rpsPerPrefix,
    prefixBurst,
    rateLeaseTokens: int(env, 'RATE_LEASE_TOKENS', 64, 0, 1024),
    rateLeaseMs: int(env, 'RATE_LEASE_MS', 100, 10, 1000),
    rateLimitScope: scope,
    rateLimitService: rateLimitService === undefined ? undefined : Object.freeze(rateLimitService),
    rateLimitTokenFile,

    replayWindowSecs,
    nonceTtlSecs,
    ingestMaxBytes: int(env, 'INGEST_MAX_BYTES', 1_048_576, 256, 64 * 1_048_576),

    orderMaxBytes: int(env, 'ORDER_MAX_BYTES', 65_536, 64, 16 * 1_048_576),
    orderMaxTtlSecs: int(env, 'ORDER_MAX_TTL_SECS', 86_400, 1, 365 * 86_400),
    orderMaxSize,
    orderPayloadMaxBytes: int(env, 'ORDER_PAYLOAD_MAX_BYTES', 32_768, 1, 12 * 1_048_576),
    orderBackend: parseBackend(env),

    geoipDb: str(env, 'GEOIP_DB') ?? DEFAULT_GEOIP_DB,
    geoipDbSecondary: str(env, 'GEOIP_DB_SECONDARY'),
    geoipReloadIntervalMs: int(env, 'GEOIP_RELOAD_INTERVAL_MS', 2000, 50, 3_600_000),
    blockedCountries: new Set(blockedCountries),
    blockedRegions: new Set(blockedRegions),
    closeOnlyCountries: new Set(closeOnlyCountries),
    closeOnlyRegions: new Set(closeOnlyRegions),
    geoUnknown,
    geoRegionUnknown,
    shadow,
    geoTrustedCidrs: Object.freeze(trusted),
    geoNotice,
    geoBlockedByUrl: blockedBy,
    anonymizer: anonymizerSettings(env),
    geoPolicyFile: geoPolicyFileSetting(env),

    redisUrl,
    redisMinReplicas,
    redisReplicaWaitMs: int(env, 'REDIS_REPLICA_WAIT_MS', 200, 1, 10_000),
    marketCacheTtlMs: int(env, 'MARKET_CACHE_TTL_MS', 2000, 0, 60_000),

    ingestPort: ingest.port,
    ingestBindAddress: ingest.bindAddress,
    requestBodyTimeoutMs: int(env, 'REQUEST_BODY_TIMEOUT_MS', 5000, 500, 60_000),
    ingestMaxPendingPerClient: int(env, 'INGEST_MAX_PENDING_PER_CLIENT', 8, 1, 10_000),
    envoyMemoryLimitMb: int(env, 'ENVOY_MEMORY_LIMIT_MB', 1024, 2 * ENVOY_NON_HEAP_MB, 1_048_576),

    authzTimeoutMs,
    shutdownGraceMs: int(env, 'SHUTDOWN_GRACE_MS', 5000, 0, 120_000),
    logLevel,
    logDecisions,
    workers,
    tracing: tracingSettings(env),

    edgeTls: edgeTls.tls,
    proxyProtocol: edgeTls.proxyProtocol,
  });
}
