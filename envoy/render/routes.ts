/**
 * The route table of the one virtual host.
 */
import { GEOBLOCK_METHODS, PATHS } from '../../authz/src/common/contract.ts';
import type { Config } from '../../authz/src/common/config.ts';
import { ERROR_STATUS } from '../../authz/src/common/errors.ts';
import { duration, overwriteHeader, type JsonObject, type TypedConfig } from './common.ts';
import { authzPerRoute, headerPhasePerRoute, type RouteKind } from './ext-authz.ts';
import {
  BACKEND_ORDERS_PATH, CLUSTER, FILTER, GEOBLOCK_PATH, INGEST_PATH, LISTENER, ORDERS_PATH, ROUTE, type HttpFilterName, type ListenerName, type RouteName,
} from './names.ts';
import { bodyBufferPerRoute, globalLimitFilter, globalLimitInCheck } from './global-rate-limit.ts';
import { orderBodyPerRoute } from './order-body.ts';

/** typed_per_filter_config: keyed by the name of a filter in the chain, or it does nothing. */
type PerFilterConfig = { readonly [F in HttpFilterName]?: TypedConfig };

interface Route extends JsonObject {
  readonly name: RouteName;
  readonly match: JsonObject;
  /**
   * On the routes whose body authz reads (ingest, orders): the route's body limit as the stream's
   * buffer limit from the moment the route matches (Envoy ≥ 1.37), not only once the body-phase
   * ext_authz raises it. The body that arrives while the header phase is decided is then held up
   * to that limit; with the connection's 32 KiB, Envoy would stop reading at 32 KiB and, raised
   * to the route's limit afterwards with more than half of it already held, never resume (Envoy
   * resumes a paused stream only below half its limit): a valid order over 32 KiB sent while the
   * header phase was pending would wait for the body timeout. Checked on 1.40.
   */
  readonly request_body_buffer_limit?: number;
  readonly typed_per_filter_config: PerFilterConfig;
}

/** Route to the market service (reads and accepted ingests). */
const MARKET_ROUTE_TIMEOUT_MS = 15_000;
/** No byte in either direction for this long ends a stream (slow-client protection). */
export const STREAM_IDLE_TIMEOUT_MS = 30_000;

function postOnly(path: string): JsonObject {
  return { path, headers: [{ name: ':method', string_match: { exact: 'POST' } }] };
}

/** The largest int64: the open end of a content-length range (a string: JSON numbers lose its precision). */
const INT64_MAX = '9223372036854775807';

/**
 * A POST to `path` that declares a body over `maxBytes` (content-length). Matched before the
 * route that would buffer it: Envoy answers 413 without reading the body or asking for more than
 * geo. Without this route such a body is read while the header phase is decided, and once it is
 * over the stream's limit Envoy stops reading it, and the body phase would wait for the rest
 * until the body timeout (408) instead of answering 413 (docs/envoy.md "Bodies and memory").
 */
function declaredTooLarge(path: string, maxBytes: number): JsonObject {
  return {
    path,
    headers: [
      { name: ':method', string_match: { exact: 'POST' } },
      { name: 'content-length', range_match: { start: maxBytes + 1, end: INT64_MAX } },
    ],
  };
}

function directResponse(name: RouteName, match: JsonObject, status: number, kind: RouteKind, config: Config, headers?: [string, string][]): Route {
  return {
    name,
    match,
    // No body: the local-reply mappers write the CONTRACT JSON for the status.
    direct_response: { status },
    response_headers_to_add: headers?.map(([key, value]) => overwriteHeader(key, value)),
    typed_per_filter_config: { [FILTER.extAuthz]: authzPerRoute(kind, config) },
  };
}

/** The ingest routes: the POST (authz gets the body, INGEST_MAX_BYTES, after its header phase), then 405 for other methods. */
function ingestRoutes(config: Config): Route[] {
  const inCheck = globalLimitInCheck(config);
  return [
    directResponse(ROUTE.ingestTooLarge, declaredTooLarge(INGEST_PATH, config.ingestMaxBytes), ERROR_STATUS.payload_too_large, 'read', config),
    {
      name: ROUTE.ingest,
      match: postOnly(INGEST_PATH),
      route: { cluster: CLUSTER.market, timeout: duration(MARKET_ROUTE_TIMEOUT_MS) },
      // The stream may hold the route's whole body from the start (see Route.request_body_buffer_limit).
      request_body_buffer_limit: config.ingestMaxBytes,
      typed_per_filter_config: {
        [FILTER.headerPhase]: headerPhasePerRoute('ingest', inCheck),
        ...buffered(config, config.ingestMaxBytes),
        [FILTER.extAuthz]: authzPerRoute('ingest', config),
      },
    },
    directResponse(ROUTE.ingestMethod, { path: INGEST_PATH }, ERROR_STATUS.method_not_allowed, 'read', config, [['allow', 'POST']]),
  ];
}

