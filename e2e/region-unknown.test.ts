/**
 * GEO_REGION_UNKNOWN through real Envoy 1.40 (e2e/lib/stack.ts): a City database
 * (testkit/fixtures/make-mmdb.py), BLOCKED_REGIONS=US-NV, GEO_UNKNOWN=allow so that only the
 * region rule can refuse. Client addresses come from X-Forwarded-For (one trusted hop):
 *   198.18.0.0/24 US-NV · 198.18.1.0/24 US, no subdivision · 198.18.2.0/24 US-CA.
 * Two stacks: the default (`strictest`: a US record without subdivision gets US-NV's tier, 451)
 * and GEO_REGION_UNKNOWN=country (the country's tier, full). Each is counted as `unknown_region`
 * and /v1/geoblock answers the same tier with `region: null`.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { setTimeout as sleep } from 'node:timers/promises';
import { geoFixtures } from '../testkit/geo-fixtures.ts';
import { startStack, type Stack } from './lib/driver.ts';
import { errorCode, request } from './lib/client.ts';
import { sansPolicy } from './lib/geoblock.ts';

const US_NV = '198.18.0.7';
const US_NONE = '198.18.1.7';
const US_CA = '198.18.2.7';
const BASE = { XFF_NUM_TRUSTED_HOPS: '1', BLOCKED_REGIONS: 'US-NV', GEO_UNKNOWN: 'allow', LOG_DECISIONS: 'all' };

async function unknownRegionCount(stack: Stack): Promise<number> {
  const text = await (await fetch(`${stack.authzAdmin}/metrics`)).text();
  return Number(/edge_geo_verdicts_total\{verdict="unknown_region"\} ([0-9]+)/.exec(text)?.[1] ?? 'NaN');
}

/** The decision line of request `id` (LOG_DECISIONS=all), waiting up to 2.5 s for the log to be flushed. */
async function decisionLine(stack: Stack, id: string): Promise<Record<string, unknown>> {
  for (let i = 0; i < 50; i++) {
    for (const raw of stack.logs().split('\n')) {
      if (raw.includes('"msg":"decision"') && raw.includes(id)) return JSON.parse(raw.slice(raw.indexOf('{'))) as Record<string, unknown>;
    }
    await sleep(50);
  }
  assert.fail(`no decision line for ${id}`);
}

describe('GEO_REGION_UNKNOWN=strictest (default), BLOCKED_REGIONS=US-NV, through Envoy', () => {
  let stack: Stack;
  before(async () => { stack = await startStack({ env: BASE, geoipDb: geoFixtures().geoip2 }); });
  after(async () => stack?.stop());

  test('a US record without subdivision → 451 (US-NV\'s tier), counted as unknown_region, logged with geo unknown_region', async () => {
    const before = await unknownRegionCount(stack);
    const r = await request(stack, 'GET', '/v1/markets', { ip: US_NONE });
    assert.deepEqual([r.status, errorCode(r)], [451, 'restricted_jurisdiction'], r.text);
    assert.equal(await unknownRegionCount(stack), before + 1);
    const line = await decisionLine(stack, r.headers.get('x-request-id') ?? '');
    assert.deepEqual([line['geo'], line['tier'], line['country'], line['region']], ['unknown_region', 'blocked', 'US', null]);
  });

  test('/v1/geoblock agrees: blocked, country US, region null', async () => {
    const r = await request(stack, 'GET', '/v1/geoblock', { ip: US_NONE });
    assert.equal(r.status, 200, r.text);
    assert.deepEqual(sansPolicy(r.json()), { blocked: true, access: 'blocked', country: 'US', region: null, ip: US_NONE });
  });

  test('the region itself is blocked; another US region is full (the rule is not widened to the country)', async () => {
    assert.equal((await request(stack, 'GET', '/v1/markets', { ip: US_NV })).status, 451);
    assert.equal((await request(stack, 'GET', '/v1/markets', { ip: US_CA })).status, 200);
    const r = await request(stack, 'GET', '/v1/geoblock', { ip: US_CA });
    assert.deepEqual(sansPolicy(r.json()), { blocked: false, access: 'full', country: 'US', region: 'US-CA', ip: US_CA });
  });
});

describe('GEO_REGION_UNKNOWN=country, BLOCKED_REGIONS=US-NV, through Envoy', () => {
  let stack: Stack;
  before(async () => { stack = await startStack({ env: { ...BASE, GEO_REGION_UNKNOWN: 'country' }, geoipDb: geoFixtures().geoip2 }); });
  after(async () => stack?.stop());

  test('a US record without subdivision gets the country\'s tier: 200, still counted as unknown_region and logged', async () => {
    const before = await unknownRegionCount(stack);
    const r = await request(stack, 'GET', '/v1/markets', { ip: US_NONE });
    assert.equal(r.status, 200, r.text);
    assert.equal(await unknownRegionCount(stack), before + 1);
    const line = await decisionLine(stack, r.headers.get('x-request-id') ?? '');
    assert.deepEqual([line['geo'], line['tier'], line['outcome']], ['unknown_region', 'full', 'allow']);
  });

  test('/v1/geoblock agrees: full, country US, region null; US-NV itself stays 451', async () => {
    const r = await request(stack, 'GET', '/v1/geoblock', { ip: US_NONE });
    assert.deepEqual(sansPolicy(r.json()), { blocked: false, access: 'full', country: 'US', region: null, ip: US_NONE });
    assert.equal((await request(stack, 'GET', '/v1/markets', { ip: US_NV })).status, 451);
  });
});
