/**
 * The route registry: every route of the API, once, as data. One concern: what a route is.
 *
 * Derived from it: Envoy's route table and per-route ext_authz body limits (envoy/render/routes.ts),
 * classify() below (the route of a Check that does not carry one), the market service's dispatch
 * and its metric labels (authz/src/market/http.ts, common/metrics.ts), the OpenAPI paths
 * (scripts/openapi.ts). Checked against it by tests: docs/api.md's route table, each OpenAPI
 * operation's error codes, the anonymizer policy's route names (authz/test/routes.test.ts).
 *
 * Adding a route is one entry in API_ROUTES. A route of a new kind also needs its entry in KINDS,
 * its policy in the pipeline's exhaustive switch (authz/src/authz/pipeline.ts) and its metric
 * codes (metrics.ts DECISION_CODES); a new market route needs its handler (market/http.ts
 * HANDLERS); a new OpenAPI operation its text (scripts/openapi.ts OPERATIONS). Each of those is a
 * `satisfies Record<…>` or a `never` check, so leaving one out fails `npm run typecheck`
 * (docs/authz.md "Adding a route").
 */
import type { Config } from './config.ts';
import type { ErrorCode } from './errors.ts';

export const PATHS = {
  root: '/',
  healthz: '/healthz',
  markets: '/v1/markets',
  quotes: '/v1/quotes',
  orders: '/v1/orders',
  /** The caller's jurisdiction tier: answered for every client, blocked ones too. */
  geoblock: '/v1/geoblock',
  ingest: '/internal/ingest/market',
  /** Everything under it but the exact ingest POST is refused by Envoy (404). */
  internalPrefix: '/internal',
} as const;

/**
 * What the service decides on a request: the ingest policy, the order policy, geo only (`read`),
 * or nothing but the seal (`geoblock`: GET/HEAD /v1/geoblock, which tells a blocked client that
 * it is blocked, so geo must not refuse it; the market service answers it).
 */
export type RouteKind = 'ingest' | 'order' | 'read' | 'geoblock';

/**
 * The route value of a Check that Envoy sent but this registry does not know (a route config
 * rendered by another version, a typo in a hand-written one): denied 503 `service_unavailable`,
 * counted under this route label (docs/api.md "Errors"). Never classified by method and path.
 */
export const UNKNOWN_ROUTE = 'unknown';
/** The route of a Check as decoded: a known kind, or UNKNOWN_ROUTE. */
export type CheckRoute = RouteKind | typeof UNKNOWN_ROUTE;

/** The ANONYMIZER_POLICY name governing a kind (config.ts ANONYMIZER_ROUTES), or none: never refused. */
export type AnonymizerRouteName = 'order' | 'ingest' | 'read';

/** What holds for every route of a kind. */
export interface KindSpec {
  /** Whether geo (and the anonymizer rule) applies: everywhere but the geoblock answer. */
  readonly geo: boolean;
  /** The ANONYMIZER_POLICY name of the kind (undefined: the rule never refuses it). */
  readonly anonymizer: AnonymizerRouteName | undefined;
  /**
   * The metric and decision-log label of the kind's header phase (its routes read a body: the
   * first Check decides on the headers alone); undefined for kinds without a body.
   */
  readonly headerLabel: string | undefined;
}

export const KINDS = Object.freeze({
  ingest: { geo: true, anonymizer: 'ingest', headerLabel: 'ingest_headers' },
  order: { geo: true, anonymizer: 'order', headerLabel: 'order_headers' },
  read: { geo: true, anonymizer: 'read', headerLabel: undefined },
  geoblock: { geo: false, anonymizer: undefined, headerLabel: undefined },
} as const satisfies Record<RouteKind, KindSpec>);

/** Every RouteKind (the compiler checks KINDS is complete). */
export const ROUTE_KINDS: readonly RouteKind[] = Object.freeze(Object.keys(KINDS) as RouteKind[]);

/** The label of a header phase (`ingest_headers`, `order_headers`). */
export type HeaderPhaseLabel = NonNullable<(typeof KINDS)[RouteKind]['headerLabel']>;

