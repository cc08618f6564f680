/**
 * local_reply_config (docs/api.md "Errors": every Envoy-generated error is JSON).
 */
import type { Config } from '../../authz/src/common/config.ts';
import { BAD_REQUEST_MESSAGE_BY_STATUS, ERROR_MESSAGE, ERROR_STATUS, type ErrorCode } from '../../authz/src/common/errors.ts';
import { typedExtension, type JsonObject } from './common.ts';
import { xffMessage } from './client-address.ts';
import { CLUSTER, TYPE_URL, XFF_POLICY, type ClusterName } from './names.ts';

/** Response flags that mean the order never reached the backend. */
export const NOT_DELIVERED_FLAGS = ['UF', 'UH', 'URX', 'UO'] as const;
/**
 * Response flags after which the backend may have received the order: a timeout, a reset or
 * connection close after the request went out, an upstream protocol error.
 */
export const OUTCOME_UNKNOWN_FLAGS = ['UT', 'UC', 'UR', 'UPE', 'UMSDR'] as const;

const PASS_THROUGH_JSON = "('content-type' in response.headers && response.headers['content-type'].startsWith('application/json'))";

/** A timeout on the market route: same code as the order backend's, without naming orders. */
export const UPSTREAM_TIMEOUT_MESSAGE = 'upstream service did not answer in time; the outcome is unknown';

/**
 * Envoy's own 4xx replies about the request itself have no row in docs/api.md's error table; they
 * get the code `bad_request` (status unchanged) with these messages, default last.
 */
export const BAD_REQUEST_CODE = 'bad_request';
export const BAD_REQUEST_MESSAGES: readonly (readonly [number | undefined, string])[] = [
  ...Object.entries(BAD_REQUEST_MESSAGE_BY_STATUS).map(([status, message]) => [Number(status), message] as const),
  [undefined, ERROR_MESSAGE.bad_request],
];

/** One ResponseMapper: which replies it matches, and what they become. */
interface Mapper extends JsonObject {
  readonly filter: JsonObject;
  readonly status_code?: number;
  readonly body_format_override: JsonObject;
}

/** A format-string literal: `%` starts a command operator in Envoy formatters. */
function literal(text: string): string {
  return text.replaceAll('%', '%%');
}

/**
 * The request id in an Envoy-made body: the `x-request-id` Envoy generated for the request, the
 * one `always_set_request_id_in_response` returns to the client.
 */
export const REQUEST_ID_FORMAT = '%REQ(X-REQUEST-ID)%';

/**
 * A JSON local-reply body in the API's error shape: error, message, requestId (json_format writes
 * the keys in this order).
 */
function jsonBody(code: string, message: string): JsonObject {
  return { json_format: { error: literal(code), message: literal(message), requestId: REQUEST_ID_FORMAT }, content_type: 'application/json' };
}

function contractBody(code: ErrorCode): JsonObject {
  return jsonBody(code, ERROR_MESSAGE[code]);
}

function statusIs(status: number): JsonObject {
  return { status_code_filter: { comparison: { op: 'EQ', value: { default_value: status, runtime_key: `edge.local_reply.status_${status}` } } } };
}

function cel(expression: string): JsonObject {
  return { extension_filter: typedExtension('envoy.access_loggers.extension_filters.cel', TYPE_URL.celFilter, { expression }) };
}

/** Any 5xx status (the runtime key is required by the filter's API; nothing sets it). */
function status5xx(): JsonObject {
  return { status_code_filter: { comparison: { op: 'GE', value: { default_value: 500, runtime_key: 'edge.local_reply.status_5xx' } } } };
}

function flagsOnCluster(flags: readonly string[], cluster: ClusterName): JsonObject {
  return { and_filter: { filters: [{ response_flag_filter: { flags: [...flags] } }, cel(`xds.cluster_name == '${cluster}'`)] } };
}

