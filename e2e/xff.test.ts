/**
 * With XFF_NUM_TRUSTED_HOPS=0 (the default) the client address is the TCP peer: a
 * client-supplied X-Forwarded-For changes neither the geo decision nor the rate-limit bucket.
 * (The peer here is 127.0.0.1, a trusted CIDR by default, so it is allowed.)
 */
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { geoFixtures } from '../testkit/geo-fixtures.ts';
import { startStack, type Stack } from './lib/driver.ts';
import { CU_IP, KP_IP } from './lib/client.ts';

let stack: Stack;
before(async () => {
  stack = await startStack({ env: { BLOCKED_COUNTRIES: 'KP,CU' }, geoipDb: geoFixtures().geoip2 });
});
after(async () => stack?.stop());

async function get(xff: string): Promise<number> {
  const r = await fetch(`${stack.edgeUrl}/`, { headers: { 'x-forwarded-for': xff } });
  await r.text();
  return r.status;
}

test('xff hops=0 – a spoofed X-Forwarded-For from a blocked country does not change the geo decision', async () => {
  assert.equal(await get(KP_IP), 200);
  assert.equal(await get(`${CU_IP}, ${KP_IP}`), 200);
});

test('xff hops=0 – varying X-Forwarded-For does not give a client fresh rate-limit buckets', async () => {
  const statuses = await Promise.all(Array.from({ length: 60 }, (_, i) => get(`192.0.2.${i + 1}`)));
  const limited = statuses.filter((s) => s === 429).length;
  assert.ok(limited >= 10, `one bucket for the peer: ${limited} of 60 limited`);
});
