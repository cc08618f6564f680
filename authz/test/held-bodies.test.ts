/**
 * Issue 26, "No unauthenticated megabytes" (docs/reliability.md "Hostile input"), in the service:
 * - the pending-body bound (pending-bodies.ts): at most INGEST_MAX_PENDING_PER_CLIENT ingest bodies
 *   per client address between the header phase's allow and the body phase, each slot freed by its
 *   body phase or after REQUEST_BODY_TIMEOUT_MS;
 * - the header phase of an order: geo (451, the same bytes as ever) and the anonymizer rule before
 *   any body, and nothing that needs one; the body phase judges the order as before;
 * - a body Envoy cut at the route's limit (x-envoy-auth-partial-body) is 413, never judged short;
 * - the settings: INGEST_PORT, INGEST_BIND_ADDRESS, REQUEST_BODY_TIMEOUT_MS,
 *   INGEST_MAX_PENDING_PER_CLIENT, ENVOY_MEMORY_LIMIT_MB.
 * Through the real core over gRPC (in-memory nonces: no Redis needed) where the wire matters.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { ConfigError, configWarnings, loadConfig, type Env } from '../src/common/config.ts';
import { createPendingBodies } from '../src/authz/pending-bodies.ts';
import { pendingDenial, routeLabel } from '../src/authz/pipeline.ts';
import { decodeCheckRequest } from '../src/authz/codec/request.ts';
import { encodeCheckRequest } from '../../testkit/check-request.ts';
import { fakeMarkets, hmacHeaders } from './helpers.ts';
import { ingestBody, marketDoc } from '../../testkit/feed.ts';
import { startFixture, type Fixture } from './server-fixture.ts';

// ─── Settings ──────────────────────────────────────────────────────────────────────────────

describe('settings – ingest listener, body timeout, pending bodies, Envoy memory', () => {
  test('defaults: ingest on EDGE_PORT, loopback if given a port, 5 s body timeout, 8 pending bodies, 1024 MiB', () => {
    const c = loadConfig({});
    assert.deepEqual([c.ingestPort, c.ingestBindAddress, c.requestBodyTimeoutMs, c.ingestMaxPendingPerClient, c.envoyMemoryLimitMb],
      [undefined, '127.0.0.1', 5000, 8, 1024]);
    assert.deepEqual([loadConfig({ INGEST_PORT: '8082' }).ingestPort, loadConfig({ INGEST_PORT: '8082' }).ingestBindAddress], [8082, '127.0.0.1']);
  });

  test('overrides are read', () => {
    const c = loadConfig({ INGEST_PORT: '9000', INGEST_BIND_ADDRESS: '0.0.0.0', REQUEST_BODY_TIMEOUT_MS: '3000', INGEST_MAX_PENDING_PER_CLIENT: '2', ENVOY_MEMORY_LIMIT_MB: '256' });
    assert.deepEqual([c.ingestPort, c.ingestBindAddress, c.requestBodyTimeoutMs, c.ingestMaxPendingPerClient, c.envoyMemoryLimitMb], [9000, '0.0.0.0', 3000, 2, 256]);
    assert.equal(loadConfig({ INGEST_PORT: '9000', INGEST_BIND_ADDRESS: '::' }).ingestBindAddress, '::');
  });

  const malformed: Record<string, [Env, string]> = {
    'INGEST_PORT=abc': [{ INGEST_PORT: 'abc' }, 'INGEST_PORT'],
    'INGEST_PORT=0 (Envoy would pick any port)': [{ INGEST_PORT: '0' }, 'INGEST_PORT'],
    'INGEST_PORT=65536': [{ INGEST_PORT: '65536' }, 'INGEST_PORT'],
    'INGEST_PORT = EDGE_PORT': [{ INGEST_PORT: '8080' }, 'INGEST_PORT'],
    'INGEST_PORT = ENVOY_ADMIN_PORT': [{ INGEST_PORT: '9901' }, 'INGEST_PORT'],
    'INGEST_BIND_ADDRESS without INGEST_PORT': [{ INGEST_BIND_ADDRESS: '0.0.0.0' }, 'INGEST_BIND_ADDRESS'],
    'INGEST_BIND_ADDRESS=localhost (not an IP)': [{ INGEST_PORT: '8082', INGEST_BIND_ADDRESS: 'localhost' }, 'INGEST_BIND_ADDRESS'],
    'REQUEST_BODY_TIMEOUT_MS=5s': [{ REQUEST_BODY_TIMEOUT_MS: '5s' }, 'REQUEST_BODY_TIMEOUT_MS'],
    'REQUEST_BODY_TIMEOUT_MS=100 (below 500)': [{ REQUEST_BODY_TIMEOUT_MS: '100' }, 'REQUEST_BODY_TIMEOUT_MS'],
    'INGEST_MAX_PENDING_PER_CLIENT=0': [{ INGEST_MAX_PENDING_PER_CLIENT: '0' }, 'INGEST_MAX_PENDING_PER_CLIENT'],
    'ENVOY_MEMORY_LIMIT_MB=64 (no room for a heap)': [{ ENVOY_MEMORY_LIMIT_MB: '64' }, 'ENVOY_MEMORY_LIMIT_MB'],
    'ENVOY_MEMORY_LIMIT_MB=256Mi': [{ ENVOY_MEMORY_LIMIT_MB: '256Mi' }, 'ENVOY_MEMORY_LIMIT_MB'],
  };
  for (const [name, [env, variable]] of Object.entries(malformed)) {
    test(`malformed – ${name} → ConfigError(${variable})`, () => {
      assert.throws(() => loadConfig(env), (err: unknown) => err instanceof ConfigError && err.variable === variable && err.message.startsWith(`${variable}:`));
    });
  }

  test('a body timeout that leaves no time past two Checks is warned about', () => {
    const warned = (env: Env): boolean => configWarnings(loadConfig(env)).some((w) => w.startsWith('REQUEST_BODY_TIMEOUT_MS='));
    assert.equal(warned({}), false);
    assert.equal(warned({ REQUEST_BODY_TIMEOUT_MS: '2500' }), false);
    assert.equal(warned({ REQUEST_BODY_TIMEOUT_MS: '2000' }), true, 'two default Checks (1000 ms each) fill it');
    assert.equal(warned({ REQUEST_BODY_TIMEOUT_MS: '1500', AUTHZ_TIMEOUT_MS: '500' }), false);
  });
});

// ─── The pending-body bound ────────────────────────────────────────────────────────────────

describe('pending bodies – the bound per client address', () => {
  const make = (max = 2, ttlMs = 5000): { p: ReturnType<typeof createPendingBodies>; clock: { now: number } } => {
    const clock = { now: 1_000_000 };
    return { p: createPendingBodies({ maxPerClient: max, ttlMs, nowMs: () => clock.now }), clock };
  };

  test('at most N per client; the next is refused with the time until the oldest expires', () => {
    const { p, clock } = make(2, 5000);
    assert.equal(p.admit('192.0.2.1', 'a'), undefined);
    clock.now += 1000;
    assert.equal(p.admit('192.0.2.1', 'b'), undefined);
    assert.equal(p.admit('192.0.2.1', 'c'), 4000, 'a expires 5 s after its admission');
    assert.equal(p.admit('192.0.2.2', 'd'), undefined, 'another address is unaffected');
    assert.equal(p.size(), 3);
  });

  test('a body phase frees its slot at once; releasing an unknown or missing id changes nothing', () => {
    const { p } = make(1);
    assert.equal(p.admit('192.0.2.1', 'a'), undefined);
    assert.notEqual(p.admit('192.0.2.1', 'b'), undefined);
    p.release('nope');
    p.release(undefined);
    assert.notEqual(p.admit('192.0.2.1', 'b'), undefined);
    p.release('a');
    assert.equal(p.admit('192.0.2.1', 'b'), undefined);
    p.release('a');
    assert.equal(p.size(), 1);
  });

  test('a body that never came (Envoy answered 408) frees its slot after the body timeout', () => {
    const { p, clock } = make(1, 5000);
    assert.equal(p.admit('192.0.2.1', 'a'), undefined);
    clock.now += 4999;
    assert.equal(p.admit('192.0.2.1', 'b'), 1);
    clock.now += 1;
    assert.equal(p.admit('192.0.2.1', 'b'), undefined);
    assert.equal(p.size(), 1);
  });

  test('a client is its rate-limit key: an IPv4-mapped address is its IPv4, an IPv6 address its /64', () => {
    const { p } = make(1);
    assert.equal(p.admit('192.0.2.7', 'a'), undefined);
    assert.notEqual(p.admit('::ffff:192.0.2.7', 'b'), undefined);
    assert.equal(p.admit('2001:db8:1:2::1', 'c'), undefined);
    assert.notEqual(p.admit('2001:db8:1:2:ffff::9', 'd'), undefined, 'same /64');
    assert.equal(p.admit('2001:db8:1:3::1', 'e'), undefined, 'another /64');
  });

  test('no address or no request id (a hand-made Check): admitted untracked; the same id twice takes one slot', () => {
    const { p } = make(1);
    assert.equal(p.admit('unknown', 'a'), undefined);
    assert.equal(p.admit('192.0.2.1', undefined), undefined);
    assert.equal(p.admit('192.0.2.1', ''), undefined);
    assert.equal(p.size(), 0);
    assert.equal(p.admit('192.0.2.1', 'x'), undefined);
    assert.equal(p.admit('192.0.2.1', 'x'), undefined);
    assert.equal(p.size(), 1);
  });

  test('memory stays bounded under churn: released and expired entries are compacted away', () => {
    const { p, clock } = make(8, 100);
    for (let i = 0; i < 50_000; i++) {
      assert.equal(p.admit(`192.0.2.${i % 200}`, `r${i}`), undefined);
      if (i % 2 === 0) p.release(`r${i}`);
      clock.now += 1;
    }
    assert.ok(p.size() <= 100, `${p.size()} pending after 50,000 admissions with a 100-ms timeout`);
  });

  test('the 429: too many requests, Retry-After in whole seconds ≥ 1, one Decision per value', () => {
    const d = pendingDenial(4001);
    assert.deepEqual([d.allow, d.httpStatus, d.code, d.reason], [false, 429, 'too many requests', 'too many requests:pending_bodies']);
    assert.deepEqual(d.headers.find(([k]) => k === 'retry-after'), ['retry-after', '5']);
    assert.deepEqual(pendingDenial(1).headers.find(([k]) => k === 'retry-after'), ['retry-after', '1']);
    assert.equal(pendingDenial(4500), d);
  });
});

// ─── Through the real core ─────────────────────────────────────────────────────────────────

describe('header phases and cut bodies on the real core over gRPC', () => {
  let f: Fixture;
  const now = (): number => Math.floor(Date.now() / 1000);
  const KP = '198.51.100.9';
  before(async () => {
    f = await startFixture({
      env: { BLOCKED_COUNTRIES: 'KP', INGEST_MAX_PENDING_PER_CLIENT: '2' },
      geo: { lookup: (ip) => ({ country: ip === KP ? 'KP' : 'CH', regions: [] }) },
      markets: fakeMarkets([{ conditionId: '0xmkt', seq: 1, active: true, closed: false, minSize: '1', maxSize: '100' }]),
      nonces: 'memory',
    });
  });
  after(async () => f?.close());

  const orderHeaders = (ip: string, id: string): Parameters<Fixture['check']>[0] => ({
    method: 'POST', path: '/v1/orders', headers: { 'x-edge-client-ip': ip, 'x-request-id': id }, contextExtensions: { route: 'order', phase: 'headers' },
  });

  test('order header phase: a blocked client gets the 451 of the body phase, byte for byte, before any body; an allowed one passes on its headers alone', async () => {
    const atHeaders = await f.check(orderHeaders(KP, 'req-kp-1'));
    const atBody = await f.check({ method: 'POST', path: '/v1/orders', headers: { 'x-edge-client-ip': KP, 'x-request-id': 'req-kp-1' }, body: Buffer.from('{}'), contextExtensions: { route: 'order' } });
    assert.equal(atHeaders.status, 451);
    assert.equal(atHeaders.raw.denied_response?.body, atBody.raw.denied_response?.body);
    assert.deepEqual(atHeaders.raw.denied_response?.headers, atBody.raw.denied_response?.headers);
    assert.equal((await f.check(orderHeaders('192.0.2.20', 'req-ch-1'))).status, 200);
    // The body phase still judges the order itself.
    const bad = await f.check({ method: 'POST', path: '/v1/orders', headers: { 'x-edge-client-ip': '192.0.2.20' }, body: Buffer.from('{}'), contextExtensions: { route: 'order' } });
    assert.deepEqual([bad.status, bad.error], [400, 'invalid_order']);
  });

  test('order header phase: counted and logged under its own label', async () => {
    assert.equal(routeLabel(decodeCheckRequest(encodeCheckRequest(orderHeaders('192.0.2.20', 'x')))), 'order_headers');
    await f.check(orderHeaders(KP, 'req-kp-2'));
    assert.match(await f.core.metricsText(), /edge_authz_decisions_total\{route="order_headers",outcome="deny",code="restricted_jurisdiction"\} [1-9]/);
  });

  test('ingest header phase: the third pending body of one address is 429 with Retry-After; its body phase frees a slot; another address is unaffected', async () => {
    const ip = '192.0.2.30';
    const body = ingestBody(marketDoc('0xpending', 1), f.feed);
    const signed = (): Record<string, string> => hmacHeaders(body, f.hmacKey, now());
    const phase = (id: string, headers: Record<string, string>, client = ip): ReturnType<Fixture['check']> => f.check({
      method: 'POST', path: '/internal/ingest/market', headers: { ...headers, 'x-edge-client-ip': client, 'x-request-id': id }, contextExtensions: { route: 'ingest', phase: 'headers' },
    });
    const h1 = signed();
    assert.equal((await phase('p1', h1)).status, 200);
    assert.equal((await phase('p2', signed())).status, 200);
    const refused = await phase('p3', signed());
    assert.deepEqual([refused.status, refused.error], [429, 'too many requests']);
    const retry = Number(refused.raw.denied_response?.headers?.find((h) => h.header?.key === 'retry-after')?.header?.value);
    assert.ok(retry >= 1 && retry <= 5, `Retry-After ${retry}`);
    assert.equal((await phase('q1', signed(), '192.0.2.31')).status, 200, 'another address');
    // p1's body arrives: its slot is free, whatever the body phase decides.
    const done = await f.check({ method: 'POST', path: '/internal/ingest/market', headers: { ...h1, 'x-edge-client-ip': ip, 'x-request-id': 'p1' }, body, contextExtensions: { route: 'ingest' } });
    assert.equal(done.status, 200, JSON.stringify(done.body));
    assert.equal((await phase('p4', signed())).status, 200);
    // Headers that fail on their own are refused for that, taking no slot.
    const bad = await phase('p5', { ...signed(), 'x-edge-nonce': 'zz' });
    assert.deepEqual([bad.status, bad.error], [401, 'unauthorized']);
  });

  test('a body cut at the route\'s limit (x-envoy-auth-partial-body: true) is 413 on both body routes, before any other check; a client\'s own copy of the header is Envoy\'s to drop', async () => {
    const body = ingestBody(marketDoc('0xcut', 1), f.feed);
    const partial = { 'x-envoy-auth-partial-body': 'true' };
    const ingest = await f.check({ method: 'POST', path: '/internal/ingest/market', headers: { ...hmacHeaders(body, f.hmacKey, now()), ...partial, 'x-edge-client-ip': '192.0.2.40' }, body, contextExtensions: { route: 'ingest' } });
    assert.deepEqual([ingest.status, ingest.error], [413, 'payload_too_large']);
    const order = await f.check({ method: 'POST', path: '/v1/orders', headers: { ...partial, 'x-edge-client-ip': '192.0.2.40' }, body: Buffer.from('{}'), contextExtensions: { route: 'order' } });
    assert.deepEqual([order.status, order.error], [413, 'payload_too_large']);
    // `false` (a whole body) is judged as usual; so is a read that carries the header.
    const whole = await f.check({ method: 'POST', path: '/internal/ingest/market', headers: { ...hmacHeaders(body, randomBytes(32), now()), 'x-envoy-auth-partial-body': 'false', 'x-edge-client-ip': '192.0.2.40' }, body, contextExtensions: { route: 'ingest' } });
    assert.deepEqual([whole.status, whole.error], [401, 'unauthorized']);
    assert.equal((await f.check({ headers: { ...partial, 'x-edge-client-ip': '192.0.2.40' }, contextExtensions: { route: 'read' } })).status, 200);
  });
});
