/**
 * EDGE_TLS_* and EDGE_PROXY_PROTOCOL: the settings (each contradiction refused with one line) and
 * what they render (the listener's TLS context, the server-certificate SDS file, the PROXY
 * protocol listener filter, the client-certificate filter), accepted by `envoy --mode validate`.
 * The behaviour itself is proved through the real Envoy in e2e/edge-tls*.test.ts.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { parse } from 'yaml';
import { ConfigError, loadConfig, type Env } from '../../authz/src/common/config.ts';
import { validateBootstrap } from '../envoy-bin.ts';
import {
  CLIENT_CERT_FILTER, EDGE_ALPN, EDGE_TLS_CIPHERS, FILTER, renderEnvoy, SERVER_SDS_FILE, serverSdsPath,
} from '../render.ts';
import { at, makeCerts, tempDir } from './helpers.ts';

type Obj = Record<string, unknown>;
const TLS: Env = { EDGE_TLS_CERT_FILE: '/tls/tls.crt', EDGE_TLS_KEY_FILE: '/tls/tls.key' };

function refused(env: Env, variable: string, re: RegExp): void {
  assert.throws(() => loadConfig(env), (e: unknown) => {
    assert.ok(e instanceof ConfigError);
    assert.equal(e.variable, variable);
    assert.match(e.message, re);
    assert.doesNotMatch(e.message, /\n/, 'one line');
    return true;
  });
}

test('EDGE_TLS_CERT_FILE and EDGE_TLS_KEY_FILE: both or neither, else refused naming the missing one', () => {
  refused({ EDGE_TLS_CERT_FILE: '/a.crt' }, 'EDGE_TLS_KEY_FILE', /both or neither/);
  refused({ EDGE_TLS_KEY_FILE: '/a.key' }, 'EDGE_TLS_CERT_FILE', /both or neither/);
  assert.equal(loadConfig({}).edgeTls, undefined);
  assert.deepEqual({ ...loadConfig(TLS).edgeTls }, { certFile: '/tls/tls.crt', keyFile: '/tls/tls.key', clientCaFile: undefined, clientAuth: 'off' });
});

test('EDGE_TLS_CLIENT_AUTH and EDGE_TLS_CLIENT_CA_FILE: only with TLS, only together, one of off|optional|required', () => {
  refused({ EDGE_TLS_CLIENT_AUTH: 'required' }, 'EDGE_TLS_CLIENT_AUTH', /need TLS/);
  refused({ EDGE_TLS_CLIENT_CA_FILE: '/ca.pem' }, 'EDGE_TLS_CLIENT_CA_FILE', /need TLS/);
  refused({ ...TLS, EDGE_TLS_CLIENT_AUTH: 'required' }, 'EDGE_TLS_CLIENT_CA_FILE', /EDGE_TLS_CLIENT_AUTH=required/);
  refused({ ...TLS, EDGE_TLS_CLIENT_CA_FILE: '/ca.pem' }, 'EDGE_TLS_CLIENT_AUTH', /"optional" or "required"/);
  refused({ ...TLS, EDGE_TLS_CLIENT_CA_FILE: '/ca.pem', EDGE_TLS_CLIENT_AUTH: 'yes' }, 'EDGE_TLS_CLIENT_AUTH', /"off", "optional" or "required"/);
  for (const mode of ['optional', 'required', 'OPTIONAL'] as const) {
    assert.equal(loadConfig({ ...TLS, EDGE_TLS_CLIENT_CA_FILE: '/ca.pem', EDGE_TLS_CLIENT_AUTH: mode }).edgeTls?.clientAuth, mode.toLowerCase());
  }
});

test('EDGE_PROXY_PROTOCOL: off|required; required with XFF_NUM_TRUSTED_HOPS ≥ 1 is refused (two sources of the client address)', () => {
  assert.equal(loadConfig({}).proxyProtocol, 'off');
  assert.equal(loadConfig({ EDGE_PROXY_PROTOCOL: 'required' }).proxyProtocol, 'required');
  refused({ EDGE_PROXY_PROTOCOL: 'v2' }, 'EDGE_PROXY_PROTOCOL', /"off" or "required"/);
  refused({ EDGE_PROXY_PROTOCOL: 'required', XFF_NUM_TRUSTED_HOPS: '1' }, 'XFF_NUM_TRUSTED_HOPS', /EDGE_PROXY_PROTOCOL=required/);
  assert.equal(loadConfig({ EDGE_PROXY_PROTOCOL: 'off', XFF_NUM_TRUSTED_HOPS: '2' }).xffNumTrustedHops, 2);
});

function rendered(env: Env, sdsPath = '/etc/envoy/sds-client-cert.yaml'): { bootstrap: Obj; serverSds: Obj | undefined; warnings: readonly string[] } {
  const r = renderEnvoy(loadConfig(env), { sdsPath });
  return { bootstrap: parse(r.bootstrap) as Obj, serverSds: r.serverSds === undefined ? undefined : parse(r.serverSds) as Obj, warnings: r.warnings };
}

test('without EDGE_TLS_*: the public listener is plaintext (no transport socket, :scheme http), no server SDS file', () => {
  const r = rendered({});
  assert.equal(r.serverSds, undefined);
  const chain = at(r.bootstrap, 'static_resources.listeners[0].filter_chains[0]') as Obj;
  assert.equal(chain['transport_socket'], undefined);
  assert.equal(at(chain, 'filters[0].typed_config.scheme_header_transformation.scheme_to_overwrite'), 'http');
  assert.deepEqual((at(r.bootstrap, 'static_resources.listeners[0].listener_filters') as Obj[]).map((f) => f['name']), [FILTER.httpInspector]);
});

test('with EDGE_TLS_*: TLS 1.2–1.3, the intermediate cipher list, ALPN h2,http/1.1, the certificate from SDS beside the client one; :scheme https; the ingest listener stays plaintext', () => {
  const r = rendered({ ...TLS, INGEST_PORT: '8090' });
  const chain = at(r.bootstrap, 'static_resources.listeners[0].filter_chains[0]') as Obj;
  const ctx = at(chain, 'transport_socket.typed_config') as Obj;
  assert.deepEqual(at(ctx, 'common_tls_context.tls_params'), {
    tls_minimum_protocol_version: 'TLSv1_2', tls_maximum_protocol_version: 'TLSv1_3', cipher_suites: [...EDGE_TLS_CIPHERS], ecdh_curves: ['X25519', 'P-256', 'P-384'],
  });
  assert.deepEqual(at(ctx, 'common_tls_context.alpn_protocols'), [...EDGE_ALPN]);
  assert.equal(at(ctx, 'common_tls_context.tls_certificate_sds_secret_configs[0].sds_config.path_config_source.path'), `/etc/envoy/${SERVER_SDS_FILE}`);
  assert.equal(ctx['require_client_certificate'], false);
  assert.equal((ctx['common_tls_context'] as Obj)['validation_context'], undefined, 'no client certificate asked for');
  assert.equal(chain['transport_socket_connect_timeout'], '10s');
  assert.equal(at(chain, 'filters[0].typed_config.scheme_header_transformation.scheme_to_overwrite'), 'https');
  const ingest = at(r.bootstrap, 'static_resources.listeners[1].filter_chains[0]') as Obj;
  assert.equal(ingest['transport_socket'], undefined);
  assert.equal(at(ingest, 'filters[0].typed_config.scheme_header_transformation.scheme_to_overwrite'), 'http');
  assert.deepEqual(at(r.serverSds, 'resources[0].tls_certificate'), {
    certificate_chain: { filename: '/tls/tls.crt' }, private_key: { filename: '/tls/tls.key' }, watched_directory: { path: '/tls' },
  });
  assert.deepEqual(r.warnings, []);
  assert.match(rendered({ EDGE_TLS_CERT_FILE: '/a/tls.crt', EDGE_TLS_KEY_FILE: '/b/tls.key' }).warnings.join('\n'), /EDGE_TLS_KEY_FILE is not in the directory/);
});

test('client certificates: required asks and insists; optional asks and accepts an untrusted one; both add the fingerprint filter after header_mutation', () => {
  const filters = (b: Obj): string[] => (at(b, 'static_resources.listeners[0].filter_chains[0].filters[0].typed_config.http_filters') as Obj[]).map((f) => f['name'] as string);
  for (const mode of ['required', 'optional'] as const) {
    const r = rendered({ ...TLS, EDGE_TLS_CLIENT_CA_FILE: '/ca/clients.pem', EDGE_TLS_CLIENT_AUTH: mode });
    const ctx = at(r.bootstrap, 'static_resources.listeners[0].filter_chains[0].transport_socket.typed_config') as Obj;
    assert.equal(ctx['require_client_certificate'], mode === 'required');
    assert.deepEqual(at(ctx, 'common_tls_context.validation_context'), {
      trusted_ca: { filename: '/ca/clients.pem' }, ...(mode === 'optional' ? { trust_chain_verification: 'ACCEPT_UNTRUSTED' } : {}),
    });
    assert.deepEqual(filters(r.bootstrap).slice(0, 2), [FILTER.headerMutation, CLIENT_CERT_FILTER]);
  }
  assert.ok(!filters(rendered(TLS).bootstrap).includes(CLIENT_CERT_FILTER));
  // The fingerprint reaches authz (the Check's allowed headers) and, header_mutation having removed
  // any client-sent copy first (EDGE_SET_HEADERS), is only ever the edge's.
  const r = rendered({ ...TLS, EDGE_TLS_CLIENT_CA_FILE: '/ca/clients.pem', EDGE_TLS_CLIENT_AUTH: 'required' });
  const chain = at(r.bootstrap, 'static_resources.listeners[0].filter_chains[0].filters[0].typed_config.http_filters') as Obj[];
  const authz = chain.find((f) => f['name'] === FILTER.extAuthz)!;
  assert.ok((at(authz, 'typed_config.allowed_headers.patterns') as Obj[]).some((p) => p['exact'] === 'x-edge-client-cert-sha256'));
  const removed = (at(chain[0], 'typed_config.mutations.request_mutations') as Obj[]).map((m) => m['remove']);
  assert.ok(removed.includes('x-edge-client-cert-sha256'));
  assert.match(at(chain[1], 'typed_config.default_source_code.inline_string') as string, /peerCertificateValidated\(\)/);
});

test('EDGE_PROXY_PROTOCOL=required: the proxy_protocol listener filter first, on the public listener only', () => {
  const r = rendered({ EDGE_PROXY_PROTOCOL: 'required', INGEST_PORT: '8090' });
  assert.deepEqual((at(r.bootstrap, 'static_resources.listeners[0].listener_filters') as Obj[]).map((f) => f['name']),
    ['envoy.filters.listener.proxy_protocol', FILTER.httpInspector]);
  assert.deepEqual((at(r.bootstrap, 'static_resources.listeners[1].listener_filters') as Obj[]).map((f) => f['name']), [FILTER.httpInspector]);
});

test('envoy --mode validate accepts TLS with required and optional client certificates and PROXY protocol', () => {
  const { dir, cleanup } = tempDir('tls-render-');
  try {
    const certs = makeCerts(dir, 'DNS:localhost');
    for (const mode of ['required', 'optional'] as const) {
      const env: Env = {
        EDGE_TLS_CERT_FILE: certs.serverCert, EDGE_TLS_KEY_FILE: certs.serverKey, EDGE_TLS_CLIENT_CA_FILE: certs.caFile,
        EDGE_TLS_CLIENT_AUTH: mode, EDGE_PROXY_PROTOCOL: 'required',
      };
      const sdsPath = join(dir, 'sds.yaml');
      const r = renderEnvoy(loadConfig(env), { sdsPath });
      writeFileSync(join(dir, 'envoy.yaml'), r.bootstrap);
      writeFileSync(serverSdsPath({ sdsPath }), r.serverSds ?? '');
      const v = validateBootstrap(join(dir, 'envoy.yaml'));
      assert.ok(v.ok, v.output);
    }
  } finally {
    cleanup();
  }
});
