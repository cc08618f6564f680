/**
 * The global rate limit taken inside the ext_authz Check (RATE_LIMIT_SCOPE=global with the TS
 * service as the limiter, i.e. RATELIMIT_SERVICE_ADDRESS unset): the same buckets as
 * RateLimitService (bucket.ts: key scheme, Lua script, limits, the keys clientKeys derives from
 * the address Envoy computed), without a second gRPC call per request.
 *
 * - Which Checks take it: those whose route Envoy marked (context_extensions `rate_limit:
 *   global`, envoy/render/ext-authz.ts): the only Check of a read, the header phase of an ingest or
 *   an order (before Envoy buffers its body; its body phase is not marked): one token per request.
 * - Two buckets for an IPv6 client: its /64's and its prefix's (RATE_PREFIX_V6), taken together,
 *   both or neither (bucket.ts); an IPv4 client has its own only.
 * - Over the limit: 429 `too many requests` with exactly the body Envoy's local reply writes for
 *   a 429 (json_format: the API's error JSON and a newline), whichever bucket refused, and the
 *   x-ratelimit-* headers of the refusing bucket, as the ratelimit filter's 429 carried them.
 * - Allowed: the x-ratelimit-* headers of the tighter bucket (fewer whole tokens left; limit =
 *   RATE_BURST or PREFIX_BURST, whole tokens left, seconds to the next token), added by Envoy to
 *   the response (bucket.ts `tighter`).
 * - Fail open: Redis failing (edge_ratelimit_redis_errors_total) or slower than RATE_LIMIT.timeoutMs
 *   (edge_ratelimit_late_total; Envoy's ratelimit filter had the same 100-ms timeout) lets the
 *   request go on without headers; each counts as edge_ratelimit_decisions_total{code="fail_open"}.
 *   The request still met Envoy's local per-replica bucket, which ran before ext_authz.
 */
import { RATE_LIMIT } from '../common/contract.ts';
import { ERROR_STATUS, errorJsonPrefix } from '../common/errors.ts';
import type { Logger } from '../common/log.ts';
import type { AuthzMetrics } from '../common/metrics.ts';
import type { AuthzInput } from '../authz/codec/request.ts';
import type { Decision, Header } from '../authz/decision.ts';
import { clientKeys, nextTokenUs, tighter, type BucketLimits, type Buckets, type BucketState, type Take } from './bucket.ts';

/** What the bucket said about one request. */
export interface LimitVerdict {
  /** The 429 to answer instead of evaluating the request; undefined when it may go on. */
  readonly denial?: Decision;
  /** The global budget's x-ratelimit-* headers for the response; undefined when it failed open. */
  readonly headers?: readonly Header[];
}

export interface CheckLimitDeps {
  readonly buckets: Buckets;
  readonly limits: BucketLimits;
  readonly metrics: AuthzMetrics;
  readonly logger: Logger;
  /** Bound on one bucket answer; default RATE_LIMIT.timeoutMs. */
  readonly timeoutMs?: number;
}

const FAIL_OPEN: LimitVerdict = Object.freeze({});

/** At most this many x-ratelimit-remaining headers are built at start-up (production bursts are tens). */
export const REMAINING_TABLE_MAX = 1024;

/**
 * At most this many distinct x-ratelimit-* triples (and, per base decision, allows encoded with
 * them) are kept; past it the cache starts afresh. Production bursts give a few hundred (limit ×
 * remaining × reset); bench:edge's 10^6 burst about as many (a bucket kept near full).
 */
export const TRIPLES_MAX = 4096;

/** Seconds until the bucket has one more whole token (0 when full), as the x-ratelimit-reset header writes it. */
export function resetSeconds(b: BucketState, rps: number): number {
  return Math.ceil(nextTokenUs(b, rps) / 1_000_000);
}

/**
 * Takes one token from the buckets of the client at `address` (x-edge-client-ip); never rejects.
 * The verdict at once when the token comes from this process's lease (bucket.ts LeasePolicy),
 * else once Redis answered. Undefined when `address` is not an address (not limited here).
 */
