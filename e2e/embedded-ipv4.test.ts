/**
 * IPv6 addresses that embed an IPv4, through real Envoy 1.40 (e2e/lib/stack.ts, its private Redis,
 * so the global rate limit runs in Check): with BLOCKED_COUNTRIES=US and GEO_UNKNOWN=allow, the
 * 6to4, NAT64 (both prefixes), SIIT and Teredo forms of a US address (198.18.1.7 in the fixture
 * City database, testkit/fixtures/make-mmdb.py) are refused 451 as that IPv4 is, although as
 * IPv6 they have no record (GEO_UNKNOWN=allow would let them through); /v1/geoblock says so; the
 * decision log names the form. The global bucket of an IPv4 is the one its 6to4 form draws from.
 * Client addresses come from X-Forwarded-For (one trusted hop).
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { setTimeout as sleep } from 'node:timers/promises';
import { geoFixtures } from '../testkit/geo-fixtures.ts';
import { startStack, type Stack } from './lib/driver.ts';
import { errorCode, request } from './lib/client.ts';
import { sansPolicy } from './lib/geoblock.ts';

const US = '198.18.1.7';

/** The form `form` of the IPv4 `v4` (Teredo: server 65.54.227.120, flags 0x8000, port 40000 obfuscated). */
function embed(form: string, v4: string): string {
  const [a = 0, b = 0, c = 0, d = 0] = v4.split('.').map(Number);
  const hex = (n: number): string => n.toString(16);
  const hi = (a << 8) | b;
  const lo = (c << 8) | d;
  switch (form) {
    case '6to4': return `2002:${hex(hi)}:${hex(lo)}::1`;
    case 'nat64': return `64:ff9b::${hex(hi)}:${hex(lo)}`;
    case 'nat64-local': return `64:ff9b:1:${hex(hi)}:${hex(c)}:${hex(d << 8)}::`;
    case 'siit': return `::ffff:0:${hex(hi)}:${hex(lo)}`;
    default: return `2001:0:4136:e378:8000:63bf:${hex(hi ^ 0xffff)}:${hex(lo ^ 0xffff)}`;
  }
}

// Each form carries a US address of its own (198.18.1.0/24, US in the fixture): the forms of one
// IPv4 share its rate-limit bucket (RATE_BURST 4 below), which the last test proves.
const FORMS: Record<string, string> = Object.fromEntries(['6to4', 'nat64', 'nat64-local', 'siit', 'teredo'].map((f, i) => [f, embed(f, `198.18.1.${20 + i}`)]));

// RPS_PER_IP=1: the global bucket refills one token a second, the margin the rate-limit test allows.
const ENV = { XFF_NUM_TRUSTED_HOPS: '1', BLOCKED_COUNTRIES: 'US', GEO_UNKNOWN: 'allow', LOG_DECISIONS: 'all', RPS_PER_IP: '1', RATE_BURST: '4' };

let stack: Stack;
before(async () => { stack = await startStack({ env: ENV, geoipDb: geoFixtures().geoip2 }); });
after(async () => stack?.stop());

async function decisionLine(id: string): Promise<Record<string, unknown>> {
  for (let i = 0; i < 50; i++) {
    for (const raw of stack.logs().split('\n')) {
      if (raw.includes('"msg":"decision"') && raw.includes(id)) return JSON.parse(raw.slice(raw.indexOf('{'))) as Record<string, unknown>;
    }
    await sleep(50);
  }
  assert.fail(`no decision line for ${id}`);
}

describe('embedded IPv4 through Envoy: judged as the IPv4 (BLOCKED_COUNTRIES=US, GEO_UNKNOWN=allow)', () => {
  test('control: the IPv4 itself is 451; an IPv6 address without a record is let through by GEO_UNKNOWN=allow', async () => {
    assert.equal((await request(stack, 'GET', '/v1/markets', { ip: US })).status, 451);
    assert.equal((await request(stack, 'GET', '/v1/markets', { ip: '2001:db8:77::1' })).status, 200);
  });

  for (const [form, ip] of Object.entries(FORMS)) {
    test(`${form} (${ip}) → 451, geoblock says blocked US, the decision log names the form`, async () => {
      const r = await request(stack, 'GET', '/v1/markets', { ip });
      assert.deepEqual([r.status, errorCode(r)], [451, 'restricted_jurisdiction'], r.text);
      const line = await decisionLine(r.headers.get('x-request-id') ?? '');
      assert.deepEqual([line['client'], line['embedded'], line['country'], line['geo']], ['ipv6', form, 'US', 'blocked_country']);
      const g = await request(stack, 'GET', '/v1/geoblock', { ip });
      assert.deepEqual(sansPolicy(g.json()), { blocked: true, access: 'blocked', country: 'US', region: null, ip });
    });
  }

  test('rate limit: a 6to4 form draws from its IPv4\'s global bucket (Envoy\'s local stage keys it apart), another IPv4\'s 6to4 form does not', async () => {
    // 192.0.2.0/25 is CH (full). Exhaust 192.0.2.77's bucket (RATE_BURST 4) as IPv4.
    let refused = 0;
    for (let i = 0; i < 10 && refused === 0; i++) if ((await request(stack, 'GET', '/v1/markets', { ip: '192.0.2.77' })).status === 429) refused++;
    assert.equal(refused, 1, 'the IPv4 met its burst');
    // Its 6to4 form (2002:c000:24d::/48) is a fresh bucket in Envoy's local stage, so any 429 here
    // is the global bucket's, shared with the IPv4. Three at once: the bucket refills one token a
    // second, so at most one of them can pass even if a second went by since the 429.
    const same = await Promise.all([1, 2, 3].map((n) => request(stack, 'GET', '/v1/markets', { ip: `2002:c000:24d:${n}::1` })));
    assert.ok(same.filter((r) => r.status === 429).length >= 2, `statuses ${same.map((r) => r.status).join(',')}`);
    // Another IPv4's 6to4 form has its own bucket.
    assert.equal((await request(stack, 'GET', '/v1/markets', { ip: '2002:c000:24e::1' })).status, 200);
  });
});
