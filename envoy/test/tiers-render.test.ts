/**
 * The rendered config's part in jurisdiction tiers (docs/api.md "Jurisdiction tiers",
 * "GET /v1/geoblock"): the geoblock route, the client-sent edge headers removed before anything
 * reads them, and the order route's header allow-list. Live behaviour: e2e/tiers.test.ts.
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { parse } from 'yaml';
import { loadConfig } from '../../authz/src/common/config.ts';
import { EDGE_SET_HEADERS, HEADER } from '../../authz/src/common/contract.ts';
import { ORDER_UPSTREAM_HEADERS } from '../order-body-lua.ts';
import { CLUSTER, FILTER, ROUTE, renderEnvoy, type JsonObject } from '../render.ts';
import { at, httpFilters, perFilter, routeNamed, routesOf } from './helpers.ts';

const config = loadConfig({ CLOSE_ONLY_COUNTRIES: 'PL', BLOCKED_REGIONS: 'UA-43' });
const bootstrap = parse(renderEnvoy(config, { sdsPath: '/tmp/unused-sds.yaml' }).bootstrap) as JsonObject;

test('geoblock route – GET/HEAD /v1/geoblock only, to the market service, authz told the route is `geoblock`, no body buffered, before the catch-all', () => {
  const route = routeNamed(bootstrap, ROUTE.geoblock);
  assert.equal(at(route, 'match.path'), '/v1/geoblock');
  const methods = at(route, 'match.headers') as { name: string; string_match: { safe_regex: { regex: string } } }[];
  assert.equal(methods.length, 1);
  assert.equal(methods[0]!.name, ':method');
  const re = new RegExp(methods[0]!.string_match.safe_regex.regex);
  for (const m of ['GET', 'HEAD']) assert.ok(re.test(m), m);
  for (const m of ['POST', 'PUT', 'DELETE', 'OPTIONS', 'GETX', 'XGET', 'get']) assert.ok(!re.test(m), m);
  assert.equal(at(route, 'route.cluster'), CLUSTER.market);
  const authz = perFilter(route, FILTER.extAuthz);
  assert.equal(at(authz, 'check_settings.context_extensions.route'), 'geoblock');
  assert.equal(at(authz, 'check_settings.disable_request_body_buffering'), true);
  const names = routesOf(bootstrap).map((r) => r['name']);
  assert.ok(names.indexOf(ROUTE.geoblock) < names.indexOf(ROUTE.read), names.join(', '));
});

test('header_mutation removes every client-sent edge-set header (x-edge-access, x-edge-jurisdiction, …) and runs before ext_authz', () => {
  const filters = httpFilters(bootstrap);
  const names = filters.map((f) => f['name']);
  assert.ok(names.indexOf(FILTER.headerMutation) < names.indexOf(FILTER.extAuthz), names.join(', '));
  const mutation = filters.find((f) => f['name'] === FILTER.headerMutation);
  const removed = (at(mutation, 'typed_config.mutations.request_mutations') as { remove?: string }[]).map((m) => m.remove).filter((x) => x !== undefined);
  assert.ok(EDGE_SET_HEADERS.includes(HEADER.access) && EDGE_SET_HEADERS.includes(HEADER.jurisdiction) && EDGE_SET_HEADERS.includes(HEADER.policy));
  for (const h of EDGE_SET_HEADERS) assert.ok(removed.includes(h), `${h} removed`);
  // The ingest's own headers are the client's and must survive.
  for (const h of [HEADER.timestamp, HEADER.nonce, HEADER.signature]) assert.ok(!removed.includes(h), `${h} kept`);
});

test('order route allow-list – exactly x-edge-access, x-edge-jurisdiction and x-edge-policy join the headers the backend receives', () => {
  const edgeHeaders = ORDER_UPSTREAM_HEADERS.filter((h) => h.startsWith('x-edge-'));
  // x-edge-client-cert-sha256 too (EDGE_TLS_CLIENT_AUTH only: the verified client certificate's fingerprint, set by the edge alone).
  assert.deepEqual([...edgeHeaders].sort(), [HEADER.access, HEADER.clientIp, HEADER.deadline, HEADER.jurisdiction, HEADER.marketId, HEADER.size, HEADER.clientCertSha256, HEADER.policy].sort());
});
