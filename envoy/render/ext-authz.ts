/**
 * The two ext_authz filters (the header phase of ingests and orders, then the full check) and the
 * per-route check settings they read.
 */
import type { Config } from '../../authz/src/common/config.ts';
import { CONTEXT_EXTENSION, GLOBAL_LIMIT_IN_CHECK, HEADER_PHASE } from '../../authz/src/common/contract.ts';
import type { RouteKind } from '../../authz/src/common/routes.ts';
import { duration, typedConfig, typedExtension, type JsonObject, type RenderOptions, type TypedConfig, type TypedExtension } from './common.ts';
import { AUTHZ_HEADERS, CLUSTER, FILTER, TYPE_URL } from './names.ts';

export type { RouteKind };

function bodySettings(maxBytes: number): JsonObject {
  return { max_request_bytes: maxBytes, allow_partial_message: false, pack_as_bytes: true };
}

/** What both ext_authz filters share: the authz cluster, fail closed with 503, the headers sent. */
function extAuthzCommon(config: Config, opts: RenderOptions): JsonObject {
  return {
    transport_api_version: 'V3',
    grpc_service: { envoy_grpc: { cluster_name: CLUSTER.authz }, timeout: duration(config.authzTimeoutMs) },
    failure_mode_allow: false,
    status_on_error: { code: 'ServiceUnavailable' },
    allowed_headers: (opts.allowedHeaders ?? 'minimal') === 'minimal'
      ? { patterns: AUTHZ_HEADERS.map((h) => ({ exact: h })) }
      : undefined,
    include_peer_certificate: false,
    validate_mutations: true,
  };
}

/** ext_authz over gRPC: fail closed with 503; body rules are set per route. */
export function extAuthzFilter(config: Config, opts: RenderOptions): TypedExtension {
  return typedExtension(FILTER.extAuthz, TYPE_URL.extAuthz, {
    ...extAuthzCommon(config, opts),
    // Fallback for a route without its own check_settings (every route here has one): the
    // smaller of the two body limits.
    with_request_body: bodySettings(Math.min(config.orderMaxBytes, config.ingestMaxBytes)),
  });
}

/**
 * The header phase: a second ext_authz filter, disabled in the chain and enabled on the routes
 * that buffer a body (ingest, orders), that asks authz before any body is buffered
 * (context_extensions `phase: headers`). Everything that does not need the body is decided then:
 * geo (a blocked client's order or ingest is 451 before Envoy holds its body), the anonymizer
 * rule, the global rate limit when the Check takes it, and for an ingest the signature headers,
 * the timestamp window and the bound on pending ingest bodies per client address
 * (INGEST_MAX_PENDING_PER_CLIENT). So a request refused on its headers never has up to
 * INGEST_MAX_BYTES (ORDER_MAX_BYTES) buffered by Envoy and shipped to authz. The body phase that
 * follows runs the whole policy again (geo included: it is synchronous), without the bucket.
 */
export const HEADER_PHASE_CONTEXT = { [CONTEXT_EXTENSION.phase]: HEADER_PHASE } as const;

export function headerPhaseFilter(config: Config, opts: RenderOptions): TypedExtension {
  return {
    name: FILTER.headerPhase,
    disabled: true,
    // No with_request_body: this phase never waits for the body.
    typed_config: typedConfig(TYPE_URL.extAuthz, { ...extAuthzCommon(config, opts), stat_prefix: 'header_phase' }),
  };
}

/**
 * The ext_authz filter's per-route config: the route's body rule and its kind; with `globalLimit`
 * (a route with an upstream, the TS service the global limiter) the mark that makes its Check
 * take the global bucket (authz/src/ratelimit/check-limit.ts). Routes Envoy answers itself stay
 * under the local limit only, as with the ratelimit filter (which skips them). On the routes with
 * a header phase the mark goes to that phase instead (headerPhasePerRoute): one token per request,
 * taken before the body is buffered.
 *
 * `bodyLimit` is the route's own limit (its registry entry's, authz/src/common/routes.ts), never
 * chosen here by kind: a route without one has its body streamed to the upstream, not buffered.
 */
export function authzPerRoute(kind: RouteKind, bodyLimit: number | undefined, globalLimit = false): TypedConfig {
  const checkSettings = bodyLimit === undefined
    // Decided on method, path and client address; buffering a body would only add latency and
    // bytes on the wire. Bodies stream to the market service, which rejects them.
    ? { disable_request_body_buffering: true }
    : { with_request_body: bodySettings(bodyLimit) };
  return typedConfig(TYPE_URL.extAuthzPerRoute, {
    // Lets the authz service (and grpcurl/log readers) see which route Envoy chose.
    check_settings: {
      ...checkSettings,
      context_extensions: { [CONTEXT_EXTENSION.route]: kind, ...(globalLimit ? { [CONTEXT_EXTENSION.rateLimit]: GLOBAL_LIMIT_IN_CHECK } : {}) },
    },
  });
}

/**
 * The header-phase filter's per-route config, which enables it on a route whose body authz reads
 * (an ingest or an order); with `globalLimit` its Check takes the global bucket (the body phase's does not).
 */
export function headerPhasePerRoute(kind: RouteKind, globalLimit = false): TypedConfig {
  return typedConfig(TYPE_URL.extAuthzPerRoute, {
    check_settings: {
      disable_request_body_buffering: true,
      context_extensions: {
        [CONTEXT_EXTENSION.route]: kind, ...HEADER_PHASE_CONTEXT, ...(globalLimit ? { [CONTEXT_EXTENSION.rateLimit]: GLOBAL_LIMIT_IN_CHECK } : {}),
      },
    },
  });
}
