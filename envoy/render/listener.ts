/**
 * The listener and its HttpConnectionManager: codec, client address, request ids, path
 * normalisation, timeouts, and where the filter chain, routes, local replies and access log
 * plug in.
 */
import type { Config } from '../../authz/src/common/config.ts';
import { accessLog } from './access-log.ts';
import { duration, overwriteHeader, socketAddress, typedExtension, type JsonObject, type RenderOptions, type TypedExtension } from './common.ts';
import { httpFilters } from './filters.ts';
import { localReplyConfig } from './local-replies.ts';
import { CLIENT_IP_HEADER, CLIENT_PORT_HEADER, FILTER, LISTENER, TYPE_URL, type ListenerName } from './names.ts';
import { routes, STREAM_IDLE_TIMEOUT_MS } from './routes.ts';
import { tracingFields } from './tracing.ts';
import { listenerScheme, withClientTransport } from './tls.ts';

/**
 * What every HttpConnectionManager (the client listeners' and the stats listener's, stats.ts)
 * does to a request before a route sees it: the path normalised (`/a/./b` and `//a/b` are `/a/b`,
 * so a route cannot be reached under another spelling), escaped slashes refused, Envoy's own
 * Server header replaced, and 10 s for the request headers to arrive.
 */
export const REQUEST_HYGIENE = {
  normalize_path: true,
  merge_slashes: true,
  // Nobody needs %2F or %5C in our paths; rejecting beats two parties disagreeing on them.
  path_with_escaped_slashes_action: 'REJECT_REQUEST',
  server_header_transformation: 'OVERWRITE',
  server_name: 'edge',
  request_headers_timeout: '10s',
} as const;

/**
 * Every HttpConnectionManager's connection options: a kept-alive connection closed after 300 s
 * idle; a header with an underscore dropped (a proxy may read it as a dash, so it could pass
 * for a header the edge sets).
 */
export const DOWNSTREAM_CONNECTION_OPTIONS = { idle_timeout: '300s', headers_with_underscores_action: 'DROP_HEADER' } as const;

/**
 * The HttpConnectionManager with its filter chain, routes and local replies: the same for both
 * listeners but for the route table (routes.ts) and the names (stat prefix, route configuration).
 */
export function httpConnectionManager(config: Config, opts: RenderOptions, name: ListenerName = LISTENER.edge): TypedExtension {
  return typedExtension(FILTER.hcm, TYPE_URL.hcm, {
    stat_prefix: name,
    codec_type: 'AUTO',
    // The client address is the TCP peer, or the XFF entry XFF_NUM_TRUSTED_HOPS from the right.
    use_remote_address: true,
    xff_num_trusted_hops: config.xffNumTrustedHops,
    // X-Forwarded-For stays as the client sent it while the filters run (the XFF guard needs to
    // see whether one was sent); upstreams get exactly the decided address (virtual host below).
    skip_xff_append: true,
    // `:scheme` and x-forwarded-proto say what the listener is (https with EDGE_TLS_*, else http)
    // whatever a client sends (an absolute-form https:// target, a forged X-Forwarded-Proto
    // through a trusted hop).
    scheme_header_transformation: { scheme_to_overwrite: listenerScheme(config, name) },
    // No client address is "internal" (internal requests keep client-sent x-envoy-* and
    // x-request-id headers). An empty list means "RFC1918 + loopback" to Envoy, so the list
    // holds the one address that can never be a peer: 0.0.0.0/32.
    internal_address_config: { unix_sockets: false, cidr_ranges: [{ address_prefix: '0.0.0.0', prefix_len: 32 }] },
    generate_request_id: true,
    preserve_external_request_id: false,
    // The client learns the id the backend can deduplicate on (a 504 is "outcome unknown").
    always_set_request_id_in_response: true,
    ...REQUEST_HYGIENE,
    // The whole request, body included, must arrive and be decided within REQUEST_BODY_TIMEOUT_MS,
    // else 408 (docs/envoy.md "Bodies and memory"). Not a route's max_stream_duration: that also
    // counts the upstream's answer, so on the orders route it would have to outlast
    // ORDER_BACKEND_TIMEOUT_MS or turn a slow backend's 504 into a 408; this timer stops once the
    // request has passed every decoder filter (or the answer started). Not an idle timeout: a body
    // trickled one byte a second never goes idle.
    request_timeout: duration(config.requestBodyTimeoutMs),
    stream_idle_timeout: duration(STREAM_IDLE_TIMEOUT_MS),
    drain_timeout: '5s',
    common_http_protocol_options: { ...DOWNSTREAM_CONNECTION_OPTIONS },
    http2_protocol_options: {
      max_concurrent_streams: 100,
      initial_stream_window_size: 65_536,
      initial_connection_window_size: 1_048_576,
    },
    access_log: [accessLog(opts.accessLogPath)],
    // OTEL_EXPORTER_OTLP_ENDPOINT: the tracer, its sampling and the trust rule (render/tracing.ts); nothing without it.
    ...tracingFields(config),
    local_reply_config: localReplyConfig(config),
    route_config: {
      name,
      virtual_hosts: [{
        name,
        domains: ['*'],
        routes: routes(config, name),
        // Upstreams see the edge's view of the client only: one X-Forwarded-For entry, the address
        // geo and the rate limit used (docs/api.md "POST /v1/orders"); no client-chosen entries.
        request_headers_to_add: [overwriteHeader('x-forwarded-for', `%REQ(${CLIENT_IP_HEADER})%`)],
        request_headers_to_remove: [CLIENT_PORT_HEADER],
      }],
    },
    http_filters: httpFilters(config, opts),
  });
}

