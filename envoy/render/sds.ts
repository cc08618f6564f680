/**
 * The edge's client certificate for the order backend, served by file-based SDS so a rotated
 * certificate on disk is picked up without a restart.
 */
import { dirname } from 'node:path';
import type { OrderBackendConfig } from '../../authz/src/common/config.ts';
import { typedConfig, type JsonObject } from './common.ts';
import { CLIENT_CERT_SECRET, TYPE_URL } from './names.ts';

/** Where a TLS context finds the secret: the SDS file at `sdsPath`. */
export function clientCertSdsConfig(sdsPath: string): JsonObject {
  return {
    name: CLIENT_CERT_SECRET,
    sds_config: { path_config_source: { path: sdsPath }, resource_api_version: 'V3' },
  };
}

/** The SDS resource file: the client certificate and key, re-read on rotation. */
export function buildSds(backend: OrderBackendConfig): JsonObject {
  return {
    resources: [typedConfig(TYPE_URL.secret, {
      name: CLIENT_CERT_SECRET,
      tls_certificate: {
        certificate_chain: { filename: backend.clientCertFile },
        private_key: { filename: backend.clientKeyFile },
        // Envoy re-reads both files on any move inside this directory: a Kubernetes `..data`
        // symlink swap or `mv new old`. Writing a file in place is NOT seen (docs/envoy.md).
        watched_directory: { path: dirname(backend.clientCertFile) },
      },
    })],
  };
}

/**
 * Envoy watches only the certificate's directory; a key elsewhere is re-read only when that
 * directory changes.
 */
export function sdsWarnings(backend: OrderBackendConfig | undefined): string[] {
  if (backend === undefined || dirname(backend.clientKeyFile) === dirname(backend.clientCertFile)) return [];
  return [
    `EDGE_CLIENT_KEY_FILE is not in the directory of EDGE_CLIENT_CERT_FILE (${dirname(backend.clientCertFile)}); `
    + 'only that directory is watched, so rotate the key before the certificate.',
  ];
}
