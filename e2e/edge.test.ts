/**
 * End-to-end through real Envoy 1.40: the whole stack as local processes (e2e/lib/stack.ts),
 * driven only through Envoy's port with fetch. Real Redis (a private redis-server), real
 * mTLS with certificates generated at run time, the real TS service on Node 24.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { randomBytes, X509Certificate } from 'node:crypto';
import { ingestSignatureHeaders } from '../authz/src/common/crypto/ingest-signer.ts';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { geoFixtures } from '../testkit/geo-fixtures.ts';
import { traceAudit } from '../testkit/trace-ledger.ts';
import { issue, publishClientCert } from '../scripts/dev/certs.ts';
import { demoDocument } from '../scripts/edge-client.ts';
import { ACCESS_LOG_PATH_MAX } from '../envoy/render.ts';
import { startStack, type Stack } from './lib/driver.ts';
import { allowedIp, CU_IP, errorCode, ingest, KP_IP, orderBody, request, signed, uniqueId } from './lib/client.ts';

const ENV = {
  XFF_NUM_TRUSTED_HOPS: '1',
  BLOCKED_COUNTRIES: 'KP,CU',
  GEO_BLOCKED_BY_URL: 'https://venue.example/jurisdictions',
  ORDER_BACKEND_TIMEOUT_MS: '1500',
  ORDER_BACKEND_MAX_CONN_SECS: '2',
  ORDER_PAYLOAD_MAX_BYTES: '32768',
};

let stack: Stack;
let market: string;

before(async () => {
  stack = await startStack({ env: ENV, geoipDb: geoFixtures().geoip2 });
  market = uniqueId('0xe2e');
  const r = await ingest(stack, market, 1);
  assert.equal(r.status, 200, r.text);
});
after(async () => stack?.stop());

/** One HTTP/2 (h2c prior knowledge) request through Envoy: status and body. */
async function h2Request(headers: Record<string, string>): Promise<[number, string]> {
  const { connect } = await import('node:http2');
  const session = connect(stack.edgeUrl);
  try {
    return await new Promise<[number, string]>((resolve, reject) => {
      const req = session.request(headers);
      let status = 0;
      let data = '';
      req.on('response', (h) => { status = Number(h[':status']); });
      req.setEncoding('utf8');
      req.on('data', (c: string) => { data += c; });
      req.on('end', () => resolve([status, data]));
      req.on('error', reject);
      req.end();
    });
  } finally {
    session.close();
  }
}

