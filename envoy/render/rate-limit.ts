/**
 * The local rate limit: one token bucket per client address in each Envoy, and the descriptors
 * it shares with the global limit (global-rate-limit.ts).
 */
import type { Config } from '../../authz/src/common/config.ts';
import { RATE_LIMIT } from '../../authz/src/common/contract.ts';
import { LOCAL_RATE_LIMIT_DESCRIPTOR_CAP } from './budget.ts';
import { overwriteHeader, typedExtension, type JsonObject, type RenderOptions, type TypedExtension } from './common.ts';
import { CLIENT_IP_HEADER, FILTER, TYPE_URL } from './names.ts';

const PERCENT_100 = { numerator: 100, denominator: 'HUNDRED' } as const;

/**
 * Per-client-address descriptors. The client is the address header_mutation (before the
 * limiters) wrote into x-edge-client-ip, where an IPv4-mapped address (`::ffff:a.b.c.d`, as some
 * dual-stack proxies write IPv4 clients in X-Forwarded-For) is already its IPv4: both forms draw
 * from one bucket (docs/api.md "Client address, geo and rate limit"). An IPv6 client is its /64: one end site holds at least that many
 * addresses and could otherwise take a fresh bucket per request. Envoy cannot mask a header, so
 * two descriptors split the two families: IPv4 keyed on the header, IPv6 on the masked address.
 * Exactly one of the two produces a descriptor for a request (expect_match false/true).
 *
 * An IPv6 client's request also produces its prefix's descriptor (RATE_PREFIX_V6, default /48,
 * unless 64): a subscriber gets a /56 or a /48, i.e. 256 or 65,536 /64s, each with a fresh
 * bucket; the prefix's bucket is that subscriber's one budget (docs/api.md "Client address, geo
 * and rate limit"). An IPv4 client gets none: its address is already the smallest unit a
 * subscriber holds (often shared, behind CGNAT), and a per-/32 bucket five times the client's
 * could never refuse what the client's own let through: a descriptor per client for nothing.
 */
export const RATE_LIMIT_V6_PREFIX = RATE_LIMIT.v6PrefixLength;
const IS_V6 = { name: CLIENT_IP_HEADER, string_match: { contains: ':' } };

/** True when IPv6 clients also draw from their prefix's bucket (RATE_PREFIX_V6 < 64). */
export function prefixBucket(config: Config): boolean {
  return config.ratePrefixV6 < RATE_LIMIT_V6_PREFIX;
}

/**
 * The rate_limits (descriptor actions) both limiters use: [client=v4, client_ip] or
 * [client=v6, masked_remote_address] and then, for IPv6, [prefix=v6, masked_remote_address].
 */
export function clientRateLimits(config: Config): JsonObject[] {
  return [
    { actions: [
      { header_value_match: { descriptor_key: RATE_LIMIT.familyKey, descriptor_value: RATE_LIMIT.v4, expect_match: false, headers: [IS_V6] } },
      { request_headers: { header_name: CLIENT_IP_HEADER, descriptor_key: RATE_LIMIT.v4AddressKey } },
    ] },
    { actions: [
      { header_value_match: { descriptor_key: RATE_LIMIT.familyKey, descriptor_value: RATE_LIMIT.v6, expect_match: true, headers: [IS_V6] } },
      { masked_remote_address: { v4_prefix_mask_len: 32, v6_prefix_mask_len: RATE_LIMIT_V6_PREFIX } },
    ] },
    ...(prefixBucket(config) ? [{ actions: [
      { header_value_match: { descriptor_key: RATE_LIMIT.prefixKey, descriptor_value: RATE_LIMIT.v6, expect_match: true, headers: [IS_V6] } },
      { masked_remote_address: { v4_prefix_mask_len: 32, v6_prefix_mask_len: config.ratePrefixV6 } },
    ] }] : []),
  ];
}

/**
 * What a 429 of the local bucket carries when the global limit runs too (its own x-ratelimit
 * headers are off then, so a forwarded request carries only the global budget's): the values the
 * local filter itself writes on a 429 with a 1-s fill interval (limit = RATE_BURST, none
 * remaining, the next token within 1 s), so a 429 looks the same whichever stage refused it.
 */
