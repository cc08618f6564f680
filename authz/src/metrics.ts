/**
 * Prometheus metrics (served on the loopback admin port at /metrics).
 * Label children are resolved once per (route, code) and cached: no label hashing per Check.
 */
import { Counter, Gauge, Histogram, Registry, collectDefaultMetrics } from 'prom-client';
import type { Decision } from './decision.ts';
import type { RouteKind } from './pipeline.ts';

export interface AuthzMetrics {
  readonly registry: Registry;
  /** Records one Check decision and its latency in seconds. */
  decision(route: RouteKind, d: Decision, seconds: number): void;
  redisError(op: string): void;
  geoipReload(ok: boolean): void;
  geoVerdict(verdict: string): void;
  setSealed(sealed: boolean): void;
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
  const geoVerdicts = new Counter({
    name: 'edge_geo_verdicts_total',
    help: 'Geo classifications by verdict',
    labelNames: ['verdict'] as const,
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
  const sealed = new Gauge({ name: 'edge_authz_sealed', help: '1 once the service is sealed', registers: [registry] });
  sealed.set(0);

  type Child = { inc(): void };
  type HChild = { observe(v: number): void };
  const decisionChildren = new Map<string, Child>();
  const latencyChildren = new Map<string, HChild>();
  const verdictChildren = new Map<string, Child>();
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
    geoVerdict(verdict) {
      let c = verdictChildren.get(verdict);
      if (c === undefined) {
        c = geoVerdicts.labels(verdict);
        verdictChildren.set(verdict, c);
      }
      c.inc();
    },
    setSealed: (s) => sealed.set(s ? 1 : 0),
  };
}
