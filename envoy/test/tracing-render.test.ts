/**
 * Traces in the rendered config (OTEL_EXPORTER_OTLP_ENDPOINT; docs/envoy.md "Traces"): without
 * the setting not one byte differs from before; with it, the client listeners' HCM gets the
 * OpenTelemetry tracer (sampling from OTEL_TRACES_SAMPLER/_ARG, spans per upstream request), the
 * early header mutation that drops a client's traceparent/tracestate (the trust rule), a plain
 * UUIDv4 request id, and the `otlp` cluster; real Envoy 1.40 accepts it (`--mode validate`).
 *
 *   scripts/node --test envoy/test/tracing-render.test.ts
 */
import assert from 'node:assert/strict';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { after, describe, test } from 'node:test';
import { parse } from 'yaml';
import { loadConfig, type Env } from '../../authz/src/common/config.ts';
import { validateBootstrap } from '../envoy-bin.ts';
import { CLUSTER, ENVOY_MIN_FLUSH_SPANS, LISTENER, renderEnvoy, UNTRUSTED_TRACE_HEADERS, type JsonObject } from '../render.ts';
import { at, clusterNamed, tempDir } from './helpers.ts';

const work = tempDir('edge-envoy-traces-');
after(() => work.cleanup());

const BASE: Env = { INGEST_PORT: '8090' };
const TRACED: Env = { ...BASE, OTEL_EXPORTER_OTLP_ENDPOINT: 'http://otel-collector:4317' };
const render = (env: Env): string => renderEnvoy(loadConfig(env), { sdsPath: '/etc/envoy/sds-client-cert.yaml' }).bootstrap;
const hcmOf = (b: JsonObject, listener: string): Record<string, unknown> => {
  const l = (at(b, 'static_resources.listeners') as Record<string, unknown>[]).find((x) => x['name'] === listener);
  return at(l, 'filter_chains[0].filters[0].typed_config') as Record<string, unknown>;
};

describe('rendered config with OTEL_EXPORTER_OTLP_ENDPOINT', () => {
  test('without it: no tracer, no otlp cluster, no early header mutation', () => {
    const text = render(BASE);
    for (const word of ['tracing', 'opentelemetry', 'early_header_mutation', 'request_id_extension', 'layered_runtime', CLUSTER.otlp]) {
      assert.ok(!new RegExp(`\\b${word}\\b`).test(text), `${word} rendered without the setting`);
    }
  });

  test('with it: both client listeners trace, sample as the settings say, and drop a client\'s trace headers first', () => {
    const b = parse(render({ ...TRACED, OTEL_TRACES_SAMPLER: 'parentbased_traceidratio', OTEL_TRACES_SAMPLER_ARG: '0.07', OTEL_SERVICE_NAME: 'venue-edge' })) as JsonObject;
    for (const listener of [LISTENER.edge, LISTENER.ingest]) {
      const hcm = hcmOf(b, listener);
      assert.deepEqual(at(hcm, 'tracing.random_sampling'), { value: 7 }, 'the ratio as a percent, without binary noise');
      assert.deepEqual(at(hcm, 'tracing.client_sampling'), { value: 0 }, 'x-client-trace-id forces nothing');
      assert.equal(at(hcm, 'tracing.spawn_upstream_span'), true);
      assert.equal(at(hcm, 'tracing.provider.name'), 'envoy.tracers.opentelemetry');
      assert.equal(at(hcm, 'tracing.provider.typed_config.grpc_service.envoy_grpc.cluster_name'), CLUSTER.otlp);
      assert.equal(at(hcm, 'tracing.provider.typed_config.service_name'), 'venue-edge-envoy');
      assert.deepEqual(at(hcm, 'early_header_mutation_extensions[0].typed_config.mutations'), UNTRUSTED_TRACE_HEADERS.map((h) => ({ remove: h })));
      assert.equal(at(hcm, 'request_id_extension.typed_config.pack_trace_reason'), false);
    }
    assert.deepEqual(at(b, 'layered_runtime.layers[0].static_layer'), { 'tracing.opentelemetry.min_flush_spans': ENVOY_MIN_FLUSH_SPANS });
    assert.deepEqual(at(b, 'layered_runtime.layers[1]'), { name: 'admin', admin_layer: {} }, 'the admin layer Envoy has by default stays');
    const otlp = clusterNamed(b, CLUSTER.otlp);
    assert.deepEqual(at(otlp, 'load_assignment.endpoints[0].lb_endpoints[0].endpoint.address.socket_address'), { address: 'otel-collector', port_value: 4317 });
    assert.ok(at(otlp, 'typed_extension_protocol_options') !== undefined, 'HTTP/2 (gRPC) to the receiver');
  });

  for (const [sampler, pct] of [['always_off', 0], ['parentbased_always_off', 0], ['always_on', 100], ['traceidratio', 100]] as const) {
    test(`OTEL_TRACES_SAMPLER=${sampler}: Envoy samples ${pct} % of new traces`, () => {
      const b = parse(render({ ...TRACED, OTEL_TRACES_SAMPLER: sampler })) as JsonObject;
      assert.deepEqual(at(hcmOf(b, LISTENER.edge), 'tracing.random_sampling'), { value: pct });
    });
  }

  test('real Envoy 1.40 accepts the traced config (envoy --mode validate)', () => {
    const file = join(work.dir, 'envoy.yaml');
    writeFileSync(file, render(TRACED));
    const r = validateBootstrap(file);
    assert.ok(r.ok, r.output);
  });
});
