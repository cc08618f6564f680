/**
 * The edge's Grafana dashboard, generated (`npm run dashboard` writes deploy/grafana/edge-dashboard.json;
 * `--check` fails when the committed file is stale). Each panel's description is the HELP text of
 * the metric it shows, read from the service's own registry (authz/src/common/metrics.ts and the
 * market service's), so a metric renamed or dropped there stops the generator; Envoy's series are
 * the ones its admin `/stats/prometheus` exports (e2e/dashboard.test.ts evaluates every query on
 * a real Prometheus scraping a real stack and requires an answer from each).
 *
 * Two scrape jobs feed it: the TS service's `/metrics` (job `edge-authz`,
 * deploy/prometheus/scrape.yaml) and Envoy's `/stats/prometheus` (docs/operations.md "Dashboard"
 * says how; Envoy's admin is loopback-only). The queries name no job: the two sets of names are
 * disjoint (`edge_*`, `envoy_*`).
 */
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { Registry } from 'prom-client';
import { ROOT } from '../paths.ts';

/** Grafana's own rate window variable; the tests substitute a fixed window for promtool and Prometheus. */
export const RATE_WINDOW = '$__rate_interval';
const W = RATE_WINDOW;

export interface Target { readonly expr: string; readonly legend: string }
export interface Panel {
  readonly title: string;
  /** The metric whose HELP becomes the panel's description (from the registry; Envoy's are written here). */
  readonly help: string;
  readonly unit: string;
  readonly targets: readonly Target[];
  readonly kind?: 'timeseries' | 'stat';
}
export interface Row { readonly title: string; readonly panels: readonly Panel[] }

/** `sum by (labels) (rate(selector[window]))`. */
const rateBy = (by: string, selector: string): string => `sum by (${by}) (rate(${selector}[${W}]))`;
const rate = (selector: string): string => `sum(rate(${selector}[${W}]))`;
const quantile = (q: number, bucket: string): string => `histogram_quantile(${q}, sum by (le) (rate(${bucket}[${W}])))`;
/** The median and the 99th percentile of a histogram (`bucket`: its `_bucket` series, with a selector if any). */
const percentiles = (bucket: string): Target[] => [
  { expr: quantile(0.5, bucket), legend: 'p50' },
  { expr: quantile(0.99, bucket), legend: 'p99' },
];
/** A panel of one service metric's rate split by the labels `by`, its HELP the description. */
const byLabels = (title: string, metric: string, by: string, legend: string, unit = 'reqps'): Panel => (
  { title, help: metric, unit, targets: [{ expr: rateBy(by, metric), legend }] }
);

