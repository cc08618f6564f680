/**
 * The geo policy's metrics (docs/operations.md "The geo policy file"): edge_geo_policy_info{version}
 * (1 for the version in force) and edge_geo_policy_reloads_total{result} (ok / refused, both
 * exported at 0). Registered with the service's other metrics (common/metrics.ts) and set by the
 * live policy (authz/geo-policy.ts); once per registry, whoever asks first.
 */
import { Counter, Gauge, type Registry } from 'prom-client';

/** The policy metrics, registered once per registry (the core and the app may both ask). */
export function policyMetrics(registry: Registry): { info: Gauge<'version'>; reloads: Counter<'result'> } {
  const info = (registry.getSingleMetric('edge_geo_policy_info') as Gauge<'version'> | undefined) ?? new Gauge({
    name: 'edge_geo_policy_info',
    help: 'The geo policy in force: 1 for its version (GEO_POLICY_FILE version, or env-<hash> for the settings)',
    labelNames: ['version'] as const,
    aggregator: 'max',
    registers: [registry],
  });
  const reloads = (registry.getSingleMetric('edge_geo_policy_reloads_total') as Counter<'result'> | undefined) ?? new Counter({
    name: 'edge_geo_policy_reloads_total',
    help: 'GEO_POLICY_FILE replacements by result: ok (in force) or refused (the previous policy kept)',
    labelNames: ['result'] as const,
    registers: [registry],
  });
  reloads.labels('ok').inc(0);
  reloads.labels('refused').inc(0);
  return { info, reloads };
}

