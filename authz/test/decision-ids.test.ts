/**
 * Decision ids (issue 18 point 4): every error body the service writes carries `requestId`, the
 * `x-request-id` the client received (null without one), and every decision is one log line
 * (LOG_DECISIONS) holding no secret. Real gRPC (grpc-js client and server) and a real market
 * service on a socket; the spliced denial encoding is compared with a full protobuf encoding.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { connect } from 'node:net';
import { Writable } from 'node:stream';
import type { MethodDefinition } from '@grpc/proto-loader';
import { Registry } from 'prom-client';
import { loadPackageDefinition, SERVICE_NAMES } from '../../proto/index.ts';
import { denialBody, deny, geoDenial, type Decision } from '../src/authz/decision.ts';
import { encodeDecision, encodeDenial, toCheckResponse, type Serialize } from '../src/authz/codec/response.ts';
import { decisionLine, shouldLogDecision } from '../src/authz/decision-log.ts';
import { ConfigError, loadConfig } from '../src/common/config.ts';
import { ERROR_MESSAGE, ERROR_STATUS, errorJson, type ErrorCode } from '../src/common/errors.ts';
import { createLogger } from '../src/common/log.ts';
import { createMarketService, requestIdInRaw, type MarketService } from '../src/market/http.ts';
import { MemoryMarketStore } from '../src/market/store.ts';
import { GEO_TRUSTED, geoResult } from '../src/authz/stages/geo.ts';
import type { AuthzInput } from '../src/authz/codec/request.ts';
import { startFixture, type Fixture } from './server-fixture.ts';
import { checkRequestObject, outcomeOf } from '../../testkit/check-request.ts';
import { fakeMarkets, hmacHeaders } from './helpers.ts';
import { ingestBody, marketDoc } from '../../testkit/feed.ts';

const pd = loadPackageDefinition();
const checkDef = (pd[SERVICE_NAMES.authorization] as Record<string, MethodDefinition<object, object>>)['Check']!;
const serialize: Serialize = checkDef.responseSerialize as Serialize;
const UUID = '0b8f1e2a-3c4d-4e5f-8a6b-7c8d9e0f1a2b';

describe('error bodies: error, message, field?, requestId', () => {
  test('errorJson puts requestId last, after field; null when the request has none; omitted only when not asked for', () => {
    assert.equal(errorJson('invalid_order', 'size must be a decimal string', 'size', UUID),
      `{"error":"invalid_order","message":"size must be a decimal string","field":"size","requestId":"${UUID}"}`);
    assert.equal(errorJson('not_found', undefined, undefined, null), '{"error":"not_found","message":"no such resource","requestId":null}');
    assert.equal(errorJson('not_found', undefined, undefined, ''), '{"error":"not_found","message":"no such resource","requestId":null}');
    assert.equal(errorJson('not_found'), '{"error":"not_found","message":"no such resource"}');
  });

  test('a request id is written as a JSON string, whatever it holds (a hand-made Check may send anything)', () => {
    const odd = 'a"b\\c\n\u2028é';
    assert.equal(JSON.parse(denialBody(deny('not_found'), odd)).requestId, odd);
  });

  test('denialBody: the denial\'s body with the request id appended; a Check without one gets null', () => {
    const d = deny('invalid_order', 'size must be a decimal string', 'size');
    assert.deepEqual(Object.entries(JSON.parse(denialBody(d, UUID))), [
      ['error', 'invalid_order'], ['message', 'size must be a decimal string'], ['field', 'size'], ['requestId', UUID],
    ]);
    assert.equal(JSON.parse(denialBody(d, undefined)).requestId, null);
    assert.equal(d.body, denialBody(d, undefined), 'Decision.body is the body of a Check without an id');
  });
});

describe('denial encoding: cached parts + the request id spliced in', () => {
  const decisions: [string, Decision][] = [
    ...(Object.keys(ERROR_STATUS) as ErrorCode[]).filter((c) => c !== 'restricted_jurisdiction').map((c) => [c, deny(c)] as [string, Decision]),
    ['invalid_order with field', deny('invalid_order', ERROR_MESSAGE.invalid_order, 'payload')],
    ['451 with Link', geoDenial('This service is not available in your jurisdiction.', 'https://venue.example/legal')],
    // Lengths past one- and two-byte varints, so the length prefixes are rewritten correctly.
    ['451 with a 200-character notice', geoDenial('n'.repeat(200), undefined)],
    ['451 with a 20,000-character notice', geoDenial('é'.repeat(10_000), undefined)],
  ];
  const ids: (string | undefined)[] = [undefined, '', 'a', UUID, 'x'.repeat(300), 'é"\\'];
  for (const [name, d] of decisions) {
    test(`${name}: byte-identical to a full protobuf encoding of the same CheckResponse, for every request id`, () => {
      for (const id of ids) {
        const spliced = encodeDenial(d, id, serialize);
        assert.deepEqual(spliced, serialize(toCheckResponse(d, id)), `id ${JSON.stringify(id)}`);
        const back = checkDef.responseDeserialize(spliced) as { denied_response?: { status?: { code?: number }; body?: string } };
        assert.equal(back.denied_response?.status?.code, d.httpStatus);
        assert.equal(back.denied_response?.body, denialBody(d, id));
      }
    });
  }

  test('encodeDecision of a denial is per request (the id differs), of a plain allow the one cached buffer', () => {
    const d = deny('unknown_market');
    assert.notDeepEqual(encodeDecision(d, serialize, 'id-1'), encodeDecision(d, serialize, 'id-2'));
    const allow: Decision = { allow: true, code: 'ok', httpStatus: 200, reason: 'allowed', headers: [], body: '' };
    assert.equal(encodeDecision(allow, serialize), encodeDecision(allow, serialize));
  });

  test('a denial built without bodyPrefix is sent as its body, unchanged', () => {
    const d: Decision = { allow: false, code: 'sealed', httpStatus: 503, reason: 'sealed', headers: [], body: '{"error":"sealed","message":"x"}' };
    const back = checkDef.responseDeserialize(encodeDenial(d, UUID, serialize)) as { denied_response?: { body?: string } };
    assert.equal(back.denied_response?.body, d.body);
  });
});

describe('decision log line', () => {
  const input = (over: Partial<AuthzInput> = {}): AuthzInput => ({
    method: 'GET', path: '/v1/markets', clientIp: '81.2.69.160', timestamp: undefined, nonce: undefined, signature: undefined,
    requestId: UUID, body: undefined, phase: undefined, route: 'read', ...over,
  });
  const gb = geoResult('allowed', 'full', 'GB', 'GB-ENG', 'GB');

  test('LOG_DECISIONS: all logs every decision, denials only denials, off none', () => {
    const allow: Decision = { allow: true, code: 'ok', httpStatus: 200, reason: 'allowed', headers: [], body: '' };
    const denied = deny('not_found');
    assert.deepEqual([shouldLogDecision('all', allow), shouldLogDecision('all', denied)], [true, true]);
    assert.deepEqual([shouldLogDecision('denials', allow), shouldLogDecision('denials', denied)], [false, true]);
    assert.deepEqual([shouldLogDecision('off', allow), shouldLogDecision('off', denied)], [false, false]);
  });

  test('an allow: route, outcome, code, client class, country, region, tier, geo verdict, latency, request id; no address', () => {
    const allow: Decision = { allow: true, code: 'ok', httpStatus: 200, reason: 'allowed', headers: [], body: '' };
    const line = decisionLine(input({ geo: gb }), allow, 'read', 0.0000425);
    assert.deepEqual(line, {
      requestId: UUID, route: 'read', outcome: 'allow', code: 'ok', status: 200, client: 'ipv4',
      country: 'GB', region: 'GB-ENG', tier: 'full', geo: 'allowed', latencyMs: 0.043,
      geoipBuilt: null, policy: null, traceId: null,
    });
    assert.ok(!JSON.stringify(line).includes('81.2.69'), 'the address itself is not logged');
  });

  test('client class: ipv6, an IPv4-mapped address as ipv4, trusted, invalid; no geo → nulls; no id → null', () => {
    const d = deny('sealed');
    assert.equal(decisionLine(input({ clientIp: '2001:db8::1' }), d, 'read', 0).client, 'ipv6');
    assert.equal(decisionLine(input({ clientIp: '::ffff:192.0.2.1' }), d, 'read', 0).client, 'ipv4');
    assert.equal(decisionLine(input({ clientIp: '127.0.0.1', geo: GEO_TRUSTED }), d, 'read', 0).client, 'trusted');
    assert.equal(decisionLine(input({ clientIp: 'unknown' }), d, 'read', 0).client, 'invalid');
    const l = decisionLine(input({ requestId: undefined }), d, 'read', 0);
    assert.deepEqual([l.requestId, l.country, l.region, l.tier, l.geo, l.reason], [null, null, null, null, null, 'sealed']);
  });

  test('an ingest line has the 12-hex nonce tag, never the nonce, signature or timestamp; a shadow policy\'s tier shows beside the enforced one', () => {
    const nonce = randomBytes(16).toString('hex');
    const sig = `v1=${'ab'.repeat(32)}`;
    const line = decisionLine(input({ method: 'POST', path: '/internal/ingest/market', route: 'ingest', nonce, signature: sig, timestamp: '1795565226', body: Buffer.from('{"secret":1}'), geo: { ...gb, shadow: geoResult('close_only_country', 'close-only', 'GB', null, 'GB') } }), deny('unauthorized'), 'ingest', 0);
    assert.match(String(line.nonceTag), /^[0-9a-f]{12}$/);
    const text = JSON.stringify(line);
    for (const secret of [nonce.slice(0, 8), sig.slice(3, 15), '1795565226', 'secret']) assert.ok(!text.includes(secret), secret);
    assert.deepEqual([line.tier, line.shadow], ['full', 'close-only']);
    assert.equal(decisionLine(input({ geo: gb }), deny('unauthorized'), 'read', 0).shadow, undefined, 'no shadow policy: no key');
  });

  test('LOG_DECISIONS defaults to denials; all, off accepted in any case; anything else stops start-up naming it', () => {
    assert.equal(loadConfig({}).logDecisions, 'denials');
    assert.equal(loadConfig({ LOG_DECISIONS: 'ALL' }).logDecisions, 'all');
    assert.equal(loadConfig({ LOG_DECISIONS: 'off' }).logDecisions, 'off');
    assert.throws(() => loadConfig({ LOG_DECISIONS: 'allows' }), (e: unknown) => e instanceof ConfigError && e.variable === 'LOG_DECISIONS');
  });
});

describe('over real gRPC', () => {
  const geo = { lookup: (ip: string) => (ip.startsWith('198.51.100.') ? { country: 'KP', regions: [] } : { country: 'CH', regions: ['CH-ZH'] }) };
  const fixtures: Fixture[] = [];
  const start = async (logDecisions: string): Promise<Fixture> => {
    const f = await startFixture({ env: { BLOCKED_COUNTRIES: 'KP', LOG_DECISIONS: logDecisions }, geo, markets: fakeMarkets([]), nonces: 'memory' });
    fixtures.push(f);
    return f;
  };
  after(async () => { await Promise.all(fixtures.map((f) => f.close())); });
  const lines = (f: Fixture): Record<string, unknown>[] => f.logs.map((l) => JSON.parse(l) as Record<string, unknown>).filter((l) => l['msg'] === 'decision');

  test('a 451 carries the x-request-id of its Check; two blocked clients differ only there; a Check without one gets null', async () => {
    const f = await start('denials');
    const a = await f.check({ headers: { 'x-edge-client-ip': '198.51.100.1', 'x-request-id': 'id-aaaa' } });
    const b = await f.check({ headers: { 'x-edge-client-ip': '198.51.100.2', 'x-request-id': 'id-bbbb' } });
    // As grpcurl sends it: no x-request-id header at all.
    const req = checkRequestObject({ headers: { 'x-edge-client-ip': '198.51.100.3' } });
    delete ((req['attributes'] as { request: { http: { headers: Record<string, string> } } }).request.http.headers)['x-request-id'];
    const none = await new Promise<{ body?: Record<string, unknown> }>((resolve, reject) => {
      (f.client as unknown as { Check: (r: object, cb: (e: Error | null, res: object) => void) => void })
        .Check(req, (e, res) => (e ? reject(e) : resolve(outcomeOf(res as Parameters<typeof outcomeOf>[0]))));
    });
    assert.deepEqual([a.status, a.body?.['requestId'], b.body?.['requestId'], none.body?.['requestId']], [451, 'id-aaaa', 'id-bbbb', null]);
    assert.equal(a.raw.denied_response?.body?.replace('id-aaaa', 'id-bbbb'), b.raw.denied_response?.body);
  });

  test('LOG_DECISIONS=denials: the denial is one line found by its request id; the allow is not logged', async () => {
    const f = await start('denials');
    await f.check({ headers: { 'x-edge-client-ip': '192.0.2.10', 'x-request-id': 'allow-1' } });
    await f.check({ headers: { 'x-edge-client-ip': '198.51.100.9', 'x-request-id': 'deny-1' } });
    const logged = lines(f);
    assert.equal(logged.filter((l) => l['requestId'] === 'allow-1').length, 0);
    const [line, ...more] = logged.filter((l) => l['requestId'] === 'deny-1');
    assert.equal(more.length, 0, 'one line per decision');
    assert.equal(line?.['level'], 30, 'info');
    assert.deepEqual([line?.['outcome'], line?.['code'], line?.['status'], line?.['country'], line?.['tier'], line?.['geo'], line?.['client']],
      ['deny', 'restricted_jurisdiction', 451, 'KP', 'blocked', 'blocked_country', 'ipv4']);
    assert.ok(typeof line?.['latencyMs'] === 'number');
    assert.ok(!JSON.stringify(line).includes('198.51.100.9'));
  });

  test('LOG_DECISIONS=all: an allowed order and a denied ingest are one line each, with no payload, key, signature or nonce', async () => {
    const f = await start('all');
    const payload = Buffer.from('secret-order-bytes').toString('base64');
    await f.check({ method: 'POST', path: '/v1/orders', headers: { 'x-edge-client-ip': '192.0.2.10', 'x-request-id': 'order-1' },
      body: Buffer.from(JSON.stringify({ marketId: 'nope', deadline: 1, size: '1', payload })) });
    const body = ingestBody(marketDoc('0xmkt-log', 1), f.feed);
    const headers: Record<string, string> = { ...hmacHeaders(body, randomBytes(32), Math.floor(Date.now() / 1000)), 'x-edge-client-ip': '192.0.2.10', 'x-request-id': 'ingest-1' };
    await f.check({ method: 'POST', path: '/internal/ingest/market', headers, body });
    await f.check({ headers: { 'x-edge-client-ip': '192.0.2.11', 'x-request-id': 'read-1' } });
    const byId = (id: string) => lines(f).filter((l) => l['requestId'] === id);
    assert.equal(byId('order-1').length, 1);
    assert.equal(byId('ingest-1').length, 1);
    assert.deepEqual([byId('read-1')[0]?.['outcome'], byId('read-1')[0]?.['country'], byId('read-1')[0]?.['region'], byId('read-1')[0]?.['tier']], ['allow', 'CH', 'CH-ZH', 'full']);
    const all = f.logs.join('\n');
    for (const secret of [payload, headers['x-edge-signature']!.slice(3, 20), headers['x-edge-nonce']!, f.hmacKey.toString('hex').slice(0, 16), f.feedSeedHex.slice(0, 16)]) {
      assert.ok(!all.includes(secret), `the log holds no ${secret.slice(0, 8)}…`);
    }
  });

  test('LOG_DECISIONS=off: no decision line at all', async () => {
    const f = await start('off');
    await f.check({ headers: { 'x-edge-client-ip': '198.51.100.9', 'x-request-id': 'deny-off' } });
    assert.equal(lines(f).length, 0);
  });
});

describe('market service error answers', () => {
  let svc: MarketService;
  let base: string;
  let port: number;
  before(async () => {
    svc = createMarketService({
      store: new MemoryMarketStore(), feedKeys: [], ingestMaxBytes: 1024,
      logger: createLogger('silent', new Writable({ write: (_c, _e, cb) => cb() })), registry: new Registry(),
      readiness: () => ({}), isSealed: () => false, host: '127.0.0.1', port: 0,
    });
    port = await svc.listen();
    base = `http://127.0.0.1:${port}`;
  });
  after(async () => svc.close());

  test('invalid_query, not_found, method_not_allowed carry the x-request-id Envoy sent, last; null without one', async () => {
    for (const [method, path, code] of [['GET', '/v1/markets?limit=x', 'invalid_query'], ['GET', '/nope', 'not_found'], ['DELETE', '/v1/markets', 'method_not_allowed']] as const) {
      const r = await fetch(`${base}${path}`, { method, headers: { 'x-request-id': UUID } });
      const body = (await r.json()) as Record<string, unknown>;
      assert.deepEqual(Object.keys(body), ['error', 'message', 'requestId'], path);
      assert.deepEqual([body['error'], body['requestId']], [code, UUID]);
      const bare = (await (await fetch(`${base}${path}`, { method })).json()) as Record<string, unknown>;
      assert.equal(bare['requestId'], null);
    }
  });

  test('a request Node\'s parser refuses still names the x-request-id it carried', async () => {
    const raw = await new Promise<string>((resolve) => {
      const s = connect(port, '127.0.0.1', () => s.write(`GET / HTTP/1.1\r\nhost: m\r\nx-request-id: ${UUID}\r\nbad header: y\r\n\r\n`));
      let out = '';
      s.on('data', (c) => { out += String(c); });
      s.on('close', () => resolve(out));
    });
    assert.match(raw, /^HTTP\/1\.1 400 /);
    assert.deepEqual(JSON.parse(raw.slice(raw.indexOf('\r\n\r\n') + 4)), { error: 'bad_request', message: ERROR_MESSAGE.bad_request, requestId: UUID });
    assert.equal(requestIdInRaw(Buffer.from('GET / HTTP/1.1\r\nx-request-id: "><script>\r\n\r\n')), null, 'only an id-shaped value');
    assert.equal(requestIdInRaw(undefined), null);
  });
});
