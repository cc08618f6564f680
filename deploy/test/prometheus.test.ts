/**
 * deploy/prometheus: the rules file passes the real `promtool check rules`, and `promtool test
 * rules` unit tests show the main alerts fire (and stay quiet) as intended; every alert uses only
 * metrics (and label values) the service really exports — read from a live registry after
 * exercising it, not from source text — every alert has a documented response in
 * docs/operations.md, and the scrape job is the one the alerts name.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import YAML from 'yaml';
import { K8S_ENV } from '../k8s/render.ts';
import { ROOT } from '../paths.ts';
import { promtool } from './tools.ts';
import { tempDir } from '../../testkit/temp-dir.ts';

interface Rule { alert: string; expr: string; labels: { severity: string }; annotations: { summary: string } }
const ALERTS = join(ROOT, 'deploy/prometheus/alerts.yaml');
const rules = (YAML.parse(readFileSync(ALERTS, 'utf8')) as { groups: { rules: Rule[] }[] }).groups.flatMap((g) => g.rules);

/** Runs `promtool <args…> <file>` on `text` written to a temporary file. */
function promtoolOn(args: readonly string[], name: string, text: string): { status: number; output: string } {
  const dir = tempDir('edge-promtool-');
  try {
    writeFileSync(join(dir, name), text);
    const r = promtool([...args, join(dir, name)], dir);
    return { status: r.status, output: r.stdout + r.stderr };
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

test('prometheus – the alert rules pass promtool check rules', () => {
  const r = promtool(['check', 'rules', ALERTS]);
  assert.equal(r.status, 0, r.stdout + r.stderr);
  assert.match(r.stdout, new RegExp(`SUCCESS: ${rules.length} rules found`));
});

test('prometheus – promtool check rules refuses a broken rule (the check fails when promtool does)', () => {
  const broken = readFileSync(ALERTS, 'utf8').replace('expr: max(edge_authz_sealed) >= 1', 'expr: max(edge_authz_sealed >= 1');
  assert.notEqual(broken, readFileSync(ALERTS, 'utf8'));
  const r = promtoolOn(['check', 'rules'], 'alerts.yaml', broken);
  assert.notEqual(r.status, 0);
  assert.match(r.output, /FAILED|error/i);
});

/** An alert as promtool test rules expects it: its labels (rule + series) and its annotations. */
function firing(alert: string, seriesLabels: Record<string, string>): { exp_labels: Record<string, string>; exp_annotations: Record<string, string> } {
  const r = rules.find((x) => x.alert === alert);
  assert.ok(r !== undefined, alert);
  return { exp_labels: { ...seriesLabels, ...r.labels }, exp_annotations: { ...r.annotations } };
}

test('prometheus – promtool test rules: the alerts fire on the conditions they describe, after their `for`, and not before or below threshold', () => {
  const tests = [
    { // a pod stops answering: pending during `for: 1m`, then firing; a healthy pod never
      interval: '1m',
      input_series: [
        { series: 'up{job="edge-authz",instance="a"}', values: '1 0x5' },
        { series: 'up{job="edge-authz",instance="b"}', values: '1x6' },
      ],
      alert_rule_test: [
        { eval_time: '1m', alertname: 'EdgeAuthzDown', exp_alerts: [] },
        { eval_time: '3m', alertname: 'EdgeAuthzDown', exp_alerts: [firing('EdgeAuthzDown', { job: 'edge-authz', instance: 'a' })] },
        { eval_time: '3m', alertname: 'EdgeMetricsAbsent', exp_alerts: [] },
      ],
    },
    { // nothing scraped as edge-authz for 10 minutes
      interval: '1m',
      input_series: [{ series: 'up{job="other",instance="x"}', values: '1x15' }],
      alert_rule_test: [
        { eval_time: '5m', alertname: 'EdgeMetricsAbsent', exp_alerts: [] },
        { eval_time: '12m', alertname: 'EdgeMetricsAbsent', exp_alerts: [firing('EdgeMetricsAbsent', { job: 'edge-authz' })] },
      ],
    },
    { // 2 % of market answers are 5xx (threshold 1 %, for 5m); 0.5 % is not
      interval: '1m',
      input_series: [
        { series: 'edge_market_requests_total{status="200",route="quotes"}', values: '0+96x20' },
        { series: 'edge_market_requests_total{status="503",route="quotes"}', values: '0+4x20' },
        { series: 'edge_market_requests_total{status="200",route="markets"}', values: '0+198x20' },
        { series: 'edge_market_requests_total{status="500",route="markets"}', values: '0+2x20' },
      ],
      alert_rule_test: [
        { eval_time: '4m', alertname: 'EdgeMarketServerErrors', exp_alerts: [] },
        { eval_time: '15m', alertname: 'EdgeMarketServerErrors', exp_alerts: [firing('EdgeMarketServerErrors', {})] },
      ],
    },
    {
      interval: '1m',
      input_series: [
        { series: 'edge_market_requests_total{status="200",route="quotes"}', values: '0+199x20' },
        { series: 'edge_market_requests_total{status="503",route="quotes"}', values: '0+1x20' },
      ],
      alert_rule_test: [{ eval_time: '15m', alertname: 'EdgeMarketServerErrors', exp_alerts: [] }],
    },
    { // ingests refused for an expired timestamp (a code with a space), 10/min for 10 minutes
      interval: '1m',
      input_series: [
        { series: 'edge_authz_decisions_total{route="ingest",outcome="deny",code="timestamp expired"}', values: '0+10x30' },
        { series: 'edge_authz_decisions_total{route="orders",outcome="deny",code="unauthorized"}', values: '0+100x30' },
      ],
      alert_rule_test: [
        { eval_time: '8m', alertname: 'EdgeIngestAuthFailures', exp_alerts: [] },
        { eval_time: '25m', alertname: 'EdgeIngestAuthFailures', exp_alerts: [firing('EdgeIngestAuthFailures', {})] },
      ],
    },
    { // the global rate limit fails open: 1.75 % of its answers (Redis errors on a, late on b; threshold 1 %, for 5m); later 0.75 % late is not
      interval: '1m',
      input_series: [
        { series: 'edge_ratelimit_decisions_total{code="ok",instance="a"}', values: '0+1000x40' },
        { series: 'edge_ratelimit_redis_errors_total{instance="a"}', values: '0+30x20 600+0x20' },
        { series: 'edge_ratelimit_late_total{instance="a"}', values: '0+0x20 0+10x20' },
        { series: 'edge_ratelimit_decisions_total{code="ok",instance="b"}', values: '0+1000x40' },
        { series: 'edge_ratelimit_late_total{instance="b"}', values: '0+5x40' },
      ],
      alert_rule_test: [
        { eval_time: '4m', alertname: 'EdgeRateLimitFailingOpen', exp_alerts: [] },
        { eval_time: '15m', alertname: 'EdgeRateLimitFailingOpen', exp_alerts: [firing('EdgeRateLimitFailingOpen', {})] },
        { eval_time: '35m', alertname: 'EdgeRateLimitFailingOpen', exp_alerts: [] },
      ],
    },
    { // one pod's GeoIP database is 46 days old (threshold 45) for over an hour
      interval: '1m',
      input_series: [
        { series: 'edge_geoip_database_age_seconds{instance="a"}', values: `${46 * 86400}x100` },
        { series: 'edge_geoip_database_age_seconds{instance="b"}', values: `${40 * 86400}x100` },
      ],
      alert_rule_test: [
        { eval_time: '30m', alertname: 'EdgeGeoipStale', exp_alerts: [] },
        { eval_time: '90m', alertname: 'EdgeGeoipStale', exp_alerts: [firing('EdgeGeoipStale', {})] },
      ],
    },
    { // a pod with AUTHZ_WORKERS=2 sealed (its primary sums the workers' gauges: 2) stays sealed; the other never is
      interval: '1m',
      input_series: [
        { series: 'edge_authz_sealed{instance="a"}', values: '0 2x10' },
        { series: 'edge_authz_sealed{instance="b"}', values: '0x10' },
      ],
      alert_rule_test: [
        { eval_time: '2m', alertname: 'EdgeSealed', exp_alerts: [] },
        { eval_time: '5m', alertname: 'EdgeSealed', exp_alerts: [firing('EdgeSealed', {})] },
      ],
    },
  ];
  const r = promtoolOn(['test', 'rules'], 'alerts.test.yaml', YAML.stringify({ rule_files: [ALERTS], evaluation_interval: '1m', tests }));
  assert.equal(r.status, 0, r.output);
});

/** Metric names in the service's exposition (authz metrics + market service, one live registry each), with their label names. */
async function exported(): Promise<Map<string, Set<string>>> {
  const { createMetrics } = await import('../../authz/src/common/metrics.ts');
  const { createMarketService } = await import('../../authz/src/market/http.ts');
  const { MemoryMarketStore } = await import('../../authz/src/market/store.ts');
  const { createLogger } = await import('../../authz/src/common/log.ts');
  const { Registry } = await import('prom-client');
  const m = createMetrics({ geoipBuildEpochSecs: () => 0 });
  const marketRegistry = new Registry();
  // Constructed, never listening: its metrics are registered at construction.
  createMarketService({
    store: new MemoryMarketStore(), feedKeys: [], ingestMaxBytes: 1024, logger: createLogger('silent'), registry: marketRegistry,
    readiness: () => ({}), isSealed: () => false, host: '127.0.0.1', port: 0,
  });
  const out = new Map<string, Set<string>>();
  for (const registry of [m.registry, marketRegistry]) {
    for (const metric of (await registry.getMetricsAsJSON()) as unknown as { name: string; type: string; values: { labels: Record<string, unknown> }[] }[]) {
      const names = metric.type === 'histogram' ? ['_bucket', '_sum', '_count'].map((s) => metric.name + s) : [metric.name];
      const labels = new Set(metric.values.flatMap((v) => Object.keys(v.labels)));
      for (const n of names) out.set(n, labels);
    }
  }
  return out;
}

test('prometheus – alert rules reference only metrics the service exports', async () => {
  const metrics = await exported();
  assert.ok(rules.length >= 8);
  for (const r of rules) {
    const used = [...r.expr.matchAll(/\b(edge_[a-z_]+)\b/g)].map((m) => m[1]!);
    for (const name of used) assert.ok(metrics.has(name), `${r.alert}: ${name} is not exported`);
    assert.match(r.labels.severity, /^(page|ticket)$/);
    assert.ok(r.annotations.summary.length > 20);
  }
});

test('prometheus – every metric the README and docs/operations.md name is exported', async () => {
  const metrics = [...(await exported()).keys()];
  // Envoy's access-log fields (edge_us, …) share the prefix; they are not metrics.
  const { ACCESS_LOG_FORMAT } = await import('../../envoy/render.ts');
  const logFields = new Set(Object.keys(ACCESS_LOG_FORMAT));
  for (const doc of ['README.md', 'docs/operations.md']) {
    const text = readFileSync(join(ROOT, doc), 'utf8');
    const named = [...text.matchAll(/`(edge_[a-z_]+)(\*?)/g)];
    assert.ok(named.length >= 5, `${doc} names metrics`);
    for (const [, name, star] of named) {
      if (logFields.has(name!)) continue;
      // A histogram is named by its base name; the exposition has its _bucket/_sum/_count.
      const ok = star === '*' ? metrics.some((m) => m.startsWith(name!)) : metrics.includes(name!) || metrics.includes(`${name!}_bucket`);
      assert.ok(ok, `${doc} names ${name}${star} but the service does not export it`);
    }
  }
});

test('prometheus – every alert has a response in docs/operations.md', () => {
  const ops = readFileSync(join(ROOT, 'docs/operations.md'), 'utf8');
  for (const r of rules) assert.ok(new RegExp(`^\\| ${r.alert} \\|`, 'm').test(ops), `${r.alert} has no row in the operations alert table`);
});

interface ScrapeJob {
  job_name: string;
  metrics_path?: string;
  relabel_configs: { source_labels?: string[]; regex?: string; action?: string; target_label?: string }[];
}
const SCRAPE = join(ROOT, 'deploy/prometheus/scrape.yaml');
const scrapeJobs = (YAML.parse(readFileSync(SCRAPE, 'utf8')) as { scrape_configs: ScrapeJob[] }).scrape_configs;

test('prometheus – the scrape jobs: edge-authz (the one the alerts name, the prometheus.io port) and edge-envoy (Envoy\'s stats listener)', () => {
  const jobs = new Set(rules.flatMap((r) => [...r.expr.matchAll(/job="([^"]+)"/g)].map((m) => m[1]!)));
  assert.deepEqual([...jobs], ['edge-authz']);
  assert.deepEqual(scrapeJobs.map((s) => s.job_name), ['edge-authz', 'edge-envoy']);
});

/**
 * The scrape config with its Kubernetes discovery swapped for file discovery: Debian's promtool
 * (2.42) is built without Kubernetes service discovery and refuses `kubernetes_sd_configs` as an
 * unknown field; everything else (paths, relabel rules and their regexes) is checked as shipped.
 */
function withFileDiscovery(text: string): string {
  const swapped = text.replaceAll('kubernetes_sd_configs:\n      - role: pod', 'file_sd_configs:\n      - files: [targets-*.json]');
  assert.equal(swapped.match(/file_sd_configs/g)?.length, scrapeJobs.length, 'every job discovered pods');
  return swapped;
}

test('prometheus – the scrape config passes the real promtool check config (Kubernetes discovery aside); a broken one does not', () => {
  const shipped = readFileSync(SCRAPE, 'utf8');
  const r = promtoolOn(['check', 'config'], 'scrape.yaml', withFileDiscovery(shipped));
  assert.equal(r.status, 0, r.output);
  assert.match(r.output, /SUCCESS/);
  for (const broken of [shipped.replace('regex: envoy-stats', 'regex: envoy-stats(['), shipped.replace('job_name: edge-envoy', 'job_name: edge-authz')]) {
    assert.notEqual(broken, shipped);
    assert.notEqual(promtoolOn(['check', 'config'], 'scrape.yaml', withFileDiscovery(broken)).status, 0);
  }
});

test('prometheus – edge-envoy scrapes /stats/prometheus on the envoy container\'s `envoy-stats` port, the one ENVOY_STATS_PORT sets (deploy/k8s)', () => {
  const job = scrapeJobs.find((s) => s.job_name === 'edge-envoy')!;
  assert.equal(job.metrics_path, '/stats/prometheus');
  const keep = (label: string): string | undefined => job.relabel_configs.find((c) => c.action === 'keep' && c.source_labels?.[0] === label)?.regex;
  assert.equal(keep('__meta_kubernetes_pod_label_app'), 'edge');
  assert.equal(keep('__meta_kubernetes_pod_container_port_name'), 'envoy-stats');
  // No address rewrite: each kept target is the pod IP and that container port.
  assert.equal(job.relabel_configs.some((c) => c.target_label === '__address__'), false);
  const deployment = YAML.parse(readFileSync(join(ROOT, 'deploy/k8s/base/deployment.yaml'), 'utf8')) as {
    spec: { template: { spec: { containers: { name: string; ports?: { name: string; containerPort: number }[] }[] } } };
  };
  const envoy = deployment.spec.template.spec.containers.find((c) => c.name === 'envoy')!;
  assert.equal(envoy.ports?.find((p) => p.name === 'envoy-stats')?.containerPort, Number(K8S_ENV['ENVOY_STATS_PORT']));
});
