/**
 * The route table of the one virtual host, rendered from the route registry
 * (authz/src/common/routes.ts).
 */
import {
  allowHeader, API_ROUTES, FALLBACK_KIND, PATHS, type BodyLimitSetting, type RouteKind, type RouteRegistry, type RouteSpec,
} from '../../authz/src/common/routes.ts';
import type { Config } from '../../authz/src/common/config.ts';
import { ERROR_STATUS } from '../../authz/src/common/errors.ts';
import { duration, overwriteHeader, type JsonObject, type TypedConfig } from './common.ts';
import { authzPerRoute, headerPhasePerRoute } from './ext-authz.ts';
import { CLUSTER, FILTER, LISTENER, ROUTE, routeName, type HttpFilterName, type ListenerName, type RouteName } from './names.ts';
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

/** Matches `path` with one of `methods` (a GET route matches HEAD too: it is listed). */
function methodMatch(path: string, methods: readonly string[]): JsonObject {
  const method = methods.length === 1
    ? { exact: methods[0] }
    : { safe_regex: { regex: `^(${methods.join('|')})$` } };
  return { path, headers: [{ name: ':method', string_match: method }] };
}

/** The largest int64: the open end of a content-length range (a string: JSON numbers lose its precision). */
const INT64_MAX = '9223372036854775807';

/**
 * A request to `route` that declares a body over `maxBytes` (content-length). Matched before the
 * route that would buffer it: Envoy answers 413 without reading the body or asking for more than
 * geo. Without this route such a body is read while the header phase is decided, and once it is
 * over the stream's limit Envoy stops reading it, and the body phase would wait for the rest
 * until the body timeout (408) instead of answering 413 (docs/envoy.md "Bodies and memory").
 */
function declaredTooLarge(route: RouteSpec, maxBytes: number): JsonObject {
  const match = methodMatch(route.path, route.methods);
  return {
    ...match,
    headers: [...(match['headers'] as JsonObject[]), { name: 'content-length', range_match: { start: maxBytes + 1, end: INT64_MAX } }],
  };
}

function directResponse(name: RouteName, match: JsonObject, status: number, kind: RouteKind, headers?: [string, string][]): Route {
  return {
    name,
    match,
    // No body: the local-reply mappers write the error JSON for the status.
    direct_response: { status },
    response_headers_to_add: headers?.map(([key, value]) => overwriteHeader(key, value)),
    // Envoy answers these itself: geo only, the body (if any) not buffered.
    typed_per_filter_config: { [FILTER.extAuthz]: authzPerRoute(kind, undefined) },
  };
}

/** RATELIMIT_SERVICE_ADDRESS: the body is buffered whole before the rate limit service is asked (global-rate-limit.ts). */
function buffered(config: Config, maxBytes: number): PerFilterConfig {
  return globalLimitFilter(config) ? { [FILTER.bodyBuffer]: bodyBufferPerRoute(maxBytes) } : {};
}

/** The market service's route action. */
function toMarket(): JsonObject {
  return { cluster: CLUSTER.market, timeout: duration(MARKET_ROUTE_TIMEOUT_MS) };
}

/**
 * The order backend's route action: its own path and authority, its timeout, no retries. Its
 * routes carry the order-body Lua filter (the backend receives the decoded payload bytes).
 */
function toOrderBackend(backend: NonNullable<Config['orderBackend']>, backendPath: string): JsonObject {
  return {
    cluster: CLUSTER.orderBackend,
    prefix_rewrite: backendPath,
    // The backend sees its own authority, not the edge's public Host.
    host_rewrite_literal: new URL(backend.url).host,
    timeout: duration(backend.timeoutMs),
    // The HCM stream_idle_timeout (30 s) would otherwise cut a longer backend wait short
    // with a 408 instead of the route timeout's 504.
    idle_timeout: duration(Math.max(STREAM_IDLE_TIMEOUT_MS, backend.timeoutMs + 5000)),
    // Deliberately no retry_policy: an order POST is sent at most once.
  };
}

/**
 * A registry route whose body authz reads (routes.ts `bodyLimit`): 413 on a declared body over its
 * limit, the route (header phase, then authz gets the body up to the limit), 405 for other methods.
 */
function bodyRoutes(route: RouteSpec & { bodyLimit: BodyLimitSetting }, config: Config, inCheck: boolean): Route[] {
  const maxBytes = config[route.bodyLimit];
  const match = methodMatch(route.path, route.methods);
  const out: Route[] = [directResponse(routeName.tooLarge(route.id), declaredTooLarge(route, maxBytes), ERROR_STATUS.payload_too_large, FALLBACK_KIND)];
  if (route.upstream === 'market') {
    out.push({
      name: routeName.main(route.id),
      match,
      route: toMarket(),
      // The stream may hold the route's whole body from the start (see Route.request_body_buffer_limit).
      request_body_buffer_limit: maxBytes,
      typed_per_filter_config: {
        [FILTER.headerPhase]: headerPhasePerRoute(route.kind, inCheck),
        ...buffered(config, maxBytes),
        [FILTER.extAuthz]: authzPerRoute(route.kind, maxBytes),
      },
    });
  } else if (config.orderBackend === undefined) {
    // The route still exists so clients get the documented answer: the order was not delivered.
    // ext_authz still runs (geo applies to every route); the order-body filter stays off.
    out.push({
      ...directResponse(routeName.noBackend(route.id), match, ERROR_STATUS.backend_unavailable, route.kind),
      request_body_buffer_limit: maxBytes,
      typed_per_filter_config: { [FILTER.headerPhase]: headerPhasePerRoute(route.kind), [FILTER.extAuthz]: authzPerRoute(route.kind, maxBytes) },
    });
  } else {
    out.push({
      name: routeName.main(route.id),
      match,
      route: toOrderBackend(config.orderBackend, route.backendPath),
      request_body_buffer_limit: maxBytes,
      typed_per_filter_config: {
        [FILTER.headerPhase]: headerPhasePerRoute(route.kind, inCheck),
        ...buffered(config, maxBytes),
        [FILTER.extAuthz]: authzPerRoute(route.kind, maxBytes),
        [FILTER.lua]: orderBodyPerRoute(),
      },
    });
  }
  out.push(directResponse(routeName.method(route.id), { path: route.path }, ERROR_STATUS.method_not_allowed, FALLBACK_KIND, [['allow', allowHeader(route)]]));
  return out;
}

