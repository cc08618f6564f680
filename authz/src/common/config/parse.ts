/**
 * Per-setting parsers: each reads one setting (or one block of settings that only mean something
 * together) from the environment, validates it, and throws a ConfigError naming the variable and
 * what was expected. load.ts calls them to assemble the Config.
 */
import { isIP } from 'node:net';
import { RE } from '../rules.ts';
import { ANONYMIZER_FLAGS, type AnonymizerFlag } from '../ports.ts';
import { socketPathProblem } from '../unix-socket.ts';
import {
  ANONYMIZER_ROUTES, CLIENT_AUTH_MODES, ConfigError, DEFAULT_ANONYMIZER_FLAGS, DEFAULT_ANONYMIZER_POLICY, DEFAULT_OTEL_SERVICE_NAME, GEO_POLICY_SETTINGS,
  LOG_DECISIONS, OTEL_SAMPLERS, PROXY_PROTOCOL_MODES, SHADOW_SETTINGS, type OtelSampler, type TracingConfig,
  type AnonymizerConfig, type AnonymizerRoute, type ClientAuth, type EdgeTlsConfig, type Env, type GeoRegionUnknown, type GeoUnknown,
  type LogDecisions, type OrderBackendConfig, type ProxyProtocol, type TierPolicy,
} from './types.ts';

export function str(env: Env, name: string): string | undefined {
  const v = env[name];
  return v === undefined || v.trim() === '' ? undefined : v.trim();
}

export function int(env: Env, name: string, def: number, min: number, max: number): number {
  const raw = str(env, name);
  if (raw === undefined) return def;
  if (!/^-?[0-9]+$/.test(raw)) throw new ConfigError(name, `an integer in [${min}, ${max}]`, raw);
  const n = Number(raw);
  if (!Number.isSafeInteger(n) || n < min || n > max) {
    throw new ConfigError(name, `an integer in [${min}, ${max}]`, raw);
  }
  return n;
}

export function port(env: Env, name: string, def: number): number {
  return int(env, name, def, 0, 65535);
}

export function list(env: Env, name: string): string[] {
  const raw = str(env, name);
  if (raw === undefined) return [];
  return raw.split(',').map((s) => s.trim()).filter((s) => s !== '');
}

/** GEO_POLICY_FILE, refused beside any of the settings it replaces (an empty value counts as unset, but not for SHADOW_*). */
export function geoPolicyFileSetting(env: Env): string | undefined {
  const file = str(env, 'GEO_POLICY_FILE');
  if (file === undefined) return undefined;
  const also = GEO_POLICY_SETTINGS.filter((n) => env[n] !== undefined && (n.startsWith('SHADOW_') || str(env, n) !== undefined));
  if (also.length > 0) {
    throw new ConfigError('GEO_POLICY_FILE', `no ${also.join(', ')} beside it (the file holds the whole geo policy; those settings are its simple form: use one or the other)`, file);
  }
  return file;
}

export function isLogDecisions(v: string): v is LogDecisions {
  return (LOG_DECISIONS as readonly string[]).includes(v);
}

/**
 * The TLS block (EDGE_TLS_CERT_FILE, EDGE_TLS_KEY_FILE, EDGE_TLS_CLIENT_CA_FILE,
 * EDGE_TLS_CLIENT_AUTH) and EDGE_PROXY_PROTOCOL. Every name is read whatever is set, so each is
 * a known setting; a combination that cannot mean one thing is refused.
 */