/** RATELIMIT_SERVICE_ADDRESS: the body is buffered whole before the rate limit service is asked (global-rate-limit.ts). */
function buffered(config: Config, maxBytes: number): PerFilterConfig {
  return globalLimitFilter(config) ? { [FILTER.bodyBuffer]: bodyBufferPerRoute(maxBytes) } : {};
}

/**
 * The route table of a listener, first match wins. The ingest listener (INGEST_PORT):
 *   POST /internal/ingest/market → market, as below; other methods → 405; anything else → 404
 *   (Envoy; geo still applies, no body is read)
 * The public listener (EDGE_PORT):
 *   POST /internal/ingest/market declaring a body over INGEST_MAX_BYTES → 413 (Envoy; geo only)
 *   POST /internal/ingest/market → market (header phase, then authz gets the body, INGEST_MAX_BYTES)
 *   /internal/ingest/market, other methods → 405 (Envoy)
 *     (both only without INGEST_PORT: with it, the ingest path is refused with the rest of /internal)
 *   /internal…, any case → 404 (Envoy): only the exact, authenticated ingest route reaches
 *     the market service's internal paths. No body is buffered for it (geo is asked on the
 *     headers alone), so with INGEST_PORT an ingest sent here is 404 before its body is read.
 *   POST /v1/orders declaring a body over ORDER_MAX_BYTES → 413 (Envoy; geo only)
 *   POST /v1/orders → order backend /orders (header phase, then the body, ORDER_MAX_BYTES,
 *     order-body Lua filter, no retries); 502 backend_unavailable when no backend is configured
 *   /v1/orders, other methods → 405 (Envoy), `allow: POST`
 *   GET/HEAD /v1/geoblock → market, authz kind `geoblock`: no geo (a blocked client learns it is
 *     blocked); the rate limit applies as everywhere. Other methods fall to the read route: geo,
 *     then the market service's 405
 *   anything else → market (it answers 404/405 itself)
 */
export function routes(config: Config, listener: ListenerName = LISTENER.edge): Route[] {
  if (listener === LISTENER.ingest) {
    return [...ingestRoutes(config), directResponse(ROUTE.ingestListenerNotFound, { prefix: '/' }, ERROR_STATUS.not_found, 'read', config)];
  }
  // The TS service as the global limiter: the Check of every route with an upstream takes the bucket.
  const inCheck = globalLimitInCheck(config);
  const table: Route[] = [
    ...(config.ingestPort === undefined ? ingestRoutes(config) : []),
    directResponse(ROUTE.internal, { prefix: PATHS.internalPrefix, case_sensitive: false }, ERROR_STATUS.not_found, 'read', config),
  ];
  table.push(directResponse(ROUTE.ordersTooLarge, declaredTooLarge(ORDERS_PATH, config.orderMaxBytes), ERROR_STATUS.payload_too_large, 'read', config));
  if (config.orderBackend === undefined) {
    // The route still exists so clients get the CONTRACT answer: the order was not delivered.
    // ext_authz still runs (geo applies to every route); the order-body filter stays off.
    table.push({
      ...directResponse(ROUTE.ordersNoBackend, postOnly(ORDERS_PATH), ERROR_STATUS.backend_unavailable, 'order', config),
      request_body_buffer_limit: config.orderMaxBytes,
      typed_per_filter_config: { [FILTER.headerPhase]: headerPhasePerRoute('order'), [FILTER.extAuthz]: authzPerRoute('order', config) },
    });
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
      request_body_buffer_limit: config.orderMaxBytes,
      typed_per_filter_config: {
        [FILTER.headerPhase]: headerPhasePerRoute('order', inCheck),
        ...buffered(config, config.orderMaxBytes),
        [FILTER.extAuthz]: authzPerRoute('order', config),
        [FILTER.lua]: orderBodyPerRoute(),
      },
    });
  }
  table.push(directResponse(ROUTE.ordersMethod, { path: ORDERS_PATH }, ERROR_STATUS.method_not_allowed, 'read', config, [['allow', 'POST']]));
  table.push({
    name: ROUTE.geoblock,
    match: {
      path: GEOBLOCK_PATH,
      headers: [{ name: ':method', string_match: { safe_regex: { regex: `^(${GEOBLOCK_METHODS.join('|')})$` } } }],
    },
    route: { cluster: CLUSTER.market, timeout: duration(MARKET_ROUTE_TIMEOUT_MS) },
    typed_per_filter_config: { [FILTER.extAuthz]: authzPerRoute('geoblock', config, inCheck) },
  });
  table.push({
    name: ROUTE.read,
    match: { prefix: '/' },
    route: { cluster: CLUSTER.market, timeout: duration(MARKET_ROUTE_TIMEOUT_MS) },
    typed_per_filter_config: { [FILTER.extAuthz]: authzPerRoute('read', config, inCheck) },
  });
  return table;
}
