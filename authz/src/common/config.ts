/**
 * One config module: defaults → parse env → validate → freeze.
 *
 * Every name here is public interface (docs/api.md, README "Settings"). A bad value throws a
 * ConfigError at start-up naming the variable and what was expected; nothing is
 * silently coerced (TIMEOUT=abc never becomes 0).
 *
 * Secrets (HMAC keys, feed keys) are parsed separately by `credentials.ts`, so the Envoy
 * renderer and the deploy tooling can load this config without holding any secret.
 */
import { createRequire } from 'node:module';
import { isIP } from 'node:net';
import { dirname, join } from 'node:path';
import { RE } from './rules.ts';
import { ANONYMIZER_FLAGS, type AnonymizerFlag } from './ports.ts';
import { RATE_LIMIT, type RouteKind } from './contract.ts';
import { socketPathProblem } from './unix-socket.ts';

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

/** The tier rules of a geo policy: what the enforced policy and a shadow policy each consist of. */
export interface TierPolicy {
  readonly blockedCountries: ReadonlySet<string>;
  readonly blockedRegions: ReadonlySet<string>;
  readonly closeOnlyCountries: ReadonlySet<string>;
  readonly closeOnlyRegions: ReadonlySet<string>;
  readonly geoUnknown: GeoUnknown;
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

/** GEO_POLICY_FILE, refused beside any of the settings it replaces (an empty value counts as unset, but not for SHADOW_*). */
function geoPolicyFileSetting(env: Env): string | undefined {
  const file = str(env, 'GEO_POLICY_FILE');
  if (file === undefined) return undefined;
  const also = GEO_POLICY_SETTINGS.filter((n) => env[n] !== undefined && (n.startsWith('SHADOW_') || str(env, n) !== undefined));
  if (also.length > 0) {
    throw new ConfigError('GEO_POLICY_FILE', `no ${also.join(', ')} beside it (the file holds the whole geo policy; those settings are its simple form: use one or the other)`, file);
  }
  return file;
}

/** LOG_DECISIONS: which authz decisions are logged (docs/operations.md "Decision log"). */
export const LOG_DECISIONS = ['all', 'denials', 'off'] as const;
export type LogDecisions = (typeof LOG_DECISIONS)[number];
function isLogDecisions(v: string): v is LogDecisions {
  return (LOG_DECISIONS as readonly string[]).includes(v);
}

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

export interface Config {
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
  readonly blockedCountries: ReadonlySet<string>;
  readonly blockedRegions: ReadonlySet<string>;
  /** The close-only tier (CLOSE_ONLY_COUNTRIES/CLOSE_ONLY_REGIONS): reads allowed, orders forwarded marked close-only. */
  readonly closeOnlyCountries: ReadonlySet<string>;
  readonly closeOnlyRegions: ReadonlySet<string>;
  /** What an address without a country gets: 451, close-only, or full access. */
  readonly geoUnknown: GeoUnknown;
  /** A record in a country with a region rule but without a subdivision: GEO_REGION_UNKNOWN (default strictest). */
  readonly geoRegionUnknown: GeoRegionUnknown;
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

/**
 * The TLS block (EDGE_TLS_CERT_FILE, EDGE_TLS_KEY_FILE, EDGE_TLS_CLIENT_CA_FILE,
 * EDGE_TLS_CLIENT_AUTH) and EDGE_PROXY_PROTOCOL. Every name is read whatever is set, so each is
 * a known setting; a combination that cannot mean one thing is refused.
 */
function edgeTlsSettings(env: Env, xffNumTrustedHops: number): { tls: EdgeTlsConfig | undefined; proxyProtocol: ProxyProtocol } {
  const certFile = str(env, 'EDGE_TLS_CERT_FILE');
  const keyFile = str(env, 'EDGE_TLS_KEY_FILE');
  const clientCaFile = str(env, 'EDGE_TLS_CLIENT_CA_FILE');
  const authRaw = str(env, 'EDGE_TLS_CLIENT_AUTH')?.toLowerCase();
  const proxyRaw = str(env, 'EDGE_PROXY_PROTOCOL')?.toLowerCase();
  const proxyProtocol = (proxyRaw ?? 'off') as ProxyProtocol;
  if (!(PROXY_PROTOCOL_MODES as readonly string[]).includes(proxyProtocol)) throw new ConfigError('EDGE_PROXY_PROTOCOL', '"off" or "required"', proxyRaw);
  if (proxyProtocol === 'required' && xffNumTrustedHops > 0) {
    throw new ConfigError('XFF_NUM_TRUSTED_HOPS', '0 with EDGE_PROXY_PROTOCOL=required (the PROXY header is then the one source of the client address)', String(xffNumTrustedHops));
  }
  const clientAuth = (authRaw ?? 'off') as ClientAuth;
  if (!(CLIENT_AUTH_MODES as readonly string[]).includes(clientAuth)) throw new ConfigError('EDGE_TLS_CLIENT_AUTH', '"off", "optional" or "required"', authRaw);
  if (certFile === undefined && keyFile === undefined) {
    if (clientCaFile !== undefined) throw new ConfigError('EDGE_TLS_CLIENT_CA_FILE', 'to be set only with EDGE_TLS_CERT_FILE and EDGE_TLS_KEY_FILE (client certificates need TLS)', clientCaFile);
    if (clientAuth !== 'off') throw new ConfigError('EDGE_TLS_CLIENT_AUTH', '"off" without EDGE_TLS_CERT_FILE and EDGE_TLS_KEY_FILE (client certificates need TLS)', authRaw);
    return { tls: undefined, proxyProtocol };
  }
  if (certFile === undefined) throw new ConfigError('EDGE_TLS_CERT_FILE', 'a file path when EDGE_TLS_KEY_FILE is set (both or neither)');
  if (keyFile === undefined) throw new ConfigError('EDGE_TLS_KEY_FILE', 'a file path when EDGE_TLS_CERT_FILE is set (both or neither)');
  if (clientAuth === 'off' && clientCaFile !== undefined) {
    throw new ConfigError('EDGE_TLS_CLIENT_AUTH', '"optional" or "required" when EDGE_TLS_CLIENT_CA_FILE is set (the CA is used for nothing with "off")', authRaw ?? 'off');
  }
  if (clientAuth !== 'off' && clientCaFile === undefined) {
    throw new ConfigError('EDGE_TLS_CLIENT_CA_FILE', `a file path with EDGE_TLS_CLIENT_AUTH=${clientAuth} (the CA client certificates must chain to)`);
  }
  return { tls: Object.freeze({ certFile, keyFile, clientCaFile, clientAuth }), proxyProtocol };
}

function str(env: Env, name: string): string | undefined {
  const v = env[name];
  return v === undefined || v.trim() === '' ? undefined : v.trim();
}

function int(env: Env, name: string, def: number, min: number, max: number): number {
  const raw = str(env, name);
  if (raw === undefined) return def;
  if (!/^-?[0-9]+$/.test(raw)) throw new ConfigError(name, `an integer in [${min}, ${max}]`, raw);
  const n = Number(raw);
  if (!Number.isSafeInteger(n) || n < min || n > max) {
    throw new ConfigError(name, `an integer in [${min}, ${max}]`, raw);
  }
  return n;
}

function port(env: Env, name: string, def: number): number {
  return int(env, name, def, 0, 65535);
}

/** The memory Envoy needs besides its heap (binary, stacks, thread-local data): measured ~55 MiB RSS with an empty heap. */
export const ENVOY_NON_HEAP_MB = 64;

/**
 * INGEST_PORT and INGEST_BIND_ADDRESS (both read whatever is set, so each is a known setting):
 * a port of its own, unlike every other listening port; an IP literal to bind, only with the port.
 */
/**
 * AUTHZ_GRPC_SOCKET / MARKET_SOCKET: an absolute path (unix-socket.ts), or `off` (TCP: the same as
 * unset, for npm start, which otherwise picks a socket in its run directory). With a socket the
 * matching *_ADDRESS setting has nothing to say and is refused rather than ignored.
 */
function socketSetting(env: Env, name: string, addressName: string): string | undefined {
  const raw = str(env, name);
  if (raw === undefined || raw.toLowerCase() === 'off') return undefined;
  const problem = socketPathProblem(raw);
  if (problem !== undefined) throw new ConfigError(name, `${problem}, or "off" for TCP`, raw);
  const address = str(env, addressName);
  if (address !== undefined) throw new ConfigError(addressName, `unset with ${name} (Envoy reaches the service on the socket, not at an address)`, address);
  return raw;
}

/** ENVOY_STATS_PORT: unset (no stats listener), or a port no other Envoy listener uses. */
function statsPort(env: Env, taken: Readonly<Record<string, number | undefined>>): number | undefined {
  const raw = str(env, 'ENVOY_STATS_PORT');
  if (raw === undefined) return undefined;
  const p = int(env, 'ENVOY_STATS_PORT', 0, 1, 65535);
  for (const [name, other] of Object.entries(taken)) {
    if (other === p) throw new ConfigError('ENVOY_STATS_PORT', `a port other than ${name} (${other})`, raw);
  }
  return p;
}

function ingestListener(env: Env, taken: Readonly<Record<string, number>>): { port: number | undefined; bindAddress: string } {
  const raw = str(env, 'INGEST_PORT');
  const bind = str(env, 'INGEST_BIND_ADDRESS');
  if (raw === undefined) {
    if (bind !== undefined) throw new ConfigError('INGEST_BIND_ADDRESS', 'to be set only with INGEST_PORT (without it ingest is served on EDGE_PORT)', bind);
    return { port: undefined, bindAddress: '127.0.0.1' };
  }
  const p = int(env, 'INGEST_PORT', 0, 1, 65535);
  for (const [name, other] of Object.entries(taken)) {
    if (other === p) throw new ConfigError('INGEST_PORT', `a port other than ${name} (${other})`, raw);
  }
  if (bind !== undefined && isIP(bind) === 0) throw new ConfigError('INGEST_BIND_ADDRESS', 'an IP address (0.0.0.0, 127.0.0.1, ::)', bind);
  return { port: p, bindAddress: bind ?? '127.0.0.1' };
}

function list(env: Env, name: string): string[] {
  const raw = str(env, name);
  if (raw === undefined) return [];
  return raw.split(',').map((s) => s.trim()).filter((s) => s !== '');
}


/** An upper-cased list of ISO 3166-1 alpha-2 codes (BLOCKED_COUNTRIES, CLOSE_ONLY_COUNTRIES). */
function countries(env: Env, name: string): string[] {
  const out = list(env, name).map((c) => c.toUpperCase());
  for (const c of out) if (!RE.country.test(c)) throw new ConfigError(name, 'ISO 3166-1 alpha-2 codes, comma-separated', c);
  return out;
}

/** An upper-cased list of ISO 3166-2 codes (BLOCKED_REGIONS, CLOSE_ONLY_REGIONS). */
function regions(env: Env, name: string): string[] {
  const out = list(env, name).map((c) => c.toUpperCase());
  for (const r of out) if (!RE.region.test(r)) throw new ConfigError(name, 'ISO 3166-2 codes like CA-ON, comma-separated', r);
  return out;
}

/** A code listed in both tiers is refused: which one was meant cannot be guessed. */
function oneTier(closeOnlyName: string, closeOnly: readonly string[], blockedName: string, blocked: readonly string[]): void {
  const both = closeOnly.filter((c) => blocked.includes(c));
  if (both.length > 0) {
    throw new ConfigError(closeOnlyName, `codes not also in ${blockedName} (each jurisdiction has one tier; ${both.join(', ')} is in both)`, both.join(','));
  }
}

/**
 * The shadow policy: present when any SHADOW_* variable is in the environment. Each one given
 * (an empty value included: "none", like GEO_TRUSTED_CIDRS) replaces its enforced counterpart;
 * each one absent keeps the enforced value, so a candidate names only what it changes.
 */
function shadowPolicy(env: Env, enforced: TierPolicy): TierPolicy | undefined {
  // Present at all, even empty (an empty value is a choice here: "none").
  const given = (name: string): boolean => env[name] !== undefined;
  if (!SHADOW_SETTINGS.some(given)) return undefined;
  const pick = (name: string, own: () => string[], fallback: ReadonlySet<string>): string[] => (given(name) ? own() : [...fallback]);
  const blockedCountries = pick('SHADOW_BLOCKED_COUNTRIES', () => countries(env, 'SHADOW_BLOCKED_COUNTRIES'), enforced.blockedCountries);
  const blockedRegions = pick('SHADOW_BLOCKED_REGIONS', () => regions(env, 'SHADOW_BLOCKED_REGIONS'), enforced.blockedRegions);
  const closeOnlyCountries = pick('SHADOW_CLOSE_ONLY_COUNTRIES', () => countries(env, 'SHADOW_CLOSE_ONLY_COUNTRIES'), enforced.closeOnlyCountries);
  const closeOnlyRegions = pick('SHADOW_CLOSE_ONLY_REGIONS', () => regions(env, 'SHADOW_CLOSE_ONLY_REGIONS'), enforced.closeOnlyRegions);
  // A code in both shadow tiers is as ambiguous as in both enforced ones; name the shadow settings.
  oneTier('SHADOW_CLOSE_ONLY_COUNTRIES', closeOnlyCountries, 'SHADOW_BLOCKED_COUNTRIES (or BLOCKED_COUNTRIES where that is unset)', blockedCountries);
  oneTier('SHADOW_CLOSE_ONLY_REGIONS', closeOnlyRegions, 'SHADOW_BLOCKED_REGIONS (or BLOCKED_REGIONS where that is unset)', blockedRegions);
  return Object.freeze({
    blockedCountries: new Set(blockedCountries),
    blockedRegions: new Set(blockedRegions),
    closeOnlyCountries: new Set(closeOnlyCountries),
    closeOnlyRegions: new Set(closeOnlyRegions),
    geoUnknown: given('SHADOW_GEO_UNKNOWN') ? geoUnknownSetting(env, 'SHADOW_GEO_UNKNOWN', enforced.geoUnknown) : enforced.geoUnknown,
    geoRegionUnknown: given('SHADOW_GEO_REGION_UNKNOWN') ? geoRegionUnknownSetting(env, 'SHADOW_GEO_REGION_UNKNOWN', enforced.geoRegionUnknown) : enforced.geoRegionUnknown,
  });
}

function geoRegionUnknownSetting(env: Env, name: string, def: GeoRegionUnknown = 'strictest'): GeoRegionUnknown {
  const v = (str(env, name) ?? def).toLowerCase();
  if (v !== 'strictest' && v !== 'country') throw new ConfigError(name, '"strictest" or "country"', v);
  return v;
}

function geoUnknownSetting(env: Env, name: string, def: GeoUnknown = 'block'): GeoUnknown {
  const v = (str(env, name) ?? def).toLowerCase();
  if (v !== 'block' && v !== 'close-only' && v !== 'allow') throw new ConfigError(name, '"block", "close-only" or "allow"', v);
  return v;
}

function parseBackend(env: Env): OrderBackendConfig | undefined {
  const url = str(env, 'ORDER_BACKEND_URL');
  if (url === undefined) return undefined;
  let parsed: URL;
  try {
    parsed = new URL(url);
  } catch {
    throw new ConfigError('ORDER_BACKEND_URL', 'https://host:port', url);
  }
  if (parsed.protocol !== 'https:' || parsed.hostname === '' || parsed.pathname !== '/' && parsed.pathname !== '') {
    throw new ConfigError('ORDER_BACKEND_URL', 'https://host:port (no path)', url);
  }
  const host = parsed.hostname.replace(/^\[(.*)\]$/, '$1');
  const required = (name: string): string => {
    const v = str(env, name);
    if (v === undefined) throw new ConfigError(name, 'a file path (required when ORDER_BACKEND_URL is set)');
    return v;
  };
  return Object.freeze({
    url,
    host,
    port: parsed.port === '' ? 443 : Number(parsed.port),
    caFile: required('ORDER_BACKEND_CA_FILE'),
    san: str(env, 'ORDER_BACKEND_SAN') ?? host,
    clientCertFile: required('EDGE_CLIENT_CERT_FILE'),
    clientKeyFile: required('EDGE_CLIENT_KEY_FILE'),
    timeoutMs: int(env, 'ORDER_BACKEND_TIMEOUT_MS', 5000, 1, 600_000),
    maxConnSecs: int(env, 'ORDER_BACKEND_MAX_CONN_SECS', 300, 1, 86_400),
  });
}

/** `host:port` or `[ipv6]:port` (RATELIMIT_SERVICE_ADDRESS). */
function hostPort(env: Env, name: string): { host: string; port: number } | undefined {
  const raw = str(env, name);
  if (raw === undefined) return undefined;
  const m = /^(?:\[([0-9a-fA-F:.]+)\]|([A-Za-z0-9.-]+)):([0-9]{1,5})$/.exec(raw);
  const host = m?.[1] ?? m?.[2];
  const port = Number(m?.[3]);
  if (m === null || host === undefined || (m[1] !== undefined && isIP(m[1]) !== 6) || port < 1 || port > 65535) {
    throw new ConfigError(name, 'host:port (an IPv6 address in brackets: [::1]:8081)', raw);
  }
  return { host, port };
}

/**
 * RATE_LIMIT_SCOPE: `global` by default when there is somewhere to keep the buckets (REDIS_URL,
 * or another RateLimitService at RATELIMIT_SERVICE_ADDRESS), else `local`.
 */
function rateLimitScope(env: Env, redisUrl: string | undefined, service: { host: string; port: number } | undefined): 'global' | 'local' {
  const raw = str(env, 'RATE_LIMIT_SCOPE')?.toLowerCase();
  const scope = raw ?? (redisUrl !== undefined || service !== undefined ? 'global' : 'local');
  if (scope !== 'global' && scope !== 'local') throw new ConfigError('RATE_LIMIT_SCOPE', '"global" or "local"', raw);
  if (scope === 'global' && redisUrl === undefined && service === undefined) {
    // The TS service keeps the global buckets in Redis; the in-memory mode has none to share.
    throw new ConfigError('RATE_LIMIT_SCOPE', '"local" without REDIS_URL (the global limit keeps its buckets in Redis) unless RATELIMIT_SERVICE_ADDRESS names another rate limit service', scope);
  }
  if (scope === 'local' && service !== undefined) {
    throw new ConfigError('RATELIMIT_SERVICE_ADDRESS', 'unset with RATE_LIMIT_SCOPE=local (only the global limit calls a rate limit service)', `${service.host}:${service.port}`);
  }
  return scope;
}

/**
 * Settings that each load but contradict one another in a way the operator must hear about at
 * start-up (logged as warnings, not refused: each limit keeps its documented meaning).
 * - ORDER_MAX_BYTES below the compact JSON of the largest valid order (the longest marketId, a
 *   10-digit deadline, the longest size up to ORDER_MAX_SIZE, an ORDER_PAYLOAD_MAX_BYTES payload
 *   in base64):
 *   such orders pass every authz rule but get 413 payload_too_large from Envoy first.
 */
export function configWarnings(c: Config): string[] {
  const out: string[] = [];
  // size: ORDER_MAX_SIZE's integer digits plus a point and 18 decimals (the most a size may
  // carry), or 40 characters when no maximum is set.
  const sizeChars = c.orderMaxSize === undefined ? 40 : (c.orderMaxSize.split('.')[0] ?? '').length + 19;
  const largestOrder = JSON.stringify({
    marketId: 'x'.repeat(128), deadline: 9_999_999_999, size: '9'.repeat(sizeChars), payload: '',
  }).length + 4 * Math.ceil(c.orderPayloadMaxBytes / 3);
  if (largestOrder > c.orderMaxBytes) {
    out.push(`ORDER_MAX_BYTES=${c.orderMaxBytes} is below the largest valid order (${largestOrder} bytes of compact JSON: an `
      + `ORDER_PAYLOAD_MAX_BYTES=${c.orderPayloadMaxBytes} payload in base64 plus its envelope); such orders get 413 `
      + `payload_too_large. Raise ORDER_MAX_BYTES to ${largestOrder} or lower ORDER_PAYLOAD_MAX_BYTES.`);
  }
  if (c.redisMinReplicas === 0 && c.redisUrl?.startsWith('redis+sentinel://') === true) {
    out.push('REDIS_URL names Sentinels but REDIS_MIN_REPLICAS=0: an acknowledged ingest or nonce can be missing on the replica '
      + 'a failover promotes, and that signed ingest is then accepted again. Set REDIS_MIN_REPLICAS=1 (docs/operations.md "Redis").');
  }
  // A nonce's write can queue behind a WAIT, then wait for the one in flight and its own; Redis
  // ends a WAIT on its clock tick (hz 10: up to 100 ms past the timeout).
  if (c.redisMinReplicas > 0 && 3 * (c.redisReplicaWaitMs + 100) >= c.authzTimeoutMs) {
    out.push(`REDIS_REPLICA_WAIT_MS=${c.redisReplicaWaitMs} is too long for AUTHZ_TIMEOUT_MS=${c.authzTimeoutMs}: an ingest's nonce `
      + `may wait for replicas three times, up to 100 ms longer each (${3 * (c.redisReplicaWaitMs + 100)} ms), so Envoy can give up `
      + 'first (503 all the same). Lower REDIS_REPLICA_WAIT_MS or raise AUTHZ_TIMEOUT_MS.');
  }
  // The global limit in the Check (docs/envoy.md §3) waits up to RATE_LIMIT.timeoutMs before the policy runs.
  if (c.rateLimitScope === 'global' && c.rateLimitService === undefined && c.authzTimeoutMs <= 2 * RATE_LIMIT.timeoutMs) {
    out.push(`AUTHZ_TIMEOUT_MS=${c.authzTimeoutMs} leaves little room for the global rate limit, which the Check waits for up to `
      + `${RATE_LIMIT.timeoutMs} ms before its policy: with Redis slow, Envoy can give up on the Check first (503). Raise AUTHZ_TIMEOUT_MS.`);
  }
  // An order or ingest is decided twice (header phase, then body phase), each Check up to
  // AUTHZ_TIMEOUT_MS, all inside REQUEST_BODY_TIMEOUT_MS (docs/envoy.md "Bodies and memory").
  if (c.requestBodyTimeoutMs <= 2 * c.authzTimeoutMs) {
    out.push(`REQUEST_BODY_TIMEOUT_MS=${c.requestBodyTimeoutMs} leaves no time for a body: an order or an ingest is decided twice `
      + `(before and after its body), each Check up to AUTHZ_TIMEOUT_MS=${c.authzTimeoutMs}, within it; a slow Check then ends `
      + 'in 408 instead of 503. Raise REQUEST_BODY_TIMEOUT_MS above 2 × AUTHZ_TIMEOUT_MS plus the time a body takes to arrive.');
  }
  if (c.rateLimitService !== undefined && c.rateLimitTokenFile === undefined) {
    out.push(`RATELIMIT_SERVICE_ADDRESS=${c.rateLimitService.host}:${c.rateLimitService.port} is set without RATELIMIT_SERVICE_TOKEN_FILE: `
      + 'this service serves no RateLimitService (calls are UNIMPLEMENTED). If that address is this service, set RATELIMIT_SERVICE_TOKEN_FILE '
      + 'for Envoy and for this service (docs/operations.md "Another rate limit service").');
  }
  // A region rule overrides its country's in both directions (docs/api.md "Jurisdiction tiers"):
  // said once at start-up where that loosens the country's tier, in case it was not meant.
  for (const r of c.closeOnlyRegions) {
    const cc = r.slice(0, 2);
    if (c.blockedCountries.has(cc)) {
      out.push(`CLOSE_ONLY_REGIONS lists ${r} inside ${cc}, which BLOCKED_COUNTRIES blocks: clients located in ${r} get close-only access, `
        + `not 451 (a region rule overrides its country's). Remove ${r} from CLOSE_ONLY_REGIONS if ${cc} is to be blocked everywhere.`);
    }
  }
  return out;
}

/** Parses and validates every non-secret setting. Throws ConfigError on the first bad one. */
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

function anonymizerSettings(env: Env): AnonymizerConfig | undefined {
  // All three are read whatever is set, so each is a known setting name.
  const db = str(env, 'ANONYMIZER_DB');
  const flagsRaw = str(env, 'ANONYMIZER_FLAGS');
  const policyRaw = str(env, 'ANONYMIZER_POLICY');
  const confidenceRaw = str(env, 'ANONYMIZER_MIN_CONFIDENCE');
  if (db === undefined) {
    if (confidenceRaw !== undefined) throw new ConfigError('ANONYMIZER_MIN_CONFIDENCE', 'to be set only with ANONYMIZER_DB (there is no anonymizer database to apply it to)', confidenceRaw);
    if (flagsRaw !== undefined) throw new ConfigError('ANONYMIZER_FLAGS', 'to be set only with ANONYMIZER_DB (there is no anonymizer database to apply them to)', flagsRaw);
    if (policyRaw !== undefined) throw new ConfigError('ANONYMIZER_POLICY', 'to be set only with ANONYMIZER_DB (there is no anonymizer database to apply it to)', policyRaw);
    return undefined;
  }
  let flags = DEFAULT_ANONYMIZER_FLAGS;
  if (flagsRaw !== undefined) {
    const names = list(env, 'ANONYMIZER_FLAGS').map((f) => f.toLowerCase());
    const bad = names.find((f) => !(ANONYMIZER_FLAGS as readonly string[]).includes(f));
    if (names.length === 0 || bad !== undefined) throw new ConfigError('ANONYMIZER_FLAGS', `a list of ${ANONYMIZER_FLAGS.join(', ')}`, flagsRaw);
    flags = [...new Set(names)] as AnonymizerFlag[];
  }
  const actions: Record<AnonymizerRoute, 'block' | 'allow'> = { ...DEFAULT_ANONYMIZER_POLICY };
  if (policyRaw !== undefined) {
    const seen = new Set<string>();
    for (const item of list(env, 'ANONYMIZER_POLICY')) {
      const [route = '', action = '', extra] = item.split('=').map((x) => x.trim().toLowerCase());
      if (extra !== undefined || !(ANONYMIZER_ROUTES as readonly string[]).includes(route) || (action !== 'block' && action !== 'allow') || seen.has(route)) {
        throw new ConfigError('ANONYMIZER_POLICY', `route=action pairs, each route (${ANONYMIZER_ROUTES.join(', ')}) at most once, action block or allow`, policyRaw);
      }
      seen.add(route);
      actions[route as AnonymizerRoute] = action;
    }
  }
  // ANONYMIZER_MIN_CONFIDENCE: GeoIP Anonymous Plus's anonymizer_confidence is 1–99.
  const minConfidence = confidenceRaw === undefined ? undefined : Number(confidenceRaw);
  if (minConfidence !== undefined && !(Number.isInteger(minConfidence) && minConfidence >= 1 && minConfidence <= 99)) {
    throw new ConfigError('ANONYMIZER_MIN_CONFIDENCE', 'an integer from 1 to 99 (GeoIP Anonymous Plus anonymizer_confidence)', confidenceRaw);
  }
  return Object.freeze({ db, flags: Object.freeze(flags), actions: Object.freeze({ ...actions, geoblock: 'allow' as const }), ...(minConfidence === undefined ? {} : { minConfidence }) });
}

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