/**
 * local_reply_config. First match wins, so the order is the contract:
 *  1. ext_authz denials, and any reply that already is JSON (the order-body filter's 503),
 *     pass through byte-identical: the TS service already wrote the API's error JSON, 451 included.
 *  2. UAEX that is not a denial = authz unreachable/timed out → 503 service_unavailable.
 *  3. Envoy's 501 for a request it cannot parse (unsupported transfer-encoding) → 400
 *     `bad_request`: the client's input, not a dependency, is at fault.
 *  4. Order backend: not delivered → 502; outcome unknown → 504.
 *  5. By status: 404, 405, 413, 429, 502, 503, 504 (market timeout); any other 5xx → 503.
 *  6. Envoy's own 4xx (malformed HTTP, header timeout, headers too large) → `bad_request`.
 */
export function localReplyConfig(config: Config): JsonObject {
  const byStatus: [number, ErrorCode][] = [
    [404, 'not_found'],
    [405, 'method_not_allowed'],
    [413, 'payload_too_large'],
    [429, 'too many requests'],
    [502, 'backend_unavailable'],
    [503, 'service_unavailable'],
  ];
  const mappers: Mapper[] = [
    ...(config.xffNumTrustedHops > 0 ? [{
      // The XFF guard's RBAC denial (403 text/plain from Envoy) is the client's fault: 400.
      filter: cel(`response.code_details == 'rbac_access_denied_matched_policy[${XFF_POLICY}]'`),
      status_code: ERROR_STATUS.bad_request,
      body_format_override: jsonBody(BAD_REQUEST_CODE, xffMessage(config.xffNumTrustedHops)),
    }] : []),
    {
      // Verified in 1.40: denials carry details `ext_authz_denied`, errors `ext_authz_error`;
      // both set UAEX, so the flag alone cannot tell them apart (docs/envoy.md §7). The
      // mapper sees the headers the replying filter set, so a Lua reply that already is
      // JSON (the order-body filter's 503) passes through as well, whatever its `details`;
      // Envoy's own replies carry no content-type at this point.
      filter: cel(`response.code_details == 'ext_authz_denied' || ${PASS_THROUGH_JSON}`),
      body_format_override: { text_format_source: { inline_string: '%LOCAL_REPLY_BODY%' }, content_type: 'application/json' },
    },
    {
      filter: { response_flag_filter: { flags: ['UAEX'] } },
      status_code: ERROR_STATUS.service_unavailable,
      body_format_override: contractBody('service_unavailable'),
    },
    {
      // Envoy's only local 501: a request it cannot parse (unsupported transfer-encoding). The
      // DPE flag is not set yet when the mapper runs (verified in 1.40), so the status decides.
      filter: statusIs(501),
      status_code: ERROR_STATUS.bad_request,
      body_format_override: jsonBody(BAD_REQUEST_CODE, BAD_REQUEST_MESSAGES.at(-1)![1]),
    },
    {
      filter: flagsOnCluster(NOT_DELIVERED_FLAGS, CLUSTER.orderBackend),
      status_code: ERROR_STATUS.backend_unavailable,
      body_format_override: contractBody('backend_unavailable'),
    },
    {
      filter: flagsOnCluster(OUTCOME_UNKNOWN_FLAGS, CLUSTER.orderBackend),
      status_code: ERROR_STATUS.backend_timeout,
      body_format_override: contractBody('backend_timeout'),
    },
    ...byStatus.map(([status, code]) => ({
      filter: statusIs(status),
      status_code: ERROR_STATUS[code],
      body_format_override: contractBody(code),
    })),
    {
      // 504 elsewhere (the market service timed out): an ingest may have been stored.
      filter: statusIs(504),
      status_code: ERROR_STATUS.backend_timeout,
      body_format_override: jsonBody('backend_timeout', UPSTREAM_TIMEOUT_MESSAGE),
    },
    {
      filter: status5xx(),
      status_code: ERROR_STATUS.service_unavailable,
      body_format_override: contractBody('service_unavailable'),
    },
    ...BAD_REQUEST_MESSAGES.flatMap(([status, message]) => (status === undefined ? [] : [{
      filter: statusIs(status),
      body_format_override: jsonBody(BAD_REQUEST_CODE, message),
    }])),
  ];
  return {
    mappers,
    // Envoy's remaining local replies are 4xx about the request itself (bad framing, escaped
    // slashes, header timeout, headers too large).
    body_format: jsonBody(BAD_REQUEST_CODE, BAD_REQUEST_MESSAGES.at(-1)![1]),
  };
}