describe('public endpoints', () => {
  test('GET / and /healthz answer 200 JSON through Envoy', async () => {
    const root = await request(stack, 'GET', '/');
    assert.deepEqual(root.json(), { service: 'edge-trading-proxy', version: '1.0.0', api: 'v1' });
    const health = await request(stack, 'GET', '/healthz');
    assert.equal(health.status, 200);
    assert.equal(health.json()['status'], 'ok');
  });

  test('unknown path → 404 not_found, wrong method → 405 method_not_allowed, bad query → 400 invalid_query', async () => {
    assert.equal(errorCode(await request(stack, 'GET', '/nope')), 'not_found');
    const r405 = await request(stack, 'DELETE', '/v1/markets');
    assert.equal(r405.status, 405);
    assert.equal(errorCode(r405), 'method_not_allowed');
    const bad = await request(stack, 'GET', '/v1/markets?limit=0');
    assert.equal(bad.status, 400);
    assert.equal(errorCode(bad), 'invalid_query');
    for (const method of ['GET', 'PUT', 'DELETE']) {
      const orders405 = await fetch(`${stack.edgeUrl}/v1/orders`, { method, headers: { 'x-forwarded-for': allowedIp() } });
      assert.equal(orders405.status, 405, `${method} /v1/orders`);
      assert.equal(orders405.headers.get('allow'), 'POST');
      assert.equal(((await orders405.json()) as { error: string }).error, 'method_not_allowed');
    }
  });

  test('malformed HTTP is the client\'s fault: 400/431 bad_request JSON, never a 5xx; headers Envoy accepts are served', async () => {
    const { connect } = await import('node:net');
    const url = new URL(stack.edgeUrl);
    const raw = (text: string): Promise<[number, Record<string, unknown>]> => new Promise((resolve, reject) => {
      // write, not end: Envoy treats a half-closed downstream as gone and answers nothing.
      const sock = connect(Number(url.port), url.hostname, () => sock.write(text));
      let got = '';
      sock.on('data', (d: Buffer) => { got += d.toString('latin1'); });
      sock.on('end', () => {
        const [head, body] = [got.slice(0, got.indexOf('\r\n\r\n')), got.slice(got.indexOf('\r\n\r\n') + 4)];
        try { resolve([Number(head.split(' ')[1]), JSON.parse(body) as Record<string, unknown>]); } catch (e) { reject(new Error(`${String(e)}: ${got}`)); }
      });
      sock.on('error', reject);
    });
    // HTTP/1.0 and an Upgrade keep Envoy's status with the bad_request code and their own message.
    const [v10, v10Body] = await raw('GET / HTTP/1.0\r\nhost: x\r\n\r\n');
    assert.deepEqual([v10, v10Body['error'], v10Body['message']], [426, 'bad_request', 'HTTP/1.1 or HTTP/2 required']);
    const [upgrade, upgradeBody] = await raw('GET / HTTP/1.1\r\nhost: x\r\nconnection: upgrade, close\r\nupgrade: websocket\r\nsec-websocket-version: 13\r\nsec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n');
    assert.deepEqual([upgrade, upgradeBody['error'], upgradeBody['message']], [403, 'bad_request', 'protocol upgrade not supported']);
    // Envoy answers an unsupported transfer-encoding with 501: the mapper makes it 400, not the 5xx catch-all's 503.
    for (const te of ['xchunked', 'chunked, identity']) {
      const [status, body] = await raw(`POST /v1/orders HTTP/1.1\r\nhost: x\r\ntransfer-encoding: ${te}\r\nconnection: close\r\n\r\n{}`);
      assert.deepEqual([status, body['error']], [400, 'bad_request'], `transfer-encoding: ${te}`);
    }
    // Over HTTP/2 an unknown method reaches the market service, whose parser refuses it.
    const [status, body] = await h2Request({ ':path': '/', ':method': 'FOO', 'x-forwarded-for': allowedIp() });
    assert.deepEqual([status, (JSON.parse(body) as { error: string }).error], [400, 'bad_request'], body);
    // 17 KiB of headers: over Node's default 16 KiB, under Envoy's 60 KiB.
    const big = await request(stack, 'GET', '/', { headers: { 'x-big': 'a'.repeat(17 * 1024) } });
    assert.equal(big.status, 200, big.text);
    const [tooBig, tooBigBody] = await raw(`GET / HTTP/1.1\r\nhost: x\r\nx-big: ${'a'.repeat(61 * 1024)}\r\nconnection: close\r\n\r\n`);
    assert.deepEqual([tooBig, tooBigBody['error']], [431, 'bad_request']);
  });
});

describe('protocols', () => {
  test('HTTP/2 (h2c prior knowledge) reaches the edge like HTTP/1.1', async () => {
    const [status, body] = await h2Request({ ':path': '/', ':method': 'GET', 'x-forwarded-for': '192.0.2.20' });
    assert.equal(status, 200);
    assert.equal(JSON.parse(body).service, 'edge-trading-proxy');
  });
});

describe('geo', () => {
  test('two different blocked countries get byte-identical 451 bodies but for the request id; an allowed country passes', async () => {
    const kp = await request(stack, 'GET', '/v1/markets', { ip: KP_IP });
    const cu = await request(stack, 'GET', '/healthz', { ip: CU_IP });
    assert.equal(kp.status, 451);
    assert.equal(cu.status, 451);
    const [kpId, cuId] = [kp.headers.get('x-request-id')!, cu.headers.get('x-request-id')!];
    assert.notEqual(kpId, cuId);
    assert.equal(kp.text.replace(kpId, cuId), cu.text, 'the requestId is the only difference');
    assert.equal(errorCode(kp), 'restricted_jurisdiction');
    assert.equal(kp.headers.get('cache-control'), 'no-store');
    assert.equal(kp.headers.get('link'), '<https://venue.example/jurisdictions>; rel="blocked-by"');
    assert.equal((await request(stack, 'GET', '/v1/markets', { ip: '192.0.2.10' })).status, 200);
  });

  test('an address with no database record is blocked (GEO_UNKNOWN=block)', async () => {
    const r = await request(stack, 'GET', '/', { ip: '100.64.9.9' });
    assert.equal(r.status, 451);
  });
});

