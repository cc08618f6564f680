/**
 * The route table of the one virtual host.
 */
import { GEOBLOCK_METHODS, PATHS } from '../../authz/src/common/contract.ts';
import type { Config } from '../../authz/src/common/config.ts';
import { ERROR_STATUS } from '../../authz/src/common/errors.ts';
import { duration, overwriteHeader, type JsonObject, type TypedConfig } from './common.ts';
import { authzPerRoute, ingestHeadersPerRoute, type RouteKind } from './ext-authz.ts';
import {
  BACKEND_ORDERS_PATH, CLUSTER, FILTER, GEOBLOCK_PATH, INGEST_PATH, ORDERS_PATH, ROUTE, type HttpFilterName, type RouteName,
} from './names.ts';
import { bodyBufferPerRoute, globalLimitFilter, globalLimitInCheck } from './global-rate-limit.ts';
import { orderBodyPerRoute } from './order-body.ts';

/** typed_per_filter_config: keyed by the name of a filter in the chain, or it does nothing. */
type PerFilterConfig = { readonly [F in HttpFilterName]?: TypedConfig };

interface Route extends JsonObject {
  readonly name: RouteName;
  readonly match: JsonObject;
  readonly typed_per_filter_config: PerFilterConfig;
}

/** Route to the market service (reads and accepted ingests). */
const MARKET_ROUTE_TIMEOUT_MS = 15_000;
/** No byte in either direction for this long ends a stream (slow-client protection). */
export const STREAM_IDLE_TIMEOUT_MS = 30_000;

function postOnly(path: string): JsonObject {
  return { path, headers: [{ name: ':method', string_match: { exact: 'POST' } }] };
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

/**
 * The route table, first match wins:
 *   POST /internal/ingest/market → market (authz gets the body, INGEST_MAX_BYTES)
 *   /internal/ingest/market, other methods → 405 (Envoy)
 *   /internal…, any case → 404 (Envoy): only the exact, authenticated ingest route reaches
 *     the market service's internal paths
 *   POST /v1/orders → order backend /orders (body ORDER_MAX_BYTES, order-body Lua filter, no retries);
 *     502 backend_unavailable when no backend is configured
 *   /v1/orders, other methods → 405 (Envoy), `allow: POST`
 *   GET/HEAD /v1/geoblock → market, authz kind `geoblock`: no geo (a blocked client learns it is
 *     blocked); the rate limit applies as everywhere. Other methods fall to the read route: geo,
 *     then the market service's 405
 *   anything else → market (it answers 404/405 itself)
 */
export function routes(config: Config): Route[] {
  // RATELIMIT_SERVICE_ADDRESS: the body is buffered whole before the rate limit service is asked (global-rate-limit.ts).
  const buffered = (maxBytes: number): PerFilterConfig =>
    (globalLimitFilter(config) ? { [FILTER.bodyBuffer]: bodyBufferPerRoute(maxBytes) } : {});
  // The TS service as the global limiter: the Check of every route with an upstream takes the bucket.
  const inCheck = globalLimitInCheck(config);
  const table: Route[] = [
    {
      name: ROUTE.ingest,
      match: postOnly(INGEST_PATH),
      route: { cluster: CLUSTER.market, timeout: duration(MARKET_ROUTE_TIMEOUT_MS) },
      typed_per_filter_config: {
        [FILTER.ingestHeaders]: ingestHeadersPerRoute(),
        ...buffered(config.ingestMaxBytes),
        [FILTER.extAuthz]: authzPerRoute('ingest', config, inCheck),
      },
    },
    directResponse(ROUTE.ingestMethod, { path: INGEST_PATH }, ERROR_STATUS.method_not_allowed, 'read', config, [['allow', 'POST']]),
    directResponse(ROUTE.internal, { prefix: PATHS.internalPrefix, case_sensitive: false }, ERROR_STATUS.not_found, 'read', config),
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
        ...buffered(config.orderMaxBytes),
        [FILTER.extAuthz]: authzPerRoute('order', config, inCheck),
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
