/**
 * Cross-setting warnings: combinations of settings that each load but contradict one another,
 * reported at start-up (not refused). Reads a loaded Config only, never the environment.
 */
import { RATE_LIMIT } from '../contract.ts';
import type { Config } from './types.ts';

/**
 * Settings that each load but contradict one another in a way the operator must hear about at
 * start-up (logged as warnings, not refused: each limit keeps its documented meaning).
 * - ORDER_MAX_BYTES below the compact JSON of the largest valid order (the longest marketId, a
 *   10-digit deadline, the longest size up to ORDER_MAX_SIZE, an ORDER_PAYLOAD_MAX_BYTES payload
 *   in base64):
 *   such orders pass every authz rule but get 413 payload_too_large from Envoy first.
 */
export function configWarnings(c: Config): string[] {
  const out: string[] = [];
  // size: ORDER_MAX_SIZE's integer digits plus a point and 18 decimals (the most a size may
  // carry), or 40 characters when no maximum is set.
  const sizeChars = c.orderMaxSize === undefined ? 40 : (c.orderMaxSize.split('.')[0] ?? '').length + 19;
  const largestOrder = JSON.stringify({
    marketId: 'x'.repeat(128), deadline: 9_999_999_999, size: '9'.repeat(sizeChars), payload: '',
  }).length + 4 * Math.ceil(c.orderPayloadMaxBytes / 3);
  if (largestOrder > c.orderMaxBytes) {
    out.push(`ORDER_MAX_BYTES=${c.orderMaxBytes} is below the largest valid order (${largestOrder} bytes of compact JSON: an `
      + `ORDER_PAYLOAD_MAX_BYTES=${c.orderPayloadMaxBytes} payload in base64 plus its envelope); such orders get 413 `
      + `payload_too_large. Raise ORDER_MAX_BYTES to ${largestOrder} or lower ORDER_PAYLOAD_MAX_BYTES.`);
  }
  if (c.redisMinReplicas === 0 && c.redisUrl?.startsWith('redis+sentinel://') === true) {
    out.push('REDIS_URL names Sentinels but REDIS_MIN_REPLICAS=0: an acknowledged ingest or nonce can be missing on the replica '
      + 'a failover promotes, and that signed ingest is then accepted again. Set REDIS_MIN_REPLICAS=1 (docs/operations.md "Redis").');
  }
  // A nonce's write can queue behind a WAIT, then wait for the one in flight and its own; Redis
  // ends a WAIT on its clock tick (hz 10: up to 100 ms past the timeout).
  if (c.redisMinReplicas > 0 && 3 * (c.redisReplicaWaitMs + 100) >= c.authzTimeoutMs) {
    out.push(`REDIS_REPLICA_WAIT_MS=${c.redisReplicaWaitMs} is too long for AUTHZ_TIMEOUT_MS=${c.authzTimeoutMs}: an ingest's nonce `
      + `may wait for replicas three times, up to 100 ms longer each (${3 * (c.redisReplicaWaitMs + 100)} ms), so Envoy can give up `
      + 'first (503 all the same). Lower REDIS_REPLICA_WAIT_MS or raise AUTHZ_TIMEOUT_MS.');
  }
  // The global limit in the Check (docs/envoy.md §3) waits up to RATE_LIMIT.timeoutMs before the policy runs.
  if (c.rateLimitScope === 'global' && c.rateLimitService === undefined && c.authzTimeoutMs <= 2 * RATE_LIMIT.timeoutMs) {
    out.push(`AUTHZ_TIMEOUT_MS=${c.authzTimeoutMs} leaves little room for the global rate limit, which the Check waits for up to `
      + `${RATE_LIMIT.timeoutMs} ms before its policy: with Redis slow, Envoy can give up on the Check first (503). Raise AUTHZ_TIMEOUT_MS.`);
  }
  // An order or ingest is decided twice (header phase, then body phase), each Check up to
  // AUTHZ_TIMEOUT_MS, all inside REQUEST_BODY_TIMEOUT_MS (docs/envoy.md "Bodies and memory").
  if (c.requestBodyTimeoutMs <= 2 * c.authzTimeoutMs) {
    out.push(`REQUEST_BODY_TIMEOUT_MS=${c.requestBodyTimeoutMs} leaves no time for a body: an order or an ingest is decided twice `
      + `(before and after its body), each Check up to AUTHZ_TIMEOUT_MS=${c.authzTimeoutMs}, within it; a slow Check then ends `
      + 'in 408 instead of 503. Raise REQUEST_BODY_TIMEOUT_MS above 2 × AUTHZ_TIMEOUT_MS plus the time a body takes to arrive.');
  }
  if (c.rateLimitService !== undefined && c.rateLimitTokenFile === undefined) {
    out.push(`RATELIMIT_SERVICE_ADDRESS=${c.rateLimitService.host}:${c.rateLimitService.port} is set without RATELIMIT_SERVICE_TOKEN_FILE: `
      + 'this service serves no RateLimitService (calls are UNIMPLEMENTED). If that address is this service, set RATELIMIT_SERVICE_TOKEN_FILE '
      + 'for Envoy and for this service (docs/operations.md "Another rate limit service").');
  }
  // A region rule overrides its country's in both directions (docs/api.md "Jurisdiction tiers"):
  // said once at start-up where that loosens the country's tier, in case it was not meant.
  for (const r of c.closeOnlyRegions) {
    const cc = r.slice(0, 2);
    if (c.blockedCountries.has(cc)) {
      out.push(`CLOSE_ONLY_REGIONS lists ${r} inside ${cc}, which BLOCKED_COUNTRIES blocks: clients located in ${r} get close-only access, `
        + `not 451 (a region rule overrides its country's). Remove ${r} from CLOSE_ONLY_REGIONS if ${cc} is to be blocked everywhere.`);
    }
  }
  return out;
}