    edgeTls: edgeTls.tls,
    proxyProtocol: edgeTls.proxyProtocol,
  });
}

/**
 * Settings read outside loadConfig: the secrets (credentials.ts, each also as `<NAME>_FILE`),
 * and the development-only ones (`npm start`, the demo backend, the scripts; README
 * "Development only"). STRICT_SETTINGS is read by checkSettingNames below.
 */
const SECRET_SETTINGS = ['EDGE_INGEST_HMAC', 'EDGE_INGEST_HMAC_PREVIOUS', 'EDGE_FEED_ED25519_PUBLIC_KEY', 'EDGE_FEED_ED25519_KEY'];
const DEV_SETTINGS = [
  'DEV_REDIS_PORT', 'DEV_BACKEND_PORT', 'DEV_RUN_DIR', 'STRICT_SETTINGS', 'DEV_EDGE_TLS',
  'BACKEND_CERT_FILE', 'BACKEND_KEY_FILE', 'BACKEND_CLIENT_CA_FILE', 'BACKEND_PORT', 'BACKEND_BIND_ADDRESS',
  'NODE_BIN', 'ENVOY_BIN', 'GRPCURL_BIN', 'PYTHON', 'RELIABILITY_SOAK_SECS', 'RELIABILITY_ONLY', 'EDGE_REQUIRE_CONTAINERS',
];

