/**
 * Config → Envoy v3 bootstrap (YAML) plus the file-based SDS resource for the client
 * certificate. Pure: no I/O, no clock, no environment; the same Config and options always
 * give the same bytes. `render-cli.ts` writes the files; docs/envoy.md explains each choice.
 *
 * Request path (CONTRACT §1):
 *   listener 0.0.0.0:EDGE_PORT (HTTP/1.1 + HTTP/2, codec AUTO)
 *   → header_mutation (x-edge-client-ip := the address Envoy trusts; strips x-envoy-*)
 *   → local_ratelimit (per client address, before anything costs work)
 *   → ext_authz (gRPC, cluster `authz`)
 *   → lua order body (disabled; enabled on the orders route only: envoy/order-body-lua.ts)
 *   → router
 *
 * Facts this file depends on were checked against Envoy 1.40 (../shared/notes/envoy.md §0)
 * and by envoy/test/render.test.ts (`envoy --mode validate`) and docs/envoy.md (live checks).
 */
import { isIP } from 'node:net';
import { dirname } from 'node:path';
import { stringify } from 'yaml';
import type { Config, OrderBackendConfig } from '../authz/src/config.ts';
import { BAD_REQUEST_MESSAGE_BY_STATUS, ERROR_MESSAGE, ERROR_STATUS, errorJson, type ErrorCode } from '../authz/src/errors.ts';
import { ORDER_PAYLOAD_METADATA_KEY } from '../authz/src/stages/order.ts';
import { orderBodyLua } from './order-body-lua.ts';

// ─── Output types ──────────────────────────────────────────────────────────────────────────

/** A JSON/YAML value. `undefined` members are dropped by the YAML writer. */
export type Json = string | number | boolean | null | readonly Json[] | JsonObject;
export interface JsonObject { readonly [key: string]: Json | undefined }

export type AllowedHeaders = 'minimal' | 'all';

export interface RenderOptions {
  /** Absolute path the bootstrap reads the client-certificate SDS resource from. */
  readonly sdsPath: string;
  /** Access log file; default Envoy's stdout. */
  readonly accessLogPath?: string;
  /** Bootstrap node id (path-based SDS needs one); default `edge-envoy`. */
  readonly nodeId?: string;
  /**
   * Which request headers ext_authz forwards in the CheckRequest. `minimal` (default): only
   * those the authz service reads. `all`: every header (Envoy's default), for benchmarks.
   */
  readonly allowedHeaders?: AllowedHeaders;
  /** ext_authz gRPC deadline; default 1000 ms. */
  readonly authzTimeoutMs?: number;
  /**
   * Idle timeout of pooled upstream HTTP/1.1 connections (market, order backend); default 4 s,
   * below Node's 5 s keep-alive so Envoy, not the server, closes idle connections.
   */
  readonly upstreamIdleTimeoutSecs?: number;
  /** Overload-manager cap on downstream connections; default 100000. */
  readonly maxDownstreamConnections?: number;
}

export interface RenderedEnvoy {
  /** The bootstrap YAML (`envoy -c`). */
  readonly bootstrap: string;
  /** The SDS YAML to write at `opts.sdsPath`; undefined when no order backend is configured. */
  readonly sds: string | undefined;
  /** Deployment problems worth a log line (never fatal). */
  readonly warnings: readonly string[];
}

// ─── Names other code and tests refer to ───────────────────────────────────────────────────

export const CLIENT_IP_HEADER = 'x-edge-client-ip';
export const CLUSTER = { authz: 'authz', market: 'market', orderBackend: 'order_backend' } as const;
export const ROUTE = {
  ingest: 'ingest',
  ingestMethod: 'ingest_method_not_allowed',
  internal: 'internal_not_found',
  orders: 'orders',
  ordersNoBackend: 'orders_no_backend',
  ordersMethod: 'orders_method_not_allowed',
  read: 'read',
} as const;
export const FILTER = {
  hcm: 'envoy.filters.network.http_connection_manager',
  rateLimit: 'envoy.filters.http.local_ratelimit',
  headerMutation: 'envoy.filters.http.header_mutation',
  extAuthz: 'envoy.filters.http.ext_authz',
  lua: 'envoy.filters.http.lua',
  router: 'envoy.filters.http.router',
} as const;
/** Name of the SDS secret holding the edge's client certificate. */
export const CLIENT_CERT_SECRET = 'edge_client_cert';
export const INGEST_PATH = '/internal/ingest/market';
export const ORDERS_PATH = '/v1/orders';
export const BACKEND_ORDERS_PATH = '/orders';

/** Request headers the authz service reads (authz/src/envoy/request.ts), plus content-type. */
export const AUTHZ_HEADERS = [
  'x-edge-client-ip', 'x-edge-timestamp', 'x-edge-nonce', 'x-edge-signature', 'x-request-id', 'content-type',
] as const;

/** The Lua source (LuaPerRoute.name) that turns an order envelope into its payload bytes. */
export const ORDER_BODY_LUA = 'order_body';
/** What a client gets when the order-body filter cannot produce the payload (never expected). */
export const ORDER_BODY_FAILURE = errorJson('service_unavailable', 'order body could not be decoded; the order was not sent');

