/**
 * TLS on the client listener (EDGE_TLS_CERT_FILE/EDGE_TLS_KEY_FILE), client certificates
 * (EDGE_TLS_CLIENT_CA_FILE, EDGE_TLS_CLIENT_AUTH) and PROXY protocol (EDGE_PROXY_PROTOCOL): what
 * the public listener gains on top of the plaintext one in listener.ts. docs/envoy.md "TLS on the
 * client listener" explains each choice.
 */
import { dirname, join } from 'node:path';
import type { Config, EdgeTlsConfig } from '../../authz/src/common/config.ts';
import { HEADER } from '../../authz/src/common/contract.ts';
import { duration, typedConfig, typedExtension, type JsonObject, type RenderOptions, type TypedExtension } from './common.ts';
import { FIRST_REQUEST_TIMEOUT_MS } from './listener.ts';
import { LISTENER, SERVER_CERT_SECRET, TYPE_URL, type ListenerName } from './names.ts';
import { certificateSds, keyDirectoryWarnings } from './sds.ts';

/** The server-certificate SDS file's name, beside the client-certificate one (RenderOptions.sdsPath). */
export const SERVER_SDS_FILE = 'sds-server-cert.yaml';

/** Where the bootstrap reads the server-certificate SDS resource: opts.serverSdsPath, else beside opts.sdsPath. */
export function serverSdsPath(opts: RenderOptions): string {
  return opts.serverSdsPath ?? join(dirname(opts.sdsPath), SERVER_SDS_FILE);
}

/**
 * TLS 1.2 cipher suites: Mozilla's "intermediate" profile (Server Side TLS 5.7), less its DHE
 * suites, which BoringSSL (Envoy's TLS library) does not implement. TLS 1.3 suites are not
 * configurable in BoringSSL; all three (AES-128-GCM, AES-256-GCM, CHACHA20-POLY1305) are on.
 */
export const EDGE_TLS_CIPHERS = [
  'ECDHE-ECDSA-AES128-GCM-SHA256',
  'ECDHE-RSA-AES128-GCM-SHA256',
  'ECDHE-ECDSA-AES256-GCM-SHA384',
  'ECDHE-RSA-AES256-GCM-SHA384',
  'ECDHE-ECDSA-CHACHA20-POLY1305',
  'ECDHE-RSA-CHACHA20-POLY1305',
] as const;
/** Key-exchange groups of the same profile (X25519, P-256, P-384). */
export const EDGE_TLS_CURVES = ['X25519', 'P-256', 'P-384'] as const;
/** ALPN offered to clients, HTTP/2 first. */
export const EDGE_ALPN = ['h2', 'http/1.1'] as const;

/** The SDS resource file for the server certificate: re-read when its directory changes (a `..data` swap or `mv`). */
export function buildServerSds(tls: EdgeTlsConfig): JsonObject {
  return certificateSds(SERVER_CERT_SECRET, tls.certFile, tls.keyFile);
}

/** As sdsWarnings (sds.ts) for the backend client certificate: only the certificate's directory is watched. */
export function serverSdsWarnings(tls: EdgeTlsConfig | undefined): string[] {
  if (tls === undefined) return [];
  return keyDirectoryWarnings('EDGE_TLS_CERT_FILE', tls.certFile, 'EDGE_TLS_KEY_FILE', tls.keyFile);
}

/**
 * The DownstreamTlsContext: TLS 1.2–1.3, the intermediate profile, ALPN h2 and http/1.1, the
 * server certificate from SDS. Client certificates: `required`: one chaining to
 * EDGE_TLS_CLIENT_CA_FILE or the handshake fails; `optional`: asked for, a missing or unverified
 * one accepted (and never forwarded: clientCertFilter).
 */
