/**
 * Prometheus metrics (served on the loopback admin port at /metrics).
 * Label children are resolved once per (route, code) and cached: no label hashing per Check.
 *
 * Every labelled series whose label values are known at start is exported at 0 from the first
 * scrape (the tables below), so a dashboard or an alert tells "none yet" from "not exported"
 * (`rate()` and `increase()` need the series before its first increment to count it). Series
 * outside the tables are still counted, created on first use.
 */
import { Counter, Gauge, Histogram, Registry, collectDefaultMetrics } from 'prom-client';
import { policyMetrics } from './geo-policy-metrics.ts';
import { ACCESS_RANK, type Access } from './contract.ts';
import { API_ROUTES, KINDS, ROUTE_KINDS, UNKNOWN_ROUTE, type RouteRegistry } from './routes.ts';
import type { Decision } from '../authz/decision.ts';
import type { ErrorCode } from './errors.ts';
import type { RouteLabel } from '../authz/pipeline.ts';
import type { GeoResult, GeoVerdict } from '../authz/stages/geo.ts';

type DecisionCode = ErrorCode | 'ok';
/** What any route can be answered: allowed, sealed, geo-blocked, a dependency down / internal error. */
const EVERY_ROUTE: readonly DecisionCode[] = ['ok', 'sealed', 'restricted_jurisdiction', 'service_unavailable'];
/** The decision codes each route can produce (pipeline.ts, stages/). */
export const DECISION_CODES: Readonly<Record<RouteLabel, readonly DecisionCode[]>> = {
  read: EVERY_ROUTE,
  // The header phases: the global rate limit (when the Check takes it) and, for an ingest, the pending-body bound answer 429 there.
  ingest_headers: [...EVERY_ROUTE, 'unauthorized', 'timestamp expired', 'too many requests'],
  order_headers: [...EVERY_ROUTE, 'too many requests'],
  ingest: [...EVERY_ROUTE, 'unauthorized', 'timestamp expired', 'ingest_replay', 'invalid_json', 'invalid_envelope', 'invalid_content_signature', 'payload_too_large'],
  order: [...EVERY_ROUTE, 'invalid_json', 'invalid_order', 'unknown_market', 'market_closed', 'deadline_expired', 'deadline_too_far', 'invalid_size', 'payload_too_large'],
  // No geo on the geoblock route: only the seal (and an internal error) refuse it.
  geoblock: ['ok', 'sealed', 'service_unavailable'],
  // A route value from Envoy the registry does not know (a configuration error): always denied.
  [UNKNOWN_ROUTE]: ['service_unavailable'],
};
/** Every GeoVerdict (the compiler checks the list is complete). */
export const GEO_VERDICTS = Object.keys({
  trusted: 0, allowed: 0, blocked_country: 0, blocked_region: 0, close_only_country: 0, close_only_region: 0,
  unknown_blocked: 0, unknown_close_only: 0, unknown_allowed: 0, unknown_region: 0,
} satisfies Record<GeoVerdict, 0>) as GeoVerdict[];
export const GEOIP_RELOAD_RESULTS = ['ok', 'failed'] as const;
/** The tiers, as the shadow-disagreement metric labels them (enforced × shadow, the 6 unequal pairs). */
export const ACCESS_TIERS = Object.keys(ACCESS_RANK) as readonly Access[];
/** The Redis operations the authorization core counts failures of (authz.ts). */
/** `nonce_replica_wait`: the nonce was written but no replica confirmed it in time (REDIS_MIN_REPLICAS). */
export const REDIS_OPS = ['nonce_set', 'nonce_replica_wait', 'market_get'] as const;
/**
 * The market service's answers by route (its `route` label: the path of a registry route it
 * serves, `other` for the rest) and status (routes.ts `marketStatuses`).
 */
export function marketRequestStatuses(registry: RouteRegistry): Readonly<Record<string, readonly number[]>> {
  return Object.freeze({
    ...Object.fromEntries(registry.flatMap((r) => (r.upstream === 'market' ? [[r.path, r.marketStatuses]] : []))),
    other: [404],
  });
}
export const MARKET_REQUEST_STATUSES = marketRequestStatuses(API_ROUTES);
/**
 * The global rate limit's answers, one per ShouldRateLimit (ratelimit/service.ts): `fail_open` =
 * Redis did not answer, so the request was let through to Envoy's local limit.
 */
export const RATE_LIMIT_CODES = ['ok', 'over_limit', 'fail_open'] as const;
export type RateLimitCode = (typeof RATE_LIMIT_CODES)[number];
/** Ingest outcomes at the market service (market/http.ts). */
export const MARKET_INGEST_OUTCOMES = ['stored', 'stale', 'store_error', 'outcome_unknown'] as const;

/** Creates each listed series of `counter` at 0. */
export function zeroSeries(counter: Counter<string>, series: Iterable<readonly string[]>): void {
  for (const labels of series) counter.labels(...labels).inc(0);
}