const T = {
  hcm: 'type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager',
  localRateLimit: 'type.googleapis.com/envoy.extensions.filters.http.local_ratelimit.v3.LocalRateLimit',
  headerMutation: 'type.googleapis.com/envoy.extensions.filters.http.header_mutation.v3.HeaderMutation',
  extAuthz: 'type.googleapis.com/envoy.extensions.filters.http.ext_authz.v3.ExtAuthz',
  extAuthzPerRoute: 'type.googleapis.com/envoy.extensions.filters.http.ext_authz.v3.ExtAuthzPerRoute',
  lua: 'type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua',
  luaPerRoute: 'type.googleapis.com/envoy.extensions.filters.http.lua.v3.LuaPerRoute',
  router: 'type.googleapis.com/envoy.extensions.filters.http.router.v3.Router',
  fileAccessLog: 'type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog',
  stdoutAccessLog: 'type.googleapis.com/envoy.extensions.access_loggers.stream.v3.StdoutAccessLog',
  celFilter: 'type.googleapis.com/envoy.extensions.access_loggers.filters.cel.v3.ExpressionFilter',
  httpOptions: 'type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions',
  upstreamTls: 'type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext',
  secret: 'type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret',
  connLimit: 'type.googleapis.com/envoy.extensions.resource_monitors.downstream_connections.v3.DownstreamConnectionsConfig',
} as const;

// ─── Small helpers ─────────────────────────────────────────────────────────────────────────

/** Milliseconds → protobuf Duration string ("5s", "0.25s"). */
export function duration(ms: number): string {
  if (!Number.isFinite(ms) || ms < 0) throw new RangeError(`duration: ${ms} ms`);
  return `${Number((ms / 1000).toFixed(3))}s`;
}

const PERCENT_100 = { numerator: 100, denominator: 'HUNDRED' } as const;

/** A format-string literal: `%` starts a command operator in Envoy formatters. */
function literal(text: string): string {
  return text.replaceAll('%', '%%');
}

/** An IPv6 literal in the form Envoy prints (compressed, lower case); other input unchanged. */
export function canonicalIp(host: string): string {
  if (isIP(host) !== 6) return host;
  return new URL(`http://[${host}]/`).hostname.replace(/^\[(.*)\]$/, '$1');
}

function socketAddress(address: string, port: number): JsonObject {
  return { socket_address: { address, port_value: port } };
}

/** STATIC for an IP literal; otherwise the given DNS discovery type. */
function discovery(host: string, dnsType: 'STRICT_DNS' | 'LOGICAL_DNS'): JsonObject {
  if (isIP(host) !== 0) return { type: 'STATIC' };
  return { type: dnsType, dns_lookup_family: 'V4_PREFERRED' };
}

function loadAssignment(cluster: string, host: string, port: number): JsonObject {
  return {
    cluster_name: cluster,
    endpoints: [{ lb_endpoints: [{ endpoint: { address: socketAddress(host, port) } }] }],
  };
}

function thresholds(max: number): JsonObject {
  return {
    thresholds: [{
      priority: 'DEFAULT', max_connections: max, max_pending_requests: max, max_requests: max, max_retries: 0,
    }],
  };
}

const TCP_KEEPALIVE = { tcp_keepalive: { keepalive_probes: 3, keepalive_time: 30, keepalive_interval: 5 } } as const;

/** A JSON local-reply body in the CONTRACT shape. Envoy's json_format sorts keys: error, message. */
function jsonBody(code: string, message: string): JsonObject {
  return { json_format: { error: literal(code), message: literal(message) }, content_type: 'application/json' };
}

function contractBody(code: ErrorCode): JsonObject {
  return jsonBody(code, ERROR_MESSAGE[code]);
}

function statusIs(status: number): JsonObject {
  return { status_code_filter: { comparison: { op: 'EQ', value: { default_value: status, runtime_key: `edge.local_reply.status_${status}` } } } };
}

function cel(expression: string): JsonObject {
  return {
    extension_filter: {
      name: 'envoy.access_loggers.extension_filters.cel',
      typed_config: { '@type': T.celFilter, expression },
    },
  };
}

/** Any 5xx status (the runtime key is required by the filter's API; nothing sets it). */
function status5xx(): JsonObject {
  return { status_code_filter: { comparison: { op: 'GE', value: { default_value: 500, runtime_key: 'edge.local_reply.status_5xx' } } } };
}

function flagsOnCluster(flags: readonly string[], cluster: string): JsonObject {
  return { and_filter: { filters: [{ response_flag_filter: { flags: [...flags] } }, cel(`xds.cluster_name == '${cluster}'`)] } };
}

// ─── Local replies (CONTRACT §2: every Envoy-generated error is JSON) ───────────────────────

/** Response flags that mean the order never reached the backend. */
export const NOT_DELIVERED_FLAGS = ['UF', 'UH', 'URX', 'UO'] as const;
/**
 * Response flags after which the backend may have received the order: a timeout, a reset or
 * connection close after the request went out, an upstream protocol error.
 */