export type CheckLimiter = (address: string) => LimitVerdict | Promise<LimitVerdict> | undefined;

export function createCheckLimiter(deps: CheckLimitDeps): CheckLimiter {
  const { buckets, limits, metrics, logger } = deps;
  const timeoutMs = deps.timeoutMs ?? RATE_LIMIT.timeoutMs;
  const keyOf = clientKeys(limits.ratePrefixV6);
  // The header values answers usually carry, built once: x-ratelimit-limit of each bucket;
  // remaining ∈ [0, the larger burst] up to REMAINING_TABLE_MAX (a burst may be set up to
  // millions; a larger remainder is built per answer).
  const clientLimit: Header = ['x-ratelimit-limit', String(limits.rateBurst)];
  const prefixLimit: Header = ['x-ratelimit-limit', String(limits.prefixBurst)];
  const tableSize = Math.min(Math.max(limits.rateBurst, limits.prefixBurst), REMAINING_TABLE_MAX) + 1;
  const remainingHeaders: Header[] = Array.from({ length: tableSize }, (_, n) => ['x-ratelimit-remaining', String(n)]);
  const resetHeaders: Header[] = [];
  const resetHeader = (s: number): Header => (resetHeaders[s] ??= ['x-ratelimit-reset', String(s)]);
  // The triples themselves, one object per (bucket, remaining, reset) seen (withGlobalLimit keys
  // its encoded allows by the triple): at most TRIPLES_MAX, then started afresh.
  const triples = new Map<number, readonly Header[]>();
  const headersOf = (t: Take): readonly Header[] => {
    const prefix = tighter(t, 1, limits) === 'prefix';
    const b: BucketState = prefix ? t.prefix! : t;
    const reset = resetSeconds(b, prefix ? limits.rpsPerPrefix : limits.rpsPerIp);
    // remaining ≤ 5 × 10^7 (PREFIX_BURST's most) and reset < 2^16 in practice: a safe integer.
    const key = reset < 65536 ? ((b.remaining * 2 + (prefix ? 1 : 0)) * 65536) + reset : -1;
    let h = triples.get(key);
    if (h === undefined) {
      h = Object.freeze([prefix ? prefixLimit : clientLimit, remainingHeaders[b.remaining] ?? ['x-ratelimit-remaining', String(b.remaining)], resetHeader(reset)]);
      if (key >= 0) {
        if (triples.size >= TRIPLES_MAX) triples.clear();
        triples.set(key, h);
      }
    }
    return h;
  };
  // The 429s, one per distinct header set (a refused take has nothing left: in practice a few).
  const prefix = errorJsonPrefix('too many requests');
  const denials = new Map<string, Decision>();
  const denialOf = (t: Take): Decision => {
    const h = headersOf(t);
    const key = `${h[0]![1]}|${h[1]![1]}|${h[2]![1]}`;
    let d = denials.get(key);
    if (d === undefined) {
      d = {
        allow: false,
        code: 'too many requests',
        httpStatus: ERROR_STATUS['too many requests'],
        reason: 'too many requests:global',
        // Retry-After (RFC 9110 §10.2.3): the seconds until the refusing bucket has a token, the
        // value of x-ratelimit-reset (≥ 1: a bucket that refuses has its next token ahead).
        headers: Object.freeze([['content-type', 'application/json'], ...h, ['retry-after', h[2]![1]]] as Header[]),
        body: `${prefix},"requestId":null}\n`,
        bodyPrefix: prefix,
        bodyEnd: '\n',
      };
      if (denials.size < 1024) denials.set(key, d);
    }
    return d;
  };

  let failing = false;
  const failOpen = (err: unknown): LimitVerdict => {
    metrics.rateLimitRedisError();
    metrics.rateLimit('fail_open');
    if (!failing) {
      failing = true;
      logger.warn({ err: String(err) }, 'global rate limit: Redis unavailable, requests meet only each Envoy\'s local per-client limit until it is back');
    }
    return FAIL_OPEN;
  };
  const answered = (t: Take): LimitVerdict => {
    if (failing) {
      failing = false;
      logger.info('global rate limit: Redis answers again');
    }
    if (!t.allowed) {
      metrics.rateLimit('over_limit');
      return { denial: denialOf(t) };
    }
    metrics.rateLimit('ok');
    return { headers: headersOf(t) };
  };

  return (address) => {
    const key = keyOf(address);
    if (key === undefined) return undefined;
    const leased = buckets.takeLeased?.(key.client, key.prefix);
    if (leased !== undefined) return answered(leased);
    return new Promise<LimitVerdict>((resolve) => {
      let done = false;
      // The verdict in the check phase, after the poll phase has read every ready socket: after
      // an event-loop stall a reply already waiting in the socket wins over the due timer (the
      // same rule as EdgeRedis's command deadline, authz/src/common/adapters/redis.ts).
      const timer = setTimeout(() => setImmediate(() => {
        if (done) return;
        done = true;
        metrics.rateLimitLate();
        metrics.rateLimit('fail_open');
        resolve(FAIL_OPEN);
      }), timeoutMs);
      buckets.take(key.client, 1, key.prefix).then((t) => {
        if (done) return;
        done = true;
        clearTimeout(timer);
        resolve(answered(t));
      }, (err: unknown) => {
        if (done) return;
        done = true;
        clearTimeout(timer);
        resolve(failOpen(err));
      });
    });
  };
}

