/**
 * The upstream clusters: authz (gRPC), market (HTTP/1.1), and the order backend (mTLS).
 */
import { isIP } from 'node:net';
import type { Config, OrderBackendConfig } from '../../authz/src/common/config.ts';
import { canonicalIp, duration, socketAddress, typedConfig, typedExtension, type JsonObject, type RenderOptions } from './common.ts';
import { CLUSTER, RATE_LIMIT_TOKEN_SECRET, TYPE_URL, type ClusterName } from './names.ts';
import { clientCertSdsConfig } from './sds.ts';
import { globalLimitFilter } from './global-rate-limit.ts';

/**
 * STATIC for an IP literal; otherwise the given DNS discovery type, re-resolved every second
 * (Envoy's default is 5 s): a restarted container or pod usually comes back on another address,
 * and until Envoy resolves it again every request to that cluster fails (503 for authz).
 */
function discovery(host: string, dnsType: 'STRICT_DNS' | 'LOGICAL_DNS'): JsonObject {
  if (isIP(host) !== 0) return { type: 'STATIC' };
  // The DNS cluster extension: Cluster.dns_refresh_rate is deprecated in 1.40.
  return {
    cluster_type: typedExtension('envoy.cluster.dns', TYPE_URL.dnsCluster, {
      // LOGICAL_DNS semantics: every resolved address is one endpoint (Envoy 1.40's field).
      all_addresses_in_single_endpoint: dnsType === 'LOGICAL_DNS',
      dns_lookup_family: 'V4_PREFERRED',
      dns_refresh_rate: '1s',
    }),
  };
}

function loadAssignment(cluster: ClusterName, host: string, port: number): JsonObject {
  return {
    cluster_name: cluster,
    endpoints: [{ lb_endpoints: [{ endpoint: { address: socketAddress(host, port) } }] }],
  };
}

/**
 * Where a cluster reaches the TS service: a Unix domain socket (AUTHZ_GRPC_SOCKET, MARKET_SOCKET)
 * as a STATIC `pipe` endpoint, without TCP keep-alive (no such option on AF_UNIX; a peer that
 * exits closes the socket at once), else host:port over TCP as before.
 */
function tsEndpoint(cluster: ClusterName, socket: string | undefined, host: string, port: number): JsonObject {
  if (socket === undefined) {
    return { ...discovery(host, 'STRICT_DNS'), load_assignment: loadAssignment(cluster, host, port) };
  }
  return {
    type: 'STATIC',
    load_assignment: { cluster_name: cluster, endpoints: [{ lb_endpoints: [{ endpoint: { address: { pipe: { path: socket } } } }] }] },
  };
}

/** upstream_connection_options for a TS-service cluster: TCP keep-alive over TCP only. */
function tsConnectionOptions(socket: string | undefined): JsonObject {
  return socket === undefined ? { upstream_connection_options: TCP_KEEPALIVE } : {};
}

function thresholds(max: number): JsonObject {
  return {
    thresholds: [{
      priority: 'DEFAULT', max_connections: max, max_pending_requests: max, max_requests: max, max_retries: 0,
    }],
  };
}

const TCP_KEEPALIVE = { tcp_keepalive: { keepalive_probes: 3, keepalive_time: 30, keepalive_interval: 5 } } as const;

/** typed_extension_protocol_options holding the cluster's HttpProtocolOptions. */
function httpProtocolOptions(fields: JsonObject): JsonObject {
  return { 'envoy.extensions.upstreams.http.v3.HttpProtocolOptions': typedConfig(TYPE_URL.httpOptions, fields) };
}

/**
 * The HttpProtocolOptions of a gRPC cluster (authz, rate limit): HTTP/2, a connection kept for
 * an hour idle, and an HTTP/2 PING every 30 s (5 s to answer), so a connection whose peer went
 * away is closed rather than kept for requests.
 */
function grpcProtocolOptions(): JsonObject {
  return {
    common_http_protocol_options: { idle_timeout: '3600s' },
    explicit_http_config: {
      http2_protocol_options: {
        connection_keepalive: { interval: '30s', timeout: '5s' },
      },
    },
  };
}

