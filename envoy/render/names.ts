/**
 * Every name the rendered config, the authz service and the tests must agree on: headers,
 * paths, filters, clusters, routes, the SDS secret, and the `@type` URL of every typed config.
 * One home per name; the other files import them from here.
 */
import { HEADER, PATHS } from '../../authz/src/common/contract.ts';

// ─── Headers and paths (the route contract with the service: authz/src/common/contract.ts) ─────────

/** The client address Envoy decided (header_mutation writes it; geo and the rate limit read it). */
export const CLIENT_IP_HEADER = HEADER.clientIp;
/** The port Envoy gave that address: 0 when it came from X-Forwarded-For (the XFF guard reads it). */
export const CLIENT_PORT_HEADER = HEADER.clientPort;

/** Request headers the authz service reads (authz/src/authz/codec/request.ts), plus content-type. */
export const AUTHZ_HEADERS = [HEADER.clientIp, HEADER.timestamp, HEADER.nonce, HEADER.signature, HEADER.requestId, 'content-type', HEADER.clientCertSha256, HEADER.traceparent] as const;

export const INGEST_PATH = PATHS.ingest;
export const ORDERS_PATH = PATHS.orders;
export const GEOBLOCK_PATH = PATHS.geoblock;

// ─── Resources ─────────────────────────────────────────────────────────────────────────────

/**
 * The listeners: `edge` (EDGE_PORT, every route) and, with INGEST_PORT, `ingest` (the ingest route
 * only). Each name is also its HttpConnectionManager's stat prefix (`http.<name>.…`) and route
 * configuration's name.
 */
export const LISTENER = { edge: 'edge', ingest: 'ingest' } as const;
export type ListenerName = (typeof LISTENER)[keyof typeof LISTENER];

/**
 * The stats listener (ENVOY_STATS_PORT; render/stats.ts): its listener, HttpConnectionManager
 * (`http.envoy_stats.…`) and route configuration name, and the one path it forwards to the admin.
 */
export const STATS_LISTENER = 'envoy_stats';
export const STATS_PATH = '/stats/prometheus';

/** `envoy_admin`: Envoy's own admin interface on loopback, the stats listener's upstream. */
export const CLUSTER = {
  authz: 'authz', market: 'market', orderBackend: 'order_backend', rateLimit: 'ratelimit', envoyAdmin: 'envoy_admin',
  /** The OTLP/gRPC receiver Envoy's tracer exports to (OTEL_EXPORTER_OTLP_ENDPOINT; render/tracing.ts). */
  otlp: 'otlp',
} as const;
export type ClusterName = (typeof CLUSTER)[keyof typeof CLUSTER];

/**
 * The names of the Envoy routes rendered for a registry route (authz/src/common/routes.ts) with
 * id `id`: the route itself, its 413 on a declared body over the limit, its 405 for other methods,
 * and (order backend routes) its 502 when no backend is configured.
 */
export const routeName = {
  main: (id: string): string => id,
  tooLarge: (id: string): string => `${id}_payload_too_large`,
  method: (id: string): string => `${id}_method_not_allowed`,
  noBackend: (id: string): string => `${id}_no_backend`,
} as const;

/** The names of the routes rendered today (tests, dashboards and logs refer to them). */
export const ROUTE = {
  /** A POST to a body route whose content-length is over the route's limit: 413 before the body is read. */
  ingestTooLarge: routeName.tooLarge('ingest'),
  ingest: routeName.main('ingest'),
  ingestMethod: routeName.method('ingest'),
  /** The ingest listener (INGEST_PORT): anything but the ingest path. */
  ingestListenerNotFound: 'ingest_listener_not_found',
  internal: 'internal_not_found',
  ordersTooLarge: routeName.tooLarge('orders'),
  orders: routeName.main('orders'),
  ordersNoBackend: routeName.noBackend('orders'),
  ordersMethod: routeName.method('orders'),
  geoblock: routeName.main('geoblock'),
  /** The catch-all: every request no other route matched, to the market service (routes.ts FALLBACK_KIND). */
  read: 'read',
} as const;
export type RouteName = string;

export const FILTER = {
  hcm: 'envoy.filters.network.http_connection_manager',
  /** Listener filter: a connection must send its first request line before it reaches the HCM. */
  httpInspector: 'envoy.filters.listener.http_inspector',
  rateLimit: 'envoy.filters.http.local_ratelimit',
  /** The global limit: asks the RateLimitService (RATE_LIMIT_SCOPE=global only). */
  globalRateLimit: 'envoy.filters.http.ratelimit',
  /**
   * Whole-body buffer before the global limit (RATE_LIMIT_SCOPE=global only; disabled, switched
   * on by the orders and ingest routes with their body limit): 413 before anything waits.
   */
  bodyBuffer: 'envoy.filters.http.buffer',
  headerMutation: 'envoy.filters.http.header_mutation',
  xffGuard: 'envoy.filters.http.rbac',
  extAuthz: 'envoy.filters.http.ext_authz',
  /**
   * A second ext_authz filter, enabled on the ingest and orders routes only: the header phase
   * (geo, the global rate limit, what the headers decide) before any body is buffered.
   */
  headerPhase: 'edge.ext_authz.header_phase',
  lua: 'envoy.filters.http.lua',
  router: 'envoy.filters.http.router',
} as const;

