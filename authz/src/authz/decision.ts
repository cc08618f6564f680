/**
 * One result type for every stage: a Decision. Denials are built once (at start-up or on
 * first use) and reused, so their wire encoding can be cached too (see authz/codec/response.ts);
 * the one per-request part of a denial is the request id at the end of its body (denialBody).
 */
import { ERROR_MESSAGE, ERROR_STATUS, errorJsonPrefix, errorJsonWithId, type ErrorCode } from '../common/errors.ts';

export type Header = readonly [name: string, value: string];

export interface Decision {
  readonly allow: boolean;
  /** 'ok' for an allow, else the API error code. */
  readonly code: ErrorCode | 'ok';
  /** HTTP status Envoy answers with on a denial (the number, 451 included). */
  readonly httpStatus: number;
  /** Short reason for logs and metrics; never contains secrets. */
  readonly reason: string;
  /** Headers of the denial response (or headers added upstream on an allow). */
  readonly headers: readonly Header[];
  /**
   * An allow's headers for the client's response (OkHttpResponse.response_headers_to_add): the
   * global rate limit's x-ratelimit-* when the Check took the bucket (authz/src/ratelimit/check-limit.ts).
   */
  readonly responseHeaders?: readonly Header[];
  /**
   * Denial body (error JSON) as sent in a Check without a request id (`"requestId":null`); empty
   * on allow. The body sent for a request is denialBody(d, requestId).
   */
  readonly body: string;
  /**
   * The denial body up to its request id, `{"error":…,"message":…[,"field":…]` (deny() and
   * geoDenial() set it); denialBody appends the id.
   */
  readonly bodyPrefix?: string;
  /**
   * What follows the request id's closing `}` (a newline in the global limit's 429, which is
   * byte for byte Envoy's json_format local reply); nothing when undefined.
   */
  readonly bodyEnd?: string;
  /**
   * String fields sent as CheckResponse.dynamic_metadata on an allow (Envoy stores them under
   * `envoy.filters.http.ext_authz` for later filters; never sent upstream, never logged).
   */
  readonly metadata?: Readonly<Record<string, string>>;
  /** Cache slot for the encoded CheckResponse (filled by authz/codec/response.ts). */
  encoded?: Buffer;
}

/**
 * The body of a denial for one request: its error JSON with `"requestId"` last, the
 * `x-request-id` Envoy generated and returns to the client (null in a Check without one).
 */
export function denialBody(d: Decision, requestId: string | undefined): string {
  return d.bodyPrefix === undefined ? d.body : errorJsonWithId(d.bodyPrefix, requestId) + (d.bodyEnd ?? '');
}

/** The body fields of a denial: its prefix and the whole body for a request without an id. */
function bodyOf(prefix: string): { body: string; bodyPrefix: string } {
  return { body: errorJsonWithId(prefix, undefined), bodyPrefix: prefix };
}

const JSON_HEADERS: readonly Header[] = Object.freeze([
  ['content-type', 'application/json'],
  ['cache-control', 'no-store'],
] as const);

/** The allow decision (no headers added upstream). */
export const ALLOW: Decision = { allow: true, code: 'ok', httpStatus: 200, reason: 'allowed', headers: [], body: '' };

const denials = new Map<string, Decision>();

/**
 * A denial with the error body for `code`. Memoized by (code, message, field) so the
 * same object (and its cached wire bytes) is reused for every identical denial.
 */
export function deny(code: ErrorCode, message: string = ERROR_MESSAGE[code], field?: string): Decision {
  const key = `${code}\u0000${message}\u0000${field ?? ''}`;
  let d = denials.get(key);
  if (d === undefined) {
    d = {
      allow: false,
      code,
      httpStatus: ERROR_STATUS[code],
      reason: field === undefined ? code : `${code}:${field}`,
      headers: JSON_HEADERS,
      ...bodyOf(errorJsonPrefix(code, message, field)),
    };
    // Bounded: messages and fields come from code, never from client input.
    if (denials.size < 1024) denials.set(key, d);
  }
  return d;
}

/**
 * The one uniform geo denial: 451, GEO_NOTICE, `Cache-Control: no-store` (451 is cacheable
 * by default) and, when configured, `Link: <url>; rel="blocked-by"` (RFC 7725). Built once: every
 * blocked client gets the same bytes but for the request id (docs/api.md "Errors").
 */
export function geoDenial(notice: string, blockedByUrl: string | undefined, reason = 'restricted_jurisdiction'): Decision {
  const headers: Header[] = [...JSON_HEADERS];
  if (blockedByUrl !== undefined) headers.push(['link', `<${blockedByUrl}>; rel="blocked-by"`]);
  return {
    allow: false,
    code: 'restricted_jurisdiction',
    httpStatus: 451,
    // The client never sees the reason (logs, metrics, grpcurl's status message): an anonymizer's
    // 451 is byte-identical to a country's on the wire.
    reason,
    headers: Object.freeze(headers),
    ...bodyOf(errorJsonPrefix('restricted_jurisdiction', notice)),
  };
}