export const OUTCOME_UNKNOWN_FLAGS = ['UT', 'UC', 'UR', 'UPE', 'UMSDR'] as const;

const PASS_THROUGH_JSON = "('content-type' in response.headers && response.headers['content-type'].startsWith('application/json'))";

/** A timeout on the market route: same code as the order backend's, without naming orders. */
export const UPSTREAM_TIMEOUT_MESSAGE = 'upstream service did not answer in time; the outcome is unknown';

/**
 * Envoy's own 4xx replies about the request itself have no row in the CONTRACT table; they
 * get the code `bad_request` (status unchanged) with these messages, default last.
 */
export const BAD_REQUEST_CODE = 'bad_request';
export const BAD_REQUEST_MESSAGES: readonly (readonly [number | undefined, string])[] = [
  ...Object.entries(BAD_REQUEST_MESSAGE_BY_STATUS).map(([status, message]) => [Number(status), message] as const),
  [undefined, ERROR_MESSAGE.bad_request],
];

/**
 * local_reply_config. First match wins, so the order is the contract:
 *  1. ext_authz denials, and any reply that already is JSON (the order-body filter's 503),
 *     pass through byte-identical: the TS service already wrote CONTRACT JSON, 451 included.
 *  2. UAEX that is not a denial = authz unreachable/timed out → 503 service_unavailable.
 *  3. Envoy's 501 for a request it cannot parse (unsupported transfer-encoding) → 400
 *     `bad_request`: the client's input, not a dependency, is at fault.
 *  4. Order backend: not delivered → 502; outcome unknown → 504.
 *  5. By status: 404, 405, 413, 429, 502, 503, 504 (market timeout); any other 5xx → 503.
 *  6. Envoy's own 4xx (malformed HTTP, header timeout, headers too large) → `bad_request`.
 */
export function localReplyConfig(): JsonObject {
  const byStatus: [number, ErrorCode][] = [
    [404, 'not_found'],
    [405, 'method_not_allowed'],
    [413, 'payload_too_large'],
    [429, 'too many requests'],
    [502, 'backend_unavailable'],
    [503, 'service_unavailable'],
  ];
  return {
    mappers: [
      {
        // Verified in 1.40: denials carry details `ext_authz_denied`, errors `ext_authz_error`;
        // both set UAEX, so the flag alone cannot tell them apart (notes/envoy.md §0). The
        // mapper sees the headers the replying filter set, so a Lua reply that already is
        // JSON (the order-body filter's 503) passes through as well, whatever its `details`;
        // Envoy's own replies carry no content-type at this point.
        filter: cel(`response.code_details == 'ext_authz_denied' || ${PASS_THROUGH_JSON}`),
        body_format_override: { text_format_source: { inline_string: '%LOCAL_REPLY_BODY%' }, content_type: 'application/json' },
      },
      {
        filter: { response_flag_filter: { flags: ['UAEX'] } },
        status_code: ERROR_STATUS.service_unavailable,
        body_format_override: contractBody('service_unavailable'),
      },
      {
        // Envoy's only local 501: a request it cannot parse (unsupported transfer-encoding). The
        // DPE flag is not set yet when the mapper runs (verified in 1.40), so the status decides.
        filter: statusIs(501),
        status_code: ERROR_STATUS.bad_request,
        body_format_override: jsonBody(BAD_REQUEST_CODE, BAD_REQUEST_MESSAGES.at(-1)![1]),
      },
      {
        filter: flagsOnCluster(NOT_DELIVERED_FLAGS, CLUSTER.orderBackend),
        status_code: ERROR_STATUS.backend_unavailable,
        body_format_override: contractBody('backend_unavailable'),
      },
      {
        filter: flagsOnCluster(OUTCOME_UNKNOWN_FLAGS, CLUSTER.orderBackend),
        status_code: ERROR_STATUS.backend_timeout,
        body_format_override: contractBody('backend_timeout'),
      },
      ...byStatus.map(([status, code]) => ({
        filter: statusIs(status),
        status_code: ERROR_STATUS[code],
        body_format_override: contractBody(code),
      })),
      {
        // 504 elsewhere (the market service timed out): an ingest may have been stored.
        filter: statusIs(504),
        status_code: ERROR_STATUS.backend_timeout,
        body_format_override: jsonBody('backend_timeout', UPSTREAM_TIMEOUT_MESSAGE),
      },
      {
        filter: status5xx(),
        status_code: ERROR_STATUS.service_unavailable,
        body_format_override: contractBody('service_unavailable'),
      },
      ...BAD_REQUEST_MESSAGES.flatMap(([status, message]) => (status === undefined ? [] : [{
        filter: statusIs(status),
        body_format_override: jsonBody(BAD_REQUEST_CODE, message),
      }])),
    ],
    // Envoy's remaining local replies are 4xx about the request itself (bad framing, escaped
    // slashes, header timeout, headers too large).
    body_format: jsonBody(BAD_REQUEST_CODE, BAD_REQUEST_MESSAGES.at(-1)![1]),
  };
}

