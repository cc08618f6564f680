/**
 * The attack suite: each finding of the outside attack on the running edge (issue 20), as the
 * attacker sent it, through real Envoy 1.40 and the real TS service, so a regression fails CI.
 * docs/reliability.md ("Hostile input") lists what was tried, against which rule, and what comes
 * back.
 *
 * The stack trusts one X-Forwarded-For hop (a load balancer in front), blocks KP, CU and IR,
 * blocks addresses with no record, and by default trusts 127.0.0.0/8: the TCP peer here, i.e.
 * the load balancer's address. Client addresses come from the fixture database
 * (authz/test/fixtures/make-mmdb.py): 192.0.2.0/25 → CH (allowed), 198.51.100.0/25 → KP.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { createHash, randomBytes } from 'node:crypto';
import { connect } from 'node:net';
import { setTimeout as sleep } from 'node:timers/promises';
import { geoFixtures } from '../authz/test/geo-fixtures.ts';
import { NONCE_TAG_HEX } from '../authz/src/common/log.ts';
import { PAGE_CACHE_MAX_BYTES, PAGE_CACHE_MAX_ENTRIES } from '../authz/src/market/redis-store.ts';
import { SHOWN_NAME_MAX } from '../authz/src/market/http.ts';
import { XFF_POLICY, XFF_RBAC_STAT_PREFIX } from '../envoy/render.ts';
import { PEER_CIDRS, startStack, type Stack } from './lib/driver.ts';
import { allowedIp, errorCode, ingest, KP_IP, orderBody, request, signed, uniqueId } from './lib/client.ts';

const ENV = {
  XFF_NUM_TRUSTED_HOPS: '1',
  BLOCKED_COUNTRIES: 'KP,CU,IR',
  GEO_UNKNOWN: 'block',
  // Long enough that only the page cache's bounds, not its TTL, limit what a flood leaves behind.
  MARKET_CACHE_TTL_MS: '60000',
};

/** One raw HTTP/1.1 exchange: exactly the bytes given, the whole answer (connection: close). */
function raw(stack: Stack, text: string, opts: { waitMs?: number } = {}): Promise<{ status: number; headers: string; body: string }> {
  const port = Number(new URL(stack.edgeUrl).port);
  return new Promise((resolve, reject) => {
    const sock = connect(port, '127.0.0.1', () => sock.write(text));
    let got = '';
    const timer = setTimeout(() => { sock.destroy(); reject(new Error(`no complete answer within ${opts.waitMs ?? 5000} ms: ${got.slice(0, 200)}`)); }, opts.waitMs ?? 5000);
    const done = (): void => {
      clearTimeout(timer);
      const [head = '', ...rest] = got.split('\r\n\r\n');
      resolve({ status: Number(/^HTTP\/1\.1 (\d{3})/.exec(head)?.[1] ?? 0), headers: head.toLowerCase(), body: rest.join('\r\n\r\n') });
    };
    sock.on('data', (d: Buffer) => {
      got += d.toString('latin1');
      // A complete answer with a body of content-length bytes is enough; Envoy may keep the socket.
      const [head, ...rest] = got.split('\r\n\r\n');
      const len = /\r\ncontent-length: (\d+)/i.exec(head ?? '')?.[1];
      if (len !== undefined && rest.join('\r\n\r\n').length >= Number(len)) { sock.destroy(); done(); }
    });
    sock.on('end', done);
    sock.on('error', (e) => { clearTimeout(timer); reject(e); });
  });
}

async function envoyStat(stack: Stack, name: string): Promise<number> {
  const text = await (await fetch(`${stack.envoyAdmin}/stats?filter=${encodeURIComponent(`^${name.replaceAll('.', '\\.')}$`)}`)).text();
  const m = new RegExp(`^${name.replaceAll('.', '\\.')}: (\\d+)$`, 'm').exec(text);
  return m === null ? 0 : Number(m[1]);
}

async function metric(stack: Stack, name: string): Promise<number> {
  const text = await (await fetch(`${stack.authzAdmin}/metrics`)).text();
  const m = new RegExp(`^${name} (\\S+)$`, 'm').exec(text);
  assert.ok(m !== null, `${name} is exported`);
  return Number(m[1]);
}

