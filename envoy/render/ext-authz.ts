/**
 * The two ext_authz filters (the ingest's header phase, then the full check) and the per-route
 * check settings they read.
 */
import type { Config } from '../../authz/src/common/config.ts';
import { CONTEXT_EXTENSION, GLOBAL_LIMIT_IN_CHECK, HEADER_PHASE, type RouteKind } from '../../authz/src/common/contract.ts';
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
 * The ingest's header phase: a second ext_authz filter, disabled in the chain and enabled on the
 * ingest route, that asks authz before any body is buffered (context_extensions `phase:
 * headers`). What the headers alone decide (missing or malformed signature headers, a timestamp
 * outside the window) is answered then, so such a request never has up to INGEST_MAX_BYTES
 * buffered by Envoy and shipped to authz. The body phase that follows runs the whole policy.
 */
export const INGEST_HEADER_PHASE = { [CONTEXT_EXTENSION.phase]: HEADER_PHASE } as const;

export function ingestHeadersFilter(config: Config, opts: RenderOptions): TypedExtension {
  return {
    name: FILTER.ingestHeaders,
    disabled: true,
    // No with_request_body: this phase never waits for the body.
    typed_config: typedConfig(TYPE_URL.extAuthz, { ...extAuthzCommon(config, opts), stat_prefix: 'ingest_headers' }),
  };
}

/**
 * The ext_authz filter's per-route config: the route's body rule and its kind; with `globalLimit`
 * (a route with an upstream, the TS service the global limiter) the mark that makes its Check
 * take the global bucket (authz/src/ratelimit/check-limit.ts). Routes Envoy answers itself stay
 * under the local limit only, as with the ratelimit filter (which skips them).
 */
export function authzPerRoute(kind: RouteKind, config: Config, globalLimit = false): TypedConfig {
  const checkSettings = kind === 'read' || kind === 'geoblock'
    // Reads: authz decides on method, path and client address; buffering a body would only
    // add latency and bytes on the wire. Bodies stream to the market service, which rejects them.
    ? { disable_request_body_buffering: true }
    : { with_request_body: bodySettings(kind === 'ingest' ? config.ingestMaxBytes : config.orderMaxBytes) };
  return typedConfig(TYPE_URL.extAuthzPerRoute, {
    // Lets the authz service (and grpcurl/log readers) see which route Envoy chose.
    check_settings: {
      ...checkSettings,
      context_extensions: { [CONTEXT_EXTENSION.route]: kind, ...(globalLimit ? { [CONTEXT_EXTENSION.rateLimit]: GLOBAL_LIMIT_IN_CHECK } : {}) },
    },
  });
}

/** The header-phase filter's per-route config, which enables it on the ingest route. */
export function ingestHeadersPerRoute(): TypedConfig {
  return typedConfig(TYPE_URL.extAuthzPerRoute, {
    check_settings: { disable_request_body_buffering: true, context_extensions: { [CONTEXT_EXTENSION.route]: 'ingest', ...INGEST_HEADER_PHASE } },
  });
}
