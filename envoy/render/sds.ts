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

/**
 * An SDS resource file holding one certificate and its key (the backend client certificate here,
 * the server certificate in tls.ts), re-read on rotation.
 */
export function certificateSds(secret: string, certFile: string, keyFile: string): JsonObject {
  return {
    resources: [typedConfig(TYPE_URL.secret, {
      name: secret,
      tls_certificate: {
        certificate_chain: { filename: certFile },
        private_key: { filename: keyFile },
        // Envoy re-reads both files on any move inside this directory: a Kubernetes `..data`
        // symlink swap or `mv new old`. Writing a file in place is NOT seen (docs/envoy.md).
        watched_directory: { path: dirname(certFile) },
      },
    })],
  };
}

/**
 * Envoy watches only the certificate's directory; a key elsewhere is re-read only when that
 * directory changes. `certVar`/`keyVar`: the settings that named the two files.
 */
export function keyDirectoryWarnings(certVar: string, certFile: string, keyVar: string, keyFile: string): string[] {
  if (dirname(keyFile) === dirname(certFile)) return [];
  return [
    `${keyVar} is not in the directory of ${certVar} (${dirname(certFile)}); `
    + 'only that directory is watched, so rotate the key before the certificate.',
  ];
}

/** The SDS resource file of the backend client certificate (EDGE_CLIENT_CERT_FILE/EDGE_CLIENT_KEY_FILE). */
export function buildSds(backend: OrderBackendConfig): JsonObject {
  return certificateSds(CLIENT_CERT_SECRET, backend.clientCertFile, backend.clientKeyFile);
}

/** keyDirectoryWarnings for the backend client certificate. */
export function sdsWarnings(backend: OrderBackendConfig | undefined): string[] {
  if (backend === undefined) return [];
  return keyDirectoryWarnings('EDGE_CLIENT_CERT_FILE', backend.clientCertFile, 'EDGE_CLIENT_KEY_FILE', backend.clientKeyFile);
}