/** The TS process's resident memory, as it reports it (either driver: a process or a container). */
async function rssMb(stack: Stack): Promise<number> {
  return await metric(stack, 'edge_authz_process_resident_memory_bytes') / 1_048_576;
}

/** The malformed trusted entries the attack used (docs/api.md "Client address, geo and rate limit"), as sent in X-Forwarded-For. */
const MALFORMED_XFF = ['8.8.8.8:1234', '[2001:4860:4860::8888]', 'unknown', '8.8.8.8, ', '', ' ', 'fe80::1%eth0', '198.51.100.7:80', '198.51.100.7,'];
const XFF_STAT = `http.edge.rbac.${XFF_RBAC_STAT_PREFIX}policy.${XFF_POLICY}.denied`;

for (const trusted of [PEER_CIDRS, ''] as const) {
  describe(`attack: geo bypass through a malformed trusted X-Forwarded-For entry (proxy ${trusted === '' ? 'not ' : ''}in GEO_TRUSTED_CIDRS)`, () => {
    let stack: Stack;
    before(async () => {
      stack = await startStack({ env: { ...ENV, GEO_TRUSTED_CIDRS: trusted }, geoipDb: geoFixtures().geoip2 });
    });
    after(async () => stack?.stop());

    test('every malformed entry → 400 bad_request naming X-Forwarded-For, on every route, counted; never the proxy\'s address', async () => {
      const before = await envoyStat(stack, XFF_STAT);
      let sent = 0;
      for (const xff of MALFORMED_XFF) {
        for (const [method, path, body] of [['GET', '/', ''], ['GET', '/v1/markets', ''], ['POST', '/v1/orders', '{}'], ['POST', '/internal/ingest/market', '{}']] as const) {
          const r = await raw(stack, `${method} ${path} HTTP/1.1\r\nhost: edge\r\nx-forwarded-for: ${xff}\r\ncontent-type: application/json\r\ncontent-length: ${body.length}\r\nconnection: close\r\n\r\n${body}`);
          sent += 1;
          assert.equal(r.status, 400, `${method} ${path} with X-Forwarded-For ${JSON.stringify(xff)}: ${r.body}`);
          const json = JSON.parse(r.body) as { error: string; message: string };
          assert.equal(json.error, 'bad_request');
          assert.match(json.message, /X-Forwarded-For/);
          assert.match(r.headers, /\r\ncontent-type: application\/json/);
        }
      }
      assert.equal(await envoyStat(stack, XFF_STAT) - before, sent, 'Envoy counts each refusal');
    });

    test('two header lines are one list: the entry that counts is the last one, and must be an address', async () => {
      const ok = await raw(stack, 'GET / HTTP/1.1\r\nhost: edge\r\nx-forwarded-for: 8.8.8.8\r\nx-forwarded-for: 192.0.2.9\r\nconnection: close\r\n\r\n');
      assert.equal(ok.status, 200, ok.body);
      const bad = await raw(stack, 'GET / HTTP/1.1\r\nhost: edge\r\nx-forwarded-for: 192.0.2.9\r\nx-forwarded-for: unknown\r\nconnection: close\r\n\r\n');
      assert.equal(bad.status, 400, bad.body);
    });

    test('no X-Forwarded-For at all is judged by the TCP peer (probes, direct connections)', async () => {
      const r = await raw(stack, 'GET /healthz HTTP/1.1\r\nhost: edge\r\nconnection: close\r\n\r\n');
      // The peer is 127.0.0.1: trusted → 200; not trusted → it has no record → 451 (GEO_UNKNOWN=block).
      assert.equal(r.status, trusted === '' ? 451 : 200, r.body);
    });

    test('a well-formed entry decides: a blocked country is 451, an allowed one 200', async () => {
      assert.equal((await request(stack, 'GET', '/', { ip: KP_IP })).status, 451);
      assert.equal((await request(stack, 'GET', '/', { ip: '192.0.2.21' })).status, 200);
      assert.equal((await request(stack, 'GET', '/', { ip: `203.0.113.9, 192.0.2.22` })).status, 200, 'only the trusted entry counts');
    });
  });
}

