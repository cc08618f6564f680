/**
 * The config's types and fixed values: the Config shape and its parts (tier policy, TLS, order
 * backend, anonymizers), the enumerations of allowed values, ConfigError, and the defaults other
 * modules import. Declarations only: parsing is parse.ts, assembly load.ts; the Config interface documents
 * every setting beside its field.
 */
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import type { AnonymizerFlag } from '../ports.ts';
import type { RouteKind } from '../contract.ts';

/** Thrown at start-up for a missing or malformed setting. */
export class ConfigError extends Error {
  readonly variable: string;
  constructor(variable: string, expected: string, got?: string) {
    super(`${variable}: expected ${expected}${got === undefined ? '' : `, got ${JSON.stringify(got)}`}`);
    this.name = 'ConfigError';
    this.variable = variable;
  }
}

export type Env = Readonly<Record<string, string | undefined>>;

const require = createRequire(import.meta.url);

/** The country database shipped by @ip-location-db/geo-whois-asn-country-mmdb (IPv4 + IPv6): development and tests only (common/geoip-default.ts). */
export const DEFAULT_GEOIP_DB = join(
  dirname(require.resolve('@ip-location-db/geo-whois-asn-country-mmdb/package.json')),
  'geo-whois-asn-country.mmdb',
);

export const DEFAULT_GEO_NOTICE =
  'This service is not available in your jurisdiction.';

/** GEO_UNKNOWN: the tier of an address the database has no country for. */
export type GeoUnknown = 'block' | 'close-only' | 'allow';

/**
 * GEO_REGION_UNKNOWN: the tier of a record whose country has a region rule but which names no
 * subdivision: the strictest of that country's region rules and its own, or the country's own.
 */
export type GeoRegionUnknown = 'strictest' | 'country';

/**
 * The tier rules of a geo policy: what the enforced policy (the Config's own fields) and a shadow
 * policy each consist of.
 */
export interface TierPolicy {
  readonly blockedCountries: ReadonlySet<string>;
  readonly blockedRegions: ReadonlySet<string>;
  /** The close-only tier (CLOSE_ONLY_COUNTRIES/CLOSE_ONLY_REGIONS): reads allowed, orders forwarded marked close-only. */
  readonly closeOnlyCountries: ReadonlySet<string>;
  readonly closeOnlyRegions: ReadonlySet<string>;
  /** What an address without a country gets: 451, close-only, or full access. */
  readonly geoUnknown: GeoUnknown;
  /** A record in a country with a region rule but without a subdivision: GEO_REGION_UNKNOWN (default strictest). */
  readonly geoRegionUnknown: GeoRegionUnknown;
}

/** The shadow policy's settings; each one unset means "as enforced" (SHADOW_<NAME> → <NAME>). */
export const SHADOW_SETTINGS = [
  'SHADOW_BLOCKED_COUNTRIES', 'SHADOW_BLOCKED_REGIONS', 'SHADOW_CLOSE_ONLY_COUNTRIES', 'SHADOW_CLOSE_ONLY_REGIONS', 'SHADOW_GEO_UNKNOWN',
  'SHADOW_GEO_REGION_UNKNOWN',
] as const;

/** The settings GEO_POLICY_FILE replaces (its simple form): set beside it, start-up is refused. */
export const GEO_POLICY_SETTINGS = [
  'BLOCKED_COUNTRIES', 'BLOCKED_REGIONS', 'CLOSE_ONLY_COUNTRIES', 'CLOSE_ONLY_REGIONS', 'GEO_UNKNOWN', 'GEO_REGION_UNKNOWN',
  ...SHADOW_SETTINGS, 'ANONYMIZER_FLAGS', 'ANONYMIZER_POLICY',
] as const;

/**
 * OTEL_TRACES_SAMPLER: the OpenTelemetry specification's sampler names this edge implements
 * (jaeger_remote and xray are not); the spec's default is parentbased_always_on.
 */
export const OTEL_SAMPLERS = [
  'always_on', 'always_off', 'traceidratio', 'parentbased_always_on', 'parentbased_always_off', 'parentbased_traceidratio',
] as const;
export type OtelSampler = (typeof OTEL_SAMPLERS)[number];
/** OTEL_SERVICE_NAME's default: the TS service's `service.name`; Envoy's spans are `<it>-envoy`'s. */
export const DEFAULT_OTEL_SERVICE_NAME = 'edge';

/**
 * Traces (OTEL_EXPORTER_OTLP_ENDPOINT and the settings that only mean something with it;
 * docs/operations.md "Traces"): Envoy's OpenTelemetry tracer and the TS service both export
 * OTLP/gRPC there.
 */