/**
 * The TS gRPC server (ext_authz Check). HTTP/2, one long-lived connection
 * per Envoy worker, kept alive with HTTP/2 PINGs; high circuit-breaker limits so a traffic
 * spike is limited by the authz deadline, not by Envoy's default 1024 concurrent requests.
 */
export function authzCluster(config: Config): JsonObject {
  return {
    name: CLUSTER.authz,
    ...tsEndpoint(CLUSTER.authz, config.authzGrpcSocket, config.authzAddress, config.authzGrpcPort),
    connect_timeout: '1s',
    circuit_breakers: thresholds(100_000),
    ...tsConnectionOptions(config.authzGrpcSocket),
    typed_extension_protocol_options: httpProtocolOptions(grpcProtocolOptions()),
  };
}

/**
 * The upstream filters of the rate limit cluster with RATELIMIT_SERVICE_TOKEN_FILE: a credential
 * injector writes `authorization: Bearer <token>` on every call (the ratelimit filter's gRPC calls
 * go through the cluster's upstream filters; checked on Envoy 1.40), the token read by Envoy from
 * the static generic secret RATE_LIMIT_TOKEN_SECRET (bootstrap.ts), i.e. from the file: it is in no
 * rendered config. A call without it is never sent (allow_request_without_credential: false).
 */
function rateLimitTokenFilters(): JsonObject[] {
  return [
    typedExtension('envoy.filters.http.credential_injector', TYPE_URL.credentialInjector, {
      overwrite: true,
      allow_request_without_credential: false,
      credential: typedExtension('envoy.http.injected_credentials.generic', TYPE_URL.genericCredential, {
        credential: { name: RATE_LIMIT_TOKEN_SECRET },
        header: 'authorization',
        header_value_prefix: 'Bearer ',
      }),
    }),
    typedExtension('envoy.filters.http.upstream_codec', TYPE_URL.upstreamCodec, {}),
  ];
}

/** The static secret of the RateLimitService token (RATELIMIT_SERVICE_TOKEN_FILE), for bootstrap.ts. */
export function rateLimitTokenSecrets(config: Config): JsonObject[] {
  if (config.rateLimitTokenFile === undefined || !globalLimitFilter(config)) return [];
  return [{ name: RATE_LIMIT_TOKEN_SECRET, generic_secret: { secret: { filename: config.rateLimitTokenFile } } }];
}

/**
 * The RateLimitService at RATELIMIT_SERVICE_ADDRESS (rendered only then; without it the TS
 * service's Check takes the global bucket), else the TS service's gRPC port. HTTP/2 like authz;
 * a failed or slow call fails open (global-rate-limit.ts). With RATELIMIT_SERVICE_TOKEN_FILE every
 * call carries the token (rateLimitTokenFilters): the TS service's RateLimitService answers nothing else.
 */
export function rateLimitCluster(config: Config): JsonObject {
  const { host, port } = config.rateLimitService ?? { host: config.authzAddress, port: config.authzGrpcPort };
  return {
    name: CLUSTER.rateLimit,
    ...discovery(host, 'STRICT_DNS'),
    connect_timeout: '1s',
    load_assignment: loadAssignment(CLUSTER.rateLimit, host, port),
    circuit_breakers: thresholds(100_000),
    upstream_connection_options: TCP_KEEPALIVE,
    typed_extension_protocol_options: httpProtocolOptions({
      ...grpcProtocolOptions(),
      ...(config.rateLimitTokenFile === undefined ? {} : { http_filters: rateLimitTokenFilters() }),
    }),
  };
}

/** The market service: plain HTTP/1.1 on MARKET_SOCKET, else MARKET_ADDRESS:MARKET_PORT. */
export function marketCluster(config: Config, opts: RenderOptions): JsonObject {
  return {
    name: CLUSTER.market,
    ...tsEndpoint(CLUSTER.market, config.marketSocket, config.marketAddress, config.marketPort),
    connect_timeout: '1s',
    circuit_breakers: thresholds(8192),
    ...tsConnectionOptions(config.marketSocket),
    typed_extension_protocol_options: httpProtocolOptions({
      common_http_protocol_options: { idle_timeout: duration((opts.upstreamIdleTimeoutSecs ?? 4) * 1000) },
      explicit_http_config: { http_protocol_options: {} },
    }),
  };
}