describe('ingest', () => {
  test('an ingest is served by /v1/markets (signed envelope included) and /v1/quotes', async () => {
    const id = uniqueId('0xserve');
    assert.equal((await ingest(stack, id, 3, { extraField: { keep: true } })).status, 200);
    const m = await request(stack, 'GET', `/v1/markets?conditionId=${id}`);
    assert.equal(m.status, 200);
    const [rec] = m.json()['markets'] as Record<string, unknown>[];
    assert.equal(rec?.['seq'], 3);
    assert.deepEqual(rec?.['extraField'], { keep: true });
    assert.equal((rec?.['envelope'] as Record<string, unknown>)['k'], 'ed25519-sha256');
    const q = await request(stack, 'GET', `/v1/quotes?conditionId=${id}`);
    const quotes = q.json()['quotes'] as Record<string, unknown>[];
    assert.equal(quotes.length, 2);
    assert.equal(quotes[0]?.['conditionId'], id);
  });

  test('replay → 401 ingest_replay; 50 concurrent replays → exactly one 200', async () => {
    const id = uniqueId('0xreplay');
    const base = Buffer.from(JSON.stringify({ conditionId: id, seq: 1, question: 'q?', active: true, closed: false, outcomes: [], updatedAt: 1 }));
    const s = signed(stack, base, id);
    const all = await Promise.all(Array.from({ length: 50 }, () => request(stack, 'POST', '/internal/ingest/market', { body: s.body, headers: s.headers })));
    assert.equal(all.filter((r) => r.status === 200).length, 1);
    assert.ok(all.filter((r) => r.status !== 200).every((r) => r.status === 401 && errorCode(r) === 'ingest_replay'));
    const again = await request(stack, 'POST', '/internal/ingest/market', { body: s.body, headers: s.headers });
    assert.equal(errorCode(again), 'ingest_replay');
  });

  test('ingest errors: unauthorized, timestamp expired, invalid_json, invalid_envelope, invalid_content_signature, stale_document, payload_too_large', async () => {
    const id = uniqueId('0xerr');
    const doc = Buffer.from(JSON.stringify({ conditionId: id, seq: 5, question: 'q?', active: true, closed: false, outcomes: [], updatedAt: 1 }));
    const s = signed(stack, doc, id);
    const bad = await request(stack, 'POST', '/internal/ingest/market', { body: s.body, headers: { ...s.headers, 'x-edge-signature': `v1=${'0'.repeat(64)}` } });
    assert.deepEqual([bad.status, errorCode(bad)], [401, 'unauthorized']);
    const missing = await request(stack, 'POST', '/internal/ingest/market', { body: s.body });
    assert.deepEqual([missing.status, errorCode(missing)], [401, 'unauthorized']);
    // An old timestamp, correctly signed.
    const ts = String(Math.floor(Date.now() / 1000) - 301);
    const old = await request(stack, 'POST', '/internal/ingest/market', { body: s.body, headers: ingestSignatureHeaders(stack.hmacKey, ts, randomBytes(16).toString('hex'), s.body) });
    assert.deepEqual([old.status, errorCode(old)], [401, 'timestamp expired']);
    // Correct HMAC over bodies with bad content.
    const send = (body: Buffer) => {
      const ts2 = String(Math.floor(Date.now() / 1000));
      return request(stack, 'POST', '/internal/ingest/market', { body, headers: ingestSignatureHeaders(stack.hmacKey, ts2, randomBytes(16).toString('hex'), body) });
    };
    const notJson = await send(Buffer.from('[1,2'));
    assert.deepEqual([notJson.status, errorCode(notJson)], [400, 'invalid_json']);
    const env = JSON.parse(s.body.toString()) as Record<string, string>;
    const badK = await send(Buffer.from(JSON.stringify({ ...env, k: 'rsa' })));
    assert.deepEqual([badK.status, errorCode(badK)], [400, 'invalid_envelope']);
    const flipped = (env['s'] ?? '').replace(/^./, (c) => (c === '0' ? '1' : '0'));
    const badSig = await send(Buffer.from(JSON.stringify({ ...env, s: flipped })));
    assert.deepEqual([badSig.status, errorCode(badSig)], [401, 'invalid_content_signature']);
    assert.equal((await send(s.body)).status, 200);
    const stale = await send(signed(stack, doc, id).body);
    assert.deepEqual([stale.status, errorCode(stale)], [409, 'stale_document']);
    const big = await request(stack, 'POST', '/internal/ingest/market', { body: Buffer.alloc(1_048_577, 0x20), headers: s.headers });
    assert.deepEqual([big.status, errorCode(big)], [413, 'payload_too_large']);
  });
});

