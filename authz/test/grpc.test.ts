/**
 * Integration: the real gRPC server on 127.0.0.1:0, a real grpc-js client sending
 * CheckRequests shaped like Envoy's, real Redis for nonces.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { createHash, randomBytes } from 'node:crypto';
import * as grpc from '@grpc/grpc-js';
import { geoDenial } from '../src/authz/decision.ts';
import { NONCE_TAG_HEX } from '../src/common/log.ts';
import type { MethodDefinition } from '@grpc/proto-loader';
import { loadPackageDefinition, SERVICE_NAMES } from '../../proto/index.ts';
import { encodeDecision } from '../src/authz/codec/response.ts';
import { startFixture, type Fixture } from './server-fixture.ts';
import { PrivateRedis } from '../../testkit/redis-server.ts';
import { fakeMarkets, hmacHeaders } from './helpers.ts';
import { ingestBody, marketDoc } from '../../testkit/feed.ts';

const now = () => Math.floor(Date.now() / 1000);
const MARKET = { conditionId: '0xmarket1', seq: 1, active: true, closed: false, minSize: '5', maxSize: '1000' };
const geo = {
  lookup: (ip: string) =>
    ip.startsWith('203.0.113.') ? { country: 'US', regions: ['US-NY'] }
      : ip.startsWith('198.51.100.') ? { country: 'KP', regions: [] }
        : ip.startsWith('192.0.2.') ? { country: 'CH', regions: [] } : null,
};
const GEO_ENV = { BLOCKED_COUNTRIES: 'US,KP', GEO_BLOCKED_BY_URL: 'https://venue.example/legal' };

function order(extra: Record<string, unknown> = {}): Buffer {
  return Buffer.from(JSON.stringify({ marketId: MARKET.conditionId, deadline: now() + 60, size: '25.5', payload: Buffer.from([0, 255, 1]).toString('base64'), ...extra }));
}

describe('authz gRPC server', () => {
  let f: Fixture;
  before(async () => {
    f = await startFixture({ env: GEO_ENV, geo, markets: fakeMarkets([MARKET]) });
  });
  after(async () => f.close());

  test('geo – a GET from an allowed country is allowed', async () => {
    const r = await f.check({ headers: { 'x-edge-client-ip': '192.0.2.10' } });
    assert.equal(r.status, 200);
  });

  test('geo – the 451 status number reaches the wire with a uniform body, no-store and Link', async () => {
    const a = await f.check({ headers: { 'x-edge-client-ip': '203.0.113.5' } });
    const b = await f.check({ headers: { 'x-edge-client-ip': '198.51.100.9' }, path: '/' });
    assert.equal(a.status, 451);
    assert.equal(b.status, 451);
    assert.equal(a.raw.denied_response?.body, b.raw.denied_response?.body, 'byte-identical bodies for two blocked countries');
    const headers = Object.fromEntries((a.raw.denied_response?.headers ?? []).map((h) => [h.header?.key, h.header?.value]));
    assert.equal(headers['content-type'], 'application/json');
    assert.equal(headers['cache-control'], 'no-store');
    assert.equal(headers['link'], '<https://venue.example/legal>; rel="blocked-by"');
    assert.equal(a.error, 'restricted_jurisdiction');
  });

  test('geo – without x-edge-client-ip the TCP peer (source.address) decides', async () => {
    const r = await f.check({ sourceAddress: '203.0.113.77' });
    assert.equal(r.status, 451);
  });

  test('geo – an address with no record is blocked by default', async () => {
    const r = await f.check({ headers: { 'x-edge-client-ip': '100.64.0.1' } });
    assert.equal(r.status, 451);
  });

  test('geo – blocked clients are denied on every route, ingest and orders included', async () => {
    for (const [method, path] of [['POST', '/internal/ingest/market'], ['POST', '/v1/orders'], ['GET', '/healthz']] as const) {
      const r = await f.check({ method, path, headers: { 'x-edge-client-ip': '203.0.113.5' }, body: order() });
      assert.equal(r.status, 451, `${method} ${path}`);
    }
  });

  test('ingest – a signed ingest is allowed once; the replay is ingest_replay', async () => {
    const body = ingestBody(marketDoc('0xmkt-int-1', 1), f.feed);
    const headers = { ...hmacHeaders(body, f.hmacKey, now()), 'x-edge-client-ip': '192.0.2.10' };
    const first = await f.check({ method: 'POST', path: '/internal/ingest/market', headers, body });
    const second = await f.check({ method: 'POST', path: '/internal/ingest/market', headers, body });
    assert.equal(first.status, 200);
    assert.deepEqual([second.status, second.error], [401, 'ingest_replay']);
  });

  test('ingest – 50 identical signed requests at once → exactly one allowed', async () => {
    const body = ingestBody(marketDoc('0xmkt-int-2', 1), f.feed);
    const headers = { ...hmacHeaders(body, f.hmacKey, now()), 'x-edge-client-ip': '192.0.2.10' };
    const results = await Promise.all(Array.from({ length: 50 }, () => f.check({ method: 'POST', path: '/internal/ingest/market', headers, body })));
    assert.equal(results.filter((r) => r.status === 200).length, 1);
    assert.equal(results.filter((r) => r.error === 'ingest_replay').length, 49);
  });

  test('ingest – a wrong HMAC is unauthorized and records no nonce', async () => {
    const body = ingestBody(marketDoc('0xmkt-int-3', 1), f.feed);
    const nonce = randomBytes(16).toString('hex');
    const headers = { ...hmacHeaders(body, randomBytes(32), now(), nonce), 'x-edge-client-ip': '192.0.2.10' };
    const r = await f.check({ method: 'POST', path: '/internal/ingest/market', headers, body });
    assert.deepEqual([r.status, r.error], [401, 'unauthorized']);
    assert.equal(await f.redis!.exists(`edge:nonce:${nonce}`), 0);
  });

  test('decision log – a denied ingest carries a short non-reversible nonce tag (sha-256 prefix), never the nonce', async () => {
    const body = ingestBody(marketDoc('0xmkt-int-tag', 1), f.feed);
    const nonce = randomBytes(16).toString('hex');
    const headers = { ...hmacHeaders(body, randomBytes(32), now(), nonce), 'x-edge-client-ip': '192.0.2.10', 'x-request-id': 'req-tag-1' };
    await f.check({ method: 'POST', path: '/internal/ingest/market', headers, body });
    const line = f.logs.map((l) => JSON.parse(l) as Record<string, unknown>).find((l) => l['requestId'] === 'req-tag-1');
    assert.ok(line !== undefined, 'the denial was logged');
    const tag = createHash('sha256').update(nonce).digest('hex').slice(0, NONCE_TAG_HEX);
    assert.equal(line['nonceTag'], tag);
    assert.ok(!JSON.stringify(line).includes(nonce.slice(0, 8)), 'no part of the nonce itself');
    assert.ok(!JSON.stringify(line).includes('[redacted]'), 'the tag is a field of its own, not censored');
  });

  test('ingest header phase – headers alone decide: missing or malformed headers and a stale timestamp are 401 without a body; good headers pass to the body phase, which still checks the HMAC', async () => {
    const phase = { route: 'ingest', phase: 'headers' };
    const ingestPath = { method: 'POST', path: '/internal/ingest/market', contextExtensions: phase };
    const good = hmacHeaders(Buffer.from('{}'), randomBytes(32), now());
    const cases: [Record<string, string>, number, string | undefined][] = [
      [{}, 401, 'unauthorized'],
      [{ ...good, 'x-edge-nonce': 'zz' }, 401, 'unauthorized'],
      [{ ...good, 'x-edge-signature': 'v1=00' }, 401, 'unauthorized'],
      [{ ...good, 'x-edge-timestamp': String(now() - 3_600) }, 401, 'timestamp expired'],
      // The header phase cannot see the body, so a wrong key still passes it ...
      [good, 200, undefined],
    ];
    for (const [headers, status, error] of cases) {
      const r = await f.check({ ...ingestPath, headers: { ...headers, 'x-edge-client-ip': '192.0.2.10' } });
      assert.deepEqual([r.status, r.error], [status, error], JSON.stringify(headers));
    }
    // ... and the body phase (no phase extension) denies it, recording no nonce.
    const body = ingestBody(marketDoc('0xmkt-phase', 1), f.feed);
    const wrongKey = hmacHeaders(body, randomBytes(32), now());
    const r = await f.check({ method: 'POST', path: '/internal/ingest/market', headers: { ...wrongKey, 'x-edge-client-ip': '192.0.2.10' }, body, contextExtensions: { route: 'ingest' } });
    assert.deepEqual([r.status, r.error], [401, 'unauthorized']);
    assert.equal(await f.redis!.exists(`edge:nonce:${wrongKey['x-edge-nonce']}`), 0);
    // Geo still applies first in the header phase.
    const blocked = await f.check({ ...ingestPath, headers: { ...good, 'x-edge-client-ip': '198.51.100.9' } });
    assert.equal(blocked.status, 451);
  });

  test('ingest header phase – a body-phase Check with an empty body is the whole policy, never the header phase', async () => {
    const headers = { ...hmacHeaders(Buffer.alloc(0), randomBytes(32), now()), 'x-edge-client-ip': '192.0.2.10' };
    const r = await f.check({ method: 'POST', path: '/internal/ingest/market', headers, body: Buffer.alloc(0), contextExtensions: { route: 'ingest' } });
    assert.deepEqual([r.status, r.error], [401, 'unauthorized']);
  });

  test('ingest – the accepted nonce is stored in Redis with the 600 s TTL', async () => {
    const body = ingestBody(marketDoc('0xmkt-int-4', 1), f.feed);
    const nonce = randomBytes(16).toString('hex');
    const headers = { ...hmacHeaders(body, f.hmacKey, now(), nonce), 'x-edge-client-ip': '192.0.2.10' };
    assert.equal((await f.check({ method: 'POST', path: '/internal/ingest/market', headers, body })).status, 200);
    const ttl = await f.redis!.ttl(`edge:nonce:${nonce}`);
    assert.ok(ttl > 590 && ttl <= 600, `ttl ${ttl}`);
  });

  test('orders – a valid order is allowed; an unknown market is 404 unknown_market', async () => {
    const ok = await f.check({ method: 'POST', path: '/v1/orders', headers: { 'x-edge-client-ip': '192.0.2.10' }, body: order() });
    const unknown = await f.check({ method: 'POST', path: '/v1/orders', headers: { 'x-edge-client-ip': '192.0.2.10' }, body: order({ marketId: '0xnope' }) });
    assert.equal(ok.status, 200);
    assert.deepEqual([unknown.status, unknown.error], [404, 'unknown_market']);
  });

  test('orders – deadline and size rules answer 422 with the documented code', async () => {
    const cases: [Record<string, unknown>, string][] = [
      [{ deadline: now() - 1 }, 'deadline_expired'],
      [{ deadline: now() + 86401 + 5 }, 'deadline_too_far'],
      [{ size: '1' }, 'invalid_size'],
      [{ size: '1000.000000000000000001' }, 'invalid_size'],
    ];
    for (const [extra, code] of cases) {
      const r = await f.check({ method: 'POST', path: '/v1/orders', headers: { 'x-edge-client-ip': '192.0.2.10' }, body: order(extra) });
      assert.deepEqual([r.status, r.error], [422, code], JSON.stringify(extra));
    }
  });

  test('metrics – decisions are counted by route, outcome and code, with a latency histogram', async () => {
    await f.check({ headers: { 'x-edge-client-ip': '203.0.113.5' } });
    await f.check({ method: 'POST', path: '/v1/orders', headers: { 'x-edge-client-ip': '192.0.2.10' }, body: order() });
    const text = await f.core.metricsText();
    assert.match(text, /edge_authz_decisions_total\{route="read",outcome="deny",code="restricted_jurisdiction"\} [1-9]/);
    assert.match(text, /edge_authz_decisions_total\{route="order",outcome="allow",code="ok"\} [1-9]/);
    assert.match(text, /edge_authz_check_duration_seconds_count\{route="order"\} [1-9]/);
    assert.match(text, /edge_geoip_database_age_seconds \d+/);
  });

  test('health – grpc.health.v1 reports SERVING', async () => {
    const status = await healthCheck(f.port);
    assert.equal(status, 'SERVING');
  });
});

async function healthCheck(port: number): Promise<string> {
  const { loadPackageDefinition } = await import('../../proto/index.ts');
  const pkg = grpc.loadPackageDefinition(loadPackageDefinition()) as unknown as { grpc: { health: { v1: { Health: grpc.ServiceClientConstructor } } } };
  const c = new pkg.grpc.health.v1.Health(`127.0.0.1:${port}`, grpc.credentials.createInsecure());
  try {
    return await new Promise((resolve, reject) => {
      (c as unknown as { Check: (r: object, cb: (e: Error | null, res: { status: string | number }) => void) => void })
        .Check({ service: '' }, (e, res) => (e ? reject(e) : resolve(['UNKNOWN', 'SERVING', 'NOT_SERVING'][Number(res.status)] ?? String(res.status))));
    });
  } finally {
    c.close();
  }
}

describe('seal', () => {
  test('seal – credential buffers read all zeros, Check answers 503 sealed, health NOT_SERVING', async () => {
    const f = await startFixture({ markets: fakeMarkets([MARKET]), nonces: 'memory' });
    try {
      const buffers = f.core.credentials.secretBuffers;
      assert.ok(buffers.every((b) => b.some((x) => x !== 0)), 'keys are non-zero before sealing');
      f.core.seal('test');
      assert.ok(buffers.every((b) => b.every((x) => x === 0)), 'every HMAC key buffer is zero after sealing');
      const r = await f.check({ headers: { 'x-edge-client-ip': '192.0.2.10' } });
      assert.deepEqual([r.status, r.error], [503, 'sealed']);
      assert.equal(await healthCheck(f.port), 'NOT_SERVING');
    } finally {
      await f.close();
    }
  });
});

describe('fail closed', () => {
  test('redis down – ingest is denied 503 service_unavailable, nothing recorded; recovers when Redis returns', async () => {
    const redisProc = await PrivateRedis.start();
    const f = await startFixture({ markets: fakeMarkets([MARKET]), redisUrl: redisProc.url });
    try {
      const body = ingestBody(marketDoc('0xmkt-down', 1), f.feed);
      const headers = { ...hmacHeaders(body, f.hmacKey, now()), 'x-edge-client-ip': '192.0.2.10' };
      await redisProc.stop();
      const down = await f.check({ method: 'POST', path: '/internal/ingest/market', headers, body });
      assert.deepEqual([down.status, down.error], [503, 'service_unavailable']);
      await redisProc.resume();
      // The client reconnects by itself; the same signed request (its nonce never recorded) is accepted.
      let r = down;
      for (let i = 0; i < 50 && r.status !== 200; i++) {
        await new Promise((res) => setTimeout(res, 100));
        r = await f.check({ method: 'POST', path: '/internal/ingest/market', headers, body });
      }
      assert.equal(r.status, 200);
    } finally {
      await f.close();
      await redisProc.stop();
    }
  });

  test('unexpected error – a throwing market store denies 503, never allows', async () => {
    const f = await startFixture({ markets: { get: () => { throw new Error('boom'); } }, nonces: 'memory' });
    try {
      const r = await f.check({ method: 'POST', path: '/v1/orders', headers: { 'x-edge-client-ip': '192.0.2.10' }, body: order() });
      assert.equal(r.status, 503);
    } finally {
      await f.close();
    }
  });
});

test('wire – the encoded 451 denial carries the status as varint 08 c3 03 (not an enum name collapsed to 0)', () => {
  const pd = loadPackageDefinition();
  const check = (pd[SERVICE_NAMES.authorization] as Record<string, MethodDefinition<object, object>>)['Check']!;
  const bytes = encodeDecision(geoDenial('notice', undefined), check.responseSerialize as (o: object) => Buffer);
  // DeniedHttpResponse.status (field 1) → HttpStatus.code (field 1) = 451 → 08 c3 03
  assert.ok(bytes.includes(Buffer.from([0x0a, 0x03, 0x08, 0xc3, 0x03])), bytes.toString('hex'));
});