export interface TracingConfig {
  /** The collector as given: `http://host:port` (OTLP over gRPC, plaintext). */
  readonly endpoint: string;
  readonly host: string;
  readonly port: number;
  readonly sampler: OtelSampler;
  /**
   * The fraction of new traces Envoy samples: 1 for *always_on, 0 for *always_off, the
   * OTEL_TRACES_SAMPLER_ARG (default 1) for *traceidratio. Envoy starts every trace (a client's
   * traceparent is never honoured), so `parentbased_` changes nothing there.
   */
  readonly ratio: number;
  /** `service.name` of the TS service's spans; Envoy's are `<serviceName>-envoy`'s. */
  readonly serviceName: string;
}

/** LOG_DECISIONS: which authz decisions are logged (docs/operations.md "Decision log"). */
export const LOG_DECISIONS = ['all', 'denials', 'off'] as const;
export type LogDecisions = (typeof LOG_DECISIONS)[number];

export interface OrderBackendConfig {
  /** https://host:port */
  readonly url: string;
  readonly host: string;
  readonly port: number;
  readonly caFile: string;
  readonly san: string;
  readonly clientCertFile: string;
  readonly clientKeyFile: string;
  readonly timeoutMs: number;
  readonly maxConnSecs: number;
}

/** The service's settings as loadConfig (load.ts) returns them, frozen; the enforced geo tiers are TierPolicy's fields. */
export interface Config extends TierPolicy {
  // Ports and addresses
  readonly edgePort: number;
  readonly authzGrpcPort: number;
  readonly marketPort: number;
  readonly authzAdminPort: number;
  readonly envoyAdminPort: number;
  /**
   * ENVOY_STATS_PORT: a listener (all interfaces) whose one route is GET /stats/prometheus, to
   * Envoy's admin (envoy/render/stats.ts); undefined (unset): no such listener.
   */
  readonly envoyStatsPort: number | undefined;
  /** Address the gRPC server binds to (loopback unless a container needs otherwise). */
  readonly bindAddress: string;
  /**
   * Address the market server binds to; AUTHZ_BIND_ADDRESS unless set. Its ingest route trusts
   * Envoy for the HMAC and nonce checks, so it binds wider only when Envoy is another host.
   */
  readonly marketBindAddress: string;
  /** Address the admin server (/metrics, /admin/seal) binds to. Seal is loopback-only regardless. */
  readonly adminBindAddress: string;
  /**
   * The admin token file (AUTHZ_ADMIN_TOKEN_FILE): POST /admin/seal needs `authorization: Bearer
   * <its content>`; unset, the admin port changes nothing (GET /metrics only). Read at start.
   */
  readonly adminTokenFile: string | undefined;
  /**
   * The seal marker (AUTHZ_SEAL_FILE): POST /admin/seal writes it before it seals; a process that
   * finds it at start starts sealed, without loading any key, until an operator removes it
   * (docs/operations.md "Seal and unseal"). Required with AUTHZ_ADMIN_TOKEN_FILE.
   */
  readonly sealFile: string | undefined;
  /** Where Envoy reaches the authz gRPC server and the market service. */
  readonly authzAddress: string;
  readonly marketAddress: string;
  /**
   * Unix domain sockets where Envoy and the TS service share a host or a pod (AUTHZ_GRPC_SOCKET,
   * MARKET_SOCKET; docs/envoy.md "Unix domain sockets"): set, the service listens on that path and
   * Envoy's cluster connects to it (a `pipe` address); AUTHZ_ADDRESS / MARKET_ADDRESS are then
   * refused. undefined: TCP (separate hosts), as before.
   */
  readonly authzGrpcSocket: string | undefined;
  readonly marketSocket: string | undefined;
  /**
   * Whether the gRPC / market server also listens on TCP (AUTHZ_GRPC_PORT / MARKET_PORT): always
   * without a socket; with one, only when that port is set explicitly (the kubelet's gRPC probe,
   * grpcurl, a client on another host).
   */
  readonly authzGrpcTcp: boolean;
  readonly marketTcp: boolean;

