/**
 * The route registry (authz/src/common/routes.ts) and what is derived from it or checked against
 * it: classify(), Envoy's route table, the market metrics' series, the OpenAPI paths and their
 * error codes, docs/api.md's route table, the anonymizer policy's route names. The last tests add
 * a route by one registry entry and show each of those following (issue 28).
 */
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { ANONYMIZER_ROUTES, loadConfig, type Config } from '../src/common/config.ts';
import { DECISION_CODES, MARKET_REQUEST_STATUSES, marketRequestStatuses } from '../src/common/metrics.ts';
import {
  API_ROUTES, classify, FALLBACK_KIND, KINDS, ROUTE_KINDS, type RouteRegistry, type RouteSpec,
} from '../src/common/routes.ts';
import type { ErrorCode } from '../src/common/errors.ts';
import { routes } from '../../envoy/render/routes.ts';
import { LISTENER, ROUTE, TYPE_URL } from '../../envoy/render/names.ts';
import { buildOpenApi, buildPaths } from '../../scripts/openapi.ts';

type Obj = Record<string, unknown>;
const DOCS = new URL('../../docs/', import.meta.url);

/** The codes every route can be answered with, whoever answers (routes.ts RouteBase.errors). */
function commonCodes(route: RouteSpec): ErrorCode[] {
  return ['bad_request', 'too many requests', 'service_unavailable', 'sealed', ...(KINDS[route.kind].geo ? ['restricted_jurisdiction' as const] : [])];
}

/** Every `error` code an operation's responses name (response $refs resolved, schema $refs not). */
function operationCodes(doc: Obj, op: Obj): Set<string> {
  const responses = (doc['components'] as { responses: Record<string, Obj> }).responses;
  const out = new Set<string>();
  const walk = (v: unknown): void => {
    if (Array.isArray(v)) { v.forEach(walk); return; }
    if (v === null || typeof v !== 'object') return;
    const o = v as Obj;
    const ref = o['$ref'];
    if (typeof ref === 'string' && ref.startsWith('#/components/responses/')) walk(responses[ref.slice('#/components/responses/'.length)]);
    const err = (o['properties'] as { error?: { enum?: string[]; const?: string } } | undefined)?.error;
    if (err?.enum !== undefined) err.enum.forEach((c) => out.add(c));
    if (err?.const !== undefined) out.add(err.const);
    for (const x of Object.values(o)) walk(x);
  };
  walk(op['responses']);
  return out;
}

function operationOf(paths: Obj, route: RouteSpec): Obj {
  const op = (paths[route.path] as Obj | undefined)?.[route.methods[0]!.toLowerCase()] as Obj | undefined;
  assert.ok(op !== undefined, `${route.methods[0]} ${route.path} is in the OpenAPI paths`);
  return op;
}

const sorted = (xs: Iterable<string>): string[] => [...xs].sort();

