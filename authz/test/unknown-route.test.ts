/**
 * Fail closed by construction (issue 28): a route value from Envoy that the route registry does
 * not know is denied 503 `service_unavailable` and counted under route `unknown`, whatever the
 * method, path and client, and never judged as a read (geo only). The real gRPC server on
 * 127.0.0.1:0, a real grpc-js client; the pipeline at its interface. The other places where a
 * route could fall through are tested beside them: the codec (request.test.ts), Envoy's body
 * limits (envoy/test/route-body-limits.test.ts), the market dispatch (market/dispatch.test.ts).
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { evaluate, UNKNOWN_ROUTE_DENIAL, type PipelineDeps } from '../src/authz/pipeline.ts';
import type { AuthzInput } from '../src/authz/codec/request.ts';
import { PATHS } from '../src/common/routes.ts';
import { startFixture, type Fixture } from './server-fixture.ts';
import { fakeMarkets } from './helpers.ts';

/** Every address is in an allowed country: only the route can refuse. */
const geo = { lookup: () => ({ country: 'CH', regions: [] }) };

function input(over: Partial<AuthzInput>): AuthzInput {
  return {
    method: 'GET', path: PATHS.markets, clientIp: '192.0.2.10', timestamp: undefined, nonce: undefined, signature: undefined,
    requestId: 'rid-unknown', body: undefined, phase: undefined, route: 'unknown', ...over,
  };
}

describe('unknown route value', () => {
  let f: Fixture;
  before(async () => {
    f = await startFixture({ env: { GEO_TRUSTED_CIDRS: '' }, geo, markets: fakeMarkets([]), nonces: 'memory' });
  });
  after(async () => f.close());

  test('pipeline – denied 503 before geo or any policy, for reads, orders, ingests and their header phases', () => {
    let geoCalls = 0;
    const deps: PipelineDeps = { ...f.core.pipeline, classifyGeo: (ip) => { geoCalls++; return f.core.pipeline.classifyGeo(ip); } };
    const cases: Partial<AuthzInput>[] = [
      {}, { method: 'HEAD', path: PATHS.root }, { method: 'GET', path: PATHS.geoblock },
      { method: 'POST', path: PATHS.orders, body: Buffer.from('{}') }, { method: 'POST', path: PATHS.orders, phase: 'headers' },
      { method: 'POST', path: PATHS.ingest, phase: 'headers' }, { method: 'DELETE', path: '/v1/cancels' },
    ];
    for (const c of cases) assert.equal(evaluate(input(c), deps), UNKNOWN_ROUTE_DENIAL, JSON.stringify(c));
    assert.equal(geoCalls, 0, 'no policy ran');
    assert.deepEqual([UNKNOWN_ROUTE_DENIAL.allow, UNKNOWN_ROUTE_DENIAL.httpStatus, UNKNOWN_ROUTE_DENIAL.code, UNKNOWN_ROUTE_DENIAL.reason],
      [false, 503, 'service_unavailable', 'service_unavailable:unknown_route']);
  });

  test('pipeline – the same request with its known route is allowed (the denial is the route\'s, not the request\'s)', async () => {
    assert.equal((await evaluate(input({ route: 'read' }), f.core.pipeline)).allow, true);
    assert.equal((await evaluate(input({ route: undefined }), f.core.pipeline)).allow, true, 'a hand-made Check without a route: classified');
  });

  test('grpc – a Check whose route Envoy names but the registry does not is 503 service_unavailable, counted under route="unknown"', async () => {
    const series = /edge_authz_decisions_total\{route="unknown",outcome="deny",code="service_unavailable"\} (\d+)/;
    assert.equal(series.exec(await f.core.metricsText())?.[1], '0', 'exported at 0 from the start (an alert can watch it)');
    for (const route of ['cancel', 'READ', '']) {
      const r = await f.check({ method: 'GET', path: PATHS.markets, headers: { 'x-edge-client-ip': '192.0.2.10', 'x-request-id': 'rid-1' }, contextExtensions: { route } });
      assert.deepEqual([r.status, r.error], [503, 'service_unavailable'], JSON.stringify(route));
      assert.equal(r.body?.['requestId'], 'rid-1');
    }
    assert.equal(series.exec(await f.core.metricsText())?.[1], '3');
    const allowed = await f.check({ method: 'GET', path: PATHS.markets, headers: { 'x-edge-client-ip': '192.0.2.10' }, contextExtensions: { route: 'read' } });
    assert.equal(allowed.status, 200, 'the same request on its known route');
  });
});

test('source – no `default:` on the decision path returns an allow', () => {
  const root = fileURLToPath(new URL('../src/', import.meta.url));
  const files = ['authz', 'authz/stages', 'authz/codec', 'common', 'market', 'ratelimit']
    .flatMap((d) => readdirSync(join(root, d)).filter((n) => n.endsWith('.ts')).map((n) => join(root, d, n)));
  for (const file of files) {
    const lines = readFileSync(file, 'utf8').split('\n');
    lines.forEach((line, i) => {
      if (!/\bdefault\s*:/.test(line)) return;
      const next = lines.slice(i, i + 3).join(' ');
      assert.doesNotMatch(next, /return\s+(ALLOW|allow\()/, `${file}:${i + 1}`);
    });
  }
});

describe('the geo decision over access tiers', () => {
  test('blocked → the denial; close-only and full → on to the route; a tier outside the type (never expected) → the denial, not an allow', async () => {
    const { geoDecision } = await import('../src/authz/stages/geo.ts');
    const denial = UNKNOWN_ROUTE_DENIAL;
    const at = (access: string): ReturnType<typeof geoDecision> => geoDecision({ access } as unknown as Parameters<typeof geoDecision>[0], denial);
    assert.equal(at('blocked'), denial);
    assert.equal(at('close-only'), undefined);
    assert.equal(at('full'), undefined);
    assert.equal(at('partial'), denial);
  });
});