/** The names loadConfig reads: recorded by running it (without and with an order backend), never listed by hand. */
function configSettingNames(): string[] {
  const seen = new Set<string>();
  const recording = (base: Record<string, string>): Env => new Proxy(base, {
    get(target, key) {
      if (typeof key === 'string') seen.add(key);
      return target[key as string];
    },
  });
  loadConfig(recording({}));
  loadConfig(recording({ ORDER_BACKEND_URL: 'https://backend:8443', ORDER_BACKEND_CA_FILE: 'a', EDGE_CLIENT_CERT_FILE: 'b', EDGE_CLIENT_KEY_FILE: 'c' }));
  return [...seen];
}

/** Every environment variable the project reads as a setting (README "Settings"). */
export const KNOWN_SETTINGS: ReadonlySet<string> = new Set([
  ...configSettingNames(), ...SECRET_SETTINGS, ...SECRET_SETTINGS.map((n) => `${n}_FILE`), ...DEV_SETTINGS,
]);

/**
 * The project's prefixes: the first word of every known setting (EDGE_, AUTHZ_, RATE_, GEO_, …),
 * except those of other programs' variables (NODE_ is Node's: NODE_ENV, NODE_OPTIONS, …).
 */
export const SETTING_PREFIXES: readonly string[] = [...new Set(
  [...KNOWN_SETTINGS].filter((n) => n.includes('_')).map((n) => `${n.slice(0, n.indexOf('_'))}_`),
)].filter((p) => p !== 'NODE_').sort();