export function edgeTlsSettings(env: Env, xffNumTrustedHops: number): { tls: EdgeTlsConfig | undefined; proxyProtocol: ProxyProtocol } {
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

/**
 * AUTHZ_GRPC_SOCKET / MARKET_SOCKET: an absolute path (unix-socket.ts), or `off` (TCP: the same as
 * unset, for npm start, which otherwise picks a socket in its run directory). With a socket the
 * matching *_ADDRESS setting has nothing to say and is refused rather than ignored.
 */
export function socketSetting(env: Env, name: string, addressName: string): string | undefined {
  const raw = str(env, name);
  if (raw === undefined || raw.toLowerCase() === 'off') return undefined;
  const problem = socketPathProblem(raw);
  if (problem !== undefined) throw new ConfigError(name, `${problem}, or "off" for TCP`, raw);
  const address = str(env, addressName);
  if (address !== undefined) throw new ConfigError(addressName, `unset with ${name} (Envoy reaches the service on the socket, not at an address)`, address);
  return raw;
}


/**
 * INGEST_PORT and INGEST_BIND_ADDRESS (both read whatever is set, so each is a known setting):
 * a port of its own, unlike every other listening port; an IP literal to bind, only with the port.
 */
export function ingestListener(env: Env, taken: Readonly<Record<string, number>>): { port: number | undefined; bindAddress: string } {
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

/** An upper-cased list of ISO 3166-1 alpha-2 codes (BLOCKED_COUNTRIES, CLOSE_ONLY_COUNTRIES). */
export function countries(env: Env, name: string): string[] {
  const out = list(env, name).map((c) => c.toUpperCase());
  for (const c of out) if (!RE.country.test(c)) throw new ConfigError(name, 'ISO 3166-1 alpha-2 codes, comma-separated', c);
  return out;
}

/** An upper-cased list of ISO 3166-2 codes (BLOCKED_REGIONS, CLOSE_ONLY_REGIONS). */
export function regions(env: Env, name: string): string[] {
  const out = list(env, name).map((c) => c.toUpperCase());
  for (const r of out) if (!RE.region.test(r)) throw new ConfigError(name, 'ISO 3166-2 codes like CA-ON, comma-separated', r);
  return out;
}

/** A code listed in both tiers is refused: which one was meant cannot be guessed. */
export function oneTier(closeOnlyName: string, closeOnly: readonly string[], blockedName: string, blocked: readonly string[]): void {
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
export function shadowPolicy(env: Env, enforced: TierPolicy): TierPolicy | undefined {
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

export function geoRegionUnknownSetting(env: Env, name: string, def: GeoRegionUnknown = 'strictest'): GeoRegionUnknown {
  const v = (str(env, name) ?? def).toLowerCase();
  if (v !== 'strictest' && v !== 'country') throw new ConfigError(name, '"strictest" or "country"', v);
  return v;
}

export function geoUnknownSetting(env: Env, name: string, def: GeoUnknown = 'block'): GeoUnknown {
  const v = (str(env, name) ?? def).toLowerCase();
  if (v !== 'block' && v !== 'close-only' && v !== 'allow') throw new ConfigError(name, '"block", "close-only" or "allow"', v);
  return v;
}

export function parseBackend(env: Env): OrderBackendConfig | undefined {
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
export function hostPort(env: Env, name: string): { host: string; port: number } | undefined {
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
export function rateLimitScope(env: Env, redisUrl: string | undefined, service: { host: string; port: number } | undefined): 'global' | 'local' {
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

export function anonymizerSettings(env: Env): AnonymizerConfig | undefined {
  // All three are read whatever is set, so each is a known setting name.
  const db = str(env, 'ANONYMIZER_DB');
  const flagsRaw = str(env, 'ANONYMIZER_FLAGS');
  const policyRaw = str(env, 'ANONYMIZER_POLICY');
  const confidenceRaw = str(env, 'ANONYMIZER_MIN_CONFIDENCE');
  if (db === undefined) {
    if (flagsRaw !== undefined) throw new ConfigError('ANONYMIZER_FLAGS', 'to be set only with ANONYMIZER_DB (there is no anonymizer database to apply them to)', flagsRaw);
    if (policyRaw !== undefined) throw new ConfigError('ANONYMIZER_POLICY', 'to be set only with ANONYMIZER_DB (there is no anonymizer database to apply it to)', policyRaw);
    if (confidenceRaw !== undefined) throw new ConfigError('ANONYMIZER_MIN_CONFIDENCE', 'to be set only with ANONYMIZER_DB (there is no anonymizer database to apply it to)', confidenceRaw);
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

/** ENVOY_STATS_PORT: unset (no stats listener), or a port no other Envoy listener uses. */
export function statsPort(env: Env, taken: Readonly<Record<string, number | undefined>>): number | undefined {
  const raw = str(env, 'ENVOY_STATS_PORT');
  if (raw === undefined) return undefined;
  const p = int(env, 'ENVOY_STATS_PORT', 0, 1, 65535);
  for (const [name, other] of Object.entries(taken)) {
    if (other === p) throw new ConfigError('ENVOY_STATS_PORT', `a port other than ${name} (${other})`, raw);
  }
  return p;
}

/** The settings that only mean something with OTEL_EXPORTER_OTLP_ENDPOINT. */
const OTEL_DEPENDENT = ['OTEL_EXPORTER_OTLP_PROTOCOL', 'OTEL_TRACES_SAMPLER', 'OTEL_TRACES_SAMPLER_ARG', 'OTEL_SERVICE_NAME'] as const;

/**
 * Traces: OTEL_EXPORTER_OTLP_ENDPOINT (`http://host:port`, OTLP over gRPC: what Envoy's tracer
 * speaks natively), OTEL_EXPORTER_OTLP_PROTOCOL (only `grpc`), OTEL_TRACES_SAMPLER(_ARG) and
 * OTEL_SERVICE_NAME, as the OpenTelemetry specification defines them. Every name is read
 * whatever is set; without the endpoint the others are refused (they would do nothing).
 */
export function tracingSettings(env: Env): TracingConfig | undefined {
  const raw = str(env, 'OTEL_EXPORTER_OTLP_ENDPOINT');
  const given = Object.fromEntries(OTEL_DEPENDENT.map((n) => [n, str(env, n)])) as Record<(typeof OTEL_DEPENDENT)[number], string | undefined>;
  if (raw === undefined) {
    for (const [name, v] of Object.entries(given)) {
      if (v !== undefined) throw new ConfigError(name, 'to be set only with OTEL_EXPORTER_OTLP_ENDPOINT (without it nothing is traced)', v);
    }
    return undefined;
  }
  const expected = 'http://host:port of an OTLP/gRPC receiver (e.g. http://127.0.0.1:4317; no path; TLS to the collector is not supported: run it beside the edge)';
  // Scheme, host and an explicit port only (`http://collector:80` too, which URL would elide).
  const m = /^http:\/\/(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9.-]+):([0-9]{1,5})\/?$/.exec(raw);
  const port = Number(m?.[2]);
  const host = (m?.[1] ?? '').replace(/^\[(.*)\]$/, '$1');
  if (m === null || port < 1 || port > 65535 || (m[1]!.startsWith('[') && isIP(host) !== 6)) {
    throw new ConfigError('OTEL_EXPORTER_OTLP_ENDPOINT', expected, raw);
  }
  const protocol = given.OTEL_EXPORTER_OTLP_PROTOCOL?.toLowerCase();
  if (protocol !== undefined && protocol !== 'grpc') {
    throw new ConfigError('OTEL_EXPORTER_OTLP_PROTOCOL', '"grpc" (Envoy\'s tracer and the service both export OTLP over gRPC), or unset', protocol);
  }
  const sampler = (given.OTEL_TRACES_SAMPLER?.toLowerCase() ?? 'parentbased_always_on') as OtelSampler;
  if (!(OTEL_SAMPLERS as readonly string[]).includes(sampler)) throw new ConfigError('OTEL_TRACES_SAMPLER', OTEL_SAMPLERS.join('|'), sampler);
  const arg = given.OTEL_TRACES_SAMPLER_ARG;
  const ratioSampler = sampler.endsWith('traceidratio');
  if (arg !== undefined && !ratioSampler) {
    throw new ConfigError('OTEL_TRACES_SAMPLER_ARG', 'to be set only with OTEL_TRACES_SAMPLER=traceidratio or parentbased_traceidratio (the other samplers take no argument)', arg);
  }
  if (arg !== undefined && !(/^(0|1|0?\.[0-9]+|1\.0*|0\.)$/.test(arg) && Number(arg) <= 1)) {
    throw new ConfigError('OTEL_TRACES_SAMPLER_ARG', 'a number from 0 to 1 (the fraction of new traces sampled, e.g. 0.01)', arg);
  }
  const ratio = ratioSampler ? (arg === undefined ? 1 : Number(arg)) : sampler.endsWith('always_off') ? 0 : 1;
  const serviceName = given.OTEL_SERVICE_NAME ?? DEFAULT_OTEL_SERVICE_NAME;
  if (!/^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$/.test(serviceName)) {
    throw new ConfigError('OTEL_SERVICE_NAME', 'a name of letters, digits, ".", "_" and "-", at most 63 characters (Envoy\'s spans get "<it>-envoy")', serviceName);
  }
  return Object.freeze({ endpoint: raw, host, port, sampler, ratio, serviceName });
}
