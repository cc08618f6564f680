/**
 * The containers driver's wiring, checked without Docker (the definitions are pure data):
 * images pinned and the same as deploy/, every env name a setting the service reads, secrets as
 * *_FILE paths under a read-only mount, ports/aliases/mounts consistent with the Envoy config
 * rendered from the same settings, containers running as the owner of the generated files.
 * Where an engine answers, one smoke scenario brings the stack up (the full scenario files run
 * with E2E_DRIVER=containers npm run test:e2e); elsewhere it is skipped with one line saying why.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { createServer } from 'node:http';
import { join } from 'node:path';
import YAML from 'yaml';
import { ROOT } from '../../deploy/paths.ts';
import { loadConfig } from '../../authz/src/common/config.ts';
import { renderEnvoy } from '../../envoy/render.ts';
import { composeConfig } from '../../deploy/test/tools.ts';
import { settingsRead } from '../../deploy/test/support.ts';
import { containerDefinitions, CONTAINER_TRUSTED_CIDRS, DEFAULT_IMAGES, loopbackRequestCommand, parseLoopbackResponse, HOST_ALIAS, PATHS, PORTS, SECRET_FILES, stackEnv, type ContainerStackInput } from './definitions.ts';
import { containerSkip, dockerEngine } from '../lib/images.ts';

const input: ContainerStackInput = {
  pkiDir: '/tmp/pki', envoyConfigDir: '/tmp/envoy', secretsDir: '/tmp/secrets', backendPort: 18443, uid: 1234, gid: 1235, geoipDb: '/tmp/geo.mmdb',
};
const defs = Object.fromEntries(containerDefinitions(input).map((d) => [d.name, d]));
const bindsOf = (name: string): Map<string, string> => new Map(defs[name]?.binds.map(([s, t]) => [t, s]));

test('containers driver – the default images are the ones deploy/ runs (official Envoy of the tested version, Redis); the stand-ins replace only them', () => {
  const compose = composeConfig().file;
  assert.equal(defs['envoy']?.image, DEFAULT_IMAGES.envoy);
  assert.equal(DEFAULT_IMAGES.envoy, compose.services['envoy']?.image);
  assert.equal(DEFAULT_IMAGES.redis, compose.services['redis']?.image);
  const local = Object.fromEntries(containerDefinitions({ ...input, images: { envoy: 'local/e', redis: 'local/r' } }).map((d) => [d.name, d.image]));
  assert.deepEqual(local, { redis: 'local/r', authz: defs['authz']?.image, envoy: 'local/e' });
  assert.deepEqual(defs['redis']?.command, compose.services['redis']?.command?.filter((a, i, all) => a !== '--dir' && all[i - 1] !== '--dir'), 'Redis durable as in compose');
  assert.equal(defs['authz']?.user, '1234:1235');
  assert.equal(defs['envoy']?.user, '1234:1235');
  assert.equal(defs['envoy']?.env['ENVOY_UID'], '1234', 'the Envoy entrypoint keeps the given user');
});

test('containers driver – every environment variable is a setting the service reads; secrets come from 0400 files, never env values', () => {
  const read = settingsRead();
  const env = defs['authz']!.env;
  for (const name of Object.keys(env)) assert.ok(read.has(name), name);
  for (const name of ['EDGE_INGEST_HMAC', 'EDGE_FEED_ED25519_PUBLIC_KEY', 'EDGE_FEED_ED25519_KEY']) assert.equal(env[name], undefined, name);
  assert.equal(env['EDGE_INGEST_HMAC_FILE'], `${PATHS.secrets}/${SECRET_FILES.hmac}`);
  assert.equal(env['EDGE_FEED_ED25519_PUBLIC_KEY_FILE'], `${PATHS.secrets}/${SECRET_FILES.feedPublicKeys}`);
  assert.equal(env['AUTHZ_ADMIN_TOKEN_FILE'], `${PATHS.secrets}/${SECRET_FILES.adminToken}`);
  assert.equal(bindsOf('authz').get(PATHS.secrets), input.secretsDir);
  assert.equal(env['GEO_TRUSTED_CIDRS'], CONTAINER_TRUSTED_CIDRS);
  loadConfig(env);
});

test('containers driver – exposed ports, aliases and mounts match the Envoy config rendered from the same settings', () => {
  const env = stackEnv(input);
  const boot = YAML.parse(renderEnvoy(loadConfig(env), { sdsPath: `${PATHS.envoyConfig}/sds-client-cert.yaml` }).bootstrap) as {
    static_resources: { clusters: { name: string; load_assignment?: { endpoints: { lb_endpoints: { endpoint: { address: { socket_address: { address: string; port_value: number } } } }[] }[] } }[]; listeners: { address: { socket_address: { port_value: number } } }[] };
  };
  const addr = (name: string): [string | undefined, number | undefined] => {
    const a = boot.static_resources.clusters.find((c) => c.name === name)?.load_assignment?.endpoints[0]?.lb_endpoints[0]?.endpoint.address.socket_address;
    return [a?.address, a?.port_value];
  };
  assert.deepEqual(addr('authz'), [defs['authz']?.alias, PORTS.grpc]);
  assert.deepEqual(addr('market'), [defs['authz']?.alias, PORTS.market]);
  assert.deepEqual(addr('order_backend'), [HOST_ALIAS, input.backendPort]);
  assert.equal(new URL(env['REDIS_URL']!).hostname, defs['redis']?.alias);
  assert.equal(boot.static_resources.listeners[0]?.address.socket_address.port_value, PORTS.edge);
  assert.ok(defs['authz']?.exposedPorts.includes(PORTS.grpc) && defs['envoy']?.exposedPorts.includes(PORTS.edge));
  assert.deepEqual(defs['envoy']?.command?.slice(0, 3), ['envoy', '-c', `${PATHS.envoyConfig}/envoy.yaml`]);
  assert.equal(bindsOf('envoy').get(PATHS.envoyConfig), input.envoyConfigDir);
  assert.equal(bindsOf('envoy').get(PATHS.pki), input.pkiDir, 'the PKI directory, so a ..data rotation reaches Envoy');
  for (const k of ['ORDER_BACKEND_CA_FILE', 'EDGE_CLIENT_CERT_FILE', 'EDGE_CLIENT_KEY_FILE']) assert.ok(env[k]?.startsWith(`${PATHS.pki}/`), k);
  // The database's directory, not the file: a new file renamed over it on the host is seen (a file bind keeps the old inode).
  assert.equal(env['GEOIP_DB'], `${PATHS.geoipDir}/geo.mmdb`);
  assert.equal(bindsOf('authz').get(PATHS.geoipDir), '/tmp');
  assert.deepEqual(defs['authz']?.wait, { kind: 'http', port: PORTS.market, path: '/healthz', statuses: [200] });
});

test('containers driver – admin requests run inside a container reach a loopback-only port (node and bash variants, chunked answers)', async () => {
  const server = createServer((req, res) => {
    res.writeHead(req.method === 'POST' ? 202 : 200, { 'transfer-encoding': 'chunked' });
    res.write(`${req.method} `);
    res.end(`${req.url ?? ''}${req.headers.authorization === undefined ? '' : ` ${req.headers.authorization}`}\n`);
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const port = (server.address() as { port: number }).port;
  try {
    for (const tool of ['node', 'bash'] as const) {
      const [bin, ...args] = loopbackRequestCommand(tool, port, 'POST', '/admin/seal');
      const out = await new Promise<string>((resolve, reject) => {
        execFile(bin === 'node' ? join(ROOT, 'scripts/node') : bin!, args, (err, stdout) => (err === null ? resolve(stdout) : reject(err)));
      });
      assert.deepEqual(parseLoopbackResponse(tool, out), { status: 202, body: 'POST /admin/seal\n' }, tool);
      // With the admin token: the authorization header reaches the port, exactly.
      const [bin2, ...args2] = loopbackRequestCommand(tool, port, 'POST', '/admin/seal', 'Bearer abc123');
      const out2 = await new Promise<string>((resolve, reject) => {
        execFile(bin2 === 'node' ? join(ROOT, 'scripts/node') : bin2!, args2, (err, stdout) => (err === null ? resolve(stdout) : reject(err)));
      });
      assert.deepEqual(parseLoopbackResponse(tool, out2), { status: 202, body: 'POST /admin/seal Bearer abc123\n' }, `${tool} with a token`);
    }
  } finally {
    server.close();
  }
});

const engine = dockerEngine();
test('containers driver – brings the stack up and answers /healthz through Envoy', { skip: containerSkip('containers driver', engine.ok ? undefined : `skipped: ${engine.why}; the same scenarios ran on local processes (e2e/*.test.ts)`) }, async () => {
  const { startContainerStack } = await import('./stack.ts');
  const stack = await startContainerStack();
  try {
    assert.equal((await fetch(`${stack.edgeUrl}/healthz`)).status, 200);
    assert.equal((await fetch(`${stack.authzAdmin}/metrics`)).status, 200);
  } finally {
    await stack.stop();
  }
});