/**
 * A registry route decided without its body, rendered on its own (its kind is not the catch-all's,
 * e.g. geoblock: no geo), or nothing: a read to the market service is the catch-all route's.
 * Other methods fall to the catch-all: geo, then the market service's 405.
 */
function plainRoutes(route: RouteSpec, config: Config, inCheck: boolean): Route[] {
  if (route.kind === FALLBACK_KIND && route.upstream === 'market') return [];
  if (route.upstream === 'order_backend' && config.orderBackend === undefined) {
    return [directResponse(routeName.noBackend(route.id), methodMatch(route.path, route.methods), ERROR_STATUS.backend_unavailable, route.kind)];
  }
  return [{
    name: routeName.main(route.id),
    match: methodMatch(route.path, route.methods),
    route: route.upstream === 'market' ? toMarket() : toOrderBackend(config.orderBackend!, route.backendPath),
    typed_per_filter_config: { [FILTER.extAuthz]: authzPerRoute(route.kind, undefined, inCheck) },
  }];
}

/** The Envoy routes of one registry route. */
function rendered(route: RouteSpec, config: Config, inCheck: boolean): Route[] {
  return route.bodyLimit === undefined ? plainRoutes(route, config, inCheck) : bodyRoutes(route, config, inCheck);
}

/**
 * The route table of a listener, derived from the route registry (authz/src/common/routes.ts),
 * first match wins. The ingest listener (INGEST_PORT): its routes (`ingestListener`: POST
 * /internal/ingest/market), then 404 for anything else (Envoy; geo still applies, no body is read).
 * The public listener (EDGE_PORT):
 *   1. the ingest-listener routes, only without INGEST_PORT (with it, the ingest path is refused
 *      with the rest of /internal); they come first: they are under /internal. For a body route:
 *        a declared body over its limit (INGEST_MAX_BYTES) → 413 (Envoy; geo only)
 *        the route → market (header phase, then authz gets the body up to the limit)
 *        the path, other methods → 405 (Envoy), `allow` from the registry
 *   2. /internal…, any case → 404 (Envoy): only the exact, authenticated ingest route reaches
 *      the market service's internal paths. No body is buffered for it (geo is asked on the
 *      headers alone), so with INGEST_PORT an ingest sent here is 404 before its body is read.
 *   3. every other body route, as in 1: POST /v1/orders → order backend /orders (413 over
 *      ORDER_MAX_BYTES, order-body Lua filter, no retries; 502 backend_unavailable when no backend
 *      is configured; 405 for other methods)
 *   4. every other route whose kind is not the catch-all's: GET/HEAD /v1/geoblock → market, authz
 *      kind `geoblock`: no geo (a blocked client learns it is blocked); the rate limit applies as
 *      everywhere. Other methods fall to the catch-all: geo, then the market service's 405
 *   5. anything else → market, kind `read` (FALLBACK_KIND; it answers 404/405 itself): the reads.
 * `registry` is API_ROUTES but in the tests that add a route (authz/test/routes.test.ts, envoy/test/route-body-limits.test.ts).
 */
export function routes(config: Config, listener: ListenerName = LISTENER.edge, registry: RouteRegistry = API_ROUTES): Route[] {
  // The TS service as the global limiter: the Check of every route with an upstream takes the bucket.
  const inCheck = globalLimitInCheck(config);
  const onIngestListener = registry.filter((r) => r.upstream === 'market' && r.ingestListener === true);
  const ingestRoutes = onIngestListener.flatMap((r) => rendered(r, config, inCheck));
  if (listener === LISTENER.ingest) {
    return [...ingestRoutes, directResponse(ROUTE.ingestListenerNotFound, { prefix: '/' }, ERROR_STATUS.not_found, FALLBACK_KIND)];
  }
  const others = registry.filter((r) => !onIngestListener.includes(r));
  return [
    ...(config.ingestPort === undefined ? ingestRoutes : []),
    directResponse(ROUTE.internal, { prefix: PATHS.internalPrefix, case_sensitive: false }, ERROR_STATUS.not_found, FALLBACK_KIND),
    ...others.filter((r) => r.bodyLimit !== undefined).flatMap((r) => rendered(r, config, inCheck)),
    ...others.filter((r) => r.bodyLimit === undefined).flatMap((r) => rendered(r, config, inCheck)),
    {
      name: ROUTE.read,
      match: { prefix: '/' },
      route: toMarket(),
      typed_per_filter_config: { [FILTER.extAuthz]: authzPerRoute(FALLBACK_KIND, undefined, inCheck) },
    },
  ];
}
