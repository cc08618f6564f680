/**
 * The contract between Envoy and the service, declared once: the header names that cross the
 * boundary, the context extensions, the dynamic-metadata key of an accepted order and the global
 * rate limit's descriptors. The routes themselves are the registry in ./routes.ts.
 * The Envoy renderer (envoy/), the CheckRequest codec, the pipeline, the market service and the
 * OpenAPI generator import these; docs/api.md describes them.
 */

/** The paths and route kinds live with the route registry (./routes.ts); re-exported for the many readers of PATHS. */
export { PATHS, type RouteKind } from './routes.ts';

/** The ext_authz `context_extensions` entries Envoy's routes set (never client input). */
export const CONTEXT_EXTENSION = {
  /** The RouteKind of the route Envoy matched (a value the registry does not know: denied, routes.ts UNKNOWN_ROUTE). */
  route: 'route',
  /** `headers` on the first Check of an ingest or an order, which carries no body (HEADER_PHASE). */
  phase: 'phase',
  /**
   * `global` (GLOBAL_LIMIT_IN_CHECK) on the Checks that take the global rate limit's bucket:
   * RATE_LIMIT_SCOPE=global with the TS service as the limiter (no RATELIMIT_SERVICE_ADDRESS),
   * every route with an upstream, one Check per request: the header phase of an ingest or an
   * order (before its body is buffered), the only Check of any other route.
   */
  rateLimit: 'rate_limit',
} as const;
export const HEADER_PHASE = 'headers';
export const GLOBAL_LIMIT_IN_CHECK = 'global';

/** Header names crossing the Envoy ⇄ service ⇄ backend boundary. */
export const HEADER = {
  /** The client address Envoy decided on (always overwritten by Envoy). */
  clientIp: 'x-edge-client-ip',
  /** The port Envoy gave that address: 0 when it came from X-Forwarded-For (the XFF guard). */
  clientPort: 'x-edge-client-port',
  timestamp: 'x-edge-timestamp',
  nonce: 'x-edge-nonce',
  signature: 'x-edge-signature',
  requestId: 'x-request-id',
  /**
   * W3C Trace Context (`00-<trace-id>-<parent-id>-<flags>`): sent to authz so the decision log
   * names the trace (authz/decision-log.ts traceIdOf); forwarded upstream as the client sent it.
   * With traces on (OTEL_EXPORTER_OTLP_ENDPOINT) a client's is removed before anything reads it,
   * and the one upstreams get, and the one in the Check's gRPC metadata, are Envoy's
   * (envoy/render/tracing.ts).
   */
  traceparent: 'traceparent',
  /** To the order backend, from the accepted order's envelope. */
  marketId: 'x-edge-market-id',
  deadline: 'x-edge-deadline',
  size: 'x-edge-size',
  /** To the order backend: the client's tier, `full` or `close-only` (docs/api.md "Client address, geo and rate limit"). */
  access: 'x-edge-access',
  /** To the order backend: the jurisdiction whose rule gave that tier (`PL`, `CA-QC`, or JURISDICTION_NONE). */
  jurisdiction: 'x-edge-jurisdiction',
  /** To the order backend: the version of the geo policy that admitted the order (GEO_POLICY_FILE's `version`, or `env-…`). */
  policy: 'x-edge-policy',
  /**
   * To authz and every upstream: the SHA-256 of the client certificate the TLS handshake verified
   * against EDGE_TLS_CLIENT_CA_FILE (64 lower-case hex digits of its DER); absent without one.
   */
  clientCertSha256: 'x-edge-client-cert-sha256',
} as const;

/**
 * The headers only the edge sets on what it forwards: Envoy removes any client-sent copy of each
 * before ext_authz and every upstream (envoy/render/client-address.ts), and the order's allow
 * sets them again. The ingest's x-edge-timestamp/-nonce/-signature are client headers and stay.
 */
export const EDGE_SET_HEADERS: readonly string[] = [HEADER.access, HEADER.jurisdiction, HEADER.marketId, HEADER.deadline, HEADER.size, HEADER.clientCertSha256, HEADER.policy];

/** The access tiers (x-edge-access; the geoblock answer's `access`). */
export type Access = 'blocked' | 'close-only' | 'full';

/**
 * Each tier's strictness, higher stricter (the stricter of two classifications wins:
 * geo-secondary.ts). Complete by the compiler, so a new tier must be ranked.
 */
export const ACCESS_RANK = Object.freeze({ blocked: 2, 'close-only': 1, full: 0 } as const satisfies Record<Access, number>);

/**
 * x-edge-jurisdiction when the edge determined none: a trusted address (GEO_TRUSTED_CIDRS, never
 * looked up) or an address without a country that GEO_UNKNOWN lets through. `ZZ` is the ISO 3166
 * user-assigned code CLDR uses for "unknown region"; it never collides with a real country.
 */
export const JURISDICTION_NONE = 'ZZ';

/** The ext_authz dynamic-metadata key under which an accepted order's base64 payload travels to the Lua filter. */
export const ORDER_PAYLOAD_METADATA_KEY = 'order_payload';

/**
 * The dynamic-metadata key that, instead of the payload itself, tells the Lua filter where the
 * payload's base64 text lies in the body Envoy buffered: `<start>:<length>`, byte offsets of the
 * text between the JSON string's quotes. Used when the Check carried the exact bytes (raw_body)
 * and the string has no escapes, so those bytes are the base64 text; else ORDER_PAYLOAD_METADATA_KEY.
 */
export const ORDER_PAYLOAD_AT_METADATA_KEY = 'order_payload_at';

/**
 * The global rate limit's protocol contract (envoy.service.ratelimit.v3.RateLimitService): the
 * domain Envoy's ratelimit filter asks for and the descriptors its actions produce — the same
 * two the local limiter uses. Exactly one matches a request: an IPv4 client (an IPv4-mapped one
 * already written as its IPv4 in x-edge-client-ip) `[client=v4, client_ip=<address>]`, an IPv6
 * client `[client=v6, masked_remote_address=<its /64>]` (Envoy writes `2001:db8:3:ffff::/64`).
 * An IPv6 client's request also carries its prefix's (RATE_PREFIX_V6, default /48)
 * `[prefix=v6, masked_remote_address=<its /48>]` (`2001:db8:3::/48`): the coarser bucket of one
 * subscriber's allocation, taken with the client's. The TS service (authz/src/ratelimit/) and another implementation's rendered config
 * (envoy/render/global-rate-limit.ts) both key on these.
 */
export const RATE_LIMIT = {
  domain: 'edge',
  familyKey: 'client',
  v4: 'v4',
  v6: 'v6',
  v4AddressKey: 'client_ip',
  v6AddressKey: 'masked_remote_address',
  /** The prefix an IPv6 client is masked to (one end site). */
  v6PrefixLength: 64,
  /** The prefix descriptor's first entry: `[prefix=v6, masked_remote_address=<prefix>]`. */
  prefixKey: 'prefix',
  /**
   * The most one bucket answer may take (Envoy's ratelimit filter timeout, or the Check's own
   * bound when the Check takes the bucket); past it the request fails open to the local limit.
   */
  timeoutMs: 100,
} as const;