/** Optimal string alignment distance (Levenshtein plus adjacent transpositions). */
function editDistance(a: string, b: string): number {
  const d: number[][] = Array.from({ length: a.length + 1 }, (_, i) => [i, ...Array<number>(b.length).fill(0)]);
  for (let j = 1; j <= b.length; j++) d[0]![j] = j;
  for (let i = 1; i <= a.length; i++) {
    for (let j = 1; j <= b.length; j++) {
      const cost = a[i - 1] === b[j - 1] ? 0 : 1;
      let v = Math.min(d[i - 1]![j]! + 1, d[i]![j - 1]! + 1, d[i - 1]![j - 1]! + cost);
      if (i > 1 && j > 1 && a[i - 1] === b[j - 2] && a[i - 2] === b[j - 1]) v = Math.min(v, d[i - 2]![j - 2]! + 1);
      d[i]![j] = v;
    }
  }
  return d[a.length]![b.length]!;
}

export interface UnknownSetting {
  readonly name: string;
  /** The known setting nearest to it. */
  readonly nearest: string;
  readonly message: string;
}

/**
 * Variables that look like settings but are none: every name with one of the project's
 * prefixes that is not a setting (RATE_LIMIT_RPS), and any other name within two edits of one
 * (EGDE_PORT, LOGLEVEL). Nothing reads them, so each is reported with the setting nearest to it.
 */
