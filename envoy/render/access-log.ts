/**
 * The access log: one JSON line per request.
 */
import { typedExtension, type TypedExtension } from './common.ts';
import { TYPE_URL } from './names.ts';

/**
 * Deliberately no request headers besides the request id and no bodies: x-edge-signature,
 * x-edge-nonce and order payloads never reach the log. The path is logged without its query
 * string.
 */
export const ACCESS_LOG_PATH_MAX = 512;
export const ACCESS_LOG_FORMAT: Readonly<Record<string, string>> = {
  time: '%START_TIME%',
  request_id: '%REQ(X-REQUEST-ID)%',
  client: '%DOWNSTREAM_REMOTE_ADDRESS_WITHOUT_PORT%',
  peer: '%DOWNSTREAM_DIRECT_REMOTE_ADDRESS_WITHOUT_PORT%',
  protocol: '%PROTOCOL%',
  // Cut like the path: over HTTP/2 a client may send any token as the method.
  method: '%REQ(:METHOD):32%',
  // The request's path at logging time, query string removed: after the route's prefix_rewrite, so
  // an order is logged as /orders (the route field says it came in on /v1/orders). At most
  // ACCESS_LOG_PATH_MAX characters: a client may send ~60 KiB of path, and must not make every
  // line of its as large (rate-limited, but still log volume at the client's choice).
  path: `%PATH(NQ):${ACCESS_LOG_PATH_MAX}%`,
  route: '%ROUTE_NAME%',
  status: '%RESPONSE_CODE%',
  flags: '%RESPONSE_FLAGS%',
  details: '%RESPONSE_CODE_DETAILS%',
  duration_ms: '%DURATION%',
  response_ms: '%RESPONSE_DURATION%',
  // Where the time went, in µs (null when the request never went upstream): from the whole
  // request received to the first byte sent upstream (rate limit, the ext_authz round trip, the
  // order-body Lua filter, taking an upstream connection), then the upstream's share.
  edge_us: '%COMMON_DURATION(DS_RX_END:US_TX_BEG:us)%',
  upstream_us: '%COMMON_DURATION(US_TX_BEG:US_RX_END:us)%',
  upstream_attempts: '%UPSTREAM_REQUEST_ATTEMPT_COUNT%',
  upstream_cluster: '%UPSTREAM_CLUSTER%',
  upstream_host: '%UPSTREAM_HOST%',
  bytes_in: '%BYTES_RECEIVED%',
  bytes_out: '%BYTES_SENT%',
};

/**
 * To a file, or to Envoy's own stdout. The stdout logger writes to the inherited descriptor;
 * a file logger on `/dev/stdout` would open() it, which fails (ENXIO) when stdout is a socket,
 * as it is under Node's child_process pipes.
 */
export function accessLog(path: string | undefined): TypedExtension {
  const log_format = { json_format: ACCESS_LOG_FORMAT };
  return path === undefined
    ? typedExtension('envoy.access_loggers.stdout', TYPE_URL.stdoutAccessLog, { log_format })
    : typedExtension('envoy.access_loggers.file', TYPE_URL.fileAccessLog, { path, log_format });
}