/** Panels in rows; `help` names an `edge_*` metric (its HELP is looked up) or is Envoy text. */
export const ROWS: readonly Row[] = [
  {
    title: 'Requests and decisions',
    panels: [
      {
        title: 'Answers by route and status (Envoy)',
        help: 'Envoy: requests routed to the market service and the order backend by the status the client got from the route '
          + '(upstream answers and ext_authz denials; 429/413/404 Envoy answers itself are in the status-class panel). '
          + 'A failed backend connection counts here as 503 and reaches the client as 502 backend_unavailable.',
        unit: 'reqps',
        targets: [{ expr: rateBy('envoy_cluster_name, envoy_response_code', 'envoy_cluster_upstream_rq{envoy_cluster_name=~"market|order_backend"}'), legend: '{{envoy_cluster_name}} {{envoy_response_code}}' }],
      },
      {
        title: 'All answers by status class (Envoy)',
        help: 'Envoy: every answer on the client listeners (edge, ingest) by status class, including what Envoy answers itself.',
        unit: 'reqps',
        targets: [{ expr: rateBy('envoy_response_code_class', 'envoy_http_downstream_rq_xx{envoy_http_conn_manager_prefix=~"edge|ingest"}'), legend: '{{envoy_response_code_class}}xx' }],
      },
      byLabels('Decisions by route and code (authz)', 'edge_authz_decisions_total', 'route, code', '{{route}} {{code}}'),
      {
        title: '451 restricted_jurisdiction by route',
        help: 'edge_authz_decisions_total',
        unit: 'reqps',
        targets: [
          { expr: rateBy('route', 'edge_authz_decisions_total{code="restricted_jurisdiction"}'), legend: '{{route}}' },
          { expr: rate('edge_anonymizer_denials_total'), legend: 'of which the anonymizer rule' },
        ],
      },
      {
        title: '429 too many requests',
        help: 'Envoy: requests the per-replica local limit refused (http_local_rate_limit.rate_limited); authz: 429 decisions (the '
          + 'global limit taken in Check, an ingest over its pending-body bound); RateLimitService over_limit answers (RATELIMIT_SERVICE_ADDRESS).',
        unit: 'reqps',
        targets: [
          { expr: rate('envoy_http_local_rate_limit_rate_limited'), legend: 'Envoy local limit' },
          { expr: rate('edge_authz_decisions_total{code="too many requests"}'), legend: 'authz (global limit, pending bodies)' },
          { expr: rate('edge_ratelimit_decisions_total{code="over_limit"}'), legend: 'RateLimitService over_limit' },
        ],
      },
    ],
  },
  {
    title: 'Latency',
    panels: [
      {
        title: 'Check latency p50 / p99 (authz)',
        help: 'edge_authz_check_duration_seconds',
        unit: 's',
        targets: percentiles('edge_authz_check_duration_seconds_bucket'),
      },
      {
        title: 'Check round trip p50 / p99 (Envoy → authz)',
        help: 'Envoy: time from sending the Check to its answer (cluster authz upstream_rq_time), gRPC and socket included.',
        unit: 'ms',
        targets: percentiles('envoy_cluster_upstream_rq_time_bucket{envoy_cluster_name="authz"}'),
      },
    ],
  },
  {
    title: 'Dependencies',
    panels: [
      byLabels('Redis errors by operation', 'edge_redis_errors_total', 'op', '{{op}}', 'ops'),
      {
        title: 'Global rate limit failing open',
        help: 'edge_ratelimit_decisions_total',
        unit: 'reqps',
        targets: [
          { expr: rate('edge_ratelimit_decisions_total{code="fail_open"}'), legend: 'fail_open answers' },
          { expr: rate('edge_ratelimit_redis_errors_total'), legend: 'buckets Redis could not take' },
          { expr: rate('edge_ratelimit_late_total'), legend: "answers after Envoy's deadline" },
        ],
      },
      {
        title: 'Order backend 502 / 504',
        help: 'Envoy: orders the backend did not get (connection or TLS failure, counted as 503 on the cluster and answered 502 '
          + 'backend_unavailable) and orders whose outcome is unknown (no answer within ORDER_BACKEND_TIMEOUT_MS: 504 backend_timeout).',
        unit: 'reqps',
        targets: [
          { expr: rate('envoy_cluster_upstream_rq{envoy_cluster_name="order_backend",envoy_response_code=~"502|503"}'), legend: '502 backend_unavailable' },
          { expr: rate('envoy_cluster_upstream_rq{envoy_cluster_name="order_backend",envoy_response_code="504"}'), legend: '504 backend_timeout' },
        ],
      },
    ],
  },
  {
    title: 'Geo',
    panels: [
      {
        title: 'GeoIP database age',
        help: 'edge_geoip_database_age_seconds',
        unit: 's',
        kind: 'stat',
        targets: [{ expr: 'max(edge_geoip_database_age_seconds)', legend: 'oldest' }],
      },
      {
        title: 'GeoIP reloads (per hour)',
        help: 'edge_geoip_reloads_total',
        unit: 'short',
        targets: [
          { expr: 'sum by (result) (increase(edge_geoip_reloads_total[1h]))', legend: 'GEOIP_DB {{result}}' },
          { expr: 'sum by (result) (increase(edge_geoip_secondary_reloads_total[1h]))', legend: 'GEOIP_DB_SECONDARY {{result}}' },
        ],
      },
      byLabels('Geo verdicts', 'edge_geo_verdicts_total', 'verdict', '{{verdict}}'),
      byLabels('Shadow policy disagreements', 'edge_geo_shadow_disagreements_total', 'enforced, shadow', '{{enforced}} → {{shadow}}'),
      {
        title: 'Sealed instances',
        help: 'edge_authz_sealed',
        unit: 'short',
        kind: 'stat',
        targets: [{ expr: 'sum(edge_authz_sealed)', legend: 'sealed' }],
      },
    ],
  },
];

/** Every target of every panel, in order. */
export function allTargets(): { panel: string; target: Target }[] {
  return ROWS.flatMap((r) => r.panels.flatMap((p) => p.targets.map((target) => ({ panel: p.title, target }))));
}