describe('orders', () => {
  test('200 random payloads (0x00, invalid UTF-8, 1 byte, the maximum) reach the backend byte-exact over mTLS', async () => {
    const clientFp = new X509Certificate(readFileSync(stack.pki.clientCertFile)).fingerprint256;
    const payloads = [Buffer.from([0]), Buffer.from([0xff, 0xfe, 0x80]), Buffer.alloc(32768, 0xab), randomBytes(32768)];
    while (payloads.length < 200) payloads.push(randomBytes(1 + Math.floor(Math.random() * 4096)));
    const before = stack.backend.deliveries.length;
    for (let i = 0; i < payloads.length; i += 20) {
      const batch = payloads.slice(i, i + 20);
      const replies = await Promise.all(batch.map((p) => request(stack, 'POST', '/v1/orders', { body: orderBody(market, p), headers: { 'content-type': 'application/json' } })));
      for (const r of replies) assert.equal(r.status, 200, r.text);
    }
    const got = stack.backend.deliveries.slice(before);
    assert.equal(got.length, payloads.length, 'each order delivered exactly once');
    const bodies = new Set(got.map((d) => d.body.toString('base64')));
    for (const p of payloads) assert.ok(bodies.has(p.toString('base64')), 'payload delivered byte-exact');
    for (const d of got) {
      assert.equal(d.path, '/orders');
      assert.equal(Number(d.headers['content-length']), d.body.length);
      assert.equal(d.headers['content-type'], 'application/octet-stream');
      assert.equal(d.headers['x-edge-market-id'], market);
      assert.equal(d.headers['x-edge-size'], '10');
      assert.match(String(d.headers['x-request-id']), /^[0-9a-f-]{36}$/);
      assert.equal(d.clientCertFingerprint, clientFp);
    }
  });

  test('access log: the line of a delivered order splits its time into edge_us and upstream_us; a denied order has no upstream time; a long path is cut', async () => {
    const before = stack.backend.deliveries.length;
    const ok = await request(stack, 'POST', '/v1/orders', { body: orderBody(market, randomBytes(64)), headers: { 'content-type': 'application/json' } });
    assert.equal(ok.status, 200, ok.text);
    const okId = String(stack.backend.deliveries[before]?.headers['x-request-id']);
    const denied = await request(stack, 'POST', '/v1/orders', { body: '{', headers: { 'content-type': 'application/json' } });
    assert.equal(denied.status, 400, denied.text);
    const deniedId = denied.headers.get('x-request-id') ?? '';
    assert.match(deniedId, /^[0-9a-f-]{36}$/);
    const long = await request(stack, 'GET', `/${'z'.repeat(4000)}`);
    assert.equal(long.status, 404);
    const longId = long.headers.get('x-request-id') ?? '';
    // Envoy flushes its access log every 10 s (--file-flush-interval-msec); reopening the logs flushes it now.
    assert.equal((await fetch(`${stack.envoyAdmin}/reopen_logs`, { method: 'POST' })).status, 200);
    // Envoy's access-log line, not the TS service's log line about the same request (pino's
    // `requestId`; the access log's field is `request_id`).
    const line = (id: string): Record<string, unknown> | undefined => {
      for (const raw of stack.logs().split('\n')) {
        const text = raw.replace(/^\[\w+\] /, '');
        if (!text.startsWith('{') || !text.includes(id)) continue;
        try {
          const parsed = JSON.parse(text) as Record<string, unknown>;
          if (parsed['request_id'] === id) return parsed;
        } catch { /* not a JSON line */ }
      }
      return undefined;
    };
    let got: (Record<string, unknown> | undefined)[] = [undefined, undefined, undefined];
    for (let i = 0; i < 50 && got.includes(undefined); i++) {
      await sleep(100);
      got = [line(okId), line(deniedId), line(longId)];
    }
    const [okLine, deniedLine, longLine] = got;
    // A client-chosen 4,000-character path is cut to ACCESS_LOG_PATH_MAX in the log.
    assert.equal(String(longLine?.['path']), `/${'z'.repeat(ACCESS_LOG_PATH_MAX - 1)}`);
    assert.ok(okLine !== undefined && deniedLine !== undefined, `both access log lines appear (${okId}, ${deniedId}); log tail:\n${stack.logs().slice(-1500)}`);
    assert.equal(okLine['route'], 'orders');
    for (const k of ['edge_us', 'upstream_us'] as const) {
      const v = okLine[k];
      assert.ok(typeof v === 'number' && Number.isInteger(v) && v > 0, `${k} is a positive count of µs: ${String(v)}`);
    }
    // Both legs fit inside the whole request's duration (ms, rounded down).
    assert.ok((okLine['edge_us'] as number) + (okLine['upstream_us'] as number) < (Number(okLine['duration_ms']) + 1) * 1000);
    assert.equal(deniedLine['status'], 400);
    // A duration with no end point is null (Envoy's json_format writes null for a missing value).
    assert.ok('edge_us' in deniedLine && 'upstream_us' in deniedLine, 'the fields are in every line');
    assert.equal(deniedLine['edge_us'], null);
    assert.equal(deniedLine['upstream_us'], null);
  });

  test('order errors: invalid_json, invalid_order (field), unknown_market, market_closed, deadline_expired, deadline_too_far, invalid_size, payload_too_large — nothing delivered', async () => {
    const closed = uniqueId('0xclosed');
    assert.equal((await ingest(stack, closed, 1, { closed: true })).status, 200);
    const now = Math.floor(Date.now() / 1000);
    const p = Buffer.from('order');
    const cases: [string, number, string][] = [
      ['{', 400, 'invalid_json'],
      [orderBody(market, p, { payload: 'not base64!' }), 400, 'invalid_order'],
      [orderBody('0xnope', p), 404, 'unknown_market'],
      [orderBody(closed, p), 409, 'market_closed'],
      [orderBody(market, p, { deadline: now - 5 }), 422, 'deadline_expired'],
      [orderBody(market, p, { deadline: now + 90_000 }), 422, 'deadline_too_far'],
      [orderBody(market, p, { size: '0' }), 422, 'invalid_size'],
      [orderBody(market, p, { size: '100001' }), 422, 'invalid_size'],
      [orderBody(market, Buffer.alloc(32_769)), 400, 'invalid_order'],
      [orderBody(market, Buffer.alloc(50_000)), 413, 'payload_too_large'],
    ];
    const before = stack.backend.deliveries.length;
    for (const [body, status, code] of cases) {
      const r = await request(stack, 'POST', '/v1/orders', { body, headers: { 'content-type': 'application/json' } });
      assert.deepEqual([r.status, errorCode(r)], [status, code], body.slice(0, 80));
      if (code === 'invalid_order') assert.equal(r.json()['field'], 'payload');
    }
    assert.equal(stack.backend.deliveries.length, before, 'no rejected order reached the backend');
  });

  test('rotated client certificate (k8s ..data swap) is presented to the backend without an Envoy restart', async () => {
    issue(stack.pki.dir, 'client-ca', 'client-2', 'edge-client-2', 'DNS:edge.internal', 'clientAuth');
    const newFp = new X509Certificate(readFileSync(join(stack.pki.dir, 'client-2.crt'))).fingerprint256;
    publishClientCert(join(stack.pki.dir, 'client'), readFileSync(join(stack.pki.dir, 'client-2.crt')), readFileSync(join(stack.pki.dir, 'client-2.key')));
    let seen: string | undefined;
    for (let i = 0; i < 60 && seen !== newFp; i++) {
      const r = await request(stack, 'POST', '/v1/orders', { body: orderBody(market, randomBytes(8)), headers: { 'content-type': 'application/json' } });
      assert.equal(r.status, 200, 'no order fails during the rotation');
      seen = stack.backend.deliveries.at(-1)?.clientCertFingerprint;
      await sleep(100);
    }
    assert.equal(seen, newFp, 'the backend sees the new certificate within ORDER_BACKEND_MAX_CONN_SECS');
  });

  test('a backend with a certificate from another CA → 502 backend_unavailable, nothing delivered; nothing listening → 502', async () => {
    await stack.swapBackend('rogue');
    try {
      const r = await request(stack, 'POST', '/v1/orders', { body: orderBody(market, Buffer.from('x')), headers: { 'content-type': 'application/json' } });
      assert.deepEqual([r.status, errorCode(r)], [502, 'backend_unavailable']);
      assert.equal(stack.backend.deliveries.length, 0, 'the rogue backend received nothing');
      await stack.swapBackend('down');
      const down = await request(stack, 'POST', '/v1/orders', { body: orderBody(market, Buffer.from('x')), headers: { 'content-type': 'application/json' } });
      assert.deepEqual([down.status, errorCode(down)], [502, 'backend_unavailable']);
    } finally {
      await stack.swapBackend('good');
    }
  });

  test('a slow backend → 504 backend_timeout, and the order was sent exactly once (no retries)', async () => {
    stack.backend.mode = 'slow';
    stack.backend.delayMs = 3000;
    try {
      const before = stack.backend.deliveries.length;
      const r = await request(stack, 'POST', '/v1/orders', { body: orderBody(market, Buffer.from('slow')), headers: { 'content-type': 'application/json' } });
      assert.deepEqual([r.status, errorCode(r)], [504, 'backend_timeout']);
      await sleep(200);
      assert.equal(stack.backend.deliveries.length, before + 1);
    } finally {
      stack.backend.mode = 'ok';
    }
  });
});

