/**
 * Traces (OTEL_EXPORTER_OTLP_ENDPOINT; docs/envoy.md "Traces"): what the client listeners'
 * HttpConnectionManager gets when the endpoint is set, and nothing at all otherwise (the rendered
 * config is then byte-identical to one without this file).
 *
 * - The OpenTelemetry tracer, exporting OTLP over gRPC to the `otlp` cluster (render/clusters.ts):
 *   a server span per request, a span per upstream request (`spawn_upstream_span`: the market
 *   service or the order backend, whose `traceparent` names it), and the ext_authz filter's
 *   egress span per Check, whose context goes to the TS service in the call's metadata.
 * - The trust rule: a client's `traceparent`/`tracestate` are never honoured. The early header
 *   mutation removes them (and `x-client-trace-id`) before the tracer reads the request, so every
 *   trace starts at Envoy with Envoy's sampling decision: a client can neither force a trace
 *   (cost) nor hide from one, nor join its spans to the edge's.
 * - Sampling: OTEL_TRACES_SAMPLER(_ARG) as `random_sampling` (the fraction of new traces);
 *   `client_sampling` 0, so `x-client-trace-id` forces nothing. (`x-envoy-force-trace` is honoured
 *   only from internal addresses, and no address is internal here: render/listener.ts.)
 * - The request id stays a plain UUIDv4: `pack_trace_reason: false` (by default Envoy writes the
 *   trace decision into one of its hex digits when a tracer is configured).
 */
import type { Config, TracingConfig } from '../../authz/src/common/config.ts';
import { HEADER } from '../../authz/src/common/contract.ts';
import { typedConfig, typedExtension, type JsonObject } from './common.ts';
import { CLUSTER, HCM_EXTENSION, TYPE_URL } from './names.ts';

/** The request headers a client may not set when tracing is on (removed before the tracer reads them). */
export const UNTRUSTED_TRACE_HEADERS = [HEADER.traceparent, 'tracestate', 'x-client-trace-id'] as const;

/** How long one OTLP export may take before Envoy gives it up (the spans of that batch are dropped). */
export const OTLP_EXPORT_TIMEOUT_MS = 1000;

/**
 * Spans Envoy's tracer buffers (per worker) before it exports them, where its default is 5: at
 * every request sampled that was an OTLP export per two requests (bench:edge, docs/benchmarks.md
 * "Findings: traces on against off"). A batch still goes out every 5 s
 * (`tracing.opentelemetry.flush_interval_ms`'s default) however few spans it holds.
 */
export const ENVOY_MIN_FLUSH_SPANS = 512;

/** Envoy's `service.name`: OTEL_SERVICE_NAME's with `-envoy` (the TS service's spans carry the name itself). */
export function envoyServiceName(t: TracingConfig): string {
  return `${t.serviceName}-envoy`;
}

/** A fraction (0..1) as Envoy's Percent (0..100), without binary noise (0.07 → 7, not 7.000000000000001). */
function percent(fraction: number): JsonObject {
  return { value: Math.round(fraction * 100 * 1e6) / 1e6 };
}

/** The HttpConnectionManager fields for traces: none without OTEL_EXPORTER_OTLP_ENDPOINT. */
export function tracingFields(config: Config): JsonObject {
  const t = config.tracing;
  if (t === undefined) return {};
  return {
    early_header_mutation_extensions: [typedExtension(HCM_EXTENSION.earlyHeaderMutation, TYPE_URL.earlyHeaderMutation, {
      mutations: UNTRUSTED_TRACE_HEADERS.map((h) => ({ remove: h })),
    })],
    request_id_extension: { typed_config: typedConfig(TYPE_URL.uuidRequestId, { pack_trace_reason: false }) },
    tracing: {
      client_sampling: percent(0),
      random_sampling: percent(t.ratio),
      spawn_upstream_span: true,
      provider: {
        name: HCM_EXTENSION.openTelemetry,
        typed_config: typedConfig(TYPE_URL.openTelemetry, {
          grpc_service: { envoy_grpc: { cluster_name: CLUSTER.otlp }, timeout: `${OTLP_EXPORT_TIMEOUT_MS / 1000}s` },
          service_name: envoyServiceName(t),
        }),
      },
    },
  };
}

/**
 * The bootstrap's layered_runtime with traces on: a static layer setting the tracer's batch size
 * (ENVOY_MIN_FLUSH_SPANS), then the admin layer Envoy has when none is configured; undefined
 * without OTEL_EXPORTER_OTLP_ENDPOINT (no layered_runtime rendered, as before).
 */
export function tracingRuntime(config: Config): JsonObject | undefined {
  if (config.tracing === undefined) return undefined;
  return {
    layers: [
      { name: 'traces', static_layer: { 'tracing.opentelemetry.min_flush_spans': ENVOY_MIN_FLUSH_SPANS } },
      { name: 'admin', admin_layer: {} },
    ],
  };
}
