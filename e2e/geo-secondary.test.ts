/**
 * GEOIP_DB_SECONDARY through real Envoy 1.40 (e2e/lib/stack.ts): the fixture City database as
 * GEOIP_DB and its "monthly update" (KP and CH swapped, testkit/fixtures/make-mmdb.py) as the
 * second database, BLOCKED_COUNTRIES=KP. An address the two place in different countries gets the
 * stricter tier whichever database holds it, counted by the pair; /v1/geoblock agrees.
 * Client addresses come from X-Forwarded-For (one trusted hop):
 *   198.51.100.0/25 KP (primary) / CH (secondary) · 192.0.2.0/25 CH / KP · 198.51.100.128/25 CU / CU.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { geoFixtures } from '../testkit/geo-fixtures.ts';
import { startStack, type Stack } from './lib/driver.ts';
import { errorCode, request } from './lib/client.ts';
import { sansPolicy } from './lib/geoblock.ts';

let stack: Stack;
before(async () => {
  const fx = geoFixtures();
  stack = await startStack({ env: { XFF_NUM_TRUSTED_HOPS: '1', BLOCKED_COUNTRIES: 'KP', GEOIP_DB_SECONDARY: fx.geoip2Swapped }, geoipDb: fx.geoip2 });
});
after(async () => stack?.stop());

async function pairCount(primary: string, secondary: string): Promise<number> {
  const text = await (await fetch(`${stack.authzAdmin}/metrics`)).text();
  return Number(new RegExp(`edge_geoip_disagreements_total\\{primary="${primary}",secondary="${secondary}"\\} ([0-9]+)`).exec(text)?.[1] ?? 0);
}

describe('two GeoIP databases through Envoy (BLOCKED_COUNTRIES=KP)', () => {
  test('KP in the secondary only → 451, counted as (other, KP); geoblock says blocked KP', async () => {
    const before = await pairCount('other', 'KP');
    const r = await request(stack, 'GET', '/v1/markets', { ip: '192.0.2.41' });
    assert.deepEqual([r.status, errorCode(r)], [451, 'restricted_jurisdiction'], r.text);
    assert.equal(await pairCount('other', 'KP'), before + 1);
    const g = await request(stack, 'GET', '/v1/geoblock', { ip: '192.0.2.41' });
    assert.deepEqual(sansPolicy(g.json()), { blocked: true, access: 'blocked', country: 'KP', region: null, ip: '192.0.2.41' });
  });

  test('KP in the primary only → 451, counted as (KP, other); an address both place in CU is served and not counted', async () => {
    const before = await pairCount('KP', 'other');
    assert.equal((await request(stack, 'GET', '/v1/markets', { ip: '198.51.100.41' })).status, 451);
    assert.equal(await pairCount('KP', 'other'), before + 1);
    const text = async (): Promise<string> => (await fetch(`${stack.authzAdmin}/metrics`)).text();
    const series = (t: string): string[] => t.split('\n').filter((l) => l.startsWith('edge_geoip_disagreements_total{'));
    const s0 = series(await text());
    assert.equal((await request(stack, 'GET', '/v1/markets', { ip: '198.51.100.141' })).status, 200);
    assert.deepEqual(series(await text()), s0, 'agreement is not a disagreement');
  });
});