describe('rate limit', () => {
  test('burst of 40 then 429 JSON with x-ratelimit headers; refills at ~20/s; two addresses are independent', async () => {
    const ip = '192.0.2.77';
    const other = '192.0.2.78';
    const t0 = Date.now();
    const replies = await Promise.all(Array.from({ length: 60 }, () => request(stack, 'GET', '/', { ip })));
    const elapsed = (Date.now() - t0) / 1000;
    const ok = replies.filter((r) => r.status === 200).length;
    // 40 of burst, plus whatever refilled at 20/s while the 60 requests were in flight (rounded up,
    // plus one token: a refill between the clock reads).
    assert.ok(ok >= 40 && ok <= 40 + Math.ceil(20 * elapsed) + 1, `burst allowed ${ok} in ${elapsed}s`);
    const limited = replies.filter((r) => r.status === 429);
    assert.ok(limited.length >= 10);
    assert.equal(errorCode(limited[0]!), 'too many requests');
    assert.ok(limited[0]!.headers.get('x-ratelimit-limit') !== null);
    // Retry-After on every 429 (issue 31): whole seconds ≥ 1, the same number as x-ratelimit-reset.
    for (const r of limited) {
      assert.match(r.headers.get('retry-after') ?? '', /^[1-9][0-9]*$/);
      assert.equal(r.headers.get('retry-after'), r.headers.get('x-ratelimit-reset'));
    }
    assert.equal(replies.find((r) => r.status === 200)!.headers.get('retry-after'), null, 'an allowed answer has none');
    assert.equal((await request(stack, 'GET', '/', { ip: other })).status, 200, 'another address has its own bucket');
    // Refill: after the bucket is empty, wait ~1 s and spend everything that came back.
    const emptiedAt = Date.now();
    await sleep(1000);
    const second = await Promise.all(Array.from({ length: 40 }, () => request(stack, 'GET', '/', { ip })));
    const refillSecs = (Date.now() - emptiedAt) / 1000;
    const sinceStart = (Date.now() - t0) / 1000;
    const refilled = second.filter((r) => r.status === 200).length;
    // The bucket refills continuously from the moment it fell below its burst, which is before
    // the first batch's replies were all in; so the upper bound counts from the first request:
    // both batches together get at most the burst plus 20/s since then.
    assert.ok(refilled >= 18 && ok + refilled <= 40 + Math.ceil(20 * sinceStart) + 1,
      `refilled ${refilled} in ${refillSecs}s (${ok} + ${refilled} allowed in ${sinceStart}s) at 20/s`);
  });
});

