/**
 * One config module: defaults → parse env → validate → freeze.
 *
 * Every name here is public interface (../shared/CONTRACT.md). A bad value throws a
 * ConfigError at start-up naming the variable and what was expected; nothing is
 * silently coerced (TIMEOUT=abc never becomes 0).
 *
 * Secrets (HMAC keys, feed keys) are parsed separately by `credentials.ts`, so the Envoy
 * renderer and the deploy tooling can load this config without holding any secret.
 */
import { createRequire } from 'node:module';
import { isIP } from 'node:net';
import { dirname, join } from 'node:path';

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

/** The CC0 country database shipped by @ip-location-db/geo-whois-asn-country-mmdb (IPv4 + IPv6). */
export const DEFAULT_GEOIP_DB = join(
  dirname(require.resolve('@ip-location-db/geo-whois-asn-country-mmdb/package.json')),
  'geo-whois-asn-country.mmdb',
);

export const DEFAULT_GEO_NOTICE =
  'This service is not available in your jurisdiction.';

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
  /** Address the gRPC server binds to (loopback unless a container needs otherwise). */
  readonly bindAddress: string;
  /**
   * Address the market server binds to; AUTHZ_BIND_ADDRESS unless set. Its ingest route trusts
   * Envoy for the HMAC and nonce checks, so it binds wider only when Envoy is another host.
   */
  readonly marketBindAddress: string;
  /** Address the admin server (/metrics, /admin/seal) binds to. Seal is loopback-only regardless. */
  readonly adminBindAddress: string;
  /** Where Envoy reaches the authz gRPC server and the market service. */
  readonly authzAddress: string;
  readonly marketAddress: string;

  // Client address, rate limits
  readonly xffNumTrustedHops: number;
  readonly rpsPerIp: number;
  readonly rateBurst: number;

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
  readonly geoipReloadIntervalMs: number;
  readonly blockedCountries: ReadonlySet<string>;
  readonly blockedRegions: ReadonlySet<string>;
  readonly geoUnknown: 'block' | 'allow';
  readonly geoTrustedCidrs: readonly string[];
  readonly geoNotice: string;
  readonly geoBlockedByUrl: string | undefined;

  // Stores
  readonly redisUrl: string | undefined;
  readonly marketCacheTtlMs: number;

  // Process
  readonly shutdownGraceMs: number;
  readonly logLevel: string;
  readonly workers: number;
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

function list(env: Env, name: string): string[] {
  const raw = str(env, name);
  if (raw === undefined) return [];
  return raw.split(',').map((s) => s.trim()).filter((s) => s !== '');
}

const DECIMAL = /^[0-9]+(\.[0-9]{1,18})?$/;
const COUNTRY = /^[A-Z]{2}$/;
const REGION = /^[A-Z]{2}-[A-Z0-9]{1,3}$/;

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

/**
 * Settings that each load but contradict one another in a way the operator must hear about at
 * start-up (logged as warnings, not refused: each limit keeps its CONTRACT meaning).
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
  return out;
}

/** Parses and validates every non-secret setting. Throws ConfigError on the first bad one. */
export function loadConfig(env: Env = process.env): Config {
  const blockedCountries = list(env, 'BLOCKED_COUNTRIES').map((c) => c.toUpperCase());
  for (const c of blockedCountries) {
    if (!COUNTRY.test(c)) throw new ConfigError('BLOCKED_COUNTRIES', 'ISO 3166-1 alpha-2 codes, comma-separated', c);
  }
  const blockedRegions = list(env, 'BLOCKED_REGIONS').map((c) => c.toUpperCase());
  for (const r of blockedRegions) {
    if (!REGION.test(r)) throw new ConfigError('BLOCKED_REGIONS', 'ISO 3166-2 codes like CA-ON, comma-separated', r);
  }
  const geoUnknown = (str(env, 'GEO_UNKNOWN') ?? 'block').toLowerCase();
  if (geoUnknown !== 'block' && geoUnknown !== 'allow') {
    throw new ConfigError('GEO_UNKNOWN', '"block" or "allow"', geoUnknown);
  }
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
  if (orderMaxSize !== undefined && !DECIMAL.test(orderMaxSize)) {
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
  const geoNotice = str(env, 'GEO_NOTICE') ?? DEFAULT_GEO_NOTICE;
  const replayWindowSecs = int(env, 'REPLAY_WINDOW_SECS', 300, 1, 86_400);
  const nonceTtlSecs = int(env, 'NONCE_TTL_SECS', 600, 1, 7 * 86_400);
  if (nonceTtlSecs < 2 * replayWindowSecs) {
    // A timestamp may be up to a window ahead of the clock, so a nonce must outlive 2 × window.
    throw new ConfigError('NONCE_TTL_SECS', `at least 2 × REPLAY_WINDOW_SECS (${2 * replayWindowSecs})`, String(nonceTtlSecs));
  }

  return Object.freeze({
    edgePort: port(env, 'EDGE_PORT', 8080),
    authzGrpcPort: port(env, 'AUTHZ_GRPC_PORT', 9191),
    marketPort: port(env, 'MARKET_PORT', 8081),
    authzAdminPort: port(env, 'AUTHZ_ADMIN_PORT', 9464),
    envoyAdminPort: port(env, 'ENVOY_ADMIN_PORT', 9901),
    bindAddress,
    marketBindAddress: str(env, 'MARKET_BIND_ADDRESS') ?? bindAddress,
    adminBindAddress: str(env, 'ADMIN_BIND_ADDRESS') ?? '127.0.0.1',
    authzAddress: str(env, 'AUTHZ_ADDRESS') ?? '127.0.0.1',
    marketAddress: str(env, 'MARKET_ADDRESS') ?? '127.0.0.1',

    xffNumTrustedHops: int(env, 'XFF_NUM_TRUSTED_HOPS', 0, 0, 10),
    rpsPerIp: int(env, 'RPS_PER_IP', 20, 1, 1_000_000),
    rateBurst: int(env, 'RATE_BURST', 40, 1, 10_000_000),

    replayWindowSecs,
    nonceTtlSecs,
    ingestMaxBytes: int(env, 'INGEST_MAX_BYTES', 1_048_576, 256, 64 * 1_048_576),

    orderMaxBytes: int(env, 'ORDER_MAX_BYTES', 65_536, 64, 16 * 1_048_576),
    orderMaxTtlSecs: int(env, 'ORDER_MAX_TTL_SECS', 86_400, 1, 365 * 86_400),
    orderMaxSize,
    orderPayloadMaxBytes: int(env, 'ORDER_PAYLOAD_MAX_BYTES', 32_768, 1, 12 * 1_048_576),
    orderBackend: parseBackend(env),

    geoipDb: str(env, 'GEOIP_DB') ?? DEFAULT_GEOIP_DB,
    geoipReloadIntervalMs: int(env, 'GEOIP_RELOAD_INTERVAL_MS', 2000, 50, 3_600_000),
    blockedCountries: new Set(blockedCountries),
    blockedRegions: new Set(blockedRegions),
    geoUnknown,
    geoTrustedCidrs: Object.freeze(trusted),
    geoNotice,
    geoBlockedByUrl: blockedBy,

    redisUrl,
    marketCacheTtlMs: int(env, 'MARKET_CACHE_TTL_MS', 2000, 0, 60_000),

    shutdownGraceMs: int(env, 'SHUTDOWN_GRACE_MS', 5000, 0, 120_000),
    logLevel,
    workers,
  });
}