/** The subject-alt-name matcher for the backend's certificate. */
export function sanMatcher(san: string): JsonObject {
  return isIP(san) === 0
    ? { san_type: 'DNS', matcher: { exact: san } }
    : { san_type: 'IP_ADDRESS', matcher: { exact: canonicalIp(san) } };
}

/**
 * SNI for the backend handshake: ORDER_BACKEND_SAN when it is a name; an IP literal is not
 * allowed in SNI (RFC 6066 §3), so then the URL's host if that is a name, else none.
 */
export function backendSni(backend: OrderBackendConfig): string | undefined {
  if (isIP(backend.san) === 0) return backend.san;
  if (isIP(backend.host) === 0) return backend.host;
  return undefined;
}

/**
 * The order backend over mTLS: pinned CA, exact SAN, client certificate from file-based SDS
 * (rotated on disk), connections closed after ORDER_BACKEND_MAX_CONN_SECS so a new certificate
 * reaches the backend in bounded time. LOGICAL_DNS for a name: one external endpoint whose
 * addresses may rotate; connections are not spread over every resolved address.
 */
export function orderBackendCluster(backend: OrderBackendConfig, opts: RenderOptions): JsonObject {
  const idleSecs = Math.min(opts.upstreamIdleTimeoutSecs ?? 4, backend.maxConnSecs);
  return {
    name: CLUSTER.orderBackend,
    ...discovery(backend.host, 'LOGICAL_DNS'),
    connect_timeout: duration(Math.min(2000, backend.timeoutMs)),
    load_assignment: loadAssignment(CLUSTER.orderBackend, backend.host, backend.port),
    circuit_breakers: thresholds(1024),
    upstream_connection_options: TCP_KEEPALIVE,
    transport_socket: typedExtension('envoy.transport_sockets.tls', TYPE_URL.upstreamTls, {
      sni: backendSni(backend),
      common_tls_context: {
        tls_params: { tls_minimum_protocol_version: 'TLSv1_2' },
        alpn_protocols: ['http/1.1'],
        tls_certificate_sds_secret_configs: [clientCertSdsConfig(opts.sdsPath)],
        validation_context: {
          trusted_ca: { filename: backend.caFile },
          match_typed_subject_alt_names: [sanMatcher(backend.san)],
        },
      },
    }),
    typed_extension_protocol_options: httpProtocolOptions({
      common_http_protocol_options: {
        idle_timeout: duration(idleSecs * 1000),
        max_connection_duration: duration(backend.maxConnSecs * 1000),
      },
      explicit_http_config: { http_protocol_options: {} },
    }),
  };
}

/**
 * Every cluster the config needs: the order backend only when one is configured, the rate limit
 * service only with RATELIMIT_SERVICE_ADDRESS (the TS service takes the global bucket in Check).
 */
/**
 * The OTLP/gRPC receiver of OTEL_EXPORTER_OTLP_ENDPOINT (Envoy's OpenTelemetry tracer exports
 * there; render/tracing.ts): HTTP/2 in plaintext, a small circuit breaker (an export that cannot be
 * sent is dropped, never queued without bound). Undefined without the setting.
 */
export function otlpCluster(config: Config): JsonObject | undefined {
  const t = config.tracing;
  if (t === undefined) return undefined;
  return {
    name: CLUSTER.otlp,
    ...discovery(t.host, 'STRICT_DNS'),
    connect_timeout: '1s',
    circuit_breakers: thresholds(64),
    upstream_connection_options: TCP_KEEPALIVE,
    typed_extension_protocol_options: httpProtocolOptions({ explicit_http_config: { http2_protocol_options: {} } }),
    load_assignment: loadAssignment(CLUSTER.otlp, t.host, t.port),
  };
}

export function clusters(config: Config, opts: RenderOptions): JsonObject[] {
  const all = [authzCluster(config), marketCluster(config, opts)];
  if (config.orderBackend !== undefined) all.push(orderBackendCluster(config.orderBackend, opts));
  if (globalLimitFilter(config)) all.push(rateLimitCluster(config));
  const otlp = otlpCluster(config);
  if (otlp !== undefined) all.push(otlp);
  return all;
}