export type Method = 'GET' | 'HEAD' | 'POST';
/** Where Envoy sends an allowed request: the market service (this process) or the order backend (mTLS). */
export type Upstream = 'market' | 'order_backend';
/** The setting that is a body route's limit (ext_authz's max_request_bytes, Envoy's 413). */
export type BodyLimitSetting = keyof Pick<Config, 'ingestMaxBytes' | 'orderMaxBytes'>;

interface RouteBase {
  /** Names the route: its Envoy route names (`<id>`, `<id>_payload_too_large`, …) and its market handler. */
  readonly id: string;
  /** The methods served; a GET route answers HEAD too. Another method: 405 with `allow`. */
  readonly methods: readonly Method[];
  /** The exact path (PATHS). */
  readonly path: string;
  readonly kind: RouteKind;
  readonly openapi: {
    readonly operationId: string;
    readonly summary: string;
    readonly tag: 'public' | 'market data' | 'orders' | 'ingest';
  };
  /**
   * The error codes of this route beyond those of every route (bad_request, too many requests,
   * service_unavailable, sealed, and restricted_jurisdiction where geo applies): its OpenAPI
   * operation lists exactly these and those (authz/test/routes.test.ts).
   */
  readonly errors: readonly ErrorCode[];
}

/** A route whose body authz reads: decided on its headers first, then with the body up to its limit. */
interface BodyRoute extends RouteBase {
  readonly bodyLimit: BodyLimitSetting;
  /** The global rate limit's token is taken on the header phase, before the body is buffered. */
  readonly rateLimitStage: 'header_phase';
}

/** A route decided on method, path and headers; its body (if any) streams to the upstream. */
interface PlainRoute extends RouteBase {
  readonly bodyLimit?: undefined;
  /** The global rate limit's token is taken by the route's one Check. */
  readonly rateLimitStage: 'check';
}

interface MarketUpstream {
  readonly upstream: 'market';
  /** The statuses the market service answers on it: its `edge_market_requests_total{route=<path>}` series, created at 0. */
  readonly marketStatuses: readonly number[];
  /** Served on the ingest listener (INGEST_PORT) alone when that is set. */
  readonly ingestListener?: boolean;
}

interface BackendUpstream {
  readonly upstream: 'order_backend';
  /** The backend's own path (SPEC: `POST /orders`); Envoy rewrites to it. */
  readonly backendPath: string;
}

export type RouteSpec = (BodyRoute | PlainRoute) & (MarketUpstream | BackendUpstream);

const GET: readonly Method[] = ['GET', 'HEAD'];

/**
 * The API's routes, in the order docs/api.md and the OpenAPI document list them. Anything that
 * is not one of them is a read (FALLBACK_KIND): Envoy sends it to the market service, which
 * answers 404/405 after geo.
 */