// ─── HTTP filters ──────────────────────────────────────────────────────────────────────────

/**
 * Per-client-address token bucket (dynamic descriptors, Envoy ≥ 1.34). One bucket per
 * remote address, shared by all workers of this Envoy instance; an LRU keeps at most
 * `max_dynamic_descriptors` of them. An IPv6 client is its /64: one end site holds at least
 * that many addresses and could otherwise take a fresh bucket per request. Except an
 * IPv4-mapped address (`::ffff:a.b.c.d`, as some dual-stack proxies write IPv4 clients in
 * X-Forwarded-For): masked to /64 every IPv4 client would share one bucket, so those keep one
 * bucket per address. Envoy's masking cannot tell them apart, so two descriptors do, keyed on
 * the computed address that header_mutation (before this filter) wrote into x-edge-client-ip.
 */
export const RATE_LIMIT_V6_PREFIX = 64;
/**
 * Envoy writes an IPv4-mapped address as `::ffff:a.b.c.d` (dotted); the IPv4-translated
 * `::ffff:0:a.b.c.d` comes out in hex (`::ffff:0:102:304`) and is an IPv6 address like any other.
 * A zone id (`%…`) may follow; Envoy keeps it.
 */
const V4_MAPPED = { name: CLIENT_IP_HEADER, string_match: { safe_regex: { regex: '::ffff:[0-9]+\\.[0-9]+\\.[0-9]+\\.[0-9]+(%.*)?' } } };

export function rateLimitFilter(config: Config): JsonObject {
  const bucket = { max_tokens: config.rateBurst, tokens_per_fill: config.rpsPerIp, fill_interval: '1s' };
  return {
    name: FILTER.rateLimit,
    typed_config: {
      '@type': T.localRateLimit,
      stat_prefix: 'per_client_ip',
      filter_enabled: { default_value: PERCENT_100, runtime_key: 'edge.rate_limit.enabled' },
      filter_enforced: { default_value: PERCENT_100, runtime_key: 'edge.rate_limit.enforced' },
      // Only the per-address bucket is charged (no shared default bucket).
      always_consume_default_token_bucket: false,
      // Room for 100,000 concurrently active clients with 2× headroom before LRU eviction.
      max_dynamic_descriptors: 200_000,
      enable_x_ratelimit_headers: 'DRAFT_VERSION_03',
      // Exactly one of the two produces a descriptor for a request (expect_match true/false).
      rate_limits: [
        { actions: [
          { header_value_match: { descriptor_key: 'client', descriptor_value: 'address', expect_match: false, headers: [V4_MAPPED] } },
          { masked_remote_address: { v4_prefix_mask_len: 32, v6_prefix_mask_len: RATE_LIMIT_V6_PREFIX } },
        ] },
        { actions: [
          { header_value_match: { descriptor_key: 'client', descriptor_value: 'v4_mapped', expect_match: true, headers: [V4_MAPPED] } },
          // The address as Envoy computed it. A zone id (`%…`) stays part of it: a client that
          // controls the trusted X-Forwarded-For entry could vary it, but such a client can
          // already name any address it likes (docs/deploy.md: only the balancer may reach Envoy).
          { remote_address: {} },
        ] },
      ],
      // No value on the address entry: a wildcard, i.e. one bucket per distinct value.
      descriptors: [
        { entries: [{ key: 'client', value: 'address' }, { key: 'masked_remote_address' }], token_bucket: bucket },
        { entries: [{ key: 'client', value: 'v4_mapped' }, { key: 'remote_address' }], token_bucket: bucket },
      ],
    },
  };
}

/**
 * Overwrites `x-edge-client-ip` with the address Envoy computed (XFF_NUM_TRUSTED_HOPS), so a
 * client can never choose the address geo and rate limiting see; removes every client-sent
 * `x-envoy-*` header so nobody can ask the router for retries or longer timeouts; removes
 * `expect`: Envoy has already answered `100-continue` itself, and any other expectation would
 * reach the upstream, where Node answers 417 with no body (after authz had already accepted,
 * and for an ingest recorded, the request).
 */
export function headerMutationFilter(): JsonObject {
  return {
    name: FILTER.headerMutation,
    typed_config: {
      '@type': T.headerMutation,
      mutations: {
        request_mutations: [
          { remove_on_match: { key_matcher: { prefix: 'x-envoy-' } } },
          { remove: 'expect' },
          {
            append: {
              header: { key: CLIENT_IP_HEADER, value: '%DOWNSTREAM_REMOTE_ADDRESS_WITHOUT_PORT%' },
              append_action: 'OVERWRITE_IF_EXISTS_OR_ADD',
            },
          },
        ],
      },
    },
  };
}

function bodySettings(maxBytes: number): JsonObject {
  return { max_request_bytes: maxBytes, allow_partial_message: false, pack_as_bytes: true };
}

