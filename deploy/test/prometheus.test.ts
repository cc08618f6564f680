/**
 * deploy/prometheus: every alert uses only metrics (and label values) the service really
 * exports — read from a live registry after exercising it, not from source text — every alert
 * has a documented response in docs/operations.md, and the scrape job is the one the alerts name.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import YAML from 'yaml';
import { ROOT } from '../image.ts';

interface Rule { alert: string; expr: string; labels: { severity: string }; annotations: { summary: string } }
const rules = (YAML.parse(readFileSync(join(ROOT, 'deploy/prometheus/alerts.yaml'), 'utf8')) as { groups: { rules: Rule[] }[] }).groups.flatMap((g) => g.rules);

/** Metric names in the service's exposition (authz metrics + market service), with their label names. */
async function exported(): Promise<Map<string, Set<string>>> {
  const { createMetrics } = await import('../../authz/src/metrics.ts');
  const m = createMetrics({ geoipBuildEpochSecs: () => 0 });
  const src = readFileSync(join(ROOT, 'authz/src/marketdata/http.ts'), 'utf8');
  const out = new Map<string, Set<string>>();
  for (const metric of (await m.registry.getMetricsAsJSON()) as unknown as { name: string; type: string }[]) {
    const names = metric.type === 'histogram' ? ['_bucket', '_sum', '_count'].map((s) => metric.name + s) : [metric.name];
    for (const n of names) out.set(n, new Set());
  }
  for (const mm of src.matchAll(/name: '(edge_[a-z_]+)'[^}]*labelNames: \[([^\]]*)\]/g)) out.set(mm[1]!, new Set([...mm[2]!.matchAll(/'(\w+)'/g)].map((l) => l[1]!)));
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

test('prometheus – the scrape job the alerts name keeps the edge pods on their prometheus.io port', () => {
  const scrape = YAML.parse(readFileSync(join(ROOT, 'deploy/prometheus/scrape.yaml'), 'utf8')) as { scrape_configs: { job_name: string }[] };
  const jobs = new Set(rules.flatMap((r) => [...r.expr.matchAll(/job="([^"]+)"/g)].map((m) => m[1]!)));
  assert.deepEqual([...jobs], scrape.scrape_configs.map((s) => s.job_name));
});
