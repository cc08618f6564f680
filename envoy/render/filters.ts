/**
 * The HTTP filter chain, in order. Each filter lives with its concern; this file only decides
 * which run and in what order.
 */
import type { Config } from '../../authz/src/common/config.ts';
import { headerMutationFilter, xffGuardFilter } from './client-address.ts';
import { typedExtension, type RenderOptions, type TypedExtension } from './common.ts';
import { extAuthzFilter, headerPhaseFilter } from './ext-authz.ts';
import { bodyBufferFilter, globalLimitFilter, globalRateLimitFilter } from './global-rate-limit.ts';
import { FILTER, TYPE_URL } from './names.ts';
import { orderBodyFilter } from './order-body.ts';
import { rateLimitFilter } from './rate-limit.ts';
import { clientCertFilter } from './tls.ts';

/**
 * header_mutation → local_ratelimit → XFF guard (trusted hops only) → ext_authz header phase
 * (disabled; the ingest and orders routes enable it) → [RATELIMIT_SERVICE_ADDRESS: body buffer
 * (disabled; orders and ingest enable it) → ratelimit] → ext_authz (with the TS service as the
 * global limiter, its Check takes the global bucket) → order-body Lua (disabled; the orders route
 * enables it) → router.
 */
export function httpFilters(config: Config, opts: RenderOptions): TypedExtension[] {
  return [
    // header_mutation first: the rate limit and the XFF guard read the address it writes.
    headerMutationFilter(config),
    // With client certificates: the verified one's SHA-256, after header_mutation removed any client-sent copy.
    ...clientCertFilter(config),
    // The rate limit before the XFF guard: a refused X-Forwarded-For costs its sender (the TCP
    // peer) a token like any request (client-address.ts xffGuardFilter).
    rateLimitFilter(config, opts),
    ...(config.xffNumTrustedHops > 0 ? [xffGuardFilter()] : []),
    // Before anything that buffers a body: geo, the global bucket and the ingest's headers are decided first.
    headerPhaseFilter(config, opts),
    // The global limit after the local one (a burst on this replica never costs a round trip), and
    // after a body is whole (global-rate-limit.ts bodyBufferFilter: 413 before anything waits).
    ...(globalLimitFilter(config) ? [bodyBufferFilter(config), globalRateLimitFilter(config)] : []),
    extAuthzFilter(config, opts),
    orderBodyFilter(),
    // suppress_envoy_headers: responses never advertise x-envoy-upstream-service-time etc.
    typedExtension(FILTER.router, TYPE_URL.router, { suppress_envoy_headers: true }),
  ];
}
