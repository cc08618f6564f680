/**
 * Jurisdiction tiers and GET /v1/geoblock through real Envoy 1.40 (e2e/lib/stack.ts): real Redis,
 * the real TS service, the demo mTLS order backend recording what it received. Client addresses
 * come from X-Forwarded-For (one trusted hop) in the generated GeoIP database
 * (testkit/fixtures/make-mmdb.py):
 *   198.51.100.128/25 CU · 203.0.113.64/26 CA-QC · 2001:db8:5::/48 UA-43 · 2001:db8:6::/48 UA-32 ·
 *   198.51.100.0/25 KP · 2001:db8:3::/48 CH · 192.0.2.192/26 no record.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { geoFixtures } from '../testkit/geo-fixtures.ts';
import { startStack, type Stack } from './lib/driver.ts';
import { allowedIp, errorCode, ingest, orderBody, request, uniqueId } from './lib/client.ts';
import { SHADOW_MSG } from '../authz/src/authz/shadow.ts';
import { setTimeout as sleep } from 'node:timers/promises';
import { sansPolicy } from './lib/geoblock.ts';

const ENV = {
  XFF_NUM_TRUSTED_HOPS: '1',
  BLOCKED_COUNTRIES: 'KP',
  BLOCKED_REGIONS: 'UA-43',
  CLOSE_ONLY_COUNTRIES: 'CU,UA',
  CLOSE_ONLY_REGIONS: 'CA-QC',
  // A candidate policy that would also make CH close-only: evaluated on every request, never
  // enforced (every test below proves the enforced outcome regardless).
  SHADOW_CLOSE_ONLY_COUNTRIES: 'CU,UA,CH',
};

const CU = '198.51.100.200';
const CA_QC = '203.0.113.70';
const UA_43 = '2001:db8:5::7';
const UA_32 = '2001:db8:6::7';
const KP = '198.51.100.7';
const UNKNOWN = '192.0.2.201';

let stack: Stack;
let market: string;

before(async () => {
  stack = await startStack({ env: ENV, geoipDb: geoFixtures().geoip2 });
  market = uniqueId('0xtiers');
  const r = await ingest(stack, market, 1);
  assert.equal(r.status, 200, r.text);
});
after(async () => stack?.stop());

/** Places one order as `ip` (with `headers`), returns the reply and what the backend received. */
async function placeOrder(ip: string, headers: Record<string, string> = {}): Promise<{ status: number; text: string; got: Record<string, string | string[] | undefined> | undefined }> {
  const before = stack.backend.deliveries.length;
  const r = await request(stack, 'POST', '/v1/orders', { ip, body: orderBody(market, randomBytes(16)), headers: { 'content-type': 'application/json', ...headers } });
  return { status: r.status, text: r.text, got: stack.backend.deliveries.length > before ? stack.backend.deliveries.at(-1)?.headers : undefined };
}

describe('jurisdiction tiers through Envoy', () => {
  test('a close-only country reads 200; its order reaches the backend with x-edge-access: close-only and x-edge-jurisdiction: CU', async () => {
    assert.equal((await request(stack, 'GET', `/v1/markets?conditionId=${market}`, { ip: CU })).status, 200);
    const o = await placeOrder(CU);
    assert.equal(o.status, 200, o.text);
    assert.equal(o.got?.['x-edge-access'], 'close-only');
    assert.equal(o.got?.['x-edge-jurisdiction'], 'CU');
  });

  test('a close-only region inside a full country (CA-QC): reads 200, the order carries close-only and CA-QC', async () => {
    assert.equal((await request(stack, 'GET', '/v1/quotes', { ip: CA_QC })).status, 200);
    const o = await placeOrder(CA_QC);
    assert.equal(o.status, 200, o.text);
    assert.deepEqual([o.got?.['x-edge-access'], o.got?.['x-edge-jurisdiction']], ['close-only', 'CA-QC']);
  });

  test('a blocked region inside a close-only country (UA-43) → 451 on reads and orders, nothing delivered; another region of it (UA-32) is close-only', async () => {
    const read = await request(stack, 'GET', '/v1/markets', { ip: UA_43 });
    assert.deepEqual([read.status, errorCode(read)], [451, 'restricted_jurisdiction']);
    const o = await placeOrder(UA_43);
    assert.equal(o.status, 451, o.text);
    assert.equal(o.got, undefined, 'the backend received nothing');
    const ua = await placeOrder(UA_32);
    assert.equal(ua.status, 200, ua.text);
    assert.deepEqual([ua.got?.['x-edge-access'], ua.got?.['x-edge-jurisdiction']], ['close-only', 'UA']);
  });

  test('a full client\'s order carries x-edge-access: full and its country', async () => {
    const o = await placeOrder(allowedIp());
    assert.equal(o.status, 200, o.text);
    assert.deepEqual([o.got?.['x-edge-access'], o.got?.['x-edge-jurisdiction']], ['full', 'CH']);
  });

  test('client-sent x-edge-access / x-edge-jurisdiction never reach the backend: the edge\'s values arrive, once each', async () => {
    const forged = { 'x-edge-access': 'full', 'x-edge-jurisdiction': 'CH', 'x-edge-other': 'x' };
    const o = await placeOrder(CU, forged);
    assert.equal(o.status, 200, o.text);
    // One value each (a duplicate header would arrive as "a, b" or an array).
    assert.equal(o.got?.['x-edge-access'], 'close-only');
    assert.equal(o.got?.['x-edge-jurisdiction'], 'CU');
    assert.equal(o.got?.['x-edge-other'], undefined, 'an invented x-edge-* header is not on the allow-list');
  });
});

