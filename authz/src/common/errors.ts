/**
 * The one error table (docs/api.md "Errors"). Every error body the edge answers, whoever
 * produces it, is `{"error": "<code>", "message": "<text>", "field"?: "<name>", "requestId": "<id>"|null}`
 * with `content-type: application/json`, keys in that order. `requestId` is the `x-request-id`
 * the client received (Envoy generates it), or null when there is none (a request Envoy refused
 * before it had an id, a Check or market request sent without one).
 * The Envoy renderer, the authz denials and the market service all read this table.
 */

export const ERROR_STATUS = {
  // Seed codes, verbatim (spaces included).
  unauthorized: 401,
  'timestamp expired': 401,
  ingest_replay: 401,
  restricted_jurisdiction: 451,
  'too many requests': 429,
  // Decided in docs/api.md "Errors".
  invalid_json: 400,
  invalid_envelope: 400,
  invalid_content_signature: 401,
  stale_document: 409,
  invalid_order: 400,
  unknown_market: 404,
  market_closed: 409,
  deadline_expired: 422,
  deadline_too_far: 422,
  invalid_size: 422,
  invalid_query: 400,
  // Envoy's own replies to malformed HTTP (also 403, 408, 414, 426, 431: status kept).
  bad_request: 400,
  not_found: 404,
  method_not_allowed: 405,
  payload_too_large: 413,
  backend_unavailable: 502,
  backend_timeout: 504,
  service_unavailable: 503,
  sealed: 503,
} as const satisfies Record<string, number>;

export type ErrorCode = keyof typeof ERROR_STATUS;

/** Default human text per code (a stage may give a more specific message). */
export const ERROR_MESSAGE: Readonly<Record<ErrorCode, string>> = {
  unauthorized: 'request signature missing, malformed or wrong',
  'timestamp expired': 'X-Edge-Timestamp is outside the accepted window',
  ingest_replay: 'nonce already used',
  restricted_jurisdiction: '', // replaced by GEO_NOTICE
  'too many requests': 'rate limit exceeded for this client address',
  invalid_json: 'body is not a JSON object',
  invalid_envelope: 'signed envelope is malformed',
  invalid_content_signature: 'content signature does not verify with any feed key',
  stale_document: 'document seq is not greater than the stored one',
  invalid_order: 'order envelope is malformed',
  unknown_market: 'market not found',
  market_closed: 'market is closed or not active',
  deadline_expired: 'order deadline has passed',
  deadline_too_far: 'order deadline is too far in the future',
  invalid_size: 'order size is not allowed for this market',
  invalid_query: 'bad query parameter',
  bad_request: 'malformed HTTP request',
  not_found: 'no such resource',
  method_not_allowed: 'method not allowed on this resource',
  payload_too_large: 'request body is too large',
  backend_unavailable: 'order backend unreachable; the order was not delivered',
  backend_timeout: 'order backend did not answer in time; the order outcome is unknown',
  service_unavailable: 'a dependency is unavailable; the request was not accepted',
  sealed: 'service is sealed',
};

/**
 * `bad_request` keeps the status of the reply it stands for, with this text per status (Envoy's
 * own replies, and the market service's parser behind it); any other status gets
 * ERROR_MESSAGE.bad_request.
 */
export const BAD_REQUEST_MESSAGE_BY_STATUS: Readonly<Record<403 | 408 | 426 | 431, string>> = {
  403: 'protocol upgrade not supported',
  408: 'request was not received in time',
  426: 'HTTP/1.1 or HTTP/2 required',
  431: 'request headers are too large',
};

export interface ErrorBody {
  readonly error: ErrorCode;
  readonly message: string;
  readonly field?: string;
  /** The x-request-id the client received; null when there is none. */
  readonly requestId?: string | null;
}

/**
 * The error body up to (not including) its request id: `{"error":…,"message":…[,"field":…]`.
 * Denials cache it and append REQUEST_ID_KEY, the id and `}` per request (errorJsonWithId).
 */
export function errorJsonPrefix(code: ErrorCode, message: string = ERROR_MESSAGE[code], field?: string): string {
  const body: ErrorBody = field === undefined ? { error: code, message } : { error: code, message, field };
  return JSON.stringify(body).slice(0, -1);
}

/** What follows an errorJsonPrefix: the request id key, then the id as JSON, then `}`. */
export const REQUEST_ID_KEY = ',"requestId":';

/** The request id as a JSON value: a JSON string, or `null` when there is none (undefined or empty). */
export function requestIdJson(requestId: string | null | undefined): string {
  return requestId === undefined || requestId === null || requestId === '' ? 'null' : JSON.stringify(requestId);
}

/** A whole error body from its cached prefix and this request's id. */
export function errorJsonWithId(prefix: string, requestId: string | null | undefined): string {
  return `${prefix}${REQUEST_ID_KEY}${requestIdJson(requestId)}}`;
}

/**
 * The JSON error body text for a code. Every answer the edge gives passes `requestId` (null when
 * the request has none); omitted, the body has no requestId key (the admin port's own answers,
 * which no client of the edge receives).
 */
export function errorJson(code: ErrorCode, message: string = ERROR_MESSAGE[code], field?: string, requestId?: string | null): string {
  const prefix = errorJsonPrefix(code, message, field);
  return requestId === undefined ? `${prefix}}` : errorJsonWithId(prefix, requestId);
}