describe('expect header', () => {
  test('an Expect other than 100-continue is ignored: a read and a signed ingest succeed (Node alone would answer 417 with no body, after authz recorded the nonce)', async () => {
    const { request: httpRequest } = await import('node:http');
    const send = (method: string, path: string, headers: Record<string, string>, body?: Buffer): Promise<[number, string]> => new Promise((resolve, reject) => {
      const req = httpRequest(`${stack.edgeUrl}${path}`, { method, headers: { 'x-forwarded-for': allowedIp(), expect: 'foo', ...headers } }, (res) => {
        let text = '';
        res.setEncoding('utf8');
        res.on('data', (c: string) => { text += c; });
        res.on('end', () => resolve([res.statusCode ?? 0, text]));
      });
      req.on('error', reject);
      req.end(body);
    });
    const [readStatus, readBody] = await send('GET', `/v1/markets?conditionId=${market}`, {});
    assert.equal(readStatus, 200, readBody);
    const id = uniqueId('0xexpect');
    const s = signed(stack, demoDocument(id, 1), id);
    const [ingestStatus, ingestBody] = await send('POST', '/internal/ingest/market', { ...s.headers, 'content-length': String(s.body.length) }, s.body);
    assert.equal(ingestStatus, 200, ingestBody);
    assert.equal((JSON.parse(ingestBody) as { status: string }).status, 'stored');
  });
});