export function local429Headers(config: Config): [string, string][] {
  return [['x-ratelimit-limit', String(config.rateBurst)], ['x-ratelimit-remaining', '0'], ['x-ratelimit-reset', '1'], LOCAL_RETRY_AFTER];
}

/**
 * Retry-After (RFC 9110 §10.2.3) on every 429 of the local bucket, in either scope: the seconds
 * until the bucket that refused has a token. Static and exact: both buckets (the client's and the
 * prefix's) refill continuously at an integer rate ≥ 1 per second (tokens_per_fill over a 1-s
 * fill_interval; checked on 1.40: at 5/s a token every 200 ms), so the next token is at most 1 s
 * away, i.e. 1 in whole seconds — the value of the `x-ratelimit-reset` the filter writes on its
 * 429s (its own draft-03 headers in `local` scope, local429Headers in `global`). The filter adds
 * response_headers_to_add to the requests it limits only (local_rate_limit.proto), so an allowed
 * response never carries it. Envoy has no formatter to compute a value there, and needs none.
 */
export const LOCAL_RETRY_AFTER: [string, string] = ['retry-after', '1'];

/**
 * Per-client-address token bucket (dynamic descriptors, Envoy ≥ 1.34). One bucket per
 * client, shared by all workers of this Envoy instance; an LRU keeps at most
 * `max_dynamic_descriptors` of them. With RATE_LIMIT_SCOPE=global it stays the first stage:
 * a burst on one replica is refused here without a round trip to the rate limit service.
 */
export function rateLimitFilter(config: Config, opts: Pick<RenderOptions, 'maxDynamicDescriptors'> = {}): TypedExtension {
  const bucket = { max_tokens: config.rateBurst, tokens_per_fill: config.rpsPerIp, fill_interval: '1s' };
  const global = config.rateLimitScope === 'global';
  return typedExtension(FILTER.rateLimit, TYPE_URL.localRateLimit, {
    stat_prefix: 'per_client_ip',
    filter_enabled: { default_value: PERCENT_100, runtime_key: 'edge.rate_limit.enabled' },
    filter_enforced: { default_value: PERCENT_100, runtime_key: 'edge.rate_limit.enforced' },
    // Only the per-address bucket is charged (no shared default bucket).
    always_consume_default_token_bucket: false,
    // Per LRU (one per wildcard descriptor): every client one Envoy core meets within a bucket's
    // refill time, so eviction never drops a bucket that is not full again (budget.ts).
    max_dynamic_descriptors: opts.maxDynamicDescriptors ?? LOCAL_RATE_LIMIT_DESCRIPTOR_CAP,
    // Global scope: the global stage writes the headers of the real (global) budget; this stage
    // writes its own only on its 429s (a forwarded request would carry both sets otherwise).
    // Unset is OFF; never write `OFF`: Envoy's YAML reads that bare word as the boolean false.
    enable_x_ratelimit_headers: global ? undefined : 'DRAFT_VERSION_03',
    response_headers_to_add: (global ? local429Headers(config) : [LOCAL_RETRY_AFTER]).map(([k, v]) => overwriteHeader(k, v)),
    rate_limits: clientRateLimits(config),
    // No value on the address entry: a wildcard, i.e. one bucket per distinct value.
    descriptors: [
      { entries: [{ key: RATE_LIMIT.familyKey, value: RATE_LIMIT.v4 }, { key: RATE_LIMIT.v4AddressKey }], token_bucket: bucket },
      { entries: [{ key: RATE_LIMIT.familyKey, value: RATE_LIMIT.v6 }, { key: RATE_LIMIT.v6AddressKey }], token_bucket: bucket },
      ...(prefixBucket(config) ? [{ entries: [{ key: RATE_LIMIT.prefixKey, value: RATE_LIMIT.v6 }, { key: RATE_LIMIT.v6AddressKey }],
        token_bucket: { max_tokens: config.prefixBurst, tokens_per_fill: config.rpsPerPrefix, fill_interval: '1s' } }] : []),
    ],
  });
}