/** ext_authz over gRPC: fail closed with 503; body rules are set per route. */
export function extAuthzFilter(config: Config, opts: RenderOptions): JsonObject {
  const headers = opts.allowedHeaders ?? 'minimal';
  return {
    name: FILTER.extAuthz,
    typed_config: {
      '@type': T.extAuthz,
      transport_api_version: 'V3',
      grpc_service: { envoy_grpc: { cluster_name: CLUSTER.authz }, timeout: duration(opts.authzTimeoutMs ?? 1000) },
      failure_mode_allow: false,
      status_on_error: { code: 'ServiceUnavailable' },
      // Fallback for a route without its own check_settings (every route here has one): the
      // smaller of the two body limits.
      with_request_body: bodySettings(Math.min(config.orderMaxBytes, config.ingestMaxBytes)),
      allowed_headers: headers === 'minimal'
        ? { patterns: AUTHZ_HEADERS.map((h) => ({ exact: h })) }
        : undefined,
      include_peer_certificate: false,
      validate_mutations: true,
    },
  };
}

/**
 * The order-body Lua filter (envoy/order-body-lua.ts). Disabled in the chain; the orders
 * route enables it by naming its source in a LuaPerRoute.
 */
export function orderBodyFilter(): JsonObject {
  return {
    name: FILTER.lua,
    disabled: true,
    typed_config: {
      '@type': T.lua,
      source_codes: { [ORDER_BODY_LUA]: { inline_string: orderBodyLua(FILTER.extAuthz, ORDER_PAYLOAD_METADATA_KEY, ORDER_BODY_FAILURE) } },
      // The script rewrites headers after ext_authz allowed the route; it must not be re-chosen.
      clear_route_cache: false,
    },
  };
}

// ─── Routes ────────────────────────────────────────────────────────────────────────────────

type RouteKind = 'ingest' | 'order' | 'read';

function authzPerRoute(kind: RouteKind, config: Config): JsonObject {
  const checkSettings = kind === 'read'
    // Reads: authz decides on method, path and client address; buffering a body would only
    // add latency and bytes on the wire. Bodies stream to the market service, which rejects them.
    ? { disable_request_body_buffering: true }
    : { with_request_body: bodySettings(kind === 'ingest' ? config.ingestMaxBytes : config.orderMaxBytes) };
  return {
    '@type': T.extAuthzPerRoute,
    // Lets the authz service (and grpcurl/log readers) see which route Envoy chose.
    check_settings: { ...checkSettings, context_extensions: { route: kind } },
  };
}

function postOnly(path: string): JsonObject {
  return { path, headers: [{ name: ':method', string_match: { exact: 'POST' } }] };
}

function directResponse(name: string, match: JsonObject, status: number, kind: RouteKind, config: Config, headers?: [string, string][]): JsonObject {
  return {
    name,
    match,
    // No body: the local-reply mappers write the CONTRACT JSON for the status.
    direct_response: { status },
    response_headers_to_add: headers?.map(([key, value]) => ({ header: { key, value }, append_action: 'OVERWRITE_IF_EXISTS_OR_ADD' })),
    typed_per_filter_config: { [FILTER.extAuthz]: authzPerRoute(kind, config) },
  };
}

/** Route to the market service (reads and accepted ingests). */
const MARKET_ROUTE_TIMEOUT_MS = 15_000;
/** No byte in either direction for this long ends a stream (slow-client protection). */
const STREAM_IDLE_TIMEOUT_MS = 30_000;

/**
 * The route table, first match wins:
 *   POST /internal/ingest/market → market (authz gets the body, INGEST_MAX_BYTES)
 *   /internal/ingest/market, other methods → 405 (Envoy)
 *   /internal…, any case → 404 (Envoy): only the exact, authenticated ingest route reaches
 *     the market service's internal paths
 *   POST /v1/orders → order backend /orders (body ORDER_MAX_BYTES, order-body Lua filter, no retries);
 *     502 backend_unavailable when no backend is configured
 *   /v1/orders, other methods → 405 (Envoy), `allow: POST`
 *   anything else → market (it answers 404/405 itself)
 */