export const API_ROUTES = Object.freeze([
  {
    id: 'root', methods: GET, path: PATHS.root, kind: 'read', rateLimitStage: 'check', upstream: 'market', marketStatuses: [200, 503],
    openapi: { operationId: 'getRoot', summary: 'Service identification', tag: 'public' }, errors: [],
  },
  {
    id: 'healthz', methods: GET, path: PATHS.healthz, kind: 'read', rateLimitStage: 'check', upstream: 'market', marketStatuses: [200, 503],
    openapi: { operationId: 'getHealth', summary: 'Readiness of authz, GeoIP and the store', tag: 'public' }, errors: [],
  },
  {
    id: 'markets', methods: GET, path: PATHS.markets, kind: 'read', rateLimitStage: 'check', upstream: 'market', marketStatuses: [200, 304, 400, 503],
    openapi: { operationId: 'listMarkets', summary: 'Markets with their signed envelopes', tag: 'market data' }, errors: ['invalid_query', 'backend_timeout'],
  },
  {
    id: 'quotes', methods: GET, path: PATHS.quotes, kind: 'read', rateLimitStage: 'check', upstream: 'market', marketStatuses: [200, 304, 400, 503],
    openapi: { operationId: 'listQuotes', summary: 'Quote rows, one per outcome', tag: 'market data' }, errors: ['invalid_query', 'backend_timeout'],
  },
  {
    id: 'geoblock', methods: GET, path: PATHS.geoblock, kind: 'geoblock', rateLimitStage: 'check', upstream: 'market', marketStatuses: [200, 400, 503],
    openapi: { operationId: 'getGeoblock', summary: 'The caller\'s jurisdiction tier', tag: 'public' }, errors: ['invalid_query', 'backend_timeout'],
  },
  {
    id: 'orders', methods: ['POST'], path: PATHS.orders, kind: 'order', bodyLimit: 'orderMaxBytes', rateLimitStage: 'header_phase',
    upstream: 'order_backend', backendPath: '/orders',
    openapi: { operationId: 'placeOrder', summary: 'Forward a signed order to the order backend', tag: 'orders' },
    errors: [
      'invalid_json', 'invalid_order', 'unknown_market', 'market_closed', 'payload_too_large', 'deadline_expired', 'deadline_too_far', 'invalid_size',
      'backend_unavailable', 'backend_timeout',
    ],
  },
  {
    id: 'ingest', methods: ['POST'], path: PATHS.ingest, kind: 'ingest', bodyLimit: 'ingestMaxBytes', rateLimitStage: 'header_phase',
    upstream: 'market', marketStatuses: [200, 400, 401, 409, 413, 503, 504], ingestListener: true,
    openapi: { operationId: 'ingestMarket', summary: 'Store a signed market document from the feed pipeline', tag: 'ingest' },
    errors: [
      'invalid_json', 'invalid_envelope', 'unauthorized', 'timestamp expired', 'ingest_replay', 'invalid_content_signature', 'not_found', 'stale_document',
      'payload_too_large', 'backend_timeout',
    ],
  },
] as const satisfies readonly RouteSpec[]);

/** The registry's type: API_ROUTES, or a test's copy with a route added. */
export type RouteRegistry = readonly RouteSpec[];

type ApiRoute = (typeof API_ROUTES)[number];
/** The id of a route the market service answers (its handler table is keyed on these). */
export type MarketRouteId = Extract<ApiRoute, { upstream: 'market' }>['id'];
/** The OpenAPI operation of each route (scripts/openapi.ts writes one per id). */
export type OperationId = ApiRoute['openapi']['operationId'];

/** The kind of anything that is not a registry route: Envoy's catch-all `read` route to the market service. */
export const FALLBACK_KIND: RouteKind = 'read';

/** Whether `route` serves `method` (a GET route answers HEAD). */
export function serves(route: RouteSpec, method: string): boolean {
  return (route.methods as readonly string[]).includes(method);
}

/** The routes at `path` (at most one per path in API_ROUTES). */
export function routeAt(path: string, registry: RouteRegistry = API_ROUTES): RouteSpec | undefined {
  return registry.find((r) => r.path === path);
}

const BY_PATH: ReadonlyMap<string, RouteSpec> = new Map(API_ROUTES.map((r) => [r.path, r]));

/**
 * The kind of a request by method and path (query stripped; Envoy normalizes the path before
 * ext_authz, so `//internal/./ingest/market` arrives as `/internal/ingest/market`): the route's
 * kind when it serves that method, else FALLBACK_KIND (geo only; Envoy routes those to the
 * market service, which stores nothing outside its ingest route). The service uses this only for
 * a Check that carries no route at all (one sent by hand, e.g. with grpcurl); Envoy sends the
 * route it matched in the context extension CONTEXT_EXTENSION.route, and a value this registry
 * does not know is UNKNOWN_ROUTE, never classified.
 */
export function classify(method: string, path: string, registry?: RouteRegistry): RouteKind {
  const route = registry === undefined ? BY_PATH.get(path) : routeAt(path, registry);
  return route !== undefined && serves(route, method) ? route.kind : FALLBACK_KIND;
}

/** Whether `value` is a RouteKind (what a Check's route extension must be). */
export function isRouteKind(value: string): value is RouteKind {
  return Object.hasOwn(KINDS, value);
}

/** The `allow` header of a 405 on `route`. */
export function allowHeader(route: RouteSpec): string {
  return route.methods.join(', ');
}
