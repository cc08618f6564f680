/**
 * Config → Envoy v3 bootstrap (YAML) plus the file-based SDS resource for the client
 * certificate. Pure: no I/O, no clock, no environment; the same Config and options always
 * give the same bytes. `render-cli.ts` writes the files; docs/envoy.md explains each choice.
 *
 * Request path (docs/api.md "Routes"):
 *   listener 0.0.0.0:EDGE_PORT (HTTP/1.1 + HTTP/2, codec AUTO; a first    render/listener.ts
 *     request line within FIRST_REQUEST_TIMEOUT_MS, else closed), and with
 *     INGEST_PORT a second one for ingest alone (the same chain)
 *   → header_mutation (x-edge-client-ip := the address Envoy trusts;      render/client-address.ts
 *     strips x-envoy-*)
 *   → local_ratelimit (per client address, before anything costs work)   render/rate-limit.ts
 *   → the XFF guard (trusted hops only: an unusable entry → 400)          render/client-address.ts
 *   → ext_authz header phase (disabled; enabled on the ingest and orders  render/ext-authz.ts
 *     routes: no body)
 *   → ratelimit (the global limit, RATE_LIMIT_SCOPE=global only: asks      render/global-rate-limit.ts
 *     the RateLimitService; fails open to the local bucket)
 *   → ext_authz (gRPC, cluster `authz`)                                   render/ext-authz.ts
 *   → lua order body (disabled; enabled on the orders route only:         render/order-body.ts
 *     envoy/order-body-lua.ts)
 *   → router                                                              render/filters.ts
 * With OTEL_EXPORTER_OTLP_ENDPOINT the client listeners' HCM also gets the OpenTelemetry tracer   render/tracing.ts
 * (and the early header mutation that drops a client's traceparent), and a cluster `otlp`.
 * With ENVOY_STATS_PORT, a third listener (0.0.0.0) whose one route, GET /stats/prometheus,    render/stats.ts
 * goes to Envoy's loopback admin (cluster `envoy_admin`); anything else there is 404: no filter
 * but the router.
 * With EDGE_TLS_* / EDGE_PROXY_PROTOCOL the public listener also gets TLS (server certificate
 * from SDS), the client-certificate filter after header_mutation, and the PROXY protocol
 * listener filter: render/tls.ts.
 * Routes: render/routes.ts; Envoy's own error replies: render/local-replies.ts; access log:
 * render/access-log.ts; clusters: render/clusters.ts; client certificate: render/sds.ts; every
 * shared name and `@type` URL: render/names.ts.
 *
 * Facts these files depend on were checked against Envoy 1.40 by envoy/test/render.test.ts
 * (`envoy --mode validate` and a live Envoy) and docs/envoy.md (live checks).
 */
import { stringify } from 'yaml';
import type { Config } from '../authz/src/common/config.ts';
import { buildBootstrap } from './render/bootstrap.ts';
import type { JsonObject, RenderedEnvoy, RenderOptions } from './render/common.ts';
import { buildSds, sdsWarnings } from './render/sds.ts';
import { buildServerSds, serverSdsWarnings } from './render/tls.ts';

export type { AllowedHeaders, Json, JsonObject, RenderedEnvoy, RenderOptions } from './render/common.ts';
export { canonicalIp, duration } from './render/common.ts';
export {
  AUTHZ_HEADERS, CLIENT_CERT_SECRET, CLIENT_IP_HEADER, CLIENT_PORT_HEADER, CLUSTER, FILTER, HCM_EXTENSION,
  INGEST_PATH, LISTENER, ORDER_BODY_LUA, ORDERS_PATH, ROUTE, STATS_LISTENER, STATS_PATH, TYPE_URL, XFF_POLICY,
} from './render/names.ts';
export { adminCluster, STATS_ROUTE, statsListener } from './render/stats.ts';
export { ACCESS_LOG_FORMAT, ACCESS_LOG_PATH_MAX } from './render/access-log.ts';
export { headerMutationFilter, XFF_RBAC_STAT_PREFIX, xffGuardFilter, xffMessage } from './render/client-address.ts';
export { authzCluster, backendSni, marketCluster, orderBackendCluster, otlpCluster, rateLimitCluster, sanMatcher } from './render/clusters.ts';
export { ENVOY_MIN_FLUSH_SPANS, envoyServiceName, OTLP_EXPORT_TIMEOUT_MS, tracingFields, tracingRuntime, UNTRUSTED_TRACE_HEADERS } from './render/tracing.ts';
export { extAuthzFilter, HEADER_PHASE_CONTEXT, headerPhaseFilter, headerPhasePerRoute } from './render/ext-authz.ts';
export { FIRST_REQUEST_TIMEOUT_MS, firstRequestDeadline, httpConnectionManager, ingestListener, listener } from './render/listener.ts';
export {
  BAD_REQUEST_CODE, BAD_REQUEST_MESSAGES, localReplyConfig, NOT_DELIVERED_FLAGS, OUTCOME_UNKNOWN_FLAGS, REQUEST_ID_FORMAT, UPSTREAM_TIMEOUT_MESSAGE,
} from './render/local-replies.ts';
export { ORDER_BODY_FAILURE_PREFIX, orderBodyFailure, orderBodyFilter } from './render/order-body.ts';
export { clientRateLimits, local429Headers, RATE_LIMIT_V6_PREFIX, rateLimitFilter } from './render/rate-limit.ts';
export { globalRateLimitFilter, RATE_LIMIT_SERVICE_TIMEOUT_MS, rateLimitServiceConfig } from './render/global-rate-limit.ts';
export { routes } from './render/routes.ts';
export { buildBootstrap, MAX_DOWNSTREAM_CONNECTIONS, overloadManager } from './render/bootstrap.ts';
export { budgetOfBootstrap, ENVOY_POD_CPUS, envoyBudget, LOCAL_RATE_LIMIT_DESCRIPTOR_CAP, requiredEnvoyMemoryLimitMb } from './render/budget.ts';
export { buildSds } from './render/sds.ts';
export {
  buildServerSds, CLIENT_CERT_FILTER, clientCertFilter, downstreamTlsContext, EDGE_ALPN, EDGE_TLS_CIPHERS, EDGE_TLS_CURVES,
  proxyProtocolFilter, SERVER_SDS_FILE, serverSdsPath,
} from './render/tls.ts';

const HEADER = '# Generated by envoy/render.ts from the environment (authz/src/common/config.ts). Do not edit.\n';

function toYaml(doc: JsonObject): string {
  return HEADER + stringify(doc, { lineWidth: 0, aliasDuplicateObjects: false });
}

/** Renders the bootstrap and (with an order backend) the SDS file. */
export function renderEnvoy(config: Config, opts: RenderOptions): RenderedEnvoy {
  const backend = config.orderBackend;
  return {
    bootstrap: toYaml(buildBootstrap(config, opts)),
    sds: backend === undefined ? undefined : toYaml(buildSds(backend)),
    serverSds: config.edgeTls === undefined ? undefined : toYaml(buildServerSds(config.edgeTls)),
    warnings: [...sdsWarnings(backend), ...serverSdsWarnings(config.edgeTls)],
  };
}