export function routes(config: Config): JsonObject[] {
  const table: JsonObject[] = [
    {
      name: ROUTE.ingest,
      match: postOnly(INGEST_PATH),
      route: { cluster: CLUSTER.market, timeout: duration(MARKET_ROUTE_TIMEOUT_MS) },
      typed_per_filter_config: { [FILTER.extAuthz]: authzPerRoute('ingest', config) },
    },
    directResponse(ROUTE.ingestMethod, { path: INGEST_PATH }, ERROR_STATUS.method_not_allowed, 'read', config, [['allow', 'POST']]),
    directResponse(ROUTE.internal, { prefix: '/internal', case_sensitive: false }, ERROR_STATUS.not_found, 'read', config),
  ];
  if (config.orderBackend === undefined) {
    // The route still exists so clients get the CONTRACT answer: the order was not delivered.
    // ext_authz still runs (geo applies to every route); the order-body filter stays off.
    table.push(directResponse(ROUTE.ordersNoBackend, postOnly(ORDERS_PATH), ERROR_STATUS.backend_unavailable, 'order', config));
  } else {
    table.push({
      name: ROUTE.orders,
      match: postOnly(ORDERS_PATH),
      route: {
        cluster: CLUSTER.orderBackend,
        prefix_rewrite: BACKEND_ORDERS_PATH,
        // The backend sees its own authority, not the edge's public Host.
        host_rewrite_literal: new URL(config.orderBackend.url).host,
        timeout: duration(config.orderBackend.timeoutMs),
        // The HCM stream_idle_timeout (30 s) would otherwise cut a longer backend wait short
        // with a 408 instead of the route timeout's 504.
        idle_timeout: duration(Math.max(STREAM_IDLE_TIMEOUT_MS, config.orderBackend.timeoutMs + 5000)),
        // Deliberately no retry_policy: an order POST is sent at most once (CONTRACT §5).
      },
      typed_per_filter_config: {
        [FILTER.extAuthz]: authzPerRoute('order', config),
        [FILTER.lua]: { '@type': T.luaPerRoute, name: ORDER_BODY_LUA },
      },
    });
  }
  table.push(directResponse(ROUTE.ordersMethod, { path: ORDERS_PATH }, ERROR_STATUS.method_not_allowed, 'read', config, [['allow', 'POST']]));
  table.push({
    name: ROUTE.read,
    match: { prefix: '/' },
    route: { cluster: CLUSTER.market, timeout: duration(MARKET_ROUTE_TIMEOUT_MS) },
    typed_per_filter_config: { [FILTER.extAuthz]: authzPerRoute('read', config) },
  });
  return table;
}

// ─── Listener ──────────────────────────────────────────────────────────────────────────────

/**
 * Access log: one JSON line per request. Deliberately no request headers besides the request
 * id and no bodies: x-edge-signature, x-edge-nonce and order payloads never reach the log.
 * The path is logged without its query string.
 */
export const ACCESS_LOG_PATH_MAX = 512;
export const ACCESS_LOG_FORMAT: Readonly<Record<string, string>> = {
  time: '%START_TIME%',
  request_id: '%REQ(X-REQUEST-ID)%',
  client: '%DOWNSTREAM_REMOTE_ADDRESS_WITHOUT_PORT%',
  peer: '%DOWNSTREAM_DIRECT_REMOTE_ADDRESS_WITHOUT_PORT%',
  protocol: '%PROTOCOL%',
  // Cut like the path: over HTTP/2 a client may send any token as the method.
  method: '%REQ(:METHOD):32%',
  // The request's path at logging time, query string removed: after the route's prefix_rewrite, so
  // an order is logged as /orders (the route field says it came in on /v1/orders). At most
  // ACCESS_LOG_PATH_MAX characters: a client may send ~60 KiB of path, and must not make every
  // line of its as large (rate-limited, but still log volume at the client's choice).
  path: `%PATH(NQ):${ACCESS_LOG_PATH_MAX}%`,
  route: '%ROUTE_NAME%',
  status: '%RESPONSE_CODE%',
  flags: '%RESPONSE_FLAGS%',
  details: '%RESPONSE_CODE_DETAILS%',
  duration_ms: '%DURATION%',
  response_ms: '%RESPONSE_DURATION%',
  // Where the time went, in µs (null when the request never went upstream): from the whole
  // request received to the first byte sent upstream (rate limit, the ext_authz round trip, the
  // order-body Lua filter, taking an upstream connection), then the upstream's share.
  edge_us: '%COMMON_DURATION(DS_RX_END:US_TX_BEG:us)%',
  upstream_us: '%COMMON_DURATION(US_TX_BEG:US_RX_END:us)%',
  upstream_attempts: '%UPSTREAM_REQUEST_ATTEMPT_COUNT%',
  upstream_cluster: '%UPSTREAM_CLUSTER%',
  upstream_host: '%UPSTREAM_HOST%',
  bytes_in: '%BYTES_RECEIVED%',
  bytes_out: '%BYTES_SENT%',
};

/**
 * To a file, or to Envoy's own stdout. The stdout logger writes to the inherited descriptor;
 * a file logger on `/dev/stdout` would open() it, which fails (ENXIO) when stdout is a socket,
 * as it is under Node's child_process pipes.
 */
function accessLog(path: string | undefined): JsonObject {
  const log_format = { json_format: ACCESS_LOG_FORMAT };
  return path === undefined
    ? { name: 'envoy.access_loggers.stdout', typed_config: { '@type': T.stdoutAccessLog, log_format } }
    : { name: 'envoy.access_loggers.file', typed_config: { '@type': T.fileAccessLog, path, log_format } };
}