describe('route registry', () => {
  test('registry – frozen, one route per path, unique ids and operationIds', () => {
    assert.ok(Object.isFrozen(API_ROUTES) && Object.isFrozen(KINDS));
    for (const key of ['path', 'id'] as const) assert.equal(new Set(API_ROUTES.map((r) => r[key])).size, API_ROUTES.length, key);
    assert.equal(new Set(API_ROUTES.map((r) => r.openapi.operationId)).size, API_ROUTES.length);
    assert.deepEqual(ROUTE_KINDS, ['ingest', 'order', 'read', 'geoblock']);
  });

  test('registry – a route whose body authz reads takes the global rate limit in its header phase, the others in their one Check', () => {
    const registry: RouteRegistry = API_ROUTES;
    for (const r of registry) assert.equal(r.rateLimitStage, r.bodyLimit === undefined ? 'check' : 'header_phase', r.id);
    assert.deepEqual(registry.filter((r) => r.bodyLimit !== undefined).map((r) => KINDS[r.kind].headerLabel), ['order_headers', 'ingest_headers']);
  });

  test('classify – each route\'s methods give its kind; another method or any other path is the catch-all read', () => {
    for (const r of API_ROUTES) {
      for (const m of r.methods) assert.equal(classify(m, r.path), r.kind, `${m} ${r.path}`);
      for (const m of ['GET', 'POST', 'PUT', 'DELETE', 'post'].filter((x) => !(r.methods as readonly string[]).includes(x))) {
        assert.equal(classify(m, r.path), FALLBACK_KIND, `${m} ${r.path}`);
      }
    }
    for (const p of ['/v1/orders/', '/V1/ORDERS', '/internal/ingest/market/', '/nope', '']) assert.equal(classify('POST', p), 'read', p);
  });

  test('anonymizer – ANONYMIZER_POLICY names exactly the kinds the rule can refuse', () => {
    assert.deepEqual(sorted(ANONYMIZER_ROUTES), sorted(ROUTE_KINDS.flatMap((k) => KINDS[k].anonymizer ?? [])));
  });

  test('metrics – the market service\'s route series are the registry\'s market routes (and `other`)', () => {
    assert.deepEqual(sorted(Object.keys(MARKET_REQUEST_STATUSES)), sorted([...API_ROUTES.filter((r) => r.upstream === 'market').map((r) => r.path), 'other']));
  });

  test('docs – docs/api.md\'s route table lists the registry\'s routes, in its order', () => {
    const md = readFileSync(new URL('api.md', DOCS), 'utf8');
    const table = md.slice(md.indexOf('\n## Routes\n')).split('\n\n')[1]!;
    const rows = table.split('\n').slice(2).map((l) => l.split('|').map((c) => c.trim()));
    assert.deepEqual(rows.map((c) => [c[1], c[2]]), API_ROUTES.map((r) => [r.methods[0], `\`${r.path}\``]));
  });

  test('openapi – each route is one operation at its path, with its id, summary and tag', () => {
    const doc = buildOpenApi();
    const paths = doc['paths'] as Obj;
    assert.deepEqual(Object.keys(paths), API_ROUTES.map((r) => r.path));
    for (const r of API_ROUTES) {
      const op = operationOf(paths, r);
      assert.deepEqual([op['operationId'], op['summary'], op['tags']], [r.openapi.operationId, r.openapi.summary, [r.openapi.tag]], r.id);
    }
  });

  test('openapi – each operation lists exactly its registry errors plus every route\'s, and every authz decision of its kind', () => {
    const doc = buildOpenApi();
    const paths = doc['paths'] as Obj;
    for (const r of API_ROUTES) {
      const codes = operationCodes(doc, operationOf(paths, r));
      assert.deepEqual(sorted(codes), sorted(new Set([...r.errors, ...commonCodes(r)])), r.id);
      const decided = [r.kind, KINDS[r.kind].headerLabel].flatMap((l) => (l === undefined ? [] : DECISION_CODES[l]));
      for (const c of decided) if (c !== 'ok') assert.ok(codes.has(c), `${r.id}: the authz decision ${c} is documented`);
    }
  });
});

// ─── Adding a route: one registry entry, and everything follows ─────────────────────────────

/** A new order-backend route: body read by authz (the order policy), forwarded to the backend's /cancels. */
const CANCELS = {
  id: 'cancels', methods: ['POST'], path: '/v1/cancels', kind: 'order', bodyLimit: 'orderMaxBytes', rateLimitStage: 'header_phase',
  upstream: 'order_backend', backendPath: '/cancels',
  openapi: { operationId: 'cancelOrder', summary: 'Cancel an order at the order backend', tag: 'orders' },
  errors: ['invalid_json', 'invalid_order', 'unknown_market', 'market_closed', 'payload_too_large', 'deadline_expired', 'deadline_too_far', 'invalid_size', 'backend_unavailable', 'backend_timeout'],
} as const satisfies RouteSpec;

/** A new market read (geo only, answered by the market service). */
const EVENTS = {
  id: 'events', methods: ['GET', 'HEAD'], path: '/v1/events', kind: 'read', rateLimitStage: 'check', upstream: 'market', marketStatuses: [200, 400, 503],
  openapi: { operationId: 'listEvents', summary: 'Market events', tag: 'market data' }, errors: ['invalid_query', 'backend_timeout'],
} as const satisfies RouteSpec;

const BACKEND_ENV = {
  ORDER_BACKEND_URL: 'https://orders.internal.example:9443', ORDER_BACKEND_CA_FILE: '/x/ca.pem',
  EDGE_CLIENT_CERT_FILE: '/x/c/tls.crt', EDGE_CLIENT_KEY_FILE: '/x/c/tls.key', ORDER_MAX_BYTES: '4096', INGEST_MAX_BYTES: '8192',
};