/** HELP text of every metric the service registers (authz metrics and the market service's). */
export async function registryHelp(): Promise<Map<string, string>> {
  const { createMetrics } = await import('../../authz/src/common/metrics.ts');
  const { createMarketService } = await import('../../authz/src/market/http.ts');
  const { MemoryMarketStore } = await import('../../authz/src/market/store.ts');
  const { createLogger } = await import('../../authz/src/common/log.ts');
  const market = new Registry();
  // Constructed, never listening: its metrics are registered at construction.
  createMarketService({
    store: new MemoryMarketStore(), feedKeys: [], ingestMaxBytes: 1024, logger: createLogger('silent'), registry: market,
    readiness: () => ({}), isSealed: () => false, host: '127.0.0.1', port: 0,
  });
  const out = new Map<string, string>();
  for (const registry of [createMetrics({ geoipBuildEpochSecs: () => 0, defaultMetrics: false }).registry, market]) {
    for (const m of await registry.getMetricsAsJSON()) out.set(m.name, m.help);
  }
  return out;
}

const GRID_WIDTH = 24;
const PANEL = { w: 12, h: 8 } as const;
const DATASOURCE = { type: 'prometheus', uid: '${datasource}' } as const;

/** The dashboard as Grafana's JSON model (schemaVersion 39: Grafana 10.4 and later import it). */
export async function buildDashboard(): Promise<Record<string, unknown>> {
  const help = await registryHelp();
  const describe = (p: Panel): string => {
    if (!p.help.startsWith('edge_')) return p.help;
    const h = help.get(p.help);
    if (h === undefined) throw new Error(`panel "${p.title}": ${p.help} is not a metric the service registers`);
    return `${p.help}: ${h}`;
  };
  for (const { panel, target } of allTargets()) {
    for (const [name] of target.expr.matchAll(/\bedge_[a-z_]+/g)) {
      const base = name.replace(/_(bucket|sum|count)$/, '');
      if (!help.has(name) && !help.has(base)) throw new Error(`panel "${panel}": ${name} is not a metric the service registers`);
    }
  }
  const panels: Record<string, unknown>[] = [];
  let id = 1;
  let y = 0;
  for (const row of ROWS) {
    panels.push({ id: id++, type: 'row', title: row.title, collapsed: false, gridPos: { x: 0, y, w: GRID_WIDTH, h: 1 }, panels: [] });
    y += 1;
    row.panels.forEach((p, i) => {
      const x = (i * PANEL.w) % GRID_WIDTH;
      if (i > 0 && x === 0) y += PANEL.h;
      panels.push({
        id: id++,
        type: p.kind ?? 'timeseries',
        title: p.title,
        description: describe(p),
        datasource: DATASOURCE,
        gridPos: { x, y, ...PANEL },
        fieldConfig: { defaults: { unit: p.unit }, overrides: [] },
        options: p.kind === 'stat' ? { reduceOptions: { calcs: ['lastNotNull'] } } : { legend: { displayMode: 'table', placement: 'bottom', calcs: ['max', 'lastNotNull'] } },
        targets: p.targets.map((t, k) => ({ refId: String.fromCharCode(65 + k), datasource: DATASOURCE, expr: t.expr, legendFormat: t.legend })),
      });
    });
    y += PANEL.h;
  }
  return {
    uid: 'edge-trading-proxy',
    title: 'Edge trading proxy',
    description: 'Generated by deploy/grafana/dashboard.ts (npm run dashboard) — do not edit; docs/operations.md "Dashboard".',
    tags: ['edge', 'envoy', 'ext_authz'],
    timezone: 'utc',
    schemaVersion: 39,
    version: 1,
    editable: false,
    refresh: '30s',
    time: { from: 'now-6h', to: 'now' },
    templating: { list: [{ name: 'datasource', label: 'Prometheus', type: 'datasource', query: 'prometheus', current: {}, hide: 0 }] },
    annotations: { list: [] },
    panels,
  };
}

export const DASHBOARD_FILE = join(ROOT, 'deploy/grafana/edge-dashboard.json');

/** The file's text: the JSON model, two-space indented, with a final newline. */
export async function dashboardText(): Promise<string> {
  return `${JSON.stringify(await buildDashboard(), null, 2)}\n`;
}

if (import.meta.main) {
  const text = await dashboardText();
  if (process.argv.includes('--check')) {
    if (readFileSync(DASHBOARD_FILE, 'utf8') !== text) {
      process.stderr.write(`stale: ${DASHBOARD_FILE}\nrun: npm run dashboard\n`);
      process.exit(1);
    }
  } else {
    writeFileSync(DASHBOARD_FILE, text);
    process.stdout.write(`wrote ${DASHBOARD_FILE}\n`);
  }
}