export function downstreamTlsContext(tls: EdgeTlsConfig, opts: RenderOptions): JsonObject {
  const validation = tls.clientAuth === 'off' || tls.clientCaFile === undefined ? undefined : {
    trusted_ca: { filename: tls.clientCaFile },
    // optional: an untrusted certificate does not fail the handshake; it is just not forwarded.
    ...(tls.clientAuth === 'optional' ? { trust_chain_verification: 'ACCEPT_UNTRUSTED' } : {}),
  };
  return typedConfig(TYPE_URL.downstreamTls, {
    common_tls_context: {
      tls_params: {
        tls_minimum_protocol_version: 'TLSv1_2',
        tls_maximum_protocol_version: 'TLSv1_3',
        cipher_suites: [...EDGE_TLS_CIPHERS],
        ecdh_curves: [...EDGE_TLS_CURVES],
      },
      alpn_protocols: [...EDGE_ALPN],
      tls_certificate_sds_secret_configs: [{
        name: SERVER_CERT_SECRET,
        sds_config: { path_config_source: { path: serverSdsPath(opts) }, resource_api_version: 'V3' },
      }],
      ...(validation === undefined ? {} : { validation_context: validation }),
    },
    require_client_certificate: tls.clientAuth === 'required',
  });
}

/** `:scheme` and x-forwarded-proto on a listener: https on the public listener with TLS, else http. */
export function listenerScheme(config: Config, name: ListenerName): 'http' | 'https' {
  return name === LISTENER.edge && config.edgeTls !== undefined ? 'https' : 'http';
}

/**
 * The PROXY protocol listener filter (EDGE_PROXY_PROTOCOL=required): v1 or v2 on every
 * connection, before any other byte; a connection without one is closed before a request is
 * read. The address it carries becomes the connection's remote address: what every filter,
 * the rate limits and the access log see. Counted under `proxy_proto.edge.*`.
 */
export function proxyProtocolFilter(): TypedExtension {
  return typedExtension('envoy.filters.listener.proxy_protocol', TYPE_URL.proxyProtocol, { stat_prefix: LISTENER.edge });
}

/**
 * The public listener as the settings want it: `plain` (listener.ts) with the PROXY protocol
 * filter in front of its listener filters, and the TLS transport socket on its filter chain
 * (the handshake bounded by FIRST_REQUEST_TIMEOUT_MS).
 */
export function withClientTransport(config: Config, opts: RenderOptions, plain: JsonObject): JsonObject {
  const listenerFilters = (plain['listener_filters'] ?? []) as readonly JsonObject[];
  const chains = (plain['filter_chains'] ?? []) as readonly JsonObject[];
  const tls = config.edgeTls;
  return {
    ...plain,
    listener_filters: config.proxyProtocol === 'required' ? [proxyProtocolFilter(), ...listenerFilters] : listenerFilters,
    filter_chains: tls === undefined ? chains : chains.map((c) => ({
      ...c,
      transport_socket: { name: 'envoy.transport_sockets.tls', typed_config: downstreamTlsContext(tls, opts) },
      transport_socket_connect_timeout: duration(FIRST_REQUEST_TIMEOUT_MS),
    })),
  };
}

/** The Lua filter's name (a second Lua filter beside the order body's). */
export const CLIENT_CERT_FILTER = 'edge.lua.client_cert';

/**
 * With client certificates (EDGE_TLS_CLIENT_AUTH optional or required): writes the SHA-256 of a
 * certificate the handshake verified into x-edge-client-cert-sha256, for authz and the upstreams.
 * header_mutation has already removed any client-sent copy (EDGE_SET_HEADERS); an unverified
 * certificate (optional mode accepts one) writes nothing.
 */
export function clientCertFilter(config: Config): TypedExtension[] {
  if (config.edgeTls === undefined || config.edgeTls.clientAuth === 'off') return [];
  const lua = [
    'function envoy_on_request(handle)',
    '  local ssl = handle:streamInfo():downstreamSslConnection()',
    '  if ssl ~= nil and ssl:peerCertificateValidated() then',
    `    handle:headers():replace("${HEADER.clientCertSha256}", ssl:sha256PeerCertificateDigest())`,
    '  end',
    'end',
  ].join('\n');
  return [typedExtension(CLIENT_CERT_FILTER, TYPE_URL.lua, { default_source_code: { inline_string: lua }, clear_route_cache: false })];
}