/**
 * A decision with the global budget's x-ratelimit-* headers for the client: an allow carries them
 * as response headers (OkHttpResponse.response_headers_to_add); a denial given after the bucket
 * let the request on among its own (Envoy's ratelimit filter added them to whatever answer followed).
 */
export function withLimitHeaders(d: Decision, headers: readonly Header[]): Decision {
  if (d.allow) return { ...d, responseHeaders: headers, encoded: undefined };
  return { ...d, headers: [...d.headers, ...headers], encoded: undefined };
}

type Evaluate = (input: AuthzInput) => Decision | Promise<Decision>;

/**
 * `decide` behind the global bucket: a Check Envoy marked (AuthzInput.globalLimit) takes one
 * token first, as Envoy's ratelimit filter ran before ext_authz, so a refused request reaches no
 * stage (no nonce is recorded for it, no ingest body is admitted). Envoy marks one Check per
 * request: an ingest's or an order's header phase, never its body phase. Unmarked Checks, and an
 * address that is not one, go straight to `decide` (the synchronous path stays synchronous).
 */
export function withGlobalLimit(limiter: CheckLimiter, decide: Evaluate): Evaluate {
  // An allow without a payload of its own (a read, an order's header phase: the shared ALLOW) with
  // one header triple (the limiter's triples are one object each) is the same response every time:
  // built once, so its bytes are encoded once (codec/response.ts caches them on the decision).
  // At most TRIPLES_MAX per base decision, then started afresh.
  const derived = new WeakMap<Decision, Map<readonly Header[], Decision>>();
  const withHeaders = (d: Decision, headers: readonly Header[]): Decision => {
    if (!d.allow || d.metadata !== undefined) return withLimitHeaders(d, headers);
    let byTriple = derived.get(d);
    if (byTriple === undefined) derived.set(d, byTriple = new Map());
    let out = byTriple.get(headers);
    if (out === undefined) {
      if (byTriple.size >= TRIPLES_MAX) byTriple.clear();
      out = withLimitHeaders(d, headers);
      byTriple.set(headers, out);
    }
    return out;
  };
  const apply = (input: AuthzInput, v: LimitVerdict): Decision | Promise<Decision> => {
    if (v.denial !== undefined) return v.denial;
    const headers = v.headers;
    const result = decide(input);
    if (headers === undefined) return result;
    return result instanceof Promise ? result.then((d) => withHeaders(d, headers)) : withHeaders(result, headers);
  };
  return (input) => {
    const verdict = input.globalLimit === true ? limiter(input.clientIp) : undefined;
    if (verdict === undefined) return decide(input);
    // A leased token answers at once: a read stays synchronous end to end.
    return verdict instanceof Promise ? verdict.then((v) => apply(input, v)) : apply(input, verdict);
  };
}