describe('rate limit, IPv6', () => {
  test('an IPv6 client is its /64: addresses in one /64 share a bucket, another /64 has its own', async () => {
    const t0 = Date.now();
    const replies = await Promise.all(Array.from({ length: 60 }, (_, i) => request(stack, 'GET', '/', { ip: `2001:db8:3:ffff::${(i + 1).toString(16)}` })));
    const elapsed = (Date.now() - t0) / 1000;
    const ok = replies.filter((r) => r.status === 200).length;
    // One burst of 40 plus the refill while in flight, rounded up, plus one token (as above).
    assert.ok(ok >= 40 && ok <= 40 + Math.ceil(20 * elapsed) + 1, `60 addresses of one /64 got ${ok} in ${elapsed}s (one burst of 40)`);
    assert.ok(replies.some((r) => r.status === 429), 'some of the /64\'s requests were limited (a bucket per address would limit none)');
    assert.equal((await request(stack, 'GET', '/', { ip: '2001:db8:3:fffe::1' })).status, 200, 'the next /64 has its own bucket');
  });

  test('IPv4-mapped addresses (::ffff:a.b.c.d, as some dual-stack proxies write IPv4 clients) keep a bucket each', async () => {
    // Masked to /64 they would all be ::ffff:0:0/64, one bucket for every IPv4 client.
    const addresses = ['::ffff:192.0.2.101', '::ffff:192.0.2.102', '::ffff:192.0.2.103'];
    const replies = await Promise.all(addresses.flatMap((ip) => Array.from({ length: 30 }, () => request(stack, 'GET', '/', { ip }).then((r) => [ip, r.status] as const))));
    for (const ip of addresses) {
      const ok = replies.filter(([a, s]) => a === ip && s === 200).length;
      assert.equal(ok, 30, `${ip}: all 30 within its own burst of 40`);
    }
  });
});

describe('operations', () => {
  test('every Envoy statistic docs/operations.md tells operators to read exists on the admin interface, and the 429s above were counted', async () => {
    // RBAC creates a policy's counter at its first match: one request with an unusable trusted entry.
    const bad = await fetch(`${stack.edgeUrl}/`, { headers: { 'x-forwarded-for': '192.0.2.9:443' } });
    assert.equal(bad.status, 400);
    await bad.text();
    const stats = (await (await fetch(`${stack.envoyAdmin}/stats`)).text()).split('\n').map((l) => l.split(':')[0]!);
    const ops = readFileSync(join(import.meta.dirname, '../docs/operations.md'), 'utf8');
    const para = ops.slice(ops.indexOf("Envoy's own statistics"), ops.indexOf('## Alerts'));
    const named = [...para.matchAll(/`((?:cluster|sds|per_client_ip|http|listener|server)\.[a-z0-9_.{},*]+)`/g)].map((m) => m[1]!);
    assert.ok(named.length >= 5, `the paragraph names Envoy statistics: ${named.join(', ')}`);
    for (const pattern of named) {
      // `{a,b}` is each alternative; `*` any suffix.
      const brace = /\{([^}]*)\}/.exec(pattern);
      const names = brace === null ? [pattern] : brace[1]!.split(',').map((alt) => pattern.replace(brace[0], alt));
      for (const name of names) {
        const re = new RegExp(`^${name.replaceAll('.', '\\.').replaceAll('*', '[a-z0-9_.]*')}$`);
        // Envoy creates a cluster's per-class response counters (upstream_rq_5xx, …) at the first
        // response of that class; upstream_rq_completed stands for them before that.
        const lazy = /\.upstream_rq_[1-5]xx$/.test(name) ? new RegExp(`^${name.replace(/[1-5]xx$/, 'completed').replaceAll('.', '\\.')}$`) : undefined;
        assert.ok(stats.some((s) => re.test(s) || (lazy?.test(s) ?? false)), `docs/operations.md names ${name}, which Envoy does not have`);
      }
    }
    const limited = (await (await fetch(`${stack.envoyAdmin}/stats?filter=^per_client_ip\\.http_local_rate_limit\\.rate_limited$`)).text()).trim();
    assert.match(limited, /: [1-9][0-9]*$/, limited);
  });
});

