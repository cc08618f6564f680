/**
 * The anonymizer rule through real Envoy 1.40 (e2e/lib/stack.ts: real Redis, the real TS service,
 * the demo mTLS order backend recording what it received). ANONYMIZER_DB is a GeoIP2 Anonymous
 * IP–layout database built at test time (testkit/fixtures/make-anonymizer-mmdb.py); every
 * address used here is CH (allowed) in the GeoIP database, so the anonymizer rule is what decides:
 *   192.0.2.64/28 VPN · 192.0.2.80/28 hosting provider · 192.0.2.112/28 Tor exit ·
 *   2001:db8:3:b000::/52 Tor exit · 192.0.2.16/28 listed only after the update.
 * The policy is the default one (orders and ingest block, reads allow) with the default flags
 * (VPN, public proxy, Tor exit, residential proxy: not hosting providers).
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { copyFileSync, renameSync } from 'node:fs';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { geoFixtures, scratchDir } from '../testkit/geo-fixtures.ts';
import { anonymizerFixtures } from '../testkit/anonymizer-fixtures.ts';
import { startStack, type Stack } from './lib/driver.ts';
import { errorCode, ingest, KP_IP, orderBody, request, uniqueId, type Reply } from './lib/client.ts';

const VPN = '192.0.2.66';
const HOSTING = '192.0.2.82';
const TOR = '192.0.2.114';
const TOR6 = '2001:db8:3:b000::9';
const CLEAN = '192.0.2.5';
const LISTED_LATER = '192.0.2.18';

const dir = scratchDir();
const anonDb = join(dir, 'anonymizer.mmdb');
copyFileSync(anonymizerFixtures().anonymizer, anonDb);

let stack: Stack;
let market: string;

before(async () => {
  stack = await startStack({
    env: { XFF_NUM_TRUSTED_HOPS: '1', BLOCKED_COUNTRIES: 'KP', ANONYMIZER_DB: anonDb, GEOIP_RELOAD_INTERVAL_MS: '200' },
    geoipDb: geoFixtures().geoip2,
  });
  market = uniqueId('0xanon');
  const r = await ingest(stack, market, 1);
  assert.equal(r.status, 200, r.text);
});
after(async () => stack?.stop());

async function placeOrder(ip: string): Promise<{ r: Reply; delivered: boolean }> {
  const before = stack.backend.deliveries.length;
  const r = await request(stack, 'POST', '/v1/orders', { ip, body: orderBody(market, randomBytes(16)), headers: { 'content-type': 'application/json' } });
  return { r, delivered: stack.backend.deliveries.length > before };
}

/** The body without its requestId, and the headers a client could compare. */
function notice(r: Reply): { body: string; headers: [string, string | null][] } {
  const { requestId: _id, ...rest } = r.json();
  return { body: JSON.stringify(rest), headers: ['content-type', 'cache-control', 'link'].map((h) => [h, r.headers.get(h)]) };
}

describe('anonymizer rule through Envoy', () => {
  test('a VPN address reads 200, but its order is refused 451 and nothing reaches the backend', async () => {
    assert.equal((await request(stack, 'GET', `/v1/markets?conditionId=${market}`, { ip: VPN })).status, 200);
    const { r, delivered } = await placeOrder(VPN);
    assert.deepEqual([r.status, errorCode(r)], [451, 'restricted_jurisdiction']);
    assert.equal(delivered, false);
  });

  test('the anonymizer 451 is the uniform notice: body (apart from requestId) and headers identical to a blocked country\'s', async () => {
    const vpn = await placeOrder(VPN);
    const kp = await placeOrder(KP_IP);
    assert.equal(kp.r.status, 451);
    assert.deepEqual(notice(vpn.r), notice(kp.r));
  });

  test('Tor exits over IPv4 and IPv6 are refused on orders; a hosting provider (not among the default flags) and a clean address are served', async () => {
    assert.equal((await placeOrder(TOR)).r.status, 451);
    assert.equal((await placeOrder(TOR6)).r.status, 451);
    const hosting = await placeOrder(HOSTING);
    assert.equal(hosting.r.status, 200, hosting.r.text);
    assert.equal(hosting.delivered, true);
    const clean = await placeOrder(CLEAN);
    assert.equal(clean.r.status, 200, clean.r.text);
    assert.equal(clean.delivered, true);
  });

  test('a signed ingest from a VPN address is refused 451 and records nothing: the same ingest from a clean address is then accepted', async () => {
    const id = uniqueId('0xanon-ingest');
    const fromVpn = await ingest(stack, id, 7, {}, VPN);
    assert.deepEqual([fromVpn.status, errorCode(fromVpn)], [451, 'restricted_jurisdiction']);
    assert.deepEqual((await request(stack, 'GET', `/v1/markets?conditionId=${id}`, { ip: CLEAN })).json()['markets'], [], 'nothing stored');
    const fromClean = await ingest(stack, id, 7, {}, CLEAN);
    assert.equal(fromClean.status, 200, fromClean.text);
  });

  test('GET /v1/geoblock tells a VPN address it is blocked, and a hosting provider that it is not', async () => {
    const vpn = (await request(stack, 'GET', '/v1/geoblock', { ip: VPN })).json();
    assert.deepEqual([vpn['blocked'], vpn['access'], vpn['ip']], [true, 'blocked', VPN]);
    const hosting = (await request(stack, 'GET', '/v1/geoblock', { ip: HOSTING })).json();
    assert.deepEqual([hosting['blocked'], hosting['access'], hosting['country']], [false, 'full', 'CH']);
  });

  test('a replaced database is picked up under load: the delisted VPN range is served, the newly listed one refused', async () => {
    copyFileSync(anonymizerFixtures().anonymizerSwapped, join(dir, 'next.mmdb'));
    renameSync(join(dir, 'next.mmdb'), anonDb);
    const deadline = Date.now() + 10_000;
    let last = 0;
    while (Date.now() < deadline) {
      last = (await placeOrder(VPN)).r.status;
      if (last === 200) break;
      await sleep(100);
    }
    // Margin: the file is polled every 200 ms (GEOIP_RELOAD_INTERVAL_MS above), so 10 s is ~50 polls.
    assert.equal(last, 200, 'the delisted VPN range is served within 10 s');
    assert.equal((await placeOrder(LISTED_LATER)).r.status, 451);
    assert.equal((await placeOrder(TOR)).r.status, 451, 'still listed');
  });
});
