/**
 * envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit on the TS service's gRPC port: the
 * global rate limit (RATE_LIMIT_SCOPE=global) that Envoy's envoy.filters.http.ratelimit asks
 * after its local bucket (docs/envoy.md §3).
 *
 * - Domain `edge`, the per-client descriptors and the prefix descriptor (contract.ts RATE_LIMIT).
 *   A client descriptor takes its client's token bucket in Redis (bucket.ts: RATE_BURST tokens
 *   refilled at RPS_PER_IP per second) and, for an IPv6 client, its prefix's (PREFIX_BURST,
 *   RPS_PER_PREFIX; RATE_PREFIX_V6), both or neither, exactly as the Check does; `hits_addend`
 *   tokens at a time (0, the default, counts as 1; a descriptor's own hits_addend wins). The
 *   prefix descriptor Envoy sends beside it is answered from that same take (one token per
 *   request, not two); a prefix descriptor without its client's descriptor in the request is not
 *   limited here. Another domain, or a descriptor it does not know, is answered OK with no limit
 *   (as envoyproxy/ratelimit answers what its config does not name).
 * - The answer carries the standard statuses (code, limit_remaining, duration_until_reset: the
 *   time to the next token; no current_limit, from which Envoy would write its own draft-03
 *   headers beside these: statusOf) and, as
 *   response_headers_to_add, the x-ratelimit-* headers in the local limiter's own format from
 *   the real global budget of the tighter bucket (bucket.ts `tighter`): limit = its burst, the
 *   whole tokens left, and the seconds until its next token (Envoy's draft-03 headers would write
 *   `20, 20;w=1`; it writes none without a current_limit). A refusal also carries `retry-after`, the
 *   refusing bucket's x-ratelimit-reset (≥ 1), which Envoy adds to its 429.
 * - Fail open: when Redis cannot take a bucket the descriptor is answered OK without headers,
 *   counted (edge_ratelimit_redis_errors_total, edge_ratelimit_decisions_total{code="fail_open"})
 *   and logged once per outage: the request meets only Envoy's local per-replica limit. An
 *   answer ready after the deadline Envoy sent (the filter's 100-ms timeout) is counted in
 *   edge_ratelimit_late_total: Envoy had already let that request through.
 * - Without Redis (REDIS_URL unset) there is nothing to share: every call is UNAVAILABLE (which
 *   Envoy also treats as "allowed") and health reports the service NOT_SERVING.
 * - Envoy is its only caller: a call without `authorization: Bearer <RATELIMIT_SERVICE_TOKEN_FILE's
 *   token>` is UNAUTHENTICATED before any bucket is touched (a caller that reaches the gRPC port
 *   could otherwise drain any client's bucket with hits_addend). Envoy sends the token from the
 *   file itself (an upstream credential injector on its ratelimit cluster: envoy/render/clusters.ts).
 *   app.ts registers the service only with that setting (and RATELIMIT_SERVICE_ADDRESS); otherwise
 *   the port does not serve it at all (UNIMPLEMENTED).
 */
import * as grpc from '@grpc/grpc-js';
import type { MethodDefinition, ServiceDefinition } from '@grpc/proto-loader';
import { loadPackageDefinition, SERVICE_NAMES } from '../../../proto/index.ts';
import { RATE_LIMIT } from '../common/contract.ts';
import type { Logger } from '../common/log.ts';
import type { AuthzMetrics } from '../common/metrics.ts';
import type { TokenCheck } from '../common/token.ts';
import { descriptorKeys, descriptorPrefix, nextTokenUs, tighter, type BucketLimits, type Buckets, type BucketState, type ClientKey, type Take } from './bucket.ts';
import { CODE, decodeRateLimitRequest, encodeRateLimitResponse, type DescriptorStatus, type RateLimitRequest, type RateLimitResponse } from './codec.ts';