/**
 * How long a new connection has to send its first request line (HTTP/1) or the HTTP/2 preface
 * before Envoy closes it, in ms. Envoy's HCM has no timer for a connection that never sends a
 * byte: request_headers_timeout starts at the first byte, and the connection idle_timeout (300 s)
 * is meant for kept-alive clients between requests. 10 s is request_headers_timeout's value: a
 * client on a lossy link has room for three SYN-ACK/data retransmissions (1 + 2 + 4 s).
 */
export const FIRST_REQUEST_TIMEOUT_MS = 10_000;

/**
 * What every client listener puts before its filter chain: http_inspector holds a new
 * connection until its first request line (or the HTTP/2 preface) has arrived, peeking only
 * (the HCM then reads the same bytes), and the listener closes a connection that has not sent
 * one within FIRST_REQUEST_TIMEOUT_MS (`continue_on_listener_filters_timeout: false`). Bytes
 * that are not HTTP go on to the HCM, which answers 400. Counted by
 * `listener.edge.downstream_pre_cx_timeout`. A first line longer than the inspector's 64 KiB peek
 * buffer (Envoy 1.40, not configurable) is a read error: the connection is reset unanswered
 * (`http_inspector.read_error`), where a shorter one over the header limit gets 431
 * (docs/reliability.md "Flakes and their causes").
 */
export function firstRequestDeadline(): JsonObject {
  return {
    listener_filters: [typedExtension(FILTER.httpInspector, TYPE_URL.httpInspector)],
    listener_filters_timeout: duration(FIRST_REQUEST_TIMEOUT_MS),
    continue_on_listener_filters_timeout: false,
  };
}

/**
 * The public listener: HTTP/1.1 and HTTP/2 on EDGE_PORT, over TLS with EDGE_TLS_* and behind a
 * PROXY header with EDGE_PROXY_PROTOCOL=required (tls.ts).
 */
export function listener(config: Config, opts: RenderOptions): JsonObject {
  return withClientTransport(config, opts, {
    name: LISTENER.edge,
    // listener.edge.* whatever the port (downstream_pre_cx_timeout, downstream_global_cx_overflow).
    stat_prefix: 'edge',
    address: socketAddress('0.0.0.0', config.edgePort),
    // Edge best practice; the per-route body limits raise the stream buffer where needed.
    per_connection_buffer_limit_bytes: 32_768,
    ...firstRequestDeadline(),
    filter_chains: [{ filters: [httpConnectionManager(config, opts)] }],
  });
}

/**
 * The ingest listener (INGEST_PORT on INGEST_BIND_ADDRESS): the same filters, rules and limits as
 * the public one, the ingest routes only. Undefined without INGEST_PORT.
 */
export function ingestListener(config: Config, opts: RenderOptions): JsonObject | undefined {
  if (config.ingestPort === undefined) return undefined;
  return {
    name: LISTENER.ingest,
    stat_prefix: LISTENER.ingest,
    address: socketAddress(config.ingestBindAddress, config.ingestPort),
    per_connection_buffer_limit_bytes: 32_768,
    ...firstRequestDeadline(),
    filter_chains: [{ filters: [httpConnectionManager(config, opts, LISTENER.ingest)] }],
  };
}