export interface AuthzMetrics {
  readonly registry: Registry;
  /** Records one Check decision and its latency in seconds. */
  decision(route: RouteLabel, d: Decision, seconds: number): void;
  redisError(op: string): void;
  geoipReload(ok: boolean): void;
  /** One ANONYMIZER_DB reload attempt. */
  anonymizerReload(ok: boolean): void;
  /** One request refused by the anonymizer rule (ANONYMIZER_POLICY), by route. */
  anonymizerDenied(route: RouteLabel): void;
  /** Counts one enforced classification by its verdict (a fixed set: GEO_VERDICTS). */
  geoVerdict(geo: GeoResult): void;
  /** One GEOIP_DB_SECONDARY reload attempt. */
  geoipSecondaryReload(ok: boolean): void;
  /**
   * One request whose address GEOIP_DB and GEOIP_DB_SECONDARY give different countries, by the pair
   * (each a country a rule names, `other`, or `none`: a bounded label set; core.ts geoDbPairLabel).
   */
  geoipDisagreement(primary: string, secondary: string): void;
  /** One request the shadow policy (SHADOW_*) would have put in another tier. */
  shadowDisagreement(enforced: Access, shadow: Access): void;
  setSealed(sealed: boolean): void;
  /** One global rate limit answer (RateLimitService/ShouldRateLimit). */
  rateLimit(code: RateLimitCode): void;
  /** A rate limit bucket Redis could not take (the request was answered OK: fail open). */
  rateLimitRedisError(): void;
  /** A rate limit answer ready after Envoy's deadline (Envoy had already failed open). */
  rateLimitLate(): void;
  /** One bucket script call to Redis (a batch of one-token takes, or one take of several tokens). */
  rateLimitRedisCall(): void;
}