/** A gRPC service beside Check on the same server (authz/grpc-server.ts registers it). */
export interface GrpcServiceRegistration {
  /** Fully qualified name (health and reflection). */
  readonly name: string;
  /** Its .proto file (relative to PROTO_INCLUDE_DIRS), described by reflection only when it is served. */
  readonly proto: string;
  readonly definition: grpc.ServiceDefinition;
  readonly implementation: grpc.UntypedServiceImplementation;
  /** False when it cannot serve at all: health reports NOT_SERVING for it whatever the server's state. */
  readonly available: boolean;
}

export interface RateLimitServiceDeps {
  /** The Redis buckets; undefined without REDIS_URL. */
  readonly buckets: Buckets | undefined;
  readonly limits: BucketLimits;
  readonly metrics: AuthzMetrics;
  readonly logger: Logger;
}

const NO_LIMIT: DescriptorStatus = { code: CODE.OK };
const RATE_LIMIT_PROTO = 'envoy/service/ratelimit/v3/rls.proto';

/** The x-ratelimit-* headers of one bucket, as the local limiter writes them. */
function headersOf(b: BucketState, burst: number, rps: number): [string, string][] {
  return [
    ['x-ratelimit-limit', String(burst)],
    ['x-ratelimit-remaining', String(b.remaining)],
    ['x-ratelimit-reset', String(Math.ceil(nextTokenUs(b, rps) / 1_000_000))],
  ];
}

/**
 * A descriptor's status from one bucket of a take: code, limit_remaining, duration_until_reset;
 * not current_limit. Envoy's ratelimit filter writes its own draft-03 x-ratelimit-* headers from
 * the statuses that carry a current_limit (ratelimit_headers.cc skips the others), and this
 * service writes its own (response_headers_to_add, the local filter's format): with both, a
 * response carried every header twice (`x-ratelimit-remaining: 39, 39`).
 */
function statusOf(t: Take, b: BucketState, hits: number, rps: number): DescriptorStatus {
  return { code: !t.allowed && b.remaining < hits ? CODE.OVER_LIMIT : CODE.OK, remaining: b.remaining, resetMs: nextTokenUs(b, rps) / 1000 };
}

/** A client descriptor's take (undefined: Redis failed, answered OK). */
interface Outcome {
  readonly take: Take | undefined;
  readonly hits: number;
}

/** The decision for one request, from the Redis buckets; never rejects. */
export function createRateLimitHandler(deps: RateLimitServiceDeps): (req: RateLimitRequest) => Promise<RateLimitResponse> {
  const { buckets, limits, metrics, logger } = deps;
  let failing = false;
  const takeOne = async (b: Buckets, key: ClientKey, hits: number): Promise<Outcome> => {
    try {
      const take = await b.take(key.client, hits, key.prefix);
      if (failing) {
        failing = false;
        logger.info('global rate limit: Redis answers again');
      }
      return { take, hits };
    } catch (err) {
      metrics.rateLimitRedisError();
      if (!failing) {
        failing = true;
        logger.warn({ err: String(err) }, 'global rate limit: Redis unavailable, answering OK (each Envoy keeps its local per-client limit) until it is back');
      }
      return { take: undefined, hits };
    }
  };
  return async (req) => {
    const known = req.domain === RATE_LIMIT.domain && buckets !== undefined;
    const keys = req.descriptors.map((d) => (known ? descriptorKeys(d.entries, limits.ratePrefixV6) : undefined));
    const outcomes = await Promise.all(keys.map((k, i) => (k === undefined ? undefined
      : takeOne(buckets!, k, Math.max(1, req.descriptors[i]!.hitsAddend ?? req.hitsAddend)))));
    let headers: [string, string][] = [];
    let tightest = Infinity;
    const statuses = req.descriptors.map((d, i): DescriptorStatus => {
      const o = outcomes[i];
      if (o !== undefined) {
        if (o.take === undefined) return NO_LIMIT;
        const t = o.take;
        const prefix = tighter(t, o.hits, limits) === 'prefix';
        const b: BucketState = prefix ? t.prefix! : t;
        // The headers of the tightest answer: a refusal before any grant, then the fewest tokens left.
        const rank = (t.allowed ? 1 : 0) * 1e12 + b.remaining;
        if (rank < tightest) {
          tightest = rank;
          headers = prefix ? headersOf(b, limits.prefixBurst, limits.rpsPerPrefix) : headersOf(b, limits.rateBurst, limits.rpsPerIp);
        }
        return statusOf(t, t, o.hits, limits.rpsPerIp);
      }
      // A prefix descriptor: answered from the take of its client's descriptor in this request.
      const prefix = known ? descriptorPrefix(d.entries, limits.ratePrefixV6) : undefined;
      if (prefix === undefined) return NO_LIMIT;
      const j = keys.findIndex((k) => k?.prefix === prefix);
      const mine = j === -1 ? undefined : outcomes[j];
      if (mine?.take?.prefix === undefined) return NO_LIMIT;
      return statusOf(mine.take, mine.take.prefix, mine.hits, limits.rpsPerPrefix);
    });
    const overall = outcomes.some((o) => o?.take?.allowed === false) ? CODE.OVER_LIMIT : CODE.OK;
    // Retry-After on the 429 Envoy answers: the refusing bucket's x-ratelimit-reset (≥ 1 s).
    if (overall === CODE.OVER_LIMIT) headers = [...headers, ['retry-after', headers[2]![1]]];
    const failed = outcomes.some((o) => o !== undefined && o.take === undefined);
    metrics.rateLimit(overall === CODE.OVER_LIMIT ? 'over_limit' : failed ? 'fail_open' : 'ok');
    return { overall, statuses, headers };
  };
}