describe('attacks on one stack', () => {
  let stack: Stack;
  let market: string;
  before(async () => {
    stack = await startStack({ env: ENV, geoipDb: geoFixtures().geoip2 });
    market = uniqueId('0xatk');
    const r = await ingest(stack, market, 1, {}, '192.0.2.30');
    assert.equal(r.status, 200, r.text);
  });
  after(async () => stack?.stop());

  test('attack: distinct market queries cannot grow the page cache past its bound (entries, bytes, RSS)', async () => {
    const rssBefore = await rssMb(stack);
    const n = PAGE_CACHE_MAX_ENTRIES + 1_000;
    for (let i = 0; i < n; i += 100) {
      const replies = await Promise.all(Array.from({ length: Math.min(100, n - i) }, async (_, j) => {
        // A client address of its own each (one hop trusted), as a botnet would send them.
        const res = await fetch(`${stack.edgeUrl}/v1/markets?conditionId=${market},0xnone-${i + j}`, { headers: { 'x-forwarded-for': allowedIp() } });
        await res.arrayBuffer();
        return res.status;
      }));
      assert.deepEqual([...new Set(replies)], [200]);
    }
    const entries = await metric(stack, 'edge_market_page_cache_entries');
    const bytes = await metric(stack, 'edge_market_page_cache_bytes');
    assert.ok(entries > 0 && entries <= PAGE_CACHE_MAX_ENTRIES, `entries ${entries}`);
    assert.ok(bytes <= PAGE_CACHE_MAX_BYTES, `bytes ${bytes}`);
    const grown = await rssMb(stack) - rssBefore;
    assert.ok(grown < 100, `the service's RSS grew ${grown.toFixed(1)} MB for ${n} distinct queries`);
  });

  test('attack: an IPv4 client and its IPv4-mapped form draw from one bucket (allowed ≤ burst + rate × t)', async () => {
    const v4 = '192.0.2.77';
    const t0 = Date.now();
    const statuses = await Promise.all(Array.from({ length: 80 }, (_, i) =>
      fetch(`${stack.edgeUrl}/`, { headers: { 'x-forwarded-for': i % 2 === 0 ? v4 : `::ffff:${v4}` } }).then(async (r) => { await r.arrayBuffer(); return r.status; })));
    const seconds = (Date.now() - t0) / 1000;
    const allowed = statuses.filter((s) => s !== 429).length;
    const bound = 40 + 20 * seconds + 1;
    assert.ok(allowed <= bound, `${allowed} of 80 allowed in ${seconds.toFixed(2)} s; one client's bound is ${bound.toFixed(1)}`);
    assert.ok(statuses.filter((s) => s === 429).length >= 80 - bound, 'the rest were limited');
    // The mapped form is the same client for geo too: a KP address written as mapped IPv6 is 451.
    assert.equal((await request(stack, 'GET', '/', { ip: `::ffff:${KP_IP}` })).status, 451);
  });

  test('attack: client-chosen forwarding entries and x-edge-* headers never reach the order backend; it sees the decided address only', async () => {
    const before = stack.backend.deliveries.length;
    const payload = randomBytes(32);
    const order = orderBody(market, payload);
    const r = await request(stack, 'POST', '/v1/orders', {
      ip: '6.6.6.6, 192.0.2.60',
      body: order,
      headers: {
        'content-type': 'application/json', 'user-agent': 'attack/1',
        'x-edge-market-id': 'forged', 'x-edge-client-ip': '6.6.6.6', 'x-edge-access': 'full', 'x-edge-anything': 'x',
        forwarded: 'for=6.6.6.6', 'x-real-ip': '6.6.6.6', 'x-forwarded-host': 'evil.example', 'x-forwarded-proto': 'https', 'x-forwarded-port': '443',
        cookie: 'session=abc', authorization: 'Bearer abc',
      },
    });
    assert.equal(r.status, 200, r.text);
    const d = stack.backend.deliveries[before]!;
    assert.deepEqual(d.body, payload);
    const { host, ...rest } = d.headers;
    assert.equal(host, new URL(stack.env['ORDER_BACKEND_URL']!).host, 'the backend\'s own authority');
    assert.deepEqual(rest, {
      'content-type': 'application/octet-stream',
      'content-length': String(payload.length),
      'x-request-id': r.headers.get('x-request-id') ?? '',
      'x-edge-market-id': market,
      'x-edge-deadline': String((JSON.parse(order) as { deadline: number }).deadline),
      'x-edge-size': '10',
      // The edge's tier for 192.0.2.60 (CH, no tier rule: full), never the client's `x-edge-access: full`.
      'x-edge-access': 'full',
      'x-edge-jurisdiction': 'CH',
      'x-edge-client-ip': '192.0.2.60',
      'x-forwarded-for': '192.0.2.60',
      'x-forwarded-proto': 'http',
      'user-agent': 'attack/1',
    });
    // A mapped client reaches the backend as its IPv4.
    const mapped = await request(stack, 'POST', '/v1/orders', { ip: '::ffff:192.0.2.61', body: orderBody(market, payload), headers: { 'content-type': 'application/json' } });
    assert.equal(mapped.status, 200, mapped.text);
    assert.equal(stack.backend.deliveries.at(-1)!.headers['x-forwarded-for'], '192.0.2.61');
  });

  test('attack: an ingest without signature headers, or stamped outside the window, is refused before its body is read', async () => {
    const phaseDenied = 'http.edge.ext_authz.ingest_headers.denied';
    const bodyPhaseChecks = 'http.edge.ext_authz.ok';
    const [phaseBefore, bodyBefore] = [await envoyStat(stack, phaseDenied), await envoyStat(stack, bodyPhaseChecks)];
    const s = signed(stack, Buffer.from('{}'), 'x');
    const stale = { ...s.headers, 'x-edge-timestamp': String(Math.floor(Date.now() / 1000) - 3_600) };
    for (const [headers, code] of [[{}, 'unauthorized'], [{ 'x-edge-nonce': 'zz' }, 'unauthorized'], [stale, 'timestamp expired']] as const) {
      const lines = Object.entries(headers).map(([k, v]) => `${k}: ${v}\r\n`).join('');
      // Announce 1 MiB and send none of it: the answer must come from the headers alone.
      const r = await raw(stack, `POST /internal/ingest/market HTTP/1.1\r\nhost: edge\r\nx-forwarded-for: 192.0.2.31\r\ncontent-type: application/json\r\ncontent-length: 1048576\r\n${lines}\r\n`, { waitMs: 3000 });
      assert.equal(r.status, 401, r.body);
      assert.equal((JSON.parse(r.body) as { error: string }).error, code);
    }
    assert.equal(await envoyStat(stack, phaseDenied) - phaseBefore, 3, 'the header phase answered all three');
    assert.equal(await envoyStat(stack, bodyPhaseChecks) - bodyBefore, 0, 'no body was sent to authz');
    // A good ingest passes both phases.
    assert.equal((await ingest(stack, market, 2, {}, '192.0.2.32')).status, 200);
  });

  test('attack: absolute-form targets are served as RFC 9112 §3.2.2 says, and nothing downstream is told the request came over TLS', async () => {
    for (const target of [`https://evil.example/v1/markets?conditionId=${market}`, `http://evil.example/v1/markets?conditionId=${market}`, `/v1/markets?conditionId=${market}`]) {
      const r = await raw(stack, `GET ${target} HTTP/1.1\r\nhost: other.example\r\nx-forwarded-for: 192.0.2.40\r\nx-forwarded-proto: https\r\nconnection: close\r\n\r\n`);
      assert.equal(r.status, 200, `${target}: ${r.body}`);
      assert.equal((JSON.parse(r.body) as { markets: unknown[] }).markets.length, 1, target);
    }
    const before = stack.backend.deliveries.length;
    const body = orderBody(market, randomBytes(8));
    const r = await raw(stack, `POST https://evil.example/v1/orders HTTP/1.1\r\nhost: other.example\r\nx-forwarded-for: 192.0.2.41\r\nx-forwarded-proto: https\r\ncontent-type: application/json\r\ncontent-length: ${body.length}\r\nconnection: close\r\n\r\n${body}`);
    assert.equal(r.status, 200, r.body);
    assert.equal(stack.backend.deliveries[before]?.headers['x-forwarded-proto'], 'http');
    // An Upgrade is refused whatever the target's form (no protocol is upgraded at the edge).
    for (const target of ['/', 'http://evil.example/']) {
      const up = await raw(stack, `GET ${target} HTTP/1.1\r\nhost: edge\r\nx-forwarded-for: 192.0.2.42\r\nconnection: upgrade\r\nupgrade: websocket\r\n\r\n`);
      assert.equal(up.status, 403, up.body);
      assert.equal(JSON.parse(up.body).error, 'bad_request');
    }
  });

  test('attack: a huge or control-laden query parameter name is echoed at most 64 characters, escaped', async () => {
    const r = await request(stack, 'GET', `/v1/markets?${'p'.repeat(20_000)}=1`);
    assert.equal(r.status, 400);
    assert.equal(errorCode(r), 'invalid_query');
    assert.equal(r.json()['message'], `unknown parameter "${'p'.repeat(SHOWN_NAME_MAX)}…"`);
    const ctl = await request(stack, 'GET', `/v1/markets?${encodeURIComponent('a\u2028\n"b')}=1`);
    assert.doesNotMatch(ctl.text, /[\u2028\n]/);
  });

  test('attack: support can match a refused ingest by its nonce tag; the log holds no part of the nonce', async () => {
    const s = signed(stack, Buffer.from('{"conditionId":"x"}'), 'x');
    const nonce = s.headers['x-edge-nonce']!;
    const r = await request(stack, 'POST', '/internal/ingest/market', { body: s.body, headers: { ...s.headers, 'x-edge-signature': `v1=${'0'.repeat(64)}` } });
    assert.equal(r.status, 401);
    const id = r.headers.get('x-request-id')!;
    let line: Record<string, unknown> | undefined;
    for (let i = 0; i < 50 && line === undefined; i++) {
      line = stack.logs().split('\n').filter((l) => l.includes(id) && l.includes('"msg":"decision"')).map((l) => JSON.parse(l.replace(/^\[authz\] /, '')) as Record<string, unknown>)[0];
      if (line === undefined) await sleep(20);
    }
    assert.ok(line !== undefined, 'the denial is logged');
    assert.equal(line['nonceTag'], createHash('sha256').update(nonce).digest('hex').slice(0, NONCE_TAG_HEX));
    assert.ok(!stack.logs().includes(nonce.slice(0, 12)), 'no part of the nonce is logged');
  });
});