export function createMetrics(opts: { geoipBuildEpochSecs: () => number; defaultMetrics?: boolean }): AuthzMetrics {
  const registry = new Registry();
  if (opts.defaultMetrics !== false) collectDefaultMetrics({ register: registry, prefix: 'edge_authz_' });
  const decisions = new Counter({
    name: 'edge_authz_decisions_total',
    help: 'ext_authz Check decisions by route, outcome and code',
    labelNames: ['route', 'outcome', 'code'] as const,
    registers: [registry],
  });
  const latency = new Histogram({
    name: 'edge_authz_check_duration_seconds',
    help: 'Time from Check arrival to decision, by route',
    labelNames: ['route'] as const,
    buckets: [0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25],
    registers: [registry],
  });
  const redisErrors = new Counter({
    name: 'edge_redis_errors_total',
    help: 'Redis operations that failed (the request was denied 503)',
    labelNames: ['op'] as const,
    registers: [registry],
  });
  const geoReloads = new Counter({
    name: 'edge_geoip_reloads_total',
    help: 'GeoIP database reload attempts by result (failed = corrupt file refused, old database kept)',
    labelNames: ['result'] as const,
    registers: [registry],
  });
  const anonymizerReloads = new Counter({
    name: 'edge_anonymizer_reloads_total',
    help: 'Anonymizer database (ANONYMIZER_DB) reload attempts by result (failed = corrupt file refused, old database kept)',
    labelNames: ['result'] as const,
    registers: [registry],
  });
  const anonymizerDenials = new Counter({
    name: 'edge_anonymizer_denials_total',
    help: 'Requests refused 451 by the anonymizer rule (ANONYMIZER_POLICY), by route; the client saw the uniform geo notice',
    labelNames: ['route'] as const,
    registers: [registry],
  });
  const geoVerdicts = new Counter({
    name: 'edge_geo_verdicts_total',
    help: 'Geo classifications by verdict',
    labelNames: ['verdict'] as const,
    registers: [registry],
  });
  const geoSecondaryReloads = new Counter({
    name: 'edge_geoip_secondary_reloads_total',
    help: 'Secondary GeoIP database (GEOIP_DB_SECONDARY) reload attempts by result (failed = corrupt or refused file, old database kept)',
    labelNames: ['result'] as const,
    registers: [registry],
  });
  const geoDisagreements = new Counter({
    name: 'edge_geoip_disagreements_total',
    help: 'Requests whose address GEOIP_DB and GEOIP_DB_SECONDARY place in different countries, by both (a country a rule names, other, or none); the stricter tier was applied',
    labelNames: ['primary', 'secondary'] as const,
    registers: [registry],
  });
  const shadowDisagreements = new Counter({
    name: 'edge_geo_shadow_disagreements_total',
    help: 'Requests the shadow geo policy (SHADOW_*) would have put in another tier than the enforced one, by both tiers (never enforced)',
    labelNames: ['enforced', 'shadow'] as const,
    registers: [registry],
  });
  new Gauge({
    name: 'edge_geoip_database_age_seconds',
    help: 'Seconds since the loaded GeoIP database was built',
    registers: [registry],
    collect() {
      this.set(Math.max(0, Math.floor(Date.now() / 1000) - opts.geoipBuildEpochSecs()));
    },
  });
  const rateLimits = new Counter({
    name: 'edge_ratelimit_decisions_total',
    help: 'Global rate limit answers (RateLimitService) by code: ok, over_limit, fail_open (Redis unavailable: left to the local limit)',
    labelNames: ['code'] as const,
    registers: [registry],
  });
  const rateLimitRedisErrors = new Counter({
    name: 'edge_ratelimit_redis_errors_total',
    help: 'Global rate limit buckets Redis could not take; each request concerned was answered OK (fail open to the local limit)',
    registers: [registry],
  });
  const rateLimitLate = new Counter({
    name: 'edge_ratelimit_late_total',
    help: "Global rate limit answers ready after Envoy's deadline (Envoy had already let the request through on its local limit)",
    registers: [registry],
  });
  const rateLimitRedisCalls = new Counter({
    name: 'edge_ratelimit_redis_calls_total',
    help: 'Global rate limit script calls to Redis; one call takes the buckets of every request that waited for it (decisions / calls = requests per round trip)',
    registers: [registry],
  });
  const sealed = new Gauge({ name: 'edge_authz_sealed', help: '1 once the service is sealed', registers: [registry] });
  policyMetrics(registry);
  sealed.set(0);
  zeroSeries(decisions, Object.entries(DECISION_CODES).flatMap(([route, codes]) => codes.map((c) => [route, c === 'ok' ? 'allow' : 'deny', c])));
  zeroSeries(redisErrors, REDIS_OPS.map((op) => [op]));
  zeroSeries(geoReloads, GEOIP_RELOAD_RESULTS.map((r) => [r]));
  zeroSeries(geoSecondaryReloads, GEOIP_RELOAD_RESULTS.map((r) => [r]));
  zeroSeries(geoVerdicts, GEO_VERDICTS.map((v) => [v]));
  zeroSeries(anonymizerReloads, GEOIP_RELOAD_RESULTS.map((r) => [r]));
  // The labels of the kinds ANONYMIZER_POLICY can refuse, header phases included (routes.ts KINDS).
  zeroSeries(anonymizerDenials, ROUTE_KINDS.filter((k) => KINDS[k].anonymizer !== undefined).flatMap((k) => [k, KINDS[k].headerLabel ?? []].flat().map((r) => [r])));
  zeroSeries(shadowDisagreements, ACCESS_TIERS.flatMap((e) => ACCESS_TIERS.filter((x) => x !== e).map((x) => [e, x])));
  zeroSeries(rateLimits, RATE_LIMIT_CODES.map((c) => [c]));
  const rateLimitChildren = Object.fromEntries(RATE_LIMIT_CODES.map((c) => [c, rateLimits.labels(c)])) as Record<RateLimitCode, { inc(): void }>;

  type Child = { inc(): void };
  type HChild = { observe(v: number): void };
  const decisionChildren = new Map<string, Child>();
  const latencyChildren = new Map<string, HChild>();
  const verdictChildren = new Map<string, Child>();
  const disagreementChildren = new Map<string, Child>();
  return {
    registry,
    decision(route, d, seconds) {
      const key = `${route}|${d.code}`;
      let c = decisionChildren.get(key);
      if (c === undefined) {
        c = decisions.labels(route, d.allow ? 'allow' : 'deny', d.code);
        decisionChildren.set(key, c);
      }
      c.inc();
      let h = latencyChildren.get(route);
      if (h === undefined) {
        h = latency.labels(route);
        latencyChildren.set(route, h);
      }
      h.observe(seconds);
    },
    redisError: (op) => redisErrors.labels(op).inc(),
    geoipReload: (ok) => geoReloads.labels(ok ? 'ok' : 'failed').inc(),
    anonymizerReload: (ok) => anonymizerReloads.labels(ok ? 'ok' : 'failed').inc(),
    anonymizerDenied: (route) => anonymizerDenials.labels(route).inc(),
    geoVerdict({ verdict }) {
      let c = verdictChildren.get(verdict);
      if (c === undefined) {
        c = geoVerdicts.labels(verdict);
        verdictChildren.set(verdict, c);
      }
      c.inc();
    },
    geoipSecondaryReload: (ok) => geoSecondaryReloads.labels(ok ? 'ok' : 'failed').inc(),
    geoipDisagreement(primary, secondary) {
      const key = `${primary}|${secondary}`;
      let c = disagreementChildren.get(key);
      if (c === undefined) {
        c = geoDisagreements.labels(primary, secondary);
        disagreementChildren.set(key, c);
      }
      c.inc();
    },
    shadowDisagreement: (enforced, shadow) => shadowDisagreements.labels(enforced, shadow).inc(),
    setSealed: (s) => sealed.set(s ? 1 : 0),
    rateLimit: (code) => rateLimitChildren[code].inc(),
    rateLimitRedisError: () => rateLimitRedisErrors.inc(),
    rateLimitLate: () => rateLimitLate.inc(),
    rateLimitRedisCall: () => rateLimitRedisCalls.inc(),
  };
}