describe('faults', () => {
  test('authz killed → 503 service_unavailable JSON (fail closed), recovers when it returns', async () => {
    await stack.killAuthz();
    const before = stack.backend.deliveries.length;
    const r = await request(stack, 'POST', '/v1/orders', { body: orderBody(market, Buffer.from('x')), headers: { 'content-type': 'application/json' } });
    assert.deepEqual([r.status, errorCode(r)], [503, 'service_unavailable']);
    const g = await request(stack, 'GET', '/v1/markets');
    assert.equal(g.status, 503);
    assert.equal(stack.backend.deliveries.length, before, 'no unchecked order went upstream');
    await stack.startAuthz();
    let back = 0;
    for (let i = 0; i < 50 && back !== 200; i++) {
      back = (await request(stack, 'GET', '/')).status;
      if (back !== 200) await sleep(100);
    }
    assert.equal(back, 200);
  });

  test('Redis stopped → ingest 503 with nothing stored; reads answer from cache or 503 JSON; recovery', async () => {
    const id = uniqueId('0xredis');
    await stack.redis.stop();
    try {
      const r = await ingest(stack, id, 1);
      assert.deepEqual([r.status, errorCode(r)], [503, 'service_unavailable']);
      const read = await request(stack, 'GET', '/v1/markets');
      assert.ok(read.status === 200 || (read.status === 503 && errorCode(read) === 'service_unavailable'), `read ${read.status}`);
    } finally {
      await stack.redis.resume();
    }
    let status = 0;
    for (let i = 0; i < 60 && status !== 200; i++) {
      await sleep(100);
      status = (await ingest(stack, id, 1)).status;
    }
    assert.equal(status, 200, 'ingest recovers after Redis returns');
    const m = await request(stack, 'GET', `/v1/markets?conditionId=${id}`);
    assert.equal((m.json()['markets'] as unknown[]).length, 1);
  });

  test('logs contain no secrets, signatures, full nonces or order payloads', async () => {
    const s = signed(stack, Buffer.from('{}'), 'x');
    const logs = stack.logs();
    assert.ok(!logs.includes(stack.hmacKey.toString('hex')), 'HMAC key');
    assert.ok(!logs.includes(s.headers['x-edge-signature']!.slice(3, 40)), 'signature');
    // Under the trace audit (npm run audit:traces) traces are on, and every decision line names its
    // trace (`traceId`, 32 hex; docs/operations.md "Traces"): an id like the request id, left out
    // only then. Its secrets are searched for in the exported spans by the audit's own checker.
    const ids = traceAudit ? /"(id|requestId|request_id|x_request_id|traceId)":"[^"]*"/g : /"(id|requestId|request_id|x_request_id)":"[^"]*"/g;
    assert.ok(!/[0-9a-f]{32}/.test(logs.replace(ids, '')), 'no 32+ hex run (nonces, signatures, keys)');
  });

  test('sealing through the admin port (with the admin token) → 503 sealed; stopping the stack leaves no process behind', async () => {
    const res = await fetch(`${stack.authzAdmin}/admin/seal`, { method: 'POST', headers: { authorization: `Bearer ${stack.adminToken}` } });
    assert.equal(res.status, 202);
    const r = await request(stack, 'GET', '/');
    assert.deepEqual([r.status, errorCode(r)], [503, 'sealed']);
    const pids = stack.pids();
    await stack.stop();
    for (const pid of pids) {
      assert.throws(() => process.kill(pid, 0), 'process is gone');
    }
    stack = undefined as unknown as Stack;
  });
});

void allowedIp;