/** The RateLimitService registration for the gRPC server (lean codec: codec.ts), answering only callers with `token`. */
export function rateLimitService(deps: RateLimitServiceDeps & { readonly token: TokenCheck }): GrpcServiceRegistration {
  const pd = loadPackageDefinition();
  const def = pd[SERVICE_NAMES.rateLimit] as ServiceDefinition;
  const method = def['ShouldRateLimit'] as MethodDefinition<object, object>;
  const definition = {
    ShouldRateLimit: { ...method, requestDeserialize: decodeRateLimitRequest, responseSerialize: encodeRateLimitResponse },
  } as unknown as grpc.ServiceDefinition;
  const decide = createRateLimitHandler(deps);
  // Refused calls are logged at most once per 10 s (a local caller could otherwise fill the log).
  let refused = 0;
  let lastLog = -Infinity;
  const shouldRateLimit: grpc.handleUnaryCall<RateLimitRequest, RateLimitResponse> = (call, callback) => {
    const auth = call.metadata.get('authorization');
    if (auth.length !== 1 || !deps.token.accepts(String(auth[0]))) {
      refused++;
      if (Date.now() - lastLog >= 10_000) {
        lastLog = Date.now();
        deps.logger.warn({ peer: call.getPeer(), refusedSoFar: refused }, 'RateLimitService call refused: no valid token (only Envoy may ask)');
      }
      callback({ code: grpc.status.UNAUTHENTICATED, details: 'RateLimitService answers Envoy only: authorization: Bearer <RATELIMIT_SERVICE_TOKEN_FILE token>' });
      return;
    }
    if (deps.buckets === undefined) {
      callback({ code: grpc.status.UNAVAILABLE, details: 'no rate limit store: REDIS_URL is unset (RATE_LIMIT_SCOPE=local)' });
      return;
    }
    decide(call.request).then((res) => {
      const deadline = call.getDeadline();
      if (deadline !== Infinity && Date.now() > Number(deadline)) deps.metrics.rateLimitLate();
      callback(null, res);
    }, (err: unknown) => callback({ code: grpc.status.INTERNAL, details: String(err) }));
  };
  return { name: SERVICE_NAMES.rateLimit, proto: RATE_LIMIT_PROTO, definition, implementation: { ShouldRateLimit: shouldRateLimit }, available: deps.buckets !== undefined };
}
