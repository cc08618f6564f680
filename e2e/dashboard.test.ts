/**
 * The dashboard's queries against what the edge really exports (issue 31 point 2): the whole
 * stack as local processes (real Envoy 1.40, the TS service, Redis, the mTLS demo backend) and a
 * real Prometheus scraping the TS `/metrics` and Envoy's `/stats/prometheus` every second. After
 * reads, a 451, local 429s, an ingest, orders delivered, timed out (504) and undeliverable (502):
 *   - every metric name a panel query uses is in one of the two scraped pages;
 *   - Prometheus evaluates every query without error and answers each with at least one series
 *     (so every selector in it, label values included, matches a real series);
 *   - the 451, 429, 502 and 504 panels show the rate of what was just done.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { geoFixtures } from '../testkit/geo-fixtures.ts';
import { allTargets, RATE_WINDOW } from '../deploy/grafana/dashboard.ts';
import { startStack, type Stack } from './lib/driver.ts';
import { allowedIp, ingest, KP_IP, orderBody, request, uniqueId } from './lib/client.ts';
import { startPrometheus, type Prometheus } from './lib/prometheus.ts';

const ENV = { XFF_NUM_TRUSTED_HOPS: '1', BLOCKED_COUNTRIES: 'KP', RPS_PER_IP: '1', RATE_BURST: '3', ORDER_BACKEND_TIMEOUT_MS: '1000' };
/** Wide enough for two scrapes on a busy machine, short enough that the events above dominate it. */
const WINDOW = '1m';

let stack: Stack;
let prom: Prometheus | undefined;
let market: string;
const live = (expr: string): string => expr.replaceAll(RATE_WINDOW, WINDOW);

const order = async (): Promise<number> =>
  (await request(stack, 'POST', '/v1/orders', { ip: allowedIp(), body: orderBody(market, Buffer.from('dash')), headers: { 'content-type': 'application/json' } })).status;

/** One of each event the panels show; run twice so Envoy's series created by the first have an increase by the second. */
async function drive(): Promise<void> {
  for (let i = 0; i < 5; i++) assert.equal((await request(stack, 'GET', '/v1/markets', { ip: allowedIp() })).status, 200);
  assert.equal((await request(stack, 'GET', '/v1/markets', { ip: KP_IP })).status, 451);
  const ip = allowedIp();
  const statuses: number[] = [];
  for (let i = 0; i < 12 && !statuses.includes(429); i++) statuses.push((await request(stack, 'GET', '/healthz', { ip })).status);
  assert.ok(statuses.includes(429), `local limit: ${statuses.join(',')}`);
  assert.equal(await order(), 200);
  stack.backend.mode = 'slow';
  stack.backend.delayMs = 2500;
  try {
    assert.equal(await order(), 504);
  } finally {
    stack.backend.mode = 'ok';
  }
  await stack.swapBackend('down');
  try {
    assert.equal(await order(), 502);
  } finally {
    await stack.swapBackend('good');
  }
}

before(async () => {
  stack = await startStack({ env: ENV, geoipDb: geoFixtures().geoip2 });
  prom = await startPrometheus(stack);
  market = uniqueId('0xdash');
  assert.equal((await ingest(stack, market, 1)).status, 200);
  await drive();
  await prom.waitForScrapes(2);
  await drive();
  await prom.waitForScrapes(2);
});
after(async () => {
  await prom?.stop();
  await stack?.stop();
});

/** Metric names in an exposition page (histograms as their _bucket/_sum/_count series). */
function names(text: string): Set<string> {
  return new Set(text.split('\n').filter((l) => l !== '' && !l.startsWith('#')).map((l) => /^[a-zA-Z_:][a-zA-Z0-9_:]*/.exec(l)![0]));
}

describe('every panel query against the metrics the stack exports', () => {
  test('every metric name a query uses is in the TS service\'s /metrics or Envoy\'s /stats/prometheus', async () => {
    const exported = new Set([
      ...names(await (await fetch(`${stack.authzAdmin}/metrics`)).text()),
      ...names(await (await fetch(`${stack.envoyAdmin}/stats/prometheus`)).text()),
    ]);
    let checked = 0;
    for (const { panel, target } of allTargets()) {
      // Label names share the prefix: matchers and `by (…)` lists are left out.
      const bare = target.expr.replace(/\{[^}]*\}/g, '').replace(/\bby\s*\([^)]*\)/g, '');
      const used = [...bare.matchAll(/\b(?:edge|envoy)_[a-z0-9_]+/g)].map((m) => m[0]);
      assert.ok(used.length > 0, `${panel}: ${target.expr} names a metric`);
      for (const name of used) {
        assert.ok(exported.has(name), `${panel}: ${name} is not exported`);
        checked++;
      }
    }
    assert.ok(checked >= 20);
  });

  test('a real Prometheus evaluates every query and answers each with at least one series', async () => {
    for (const { panel, target } of allTargets()) {
      const result = await prom!.query(live(target.expr));
      assert.ok(result.length > 0, `${panel} / ${target.legend}: ${live(target.expr)} matched no series`);
    }
  });

  test('the 451, 429, 502 and 504 panels show what was just done (a rate above 0)', async () => {
    const byLegend = new Map(allTargets().map(({ panel, target }) => [`${panel} / ${target.legend}`, target.expr]));
    const value = async (key: string): Promise<number> => {
      const expr = byLegend.get(key);
      assert.ok(expr !== undefined, `no target ${key}`);
      const r = await prom!.query(live(expr));
      return Math.max(...r.map((s) => Number(s.value![1])));
    };
    for (const key of [
      '451 restricted_jurisdiction by route / {{route}}',
      '429 too many requests / Envoy local limit',
      'Order backend 502 / 504 / 502 backend_unavailable',
      'Order backend 502 / 504 / 504 backend_timeout',
    ]) assert.ok((await value(key)) > 0, `${key} shows nothing`);
    // And the quiet ones stay at 0: no Redis error, nothing failed open, nothing sealed.
    assert.equal(await value('Redis errors by operation / {{op}}'), 0);
    assert.equal(await value('Sealed instances / sealed'), 0);
  });
});