  // Client address, rate limits
  readonly xffNumTrustedHops: number;
  readonly rpsPerIp: number;
  readonly rateBurst: number;
  /**
   * The coarser bucket every IPv6 client also draws from (docs/api.md "Client address, geo and
   * rate limit"): the prefix length of one subscriber's allocation, RATE_PREFIX_V6 (32..64,
   * default 48; 64 means no second bucket: the prefix would be the client's own /64), refilled at
   * RPS_PER_PREFIX per second (default 5 × RPS_PER_IP) up to PREFIX_BURST (default 5 × RATE_BURST).
   * An IPv4 client has none.
   */
  readonly ratePrefixV6: number;
  readonly rpsPerPrefix: number;
  readonly prefixBurst: number;
  /**
   * Token leases of the global limit (authz/src/ratelimit/bucket.ts, docs/envoy.md §3): a Redis
   * call for a busy client also buys up to RATE_LEASE_TOKENS more tokens (default 64; 0: no
   * leases), which this process then hands out without Redis until spent or RATE_LEASE_MS (default
   * 100) after they were asked for. Across N processes a client gets at most
   * burst + rate × t + min(N × RATE_LEASE_TOKENS, rate × RATE_LEASE_MS).
   */
  readonly rateLeaseTokens: number;
  readonly rateLeaseMs: number;
  /**
   * `global`: Envoy also asks a RateLimitService (envoy.filters.http.ratelimit) after its local
   * per-replica bucket, so a client spread over N replicas gets RPS_PER_IP/RATE_BURST in all, not
   * N times that; `local`: the per-Envoy bucket only (RATE_LIMIT_SCOPE; docs/envoy.md §3).
   */
  readonly rateLimitScope: 'global' | 'local';
  /**
   * Where Envoy reaches the RateLimitService: RATELIMIT_SERVICE_ADDRESS (another implementation of
   * the protocol, e.g. envoyproxy/ratelimit), else undefined: the TS service's gRPC port.
   */
  readonly rateLimitService: { readonly host: string; readonly port: number } | undefined;
  /**
   * RATELIMIT_SERVICE_TOKEN_FILE (only with RATELIMIT_SERVICE_ADDRESS): the token Envoy sends to the
   * RateLimitService (`authorization: Bearer`, read by Envoy from the file) and the TS service's
   * RateLimitService requires. Unset, the TS service does not serve RateLimitService at all.
   */
  readonly rateLimitTokenFile: string | undefined;

  // Ingest
  readonly replayWindowSecs: number;
  readonly nonceTtlSecs: number;
  readonly ingestMaxBytes: number;

  // Orders
  readonly orderMaxBytes: number;
  readonly orderMaxTtlSecs: number;
  /** Decimal string, or undefined when unset. */
  readonly orderMaxSize: string | undefined;
  readonly orderPayloadMaxBytes: number;
  readonly orderBackend: OrderBackendConfig | undefined;

  // Geo
  readonly geoipDb: string;
  /** GEOIP_DB_SECONDARY: a second database looked up beside GEOIP_DB, the stricter tier wins; undefined: none. */
  readonly geoipDbSecondary: string | undefined;
  readonly geoipReloadIntervalMs: number;
  // The enforced tiers (blockedCountries … geoRegionUnknown): TierPolicy's fields.
  /**
   * A candidate policy evaluated beside the enforced one and never enforced (SHADOW_*; docs/
   * operations.md "Changing the geo policy: shadow first"); undefined when no SHADOW_* variable
   * is present at all, and then it costs nothing.
   */
  readonly shadow: TierPolicy | undefined;
  readonly geoTrustedCidrs: readonly string[];
  readonly geoNotice: string;
  readonly geoBlockedByUrl: string | undefined;
  /** The anonymizer rule (ANONYMIZER_DB, ANONYMIZER_FLAGS, ANONYMIZER_POLICY); undefined without ANONYMIZER_DB. */
  readonly anonymizer: AnonymizerConfig | undefined;
  /**
   * GEO_POLICY_FILE: the geo policy as a watched YAML/JSON file (common/geo-policy-file.ts), in
   * place of the settings GEO_POLICY_SETTINGS names (both given: refused); undefined: the settings.
   */
  readonly geoPolicyFile: string | undefined;

  // Stores
  readonly redisUrl: string | undefined;
  /**
   * Replicas that must confirm a nonce or a market record (Redis WAIT) before it counts as
   * recorded (REDIS_MIN_REPLICAS); 0: the master's acknowledgement is enough, which a Sentinel
   * failover can lose (docs/operations.md "Redis").
   */
  readonly redisMinReplicas: number;
  /** How long one such confirmation may take before the request is refused (REDIS_REPLICA_WAIT_MS). */
  readonly redisReplicaWaitMs: number;
  readonly marketCacheTtlMs: number;

  // Request bodies, the ingest listener, Envoy's memory (docs/envoy.md "Bodies and memory")
  /**
   * INGEST_PORT: ingest is served on a listener of its own (INGEST_BIND_ADDRESS), and the public
   * listener answers the ingest path 404 before reading a body; undefined: ingest is served on
   * EDGE_PORT as every other route.
   */
  readonly ingestPort: number | undefined;
  /** Where the ingest listener binds (INGEST_BIND_ADDRESS, default loopback). */
  readonly ingestBindAddress: string;
  /**
   * The longest a request may take to arrive whole and be decided (Envoy's request_timeout on
   * every listener): a body stalled or trickled past it is answered 408; bodies held per
   * client address are bounded by rate × this.
   */
  readonly requestBodyTimeoutMs: number;
  /**
   * Ingest bodies one client address may have pending at once (header phase allowed, body not
   * yet decided); the next is refused 429 before Envoy buffers it.
   */
  readonly ingestMaxPendingPerClient: number;
  /** The memory limit of Envoy's container (MiB): the overload manager's heap bound derives from it. */
  readonly envoyMemoryLimitMb: number;