/** Extensions of the HttpConnectionManager that are not HTTP filters (render/tracing.ts). */
export const HCM_EXTENSION = {
  earlyHeaderMutation: 'envoy.http.early_header_mutation.header_mutation',
  openTelemetry: 'envoy.tracers.opentelemetry',
  uuidRequestId: 'envoy.request_id.uuid',
} as const;
/** The name of an HTTP filter in the chain (what typed_per_filter_config is keyed on). */
export type HttpFilterName = Exclude<(typeof FILTER)[keyof typeof FILTER], typeof FILTER.hcm | typeof FILTER.httpInspector>;

/** Name of the SDS secret holding the client listener's server certificate (EDGE_TLS_CERT_FILE; render/tls.ts). */
export const SERVER_CERT_SECRET = 'edge_server_cert';
/** Name of the SDS secret holding the edge's client certificate. */
export const CLIENT_CERT_SECRET = 'edge_client_cert';
/**
 * Name of the static generic secret holding the RateLimitService token (RATELIMIT_SERVICE_TOKEN_FILE:
 * Envoy reads the file; the token itself is in no rendered file).
 */
export const RATE_LIMIT_TOKEN_SECRET = 'ratelimit_token';
/** The Lua source (LuaPerRoute.name) that turns an order envelope into its payload bytes. */
export const ORDER_BODY_LUA = 'order_body';
/** The XFF guard's RBAC policy; a local-reply mapper matches its denial by this name. */
export const XFF_POLICY = 'malformed_xff';

// ─── Type URLs ─────────────────────────────────────────────────────────────────────────────

export const TYPE_URL = {
  hcm: 'type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager',
  localRateLimit: 'type.googleapis.com/envoy.extensions.filters.http.local_ratelimit.v3.LocalRateLimit',
  rateLimit: 'type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit',
  buffer: 'type.googleapis.com/envoy.extensions.filters.http.buffer.v3.Buffer',
  bufferPerRoute: 'type.googleapis.com/envoy.extensions.filters.http.buffer.v3.BufferPerRoute',
  headerMutation: 'type.googleapis.com/envoy.extensions.filters.http.header_mutation.v3.HeaderMutation',
  extAuthz: 'type.googleapis.com/envoy.extensions.filters.http.ext_authz.v3.ExtAuthz',
  extAuthzPerRoute: 'type.googleapis.com/envoy.extensions.filters.http.ext_authz.v3.ExtAuthzPerRoute',
  lua: 'type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua',
  rbac: 'type.googleapis.com/envoy.extensions.filters.http.rbac.v3.RBAC',
  dnsCluster: 'type.googleapis.com/envoy.extensions.clusters.dns.v3.DnsCluster',
  celFormatter: 'type.googleapis.com/envoy.extensions.formatter.cel.v3.Cel',
  luaPerRoute: 'type.googleapis.com/envoy.extensions.filters.http.lua.v3.LuaPerRoute',
  router: 'type.googleapis.com/envoy.extensions.filters.http.router.v3.Router',
  fileAccessLog: 'type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog',
  stdoutAccessLog: 'type.googleapis.com/envoy.extensions.access_loggers.stream.v3.StdoutAccessLog',
  celFilter: 'type.googleapis.com/envoy.extensions.access_loggers.filters.cel.v3.ExpressionFilter',
  httpOptions: 'type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions',
  upstreamTls: 'type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext',
  secret: 'type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret',
  connLimit: 'type.googleapis.com/envoy.extensions.resource_monitors.downstream_connections.v3.DownstreamConnectionsConfig',
  httpInspector: 'type.googleapis.com/envoy.extensions.filters.listener.http_inspector.v3.HttpInspector',
  fixedHeap: 'type.googleapis.com/envoy.extensions.resource_monitors.fixed_heap.v3.FixedHeapConfig',
  credentialInjector: 'type.googleapis.com/envoy.extensions.filters.http.credential_injector.v3.CredentialInjector',
  earlyHeaderMutation: 'type.googleapis.com/envoy.extensions.http.early_header_mutation.header_mutation.v3.HeaderMutation',
  openTelemetry: 'type.googleapis.com/envoy.config.trace.v3.OpenTelemetryConfig',
  uuidRequestId: 'type.googleapis.com/envoy.extensions.request_id.uuid.v3.UuidRequestIdConfig',
  genericCredential: 'type.googleapis.com/envoy.extensions.http.injected_credentials.generic.v3.Generic',
  upstreamCodec: 'type.googleapis.com/envoy.extensions.filters.http.upstream_codec.v3.UpstreamCodec',
  downstreamTls: 'type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext',
  proxyProtocol: 'type.googleapis.com/envoy.extensions.filters.listener.proxy_protocol.v3.ProxyProtocol',
} as const;
export type TypeUrl = (typeof TYPE_URL)[keyof typeof TYPE_URL];