/** The HttpConnectionManager with its filter chain, routes and local replies. */
export function httpConnectionManager(config: Config, opts: RenderOptions): JsonObject {
  return {
    name: FILTER.hcm,
    typed_config: {
      '@type': T.hcm,
      stat_prefix: 'edge',
      codec_type: 'AUTO',
      // The client address is the TCP peer, or the XFF entry XFF_NUM_TRUSTED_HOPS from the right.
      use_remote_address: true,
      xff_num_trusted_hops: config.xffNumTrustedHops,
      skip_xff_append: false,
      // No client address is "internal" (internal requests keep client-sent x-envoy-* and
      // x-request-id headers). An empty list means "RFC1918 + loopback" to Envoy, so the list
      // holds the one address that can never be a peer: 0.0.0.0/32.
      internal_address_config: { unix_sockets: false, cidr_ranges: [{ address_prefix: '0.0.0.0', prefix_len: 32 }] },
      generate_request_id: true,
      preserve_external_request_id: false,
      // The client learns the id the backend can deduplicate on (a 504 is "outcome unknown").
      always_set_request_id_in_response: true,
      normalize_path: true,
      merge_slashes: true,
      // Nobody needs %2F or %5C in our paths; rejecting beats two parties disagreeing on them.
      path_with_escaped_slashes_action: 'REJECT_REQUEST',
      server_header_transformation: 'OVERWRITE',
      server_name: 'edge',
      request_headers_timeout: '10s',
      request_timeout: '60s',
      stream_idle_timeout: duration(STREAM_IDLE_TIMEOUT_MS),
      drain_timeout: '5s',
      common_http_protocol_options: {
        idle_timeout: '300s',
        headers_with_underscores_action: 'DROP_HEADER',
      },
      http2_protocol_options: {
        max_concurrent_streams: 100,
        initial_stream_window_size: 65_536,
        initial_connection_window_size: 1_048_576,
      },
      access_log: [accessLog(opts.accessLogPath)],
      local_reply_config: localReplyConfig(),
      route_config: {
        name: 'edge',
        virtual_hosts: [{ name: 'edge', domains: ['*'], routes: routes(config) }],
      },
      http_filters: [
        // header_mutation first: the rate limit reads the computed address it writes.
        headerMutationFilter(),
        rateLimitFilter(config),
        extAuthzFilter(config, opts),
        orderBodyFilter(),
        // suppress_envoy_headers: responses never advertise x-envoy-upstream-service-time etc.
        { name: FILTER.router, typed_config: { '@type': T.router, suppress_envoy_headers: true } },
      ],
    },
  };
}

// ─── Clusters ──────────────────────────────────────────────────────────────────────────────

/**
 * The TS gRPC server (ext_authz Check). HTTP/2, one long-lived connection
 * per Envoy worker, kept alive with HTTP/2 PINGs; high circuit-breaker limits so a traffic
 * spike is limited by the authz deadline, not by Envoy's default 1024 concurrent requests.
 */
export function authzCluster(config: Config): JsonObject {
  return {
    name: CLUSTER.authz,
    ...discovery(config.authzAddress, 'STRICT_DNS'),
    connect_timeout: '1s',
    load_assignment: loadAssignment(CLUSTER.authz, config.authzAddress, config.authzGrpcPort),
    circuit_breakers: thresholds(100_000),
    upstream_connection_options: TCP_KEEPALIVE,
    typed_extension_protocol_options: {
      'envoy.extensions.upstreams.http.v3.HttpProtocolOptions': {
        '@type': T.httpOptions,
        common_http_protocol_options: { idle_timeout: '3600s' },
        explicit_http_config: {
          http2_protocol_options: {
            connection_keepalive: { interval: '30s', timeout: '5s' },
          },
        },
      },
    },
  };
}

/** The market service: plain HTTP/1.1 on MARKET_ADDRESS:MARKET_PORT. */
export function marketCluster(config: Config, opts: RenderOptions): JsonObject {
  return {
    name: CLUSTER.market,
    ...discovery(config.marketAddress, 'STRICT_DNS'),
    connect_timeout: '1s',
    load_assignment: loadAssignment(CLUSTER.market, config.marketAddress, config.marketPort),
    circuit_breakers: thresholds(8192),
    upstream_connection_options: TCP_KEEPALIVE,
    typed_extension_protocol_options: {
      'envoy.extensions.upstreams.http.v3.HttpProtocolOptions': {
        '@type': T.httpOptions,
        common_http_protocol_options: { idle_timeout: duration((opts.upstreamIdleTimeoutSecs ?? 4) * 1000) },
        explicit_http_config: { http_protocol_options: {} },
      },
    },
  };
}

/** The subject-alt-name matcher for the backend's certificate. */
export function sanMatcher(san: string): JsonObject {
  return isIP(san) === 0
    ? { san_type: 'DNS', matcher: { exact: san } }
    : { san_type: 'IP_ADDRESS', matcher: { exact: canonicalIp(san) } };
}

/**
 * SNI for the backend handshake: ORDER_BACKEND_SAN when it is a name; an IP literal is not
 * allowed in SNI (RFC 6066 §3), so then the URL's host if that is a name, else none.
 */
export function backendSni(backend: OrderBackendConfig): string | undefined {
  if (isIP(backend.san) === 0) return backend.san;
  if (isIP(backend.host) === 0) return backend.host;
  return undefined;
}