/** Envoy's request-header limit (max_request_headers_kb, its default: envoy/render/listener.ts does not set it): request line and headers together. */
const ENVOY_MAX_REQUEST_HEADERS_BYTES = 60 * 1024;

describe('attack: costly requests (issue 26): deep JSON orders, long id lists, long URLs', () => {
  let stack: Stack;
  let market: string;
  before(async () => {
    stack = await startStack({ env: ENV, geoipDb: geoFixtures().geoip2 });
    // The longest id the pattern allows, so the 100-id query below is the longest one allowed.
    market = `0x${'c'.repeat(120)}${randomBytes(3).toString('hex')}`;
    assert.equal(market.length, 128);
    const r = await ingest(stack, market, 1, {}, '192.0.2.33');
    assert.equal(r.status, 200, r.text);
  });
  after(async () => stack?.stop());

  /** An extra order member nesting `levels` arrays: the body then nests `levels + 1` levels. */
  const nestedArrays = (levels: number): unknown => {
    let v: unknown = [];
    for (let d = 1; d < levels; d++) v = [v];
    return v;
  };

  test('an order nested 33 levels deep is 400 invalid_json naming the bound, 32 levels is delivered, 32,700 [ are refused at once', async () => {
    const before = stack.backend.deliveries.length;
    const deep = await request(stack, 'POST', '/v1/orders', { body: orderBody(market, randomBytes(16), { x: nestedArrays(32) }), headers: { 'content-type': 'application/json' } });
    assert.equal(deep.status, 400, deep.text);
    assert.equal(errorCode(deep), 'invalid_json');
    assert.match(String(deep.json()['message']), /more than 32 levels/);
    const brackets = await request(stack, 'POST', '/v1/orders', { body: '['.repeat(32_700) + ']'.repeat(32_700), headers: { 'content-type': 'application/json' } });
    assert.equal(brackets.status, 400, brackets.text);
    assert.equal(errorCode(brackets), 'invalid_json');
    assert.equal(stack.backend.deliveries.length, before, 'nothing reached the backend');
    const payload = randomBytes(16);
    const bound = await request(stack, 'POST', '/v1/orders', {
      body: orderBody(market, payload, { x: nestedArrays(31), note: '['.repeat(500) }), headers: { 'content-type': 'application/json' },
    });
    assert.equal(bound.status, 200, bound.text);
    assert.deepEqual(stack.backend.deliveries.at(-1)?.body, payload);
  });

  test('a query naming 101 conditionIds is 400 invalid_query naming the bound; 100 of the longest ids are served', async () => {
    const others = Array.from({ length: 99 }, (_, i) => `${String(i).padStart(3, '0')}${'u'.repeat(125)}`);
    for (const path of ['/v1/markets', '/v1/quotes']) {
      const ok = await request(stack, 'GET', `${path}?conditionId=${[...others, market].join(',')}`);
      assert.equal(ok.status, 200, `${path}: ${ok.text.slice(0, 200)}`);
      assert.ok(ok.text.includes(market), path);
      const over = await request(stack, 'GET', `${path}?conditionId=${[...others, market, 'x'].join(',')}`);
      assert.equal(over.status, 400, over.text);
      assert.equal(errorCode(over), 'invalid_query');
      assert.match(String(over.json()['message']), /at most 100 per query/);
    }
  });

  test('distinct 500-id queries are refused before the store: the page cache does not grow', async () => {
    const [entries, bytes] = [await metric(stack, 'edge_market_page_cache_entries'), await metric(stack, 'edge_market_page_cache_bytes')];
    for (let i = 0; i < 300; i += 50) {
      const replies = await Promise.all(Array.from({ length: 50 }, async (_, j) => {
        const ids = Array.from({ length: 500 }, (_, k) => `q${i + j}-${k}-${'z'.repeat(90)}`);
        const res = await fetch(`${stack.edgeUrl}/v1/markets?conditionId=${ids.join(',')}`, { headers: { 'x-forwarded-for': allowedIp() } });
        return [res.status, ((await res.json()) as { error: string }).error] as const;
      }));
      assert.deepEqual([...new Set(replies.map((r) => r.join(' ')))], ['400 invalid_query']);
    }
    assert.equal(await metric(stack, 'edge_market_page_cache_entries'), entries, 'no page was cached');
    assert.equal(await metric(stack, 'edge_market_page_cache_bytes'), bytes);
  });

  test(`a URL over Envoy's ${ENVOY_MAX_REQUEST_HEADERS_BYTES / 1024} KiB request-header limit is 431 bad_request JSON over HTTP/1.1 and refused over HTTP/2; under it, the service answers`, async () => {
    const target = (bytes: number): string => {
      const head = `/v1/markets?conditionId=${market}&x=`;
      return head + 'a'.repeat(bytes - head.length);
    };
    const under = await raw(stack, `GET ${target(ENVOY_MAX_REQUEST_HEADERS_BYTES - 1024)} HTTP/1.1\r\nhost: edge\r\nx-forwarded-for: 192.0.2.34\r\nconnection: close\r\n\r\n`);
    assert.equal(under.status, 400, under.body.slice(0, 200));
    assert.equal(JSON.parse(under.body).error, 'invalid_query', 'the market service read it (unknown parameter x)');
    for (const bytes of [ENVOY_MAX_REQUEST_HEADERS_BYTES + 1024, 4 * ENVOY_MAX_REQUEST_HEADERS_BYTES]) {
      // The answer comes before the connection closes; a client still sending may see a reset after it.
      const over = await raw(stack, `GET ${target(bytes)} HTTP/1.1\r\nhost: edge\r\nx-forwarded-for: 192.0.2.35\r\nconnection: close\r\n\r\n`);
      assert.equal(over.status, 431, `${bytes}-byte URL`);
      assert.match(over.headers, /\r\ncontent-type: application\/json/);
      assert.deepEqual(JSON.parse(over.body), { error: 'bad_request', message: 'request headers are too large', requestId: null });
    }
    // HTTP/2: Envoy resets the stream (its codec's answer to oversized headers); never served, never a 5xx.
    const { connect: h2connect } = await import('node:http2');
    const session = h2connect(stack.edgeUrl);
    session.on('error', () => { /* the reset is the outcome under test */ });
    try {
      const outcome = await new Promise<string>((resolve) => {
        const req = session.request({ ':path': target(ENVOY_MAX_REQUEST_HEADERS_BYTES + 1024), 'x-forwarded-for': '192.0.2.36' });
        req.on('response', (h) => resolve(`status ${String(h[':status'])}`));
        req.on('error', (e: NodeJS.ErrnoException) => resolve(`reset ${e.code ?? e.message}`));
        req.end();
      });
      assert.match(outcome, /^(reset |status 431$)/, outcome);
    } finally {
      session.destroy();
    }
  });
});
