/**
 * The ext_authz body rule of every rendered route comes from its registry route
 * (authz/src/common/routes.ts), never from its kind: a route without a body limit streams its
 * body, a body route gets its own limit, and every route value Envoy sends is one the service
 * knows (issue 28, fail closed). Plus: a table with a route added by one registry entry is
 * accepted by real Envoy 1.40 (`envoy --mode validate`).
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { parse, stringify } from 'yaml';
import { loadConfig, type Config } from '../../authz/src/common/config.ts';
import { API_ROUTES, isRouteKind, ROUTE_KINDS, type RouteRegistry, type RouteSpec } from '../../authz/src/common/routes.ts';
import { authzPerRoute } from '../render/ext-authz.ts';
import { routeName } from '../render/names.ts';
import { routes } from '../render/routes.ts';
import { renderEnvoy, type JsonObject } from '../render.ts';
import { validateBootstrap } from '../envoy-bin.ts';
import { certPaths, makeCerts, routesOf, tempDir } from './helpers.ts';

type Obj = Record<string, unknown>;
const checkSettings = (perRoute: unknown): Obj => (perRoute as { check_settings: Obj }).check_settings;

describe('ext_authz per-route body rule', () => {
  test('authzPerRoute – without a limit no kind buffers a body (not even order or ingest: no limit is chosen by kind)', () => {
    for (const kind of ROUTE_KINDS) {
      const s = checkSettings(authzPerRoute(kind, undefined));
      assert.deepEqual([s['disable_request_body_buffering'], s['with_request_body']], [true, undefined], kind);
    }
  });

  test('authzPerRoute – with a limit, exactly that limit whatever the kind', () => {
    for (const kind of ROUTE_KINDS) {
      assert.deepEqual(checkSettings(authzPerRoute(kind, 1234))['with_request_body'], { max_request_bytes: 1234, allow_partial_message: false, pack_as_bytes: true }, kind);
    }
  });

  // Different limits, so a route given the other one is caught.
  const config = loadConfig({ INGEST_MAX_BYTES: '7777', ORDER_MAX_BYTES: '3333' });
  const registry: RouteRegistry = API_ROUTES;

  test('rendered routes – each body route buffers up to its own registry limit, every other route buffers nothing', () => {
    const limits = new Map<string, number>();
    for (const r of registry) {
      if (r.bodyLimit !== undefined) for (const name of [routeName.main(r.id), routeName.noBackend(r.id)]) limits.set(name, config[r.bodyLimit]);
    }
    for (const r of routes(config) as unknown as Obj[]) {
      const s = checkSettings((r['typed_per_filter_config'] as Obj)['envoy.filters.http.ext_authz']);
      const limit = limits.get(r['name'] as string);
      if (limit === undefined) assert.equal(s['disable_request_body_buffering'], true, r['name'] as string);
      else assert.equal((s['with_request_body'] as Obj)['max_request_bytes'], limit, r['name'] as string);
    }
  });

  test('rendered routes – every route value Envoy sends is a kind the service knows (none is denied as unknown)', () => {
    for (const ingestPort of [undefined, '18082']) {
      const c = loadConfig(ingestPort === undefined ? {} : { INGEST_PORT: ingestPort });
      for (const listener of ingestPort === undefined ? ['edge'] as const : ['edge', 'ingest'] as const) {
        for (const r of routes(c, listener) as unknown as Obj[]) {
          for (const f of Object.values(r['typed_per_filter_config'] as Obj)) {
            const route = (checkSettings(f)?.['context_extensions'] as Obj | undefined)?.['route'];
            if (route !== undefined) assert.ok(isRouteKind(route as string), `${listener}/${String(r['name'])}: ${String(route)}`);
          }
        }
      }
    }
  });
});

describe('a route added by one registry entry, through real Envoy', () => {
  const work = tempDir('edge-registry-render-');
  before(() => { makeCerts(work.dir); });
  after(() => work.cleanup());

  const CANCELS = {
    id: 'cancels', methods: ['POST'], path: '/v1/cancels', kind: 'order', bodyLimit: 'orderMaxBytes', rateLimitStage: 'header_phase',
    upstream: 'order_backend', backendPath: '/cancels',
    openapi: { operationId: 'cancelOrder', summary: 'Cancel an order', tag: 'orders' }, errors: ['invalid_json', 'payload_too_large'],
  } as const satisfies RouteSpec;

  function withRoute(config: Config, file: string): string[] {
    const rendered = renderEnvoy(config, { sdsPath: join(work.dir, 'sds.yaml') });
    if (rendered.sds !== undefined) writeFileSync(join(work.dir, 'sds.yaml'), rendered.sds);
    const bootstrap = parse(rendered.bootstrap) as JsonObject;
    const table = routesOf(bootstrap);
    table.splice(0, table.length, ...(routes(config, 'edge', [...API_ROUTES, CANCELS]) as unknown as Obj[]));
    writeFileSync(file, stringify(bootstrap));
    return table.map((r) => r['name'] as string);
  }

  test('envoy --mode validate – accepts the table with the new route, with and without an order backend', () => {
    const certs = certPaths(work.dir);
    const backend = {
      ORDER_BACKEND_URL: 'https://orders.test:9443', ORDER_BACKEND_CA_FILE: certs.caFile, EDGE_CLIENT_CERT_FILE: certs.clientCert, EDGE_CLIENT_KEY_FILE: certs.clientKey,
    };
    for (const [name, env] of [['no-backend', {}], ['backend', backend]] as const) {
      const file = join(work.dir, `${name}.yaml`);
      const names = withRoute(loadConfig(env), file);
      assert.ok(names.includes(name === 'backend' ? 'cancels' : 'cancels_no_backend'), names.join(', '));
      const v = validateBootstrap(file);
      assert.ok(v.ok, `${name}: ${v.output}`);
    }
  });
});