export function unknownSettings(env: Env): UnknownSetting[] {
  const out: UnknownSetting[] = [];
  for (const name of Object.keys(env).sort()) {
    if (KNOWN_SETTINGS.has(name) || !/^[A-Z][A-Z0-9_]*$/.test(name)) continue;
    let nearest = '';
    let best = Infinity;
    for (const k of KNOWN_SETTINGS) {
      const dist = editDistance(name, k);
      if (dist < best) [best, nearest] = [dist, k];
    }
    const prefixed = SETTING_PREFIXES.some((p) => name.startsWith(p));
    if (prefixed || best <= (name.length >= 8 ? 2 : 1)) {
      out.push({ name, nearest, message: `${name} is not a setting (did you mean ${nearest}?)` });
    }
  }
  return out;
}

/**
 * Reports unknownSettings: returns them as warnings, or with STRICT_SETTINGS=1 throws a
 * ConfigError naming them (README "Settings").
 */
export function checkSettingNames(env: Env): UnknownSetting[] {
  const strict = str(env, 'STRICT_SETTINGS') ?? '0';
  if (strict !== '0' && strict !== '1') throw new ConfigError('STRICT_SETTINGS', '1 or 0', strict);
  const unknown = unknownSettings(env);
  const [first, ...more] = unknown;
  if (strict === '1' && first !== undefined) {
    const others = more.length === 0 ? '' : ` (also not settings: ${more.map((u) => u.name).join(', ')})`;
    throw new ConfigError(first.name, `a known setting (STRICT_SETTINGS=1 refuses unknown ones); did you mean ${first.nearest}?${others}`);
  }
  return unknown;
}