  // Process
  /**
   * Envoy's deadline for one authz Check (ext_authz grpc_service.timeout): past it the request
   * is answered 503 service_unavailable, never allowed.
   */
  readonly authzTimeoutMs: number;
  readonly shutdownGraceMs: number;
  readonly logLevel: string;
  /**
   * Which authz decisions get their one decision-log line (LOG_DECISIONS): `all`, `denials`
   * (every denial, no allow) or `off`; at info, so LOG_LEVEL above info silences them too.
   */
  readonly logDecisions: LogDecisions;
  readonly workers: number;
  /**
   * OpenTelemetry traces (OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_TRACES_SAMPLER(_ARG),
   * OTEL_SERVICE_NAME); undefined (no endpoint): no tracer in Envoy's config and the SDK is not
   * even loaded by the service.
   */
  readonly tracing: TracingConfig | undefined;

  // TLS on the client listener, client certificates, PROXY protocol (docs/envoy.md "TLS on the client listener")
  /** EDGE_TLS_CERT_FILE and EDGE_TLS_KEY_FILE (both or neither): EDGE_PORT serves TLS only; undefined: plaintext HTTP. */
  readonly edgeTls: EdgeTlsConfig | undefined;
  /**
   * EDGE_PROXY_PROTOCOL: `required`: every connection to EDGE_PORT starts with a PROXY v1/v2
   * header, whose address is the client address; `off`: none is read.
   */
  readonly proxyProtocol: ProxyProtocol;
}

/** EDGE_TLS_CLIENT_AUTH: whether EDGE_PORT asks for a client certificate, and what a missing or unverified one means. */
export const CLIENT_AUTH_MODES = ['off', 'optional', 'required'] as const;
export type ClientAuth = (typeof CLIENT_AUTH_MODES)[number];
export const PROXY_PROTOCOL_MODES = ['off', 'required'] as const;
export type ProxyProtocol = (typeof PROXY_PROTOCOL_MODES)[number];

export interface EdgeTlsConfig {
  /** The server certificate chain (PEM), served through file-based SDS and re-read when its directory changes. */
  readonly certFile: string;
  readonly keyFile: string;
  /** CA bundle client certificates must chain to (EDGE_TLS_CLIENT_CA_FILE); only with clientAuth optional or required. */
  readonly clientCaFile: string | undefined;
  readonly clientAuth: ClientAuth;
}

/** The memory Envoy needs besides its heap (binary, stacks, thread-local data): measured ~55 MiB RSS with an empty heap. */
export const ENVOY_NON_HEAP_MB = 64;

/** The routes ANONYMIZER_POLICY names (GET /v1/geoblock always answers: it is how a client learns it is refused). */
export const ANONYMIZER_ROUTES = ['order', 'ingest', 'read'] as const;
export type AnonymizerRoute = (typeof ANONYMIZER_ROUTES)[number];

export interface AnonymizerConfig {
  /** A GeoIP2 Anonymous IP–layout .mmdb, reloaded like GEOIP_DB (GEOIP_RELOAD_INTERVAL_MS). */
  readonly db: string;
  /** The flags that make an address an anonymizer. */
  readonly flags: readonly AnonymizerFlag[];
  /** What a flagged address gets per route. */
  readonly actions: Readonly<Record<RouteKind, 'block' | 'allow'>>;
  /** ANONYMIZER_MIN_CONFIDENCE (1–99; GeoIP Anonymous Plus only): a flagged record whose anonymizer_confidence is lower does not count; undefined: any. */
  readonly minConfidence?: number | undefined;
}

/**
 * Default flags: VPNs, public proxies, Tor exits and residential proxies. Hosting providers are
 * opt-in: market makers and API clients commonly trade from cloud machines (docs/api.md "Anonymizers").
 */
export const DEFAULT_ANONYMIZER_FLAGS: readonly AnonymizerFlag[] = ['is_anonymous_vpn', 'is_public_proxy', 'is_tor_exit_node', 'is_residential_proxy'];
/** Default policy: orders and ingests refuse anonymizers, reads serve them. */
export const DEFAULT_ANONYMIZER_POLICY: Readonly<Record<AnonymizerRoute, 'block' | 'allow'>> = { order: 'block', ingest: 'block', read: 'allow' };