/**
 * The order backend over mTLS: pinned CA, exact SAN, client certificate from file-based SDS
 * (rotated on disk), connections closed after ORDER_BACKEND_MAX_CONN_SECS so a new certificate
 * reaches the backend in bounded time. LOGICAL_DNS for a name: one external endpoint whose
 * addresses may rotate; connections are not spread over every resolved address.
 */
export function orderBackendCluster(backend: OrderBackendConfig, opts: RenderOptions): JsonObject {
  const idleSecs = Math.min(opts.upstreamIdleTimeoutSecs ?? 4, backend.maxConnSecs);
  return {
    name: CLUSTER.orderBackend,
    ...discovery(backend.host, 'LOGICAL_DNS'),
    connect_timeout: duration(Math.min(2000, backend.timeoutMs)),
    load_assignment: loadAssignment(CLUSTER.orderBackend, backend.host, backend.port),
    circuit_breakers: thresholds(1024),
    upstream_connection_options: TCP_KEEPALIVE,
    transport_socket: {
      name: 'envoy.transport_sockets.tls',
      typed_config: {
        '@type': T.upstreamTls,
        sni: backendSni(backend),
        common_tls_context: {
          tls_params: { tls_minimum_protocol_version: 'TLSv1_2' },
          alpn_protocols: ['http/1.1'],
          tls_certificate_sds_secret_configs: [{
            name: CLIENT_CERT_SECRET,
            sds_config: { path_config_source: { path: opts.sdsPath }, resource_api_version: 'V3' },
          }],
          validation_context: {
            trusted_ca: { filename: backend.caFile },
            match_typed_subject_alt_names: [sanMatcher(backend.san)],
          },
        },
      },
    },
    typed_extension_protocol_options: {
      'envoy.extensions.upstreams.http.v3.HttpProtocolOptions': {
        '@type': T.httpOptions,
        common_http_protocol_options: {
          idle_timeout: duration(idleSecs * 1000),
          max_connection_duration: duration(backend.maxConnSecs * 1000),
        },
        explicit_http_config: { http_protocol_options: {} },
      },
    },
  };
}

// ─── Bootstrap ─────────────────────────────────────────────────────────────────────────────

/** The whole bootstrap as a plain object (what the YAML encodes). */
export function buildBootstrap(config: Config, opts: RenderOptions): JsonObject {
  const clusters = [authzCluster(config), marketCluster(config, opts)];
  if (config.orderBackend !== undefined) clusters.push(orderBackendCluster(config.orderBackend, opts));
  return {
    // Path-based SDS refuses to start without a node id and cluster.
    node: { id: opts.nodeId ?? 'edge-envoy', cluster: 'edge-trading-proxy' },
    admin: { address: socketAddress('127.0.0.1', config.envoyAdminPort) },
    overload_manager: {
      resource_monitors: [{
        name: 'envoy.resource_monitors.global_downstream_max_connections',
        typed_config: { '@type': T.connLimit, max_active_downstream_connections: opts.maxDownstreamConnections ?? 100_000 },
      }],
    },
    static_resources: {
      listeners: [{
        name: 'edge',
        address: socketAddress('0.0.0.0', config.edgePort),
        // Edge best practice; the per-route body limits raise the stream buffer where needed.
        per_connection_buffer_limit_bytes: 32_768,
        filter_chains: [{ filters: [httpConnectionManager(config, opts)] }],
      }],
      clusters,
    },
  };
}

/** The SDS resource file: the client certificate and key, re-read on rotation. */
export function buildSds(backend: OrderBackendConfig): JsonObject {
  return {
    resources: [{
      '@type': T.secret,
      name: CLIENT_CERT_SECRET,
      tls_certificate: {
        certificate_chain: { filename: backend.clientCertFile },
        private_key: { filename: backend.clientKeyFile },
        // Envoy re-reads both files on any move inside this directory: a Kubernetes `..data`
        // symlink swap or `mv new old`. Writing a file in place is NOT seen (docs/envoy.md).
        watched_directory: { path: dirname(backend.clientCertFile) },
      },
    }],
  };
}

const HEADER = '# Generated by envoy/render.ts from the environment (authz/src/config.ts). Do not edit.\n';

function toYaml(doc: JsonObject): string {
  return HEADER + stringify(doc, { lineWidth: 0, aliasDuplicateObjects: false });
}

/** Renders the bootstrap and (with an order backend) the SDS file. */
export function renderEnvoy(config: Config, opts: RenderOptions): RenderedEnvoy {
  const warnings: string[] = [];
  const backend = config.orderBackend;
  if (backend !== undefined && dirname(backend.clientKeyFile) !== dirname(backend.clientCertFile)) {
    warnings.push(
      `EDGE_CLIENT_KEY_FILE is not in the directory of EDGE_CLIENT_CERT_FILE (${dirname(backend.clientCertFile)}); `
      + 'only that directory is watched, so rotate the key before the certificate.',
    );
  }
  return {
    bootstrap: toYaml(buildBootstrap(config, opts)),
    sds: backend === undefined ? undefined : toYaml(buildSds(backend)),
    warnings,
  };
}