type EnvoyRoute = Obj & {
  name: string; match: Obj; route?: Obj; direct_response?: { status: number }; request_body_buffer_limit?: number;
  typed_per_filter_config: Record<string, Obj & { check_settings?: Obj }>;
};
const table = (config: Config, registry?: RouteRegistry): EnvoyRoute[] => routes(config, LISTENER.edge, registry) as unknown as EnvoyRoute[];
const authzOf = (r: EnvoyRoute): Obj => r.typed_per_filter_config['envoy.filters.http.ext_authz']!.check_settings!;

describe('route registry – adding a route', () => {
  const withCancels: RouteRegistry = [...API_ROUTES, CANCELS];
  const withEvents: RouteRegistry = [...API_ROUTES, EVENTS];

  test('envoy – a body route gets its 413, its route to its upstream with its own body limit and kind, its 405, before the catch-all', () => {
    const config = loadConfig(BACKEND_ENV);
    const before = table(config).map((r) => r.name);
    const after = table(config, withCancels);
    const names = after.map((r) => r.name);
    assert.deepEqual(names.filter((n) => !before.includes(n)), ['cancels_payload_too_large', 'cancels', 'cancels_method_not_allowed']);
    assert.equal(names.at(-1), ROUTE.read, 'the catch-all stays last');
    const route = after.find((r) => r.name === 'cancels')!;
    assert.deepEqual(route.match, { path: '/v1/cancels', headers: [{ name: ':method', string_match: { exact: 'POST' } }] });
    assert.equal(route.route?.['prefix_rewrite'], '/cancels');
    assert.equal(route.request_body_buffer_limit, config.orderMaxBytes);
    assert.deepEqual(authzOf(route)['with_request_body'], { max_request_bytes: config.orderMaxBytes, allow_partial_message: false, pack_as_bytes: true });
    assert.deepEqual(authzOf(route)['context_extensions'], { route: 'order' });
    assert.ok(route.typed_per_filter_config['envoy.filters.http.lua'] !== undefined, 'the order-body Lua filter decodes its payload');
    const tooLarge = after.find((r) => r.name === 'cancels_payload_too_large')!;
    assert.equal(tooLarge.direct_response?.status, 413);
    const method = after.find((r) => r.name === 'cancels_method_not_allowed')!;
    assert.deepEqual([method.direct_response?.status, method.match], [405, { path: '/v1/cancels' }]);
    // Without a backend: the documented 502, its body still decided by the order policy.
    const noBackend = table(loadConfig({}), withCancels).find((r) => r.name === 'cancels_no_backend')!;
    assert.equal(noBackend.direct_response?.status, 502);
    assert.equal(noBackend.typed_per_filter_config['envoy.filters.http.ext_authz']!['@type'], TYPE_URL.extAuthzPerRoute);
    assert.deepEqual(authzOf(noBackend)['context_extensions'], { route: 'order' });
  });

  test('envoy – a market read of the catch-all\'s kind adds no route: the catch-all serves it (geo, then the market service)', () => {
    const config = loadConfig(BACKEND_ENV);
    assert.deepEqual(table(config, withEvents), table(config));
  });

  test('classify – the new routes\' kinds by method and path', () => {
    assert.equal(classify('POST', '/v1/cancels', withCancels), 'order');
    assert.equal(classify('GET', '/v1/cancels', withCancels), 'read');
    assert.equal(classify('POST', '/v1/cancels'), 'read', 'not in the shipped registry');
    assert.equal(classify('HEAD', '/v1/events', withEvents), 'read');
  });

  test('metrics – a new market route has its own series; the decision labels are per kind and cover it', () => {
    assert.deepEqual(marketRequestStatuses(withEvents)['/v1/events'], [200, 400, 503]);
    assert.equal(marketRequestStatuses(withCancels)['/v1/cancels'], undefined, 'an order-backend route is not the market service\'s');
    for (const r of [CANCELS, EVENTS]) assert.ok(DECISION_CODES[r.kind].length > 0, r.kind);
  });

  test('openapi – the new routes appear with their operation and their errors', () => {
    for (const [registry, r] of [[withCancels, CANCELS], [withEvents, EVENTS]] as const) {
      const paths = buildPaths(registry);
      assert.deepEqual(Object.keys(paths), registry.map((x) => x.path));
      const op = operationOf(paths, r);
      assert.deepEqual([op['operationId'], op['summary'], op['tags']], [r.openapi.operationId, r.openapi.summary, [r.openapi.tag]]);
      assert.deepEqual(sorted(operationCodes(buildOpenApi(), op)), sorted(new Set([...r.errors, ...commonCodes(r)])));
    }
  });
});
