/**
 * The market service's dispatch is the route registry's (authz/src/common/routes.ts): each market
 * route is answered by its own handler, another method by 405 with the registry's `allow`, any
 * other path by 404; nothing falls through to another route's handler (the ingest handler was
 * the old `default:`; issue 28). The real HTTP server on 127.0.0.1:0, the in-memory store.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { Writable } from 'node:stream';
import { Registry } from 'prom-client';
import { createLogger } from '../../src/common/log.ts';
import { createMarketService, type MarketService } from '../../src/market/http.ts';
import { MemoryMarketStore } from '../../src/market/store.ts';
import { GEO_TRUSTED } from '../../src/authz/stages/geo.ts';
import { allowHeader, API_ROUTES, PATHS, serves, type MarketRouteId, type RouteRegistry } from '../../src/common/routes.ts';
import { ROOT_BODY } from '../../src/market/schemas.ts';

const logger = createLogger('silent', new Writable({ write: (_c, _e, cb) => cb() }));
const registry: RouteRegistry = API_ROUTES;
const marketRoutes = registry.filter((r) => r.upstream === 'market');

/** What each market route's own handler answers to a served request with no body or query. */
const OWN_ANSWER: Record<MarketRouteId, (status: number, body: string) => boolean> = {
  root: (s, b) => s === 200 && b === ROOT_BODY,
  healthz: (s, b) => s === 200 && b === '{"status":"ok"}',
  markets: (s, b) => s === 200 && 'markets' in JSON.parse(b),
  quotes: (s, b) => s === 200 && 'quotes' in JSON.parse(b),
  geoblock: (s, b) => s === 200 && JSON.parse(b).access === 'full',
  // An empty body: the ingest handler's own refusal (the signed envelope is checked again here).
  ingest: (s, b) => s === 400 && JSON.parse(b).error === 'invalid_json',
};

describe('market service dispatch', () => {
  let svc: MarketService;
  let base: string;
  const metrics = new Registry();
  before(async () => {
    svc = createMarketService({
      store: new MemoryMarketStore(), feedKeys: [], ingestMaxBytes: 1024, logger, registry: metrics,
      readiness: () => ({ store: true }), isSealed: () => false, geoblock: () => GEO_TRUSTED, host: '127.0.0.1', port: 0,
    });
    base = `http://127.0.0.1:${await svc.listen()}`;
  });
  after(async () => svc.close());

  const ingestCount = async (): Promise<number> => {
    const m = (await metrics.getSingleMetric('edge_market_ingest_total')?.get())?.values ?? [];
    return m.reduce((n, v) => n + v.value, 0);
  };

  test('each registry market route is answered by its own handler', async () => {
    for (const r of marketRoutes) {
      const method = r.methods[0]!;
      const res = await fetch(`${base}${r.path}`, { method, ...(method === 'POST' ? { body: '' } : {}) });
      const body = await res.text();
      assert.ok(OWN_ANSWER[r.id as MarketRouteId](res.status, body), `${method} ${r.path}: ${res.status} ${body}`);
    }
  });

  test('another method is 405 with the registry\'s allow, and never reaches a handler', async () => {
    const before = await ingestCount();
    for (const r of marketRoutes) {
      for (const method of ['GET', 'POST', 'PUT', 'DELETE'].filter((m) => !serves(r, m))) {
        const res = await fetch(`${base}${r.path}`, { method, ...(method === 'GET' ? {} : { body: '{}' }) });
        assert.deepEqual([res.status, res.headers.get('allow'), (await res.json() as { error: string }).error], [405, allowHeader(r), 'method_not_allowed'], `${method} ${r.path}`);
      }
    }
    assert.equal(await ingestCount(), before, 'the ingest handler never ran');
  });

  test('a path that is not a market route is 404 for any method, the order route included: no fallback handler', async () => {
    for (const path of [PATHS.orders, '/internal/ingest/other', '/v1/marketsx', '/internal', '/nope']) {
      for (const method of ['GET', 'POST']) {
        const res = await fetch(`${base}${path}`, { method, ...(method === 'POST' ? { body: '{}' } : {}) });
        assert.deepEqual([res.status, (await res.json() as { error: string }).error], [404, 'not_found'], `${method} ${path}`);
      }
    }
    assert.equal(await ingestCount(), 0);
  });
});

// Type-level, checked by `npm run typecheck`: the handler table (market/http.ts) is
// `satisfies Record<MarketRouteId, Handler>`, so a table that leaves one market route out does not compile.
type Handler = () => void;
const h: Handler = () => undefined;
// @ts-expect-error -- `ingest` has no handler
const missingOne = { root: h, healthz: h, markets: h, quotes: h, geoblock: h } satisfies Record<MarketRouteId, Handler>;
void missingOne;
