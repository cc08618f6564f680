/**
 * The global rate limit (RATE_LIMIT_SCOPE=global), two ways (docs/envoy.md §3):
 * - the TS service as the limiter (RATELIMIT_SERVICE_ADDRESS unset): the ext_authz Check the
 *   request already makes takes the bucket (authz/src/ratelimit/check-limit.ts); Envoy only marks
 *   the routes whose Check takes it (context_extensions, ext-authz.ts) and has no ratelimit filter;
 * - another implementation (RATELIMIT_SERVICE_ADDRESS): envoy.filters.http.ratelimit after the
 *   local bucket, asking that RateLimitService (envoy.service.ratelimit.v3) for the same per-client
 *   descriptors; and its config (envoyproxy/ratelimit), rendered from the same settings.
 */
import { stringify } from 'yaml';
import type { Config } from '../../authz/src/common/config.ts';
import { RATE_LIMIT } from '../../authz/src/common/contract.ts';
import { duration, typedConfig, typedExtension, type TypedConfig, type TypedExtension } from './common.ts';
import { CLUSTER, FILTER, TYPE_URL } from './names.ts';
import { clientRateLimits, prefixBucket } from './rate-limit.ts';

/**
 * True when the ext_authz Check takes the global bucket (the TS service is the limiter): one gRPC
 * call per request instead of two (measured in docs/benchmarks.md, "Edge data plane").
 */
export function globalLimitInCheck(config: Config): boolean {
  return config.rateLimitScope === 'global' && config.rateLimitService === undefined;
}

/** True when Envoy's ratelimit filter asks another RateLimitService (RATELIMIT_SERVICE_ADDRESS). */
export function globalLimitFilter(config: Config): boolean {
  return config.rateLimitScope === 'global' && config.rateLimitService !== undefined;
}

/**
 * Envoy's deadline for one ShouldRateLimit (the filter's own `timeout`; Envoy's default is
 * 20 ms). Past it, or with the service unreachable, the request goes on as if allowed (fail
 * open): the local bucket before this filter still holds each client to RPS_PER_IP/RATE_BURST
 * per replica (docs/envoy.md §3). 50 ms was too short on the test machine (2 vCPUs for two
 * edges): a burst of 120 concurrent requests from one client had its 40 calls to one edge's TS
 * process time out and pass on the local limit; 100 ms held every time.
 */
export const RATE_LIMIT_SERVICE_TIMEOUT_MS = RATE_LIMIT.timeoutMs;

/**
 * The ratelimit filter (RATELIMIT_SERVICE_ADDRESS): same descriptors as the local bucket
 * (filter-level `rate_limits`, so every route that has an upstream cluster is covered), fail open,
 * 429 answered like the local one.
 * - The TS service's RateLimitService, when an Envoy is pointed at it, writes the x-ratelimit-*
 *   headers itself (response_headers_to_add, in the local filter's format); without
 *   RATELIMIT_SERVICE_ADDRESS this filter is not rendered (the Check takes the bucket), so it
 *   always writes Envoy's draft-03 headers from the descriptor statuses.
 * - `x-envoy-ratelimited` is not added: a 429 carries exactly what the local one does.
 */
export function globalRateLimitFilter(config: Config): TypedExtension {
  return typedExtension(FILTER.globalRateLimit, TYPE_URL.rateLimit, {
    domain: RATE_LIMIT.domain,
    timeout: duration(RATE_LIMIT_SERVICE_TIMEOUT_MS),
    failure_mode_deny: false,
    // Unset is OFF (a bare `OFF` would be read by Envoy's YAML as the boolean false).
    enable_x_ratelimit_headers: config.rateLimitService === undefined ? undefined : 'DRAFT_VERSION_03',
    disable_x_envoy_ratelimited_header: true,
    rate_limit_service: { transport_api_version: 'V3', grpc_service: { envoy_grpc: { cluster_name: CLUSTER.rateLimit } } },
    rate_limits: clientRateLimits(config),
  });
}

/**
 * The whole request body, buffered before the ratelimit filter on the routes that have one (orders,
 * ingest): disabled in the chain, switched on per route with that route's limit. Only with the
 * filter (RATELIMIT_SERVICE_ADDRESS): with the bucket taken in Check nothing waits before ext_authz.
 *
 * Why: while a filter waits for an answer (here the rate limit service) Envoy keeps reading the
 * body only up to the connection's buffer limit (32 KiB) and then stops reading (watermark). The
 * ext_authz filter after it raises the limit to the route's and buffers; over that, Envoy answers
 * 413 — but with the body read in one piece during the wait, ext_authz got it whole and asked authz
 * with an oversized body, and a client that sends its whole body before reading (Node's fetch) never
 * saw the 413 (checked on 1.40: 66,700 bytes to a 65,536-byte order route). Buffered first, a body
 * over the limit is answered 413 while it is still read, before the rate limit service or authz
 * is asked, as without the global limit.
 */
export function bodyBufferFilter(config: Config): TypedExtension {
  return { name: FILTER.bodyBuffer, disabled: true, typed_config: typedConfig(TYPE_URL.buffer, { max_request_bytes: Math.min(config.orderMaxBytes, config.ingestMaxBytes) }) };
}

/** The buffer filter's per-route config, which enables it with the route's body limit. */
export function bodyBufferPerRoute(maxBytes: number): TypedConfig {
  return typedConfig(TYPE_URL.bufferPerRoute, { buffer: { max_request_bytes: maxBytes } });
}

/**
 * The same limit as an envoyproxy/ratelimit config file (its `config/*.yaml`): domain, the two
 * client descriptors at RPS_PER_IP per second and the prefix descriptor at RPS_PER_PREFIX. That
 * service counts fixed one-second windows, so it has no burst: RATE_BURST and PREFIX_BURST stay
 * the local stage's; and it keeps each descriptor as a counter of its own, checked and counted
 * in separate Redis commands, not as one atomic take (docs/operations.md, "Another rate limit
 * service").
 */
export function rateLimitServiceConfig(config: Config): string {
  const limit = { unit: 'second', requests_per_unit: config.rpsPerIp };
  const doc = {
    domain: RATE_LIMIT.domain,
    descriptors: [
      { key: RATE_LIMIT.familyKey, value: RATE_LIMIT.v4, descriptors: [{ key: RATE_LIMIT.v4AddressKey, rate_limit: limit }] },
      { key: RATE_LIMIT.familyKey, value: RATE_LIMIT.v6, descriptors: [{ key: RATE_LIMIT.v6AddressKey, rate_limit: limit }] },
      ...(prefixBucket(config) ? [{ key: RATE_LIMIT.prefixKey, value: RATE_LIMIT.v6,
        descriptors: [{ key: RATE_LIMIT.v6AddressKey, rate_limit: { unit: 'second', requests_per_unit: config.rpsPerPrefix } }] }] : []),
    ],
  };
  const settings = prefixBucket(config) ? `RPS_PER_IP=${config.rpsPerIp}, RATE_PREFIX_V6=${config.ratePrefixV6}, RPS_PER_PREFIX=${config.rpsPerPrefix}` : `RPS_PER_IP=${config.rpsPerIp}`;
  return `# Generated by envoy/render.ts from the environment (${settings}) for envoyproxy/ratelimit. Do not edit.\n`
    + stringify(doc, { lineWidth: 0 });
}
