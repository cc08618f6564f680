/**
 * Unix domain sockets between Envoy and the TS service (AUTHZ_GRPC_SOCKET, MARKET_SOCKET;
 * docs/envoy.md "Unix domain sockets"): the rendered clusters (STATIC `pipe` endpoints, no TCP
 * keep-alive, the rate limit cluster following the authz socket), real Envoy 1.40 accepting them,
 * and a live Envoy deciding a request through a real gRPC Check server and reading from a market
 * server, each listening on a socket only.
 *
 *   scripts/node --test envoy/test/uds-render.test.ts
 */
import assert from 'node:assert/strict';
import { mkdirSync, writeFileSync } from 'node:fs';
import http from 'node:http';
import { join } from 'node:path';
import { after, describe, test } from 'node:test';
import { parse } from 'yaml';
import { loadConfig, type Env } from '../../authz/src/common/config.ts';
import { ALLOW } from '../../authz/src/authz/decision.ts';
import { createGrpcServer } from '../../authz/src/authz/grpc-server.ts';
import { envoyBinary, validateBootstrap } from '../envoy-bin.ts';
import { CLUSTER, renderEnvoy, type JsonObject } from '../render.ts';
import { at, clusterNamed, request, startEnvoy, tempDir } from './helpers.ts';

const work = tempDir('edge-envoy-uds-');
after(() => work.cleanup());
type Obj = Record<string, unknown>;

function render(env: Env): { bootstrap: JsonObject; file: string } {
  const dir = join(work.dir, `r-${Math.random().toString(36).slice(2)}`);
  mkdirSync(dir);
  const text = renderEnvoy(loadConfig(env), { sdsPath: '/etc/envoy/sds-client-cert.yaml' }).bootstrap;
  const file = join(dir, 'envoy.yaml');
  writeFileSync(file, text);
  return { bootstrap: parse(text) as JsonObject, file };
}

const endpoint = (b: JsonObject, name: string): unknown => at(clusterNamed(b, name), 'load_assignment.endpoints[0].lb_endpoints[0].endpoint.address');
const SOCKETS: Env = { AUTHZ_GRPC_SOCKET: '/run/edge/authz.sock', MARKET_SOCKET: '/run/edge/market.sock' };

describe('rendered clusters with AUTHZ_GRPC_SOCKET and MARKET_SOCKET', () => {
  test('authz and market are STATIC pipe endpoints on the sockets, without TCP keep-alive', () => {
    const { bootstrap } = render(SOCKETS);
    for (const [cluster, path] of [[CLUSTER.authz, '/run/edge/authz.sock'], [CLUSTER.market, '/run/edge/market.sock']] as const) {
      const c = clusterNamed(bootstrap, cluster) as Obj;
      assert.deepEqual(endpoint(bootstrap, cluster), { pipe: { path } }, cluster);
      assert.equal(c['type'], 'STATIC', cluster);
      assert.equal(c['cluster_type'], undefined, `${cluster}: no DNS`);
      assert.equal(c['upstream_connection_options'], undefined, `${cluster}: no TCP keep-alive on a Unix socket`);
    }
  });

  test('without them: host:port over TCP with keep-alive, as before', () => {
    const { bootstrap } = render({ AUTHZ_GRPC_PORT: '7001', MARKET_PORT: '7002' });
    assert.deepEqual(endpoint(bootstrap, CLUSTER.authz), { socket_address: { address: '127.0.0.1', port_value: 7001 } });
    assert.deepEqual(endpoint(bootstrap, CLUSTER.market), { socket_address: { address: '127.0.0.1', port_value: 7002 } });
    assert.ok(at(clusterNamed(bootstrap, CLUSTER.market), 'upstream_connection_options.tcp_keepalive'));
  });

  test('one socket alone: only that cluster moves to it', () => {
    const { bootstrap } = render({ MARKET_SOCKET: '/run/edge/market.sock' });
    assert.deepEqual(endpoint(bootstrap, CLUSTER.market), { pipe: { path: '/run/edge/market.sock' } });
    assert.deepEqual(endpoint(bootstrap, CLUSTER.authz), { socket_address: { address: '127.0.0.1', port_value: 9191 } });
  });

  test('the global limit: taken in the Check over the authz socket (no rate limit cluster); another service at RATELIMIT_SERVICE_ADDRESS stays on TCP', () => {
    const redis = { REDIS_URL: 'redis://127.0.0.1:6379/0', RATE_LIMIT_SCOPE: 'global' };
    const own = render({ ...SOCKETS, ...redis }).bootstrap;
    assert.equal(clusterNamed(own, CLUSTER.rateLimit), undefined);
    assert.deepEqual(endpoint(own, CLUSTER.authz), { pipe: { path: '/run/edge/authz.sock' } });
    const other = render({ ...SOCKETS, ...redis, RATELIMIT_SERVICE_ADDRESS: 'ratelimit.internal:8081' }).bootstrap;
    assert.deepEqual(at(endpoint(other, CLUSTER.rateLimit), 'socket_address.address'), 'ratelimit.internal');
  });

  test('real Envoy 1.40 accepts it (envoy --mode validate exits 0, nothing deprecated)', { skip: envoyBinary() === '' }, () => {
    const v = validateBootstrap(render({ ...SOCKETS, REDIS_URL: 'redis://127.0.0.1:6379/0' }).file);
    assert.equal(v.exitCode, 0, v.output);
    assert.doesNotMatch(v.output, /deprecated/i);
  });
});

describe('live Envoy 1.40 over Unix sockets', () => {
  test('a read is decided by the Check server on AUTHZ_GRPC_SOCKET and served by the market server on MARKET_SOCKET', async (t) => {
    const dir = join(work.dir, 'live');
    mkdirSync(dir);
    const sockets = { AUTHZ_GRPC_SOCKET: join(dir, 'authz.sock'), MARKET_SOCKET: join(dir, 'market.sock') };
    let checks = 0;
    const grpc = createGrpcServer({ evaluate: () => { checks++; return ALLOW; }, observe: () => {}, onError: () => {} });
    await grpc.listenSocket(sockets.AUTHZ_GRPC_SOCKET);
    grpc.setServing(true);
    t.after(() => grpc.close(100));
    const seen: string[] = [];
    const market = http.createServer((req, res) => {
      seen.push(req.url ?? '');
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end('{"markets":[]}');
    });
    await new Promise<void>((resolve) => market.listen(sockets.MARKET_SOCKET, resolve));
    t.after(() => new Promise<void>((resolve) => market.close(() => resolve())));
    const { file } = render({ EDGE_PORT: '0', ENVOY_ADMIN_PORT: '0', ...sockets });
    const envoy = await startEnvoy(file, dir);
    t.after(() => envoy.stop());
    const r = await request(envoy.edgePort, 'GET', '/v1/markets');
    assert.equal(r.status, 200, r.body);
    assert.equal(r.body, '{"markets":[]}');
    assert.equal(checks, 1, 'one Check over the authz socket');
    assert.deepEqual(seen, ['/v1/markets']);
    // Nothing on the socket: the Check fails, and the request is refused (fail closed: 503, never allowed).
    await grpc.close(100);
    const down = await request(envoy.edgePort, 'GET', '/v1/markets');
    assert.equal(down.status, 503, down.body);
    assert.deepEqual(seen, ['/v1/markets'], 'the market was not asked');
  });
});
