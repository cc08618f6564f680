/**
 * Traces (OTEL_EXPORTER_OTLP_ENDPOINT; docs/operations.md "Traces"): one server span per Check,
 * the child of the span Envoy's ext_authz filter put in the call's gRPC metadata (`traceparent`),
 * exported with the OpenTelemetry SDK over OTLP/gRPC in batches (BatchSpanProcessor).
 * `@opentelemetry/sdk-trace` is the SDK's 3.x package, the successor of `sdk-trace-base` (2.x),
 * and the one the current OTLP exporter (0.301) is built on: one SDK in node_modules, not two.
 *
 * The SDK is loaded by startTracing only (`await import`), which app.ts calls only when the
 * endpoint is set: without it not one OpenTelemetry module is imported, and grpc-server.ts
 * registers the Check handler that has no tracing in it at all.
 *
 * What a span holds, and deliberately not: the decision (`edge.decision`), the route
 * (`edge.route`, the decision log's label), the tier geo decided (`edge.tier`, absent when geo did
 * not run), the CONTRACT error code of a denial (`edge.error_code`) and the HTTP status
 * (`http.response.status_code`), plus the rpc.* names of the call. Never a key, signature,
 * nonce, timestamp, body, payload or the client address: nothing of the AuthzInput is copied
 * but the route and the tier (tested over a whole e2e run: e2e/traces.test.ts).
 *
 * Sampling: Envoy decides (it starts every trace; docs/envoy.md "Traces"); the service follows
 * the sampled flag of the parent Envoy sent, whatever OTEL_TRACES_SAMPLER says, so it never
 * exports a child whose parent Envoy dropped. A Check that arrives without a parent (grpcurl, an
 * Envoy without the tracer) is sampled by OTEL_TRACES_SAMPLER's root rule.
 */
import type { Metadata } from '@grpc/grpc-js';
import type { TracingConfig } from '../common/config.ts';
import { throttledWarn, type Logger } from '../common/log.ts';
import { HEADER } from '../common/contract.ts';
import type { AuthzInput } from './codec/request.ts';
import type { Decision } from './decision.ts';
import { routeLabel } from './pipeline.ts';

/** The Check span's name (OpenTelemetry's RPC convention: `<rpc.service>/<rpc.method>`). */
export const CHECK_SPAN_NAME = 'envoy.service.auth.v3.Authorization/Check';

/** The Check span's attribute names (docs/operations.md "Traces"). */
export const SPAN_ATTRIBUTE = {
  decision: 'edge.decision',
  route: 'edge.route',
  tier: 'edge.tier',
  errorCode: 'edge.error_code',
  httpStatus: 'http.response.status_code',
} as const;

/** The attributes every Check span starts with (OpenTelemetry's RPC convention). */
export const RPC_ATTRIBUTES = { 'rpc.system': 'grpc', 'rpc.service': 'envoy.service.auth.v3.Authorization', 'rpc.method': 'Check' } as const;

/** Every attribute name a Check span may carry: nothing else is ever set on it. */
export const CHECK_SPAN_ATTRIBUTE_NAMES: readonly string[] = [...Object.keys(RPC_ATTRIBUTES), ...Object.values(SPAN_ATTRIBUTE)];

/** The span of one Check: ended with its decision. */
export interface CheckSpan {
  end(input: AuthzInput, d: Decision): void;
}

export interface CheckTracer {
  /**
   * Starts the span of one Check, the child of the call metadata's `traceparent`, and makes
   * `input.traceparent` that span's context, so the decision line names the same trace id.
   */
  start(metadata: Metadata, input: AuthzInput): CheckSpan;
  /** Exports what is still queued (at most the exporter's timeout) and stops. */
  shutdown(): Promise<void>;
}

/** The sampler for Checks without a parent (OTEL_TRACES_SAMPLER's root rule). */
type RootRule = 'on' | 'off' | 'ratio';
export function rootRule(sampler: TracingConfig['sampler']): RootRule {
  return sampler.endsWith('traceidratio') ? 'ratio' : sampler.endsWith('always_off') ? 'off' : 'on';
}

/**
 * Loads the SDK and starts the exporter (nothing connects until the first batch). `batchDelayMs`:
 * how long a span may wait for its batch (the SDK's default, 5 s, unless a test shortens it).
 */
export async function startTracing(config: TracingConfig, logger: Logger, batchDelayMs = 5000): Promise<CheckTracer> {
  const [api, core, sdk, resources, otlp] = await Promise.all([
    import('@opentelemetry/api'),
    import('@opentelemetry/core'),
    import('@opentelemetry/sdk-trace'),
    import('@opentelemetry/resources'),
    import('@opentelemetry/exporter-trace-otlp-grpc'),
  ]);
  // Export failures (collector down, too slow): one warning per 10 s, not an unhandled error.
  const exportFailed = throttledWarn(logger, 'trace export failed (OTEL_EXPORTER_OTLP_ENDPOINT): spans are dropped, requests are not affected');
  core.setGlobalErrorHandler((err) => exportFailed.warn({ endpoint: config.endpoint, err: err instanceof Error ? err.message : String(err) }));
  const rule = rootRule(config.sampler);
  const root = rule === 'ratio' ? new sdk.TraceIdRatioBasedSampler(config.ratio) : rule === 'off' ? new sdk.AlwaysOffSampler() : new sdk.AlwaysOnSampler();
  const provider = new sdk.TracerProvider({
    sampler: new sdk.ParentBasedSampler({ root }),
    resource: resources.resourceFromAttributes({ 'service.name': config.serviceName }),
    spanProcessors: [new sdk.BatchSpanProcessor({ exporter: new otlp.OTLPTraceExporter({ url: config.endpoint }), scheduledDelayMillis: batchDelayMs })],
  });
  const tracer = provider.getTracer('edge-authz');
  const { SpanKind, SpanStatusCode, ROOT_CONTEXT, trace } = api;
  logger.info({ endpoint: config.endpoint, sampler: config.sampler, ratio: config.ratio, serviceName: config.serviceName }, 'traces on: one span per Check, exported over OTLP/gRPC');
  return {
    start(metadata, input) {
      const sent = metadata.get(HEADER.traceparent);
      const parent = sent.length === 1 && typeof sent[0] === 'string' ? core.parseTraceParent(sent[0]) : null;
      const ctx = parent === null ? ROOT_CONTEXT : trace.setSpanContext(ROOT_CONTEXT, { ...parent, isRemote: true });
      const span = tracer.startSpan(CHECK_SPAN_NAME, {
        kind: SpanKind.SERVER,
        attributes: RPC_ATTRIBUTES,
      }, ctx);
      const sc = span.spanContext();
      input.traceparent = `00-${sc.traceId}-${sc.spanId}-0${sc.traceFlags & 1}`;
      return {
        end(done, d) {
          if (span.isRecording()) {
            span.setAttribute(SPAN_ATTRIBUTE.decision, d.allow ? 'allow' : 'deny');
            span.setAttribute(SPAN_ATTRIBUTE.route, routeLabel(done));
            if (done.geo !== undefined) span.setAttribute(SPAN_ATTRIBUTE.tier, done.geo.access);
            if (!d.allow) span.setAttribute(SPAN_ATTRIBUTE.errorCode, d.code);
            span.setAttribute(SPAN_ATTRIBUTE.httpStatus, d.httpStatus);
            // A 5xx is the service failing (a store down, an internal error), not the client.
            if (d.httpStatus >= 500) span.setStatus({ code: SpanStatusCode.ERROR, message: d.code });
          }
          span.end();
        },
      };
    },
    shutdown: () => provider.shutdown(),
  };
}