describe('GET /v1/geoblock through Envoy', () => {
  const cases: Record<string, [ip: string, body: Record<string, unknown>]> = {
    'a blocked client (KP) learns it is blocked: 200, not 451': [KP, { blocked: true, access: 'blocked', country: 'KP', region: null, ip: KP }],
    'a blocked region (UA-43)': [UA_43, { blocked: true, access: 'blocked', country: 'UA', region: 'UA-43', ip: UA_43 }],
    'a close-only client (CU)': [CU, { blocked: false, access: 'close-only', country: 'CU', region: null, ip: CU }],
    'a close-only region (CA-QC)': [CA_QC, { blocked: false, access: 'close-only', country: 'CA', region: 'CA-QC', ip: CA_QC }],
    'an unknown address (GEO_UNKNOWN=block)': [UNKNOWN, { blocked: true, access: 'blocked', country: null, region: null, ip: UNKNOWN }],
  };
  for (const [name, [ip, body]] of Object.entries(cases)) {
    test(`geoblock – ${name}`, async () => {
      const r = await request(stack, 'GET', '/v1/geoblock', { ip });
      assert.equal(r.status, 200, r.text);
      assert.deepEqual(sansPolicy(r.json()), body);
      assert.equal(r.headers.get('cache-control'), 'no-store');
    });
  }

  test('geoblock – a full client gets its own computed address (X-Forwarded-For, one trusted hop), never one it claims', async () => {
    const ip = '192.0.2.33';
    const r = await request(stack, 'GET', '/v1/geoblock', { ip, headers: { 'x-edge-client-ip': KP } });
    assert.deepEqual(sansPolicy(r.json()), { blocked: false, access: 'full', country: 'CH', region: null, ip });
  });

  test('geoblock – another method is geo-checked like every route (451 for a blocked client, 405 for the rest); HEAD answers 200', async () => {
    assert.equal((await request(stack, 'POST', '/v1/geoblock', { ip: KP, body: '{}' })).status, 451);
    const r405 = await request(stack, 'DELETE', '/v1/geoblock', { ip: CU });
    assert.deepEqual([r405.status, errorCode(r405), r405.headers.get('allow')], [405, 'method_not_allowed', 'GET, HEAD']);
    const head = await fetch(`${stack.edgeUrl}/v1/geoblock`, { method: 'HEAD', headers: { 'x-forwarded-for': KP } });
    assert.equal(head.status, 200);
  });

  test('geoblock – rate-limited like every route: a blocked client that floods it gets 429', async () => {
    const ip = '198.51.100.9';
    let limited = 0;
    for (let i = 0; i < 80 && limited === 0; i++) {
      const r = await fetch(`${stack.edgeUrl}/v1/geoblock`, { headers: { 'x-forwarded-for': ip } });
      await r.arrayBuffer();
      if (r.status === 429) limited++;
      else assert.equal(r.status, 200);
    }
    assert.ok(limited > 0, 'the limiter answered 429 within RATE_BURST + a few requests');
  });
});

describe('shadow geo policy through Envoy', () => {
  test('a request the shadow policy would treat otherwise is served as enforced, counted with both tiers and logged with its request id', async () => {
    const metric = async (): Promise<number> => {
      const text = await (await fetch(`${stack.authzAdmin}/metrics`)).text();
      return Number(/edge_geo_shadow_disagreements_total\{enforced="full",shadow="close-only"\} ([0-9]+)/.exec(text)?.[1] ?? 'NaN');
    };
    const before = await metric();
    const r = await request(stack, 'GET', '/v1/markets', { ip: '192.0.2.44' });
    assert.equal(r.status, 200, 'CH is full: the shadow policy is not enforced');
    const id = r.headers.get('x-request-id') ?? '';
    assert.match(id, /^[0-9a-f-]{36}$/);
    let line: Record<string, unknown> | undefined;
    for (let i = 0; i < 50 && line === undefined; i++) {
      for (const raw of stack.logs().split('\n')) {
        if (!raw.includes(SHADOW_MSG) || !raw.includes(id)) continue;
        line = JSON.parse(raw.slice(raw.indexOf('{'))) as Record<string, unknown>;
      }
      if (line === undefined) await sleep(50);
    }
    assert.ok(line !== undefined, `a "${SHADOW_MSG}" line with ${id}`);
    assert.deepEqual([line['requestId'], line['enforced'], line['shadow'], line['country'], line['level']], [id, 'full', 'close-only', 'CH', 30]);
    assert.equal(await metric(), before + 1);
  });
});
