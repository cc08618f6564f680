/**
 * The lean CheckRequest decoder (authz/codec/request.ts) against the full proto-loader decode of
 * the same bytes: method, path (query stripped), client address (x-edge-client-ip header
 * over the source address), the four policy headers, raw body bytes, the `body` string
 * fallback, `header_map` (encode_raw_headers) — by table and by property — and malformed
 * wire data (throws; never a half-filled input that could be allowed).
 */
import { HmacSha256Key } from '../src/common/crypto/hmac.ts';
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import type { MethodDefinition } from '@grpc/proto-loader';
import { loadPackageDefinition, SERVICE_NAMES } from '../../proto/index.ts';
import { decodeCheckRequest, type AuthzInput } from '../src/authz/codec/request.ts';
import { geoDenial } from '../src/authz/decision.ts';
import { GEO_TRUSTED, geoResult } from '../src/authz/stages/geo.ts';
import { JURISDICTION_NONE, type RouteKind } from '../src/common/contract.ts';
import { MemoryNonceStore } from '../src/common/adapters/nonce-store.ts';
import { evaluate, type PipelineDeps } from '../src/authz/pipeline.ts';
import { checkRequestObject, type CheckSpec } from '../../testkit/check-request.ts';
import { fakeMarkets, fixedClock, HMAC_KEY, hmacHeaders } from './helpers.ts';
import { ingestBody, marketDoc, newFeedKey } from '../../testkit/feed.ts';

const UNKNOWN_ALLOWED = geoResult('unknown_allowed', 'full', null, null, JURISDICTION_NONE);
const UNKNOWN_BLOCKED = geoResult('unknown_blocked', 'blocked', null, null, JURISDICTION_NONE);

const pd = loadPackageDefinition();
const checkDef = (pd[SERVICE_NAMES.authorization] as Record<string, MethodDefinition<object, object>>)['Check']!;
const serialize = (o: object): Buffer => checkDef.requestSerialize(o);

type HeaderMode = 'headers' | 'header_map raw_value' | 'header_map value';

/** The CheckRequest object for `spec`, with its headers in the chosen field. */
function requestObject(spec: CheckSpec, mode: HeaderMode = 'headers'): Record<string, unknown> {
  const obj = checkRequestObject(spec);
  if (mode === 'headers') return obj;
  const http = ((obj['attributes'] as Record<string, unknown>)['request'] as Record<string, unknown>)['http'] as Record<string, unknown>;
  const headers = http['headers'] as Record<string, string>;
  delete http['headers'];
  http['header_map'] = {
    headers: Object.entries(headers).map(([key, v]) =>
      mode === 'header_map raw_value' ? { key, raw_value: Buffer.from(v, 'utf8') } : { key, value: v }),
  };
  return obj;
}

interface FullHttp {
  method?: string;
  path?: string;
  headers?: Record<string, string>;
  header_map?: { headers?: { key?: string; value?: string; raw_value?: Buffer }[] };
  body?: string;
  raw_body?: Buffer;
}
interface FullRequest {
  attributes?: {
    source?: { address?: { socket_address?: { address?: string } } };
    request?: { http?: FullHttp };
    context_extensions?: Record<string, string>;
  };
}

/** The reference: decode with the real protos, then apply the documented rules. */
function fullDecode(wire: Buffer): AuthzInput {
  const req = checkDef.requestDeserialize(wire) as FullRequest;
  const http = req.attributes?.request?.http ?? {};
  const headers = new Map<string, string>();
  for (const [k, v] of Object.entries(http.headers ?? {})) headers.set(k, v);
  for (const h of http.header_map?.headers ?? []) {
    const rv = h.raw_value === undefined ? undefined : h.raw_value.toString('utf8');
    const v = rv !== undefined && rv !== '' ? rv : h.value !== undefined && h.value !== '' ? h.value : rv ?? h.value;
    if (v !== undefined) headers.set(h.key ?? '', v);
  }
  const path = http.path ?? '';
  const q = path.indexOf('?');
  let body: Buffer | undefined;
  if (http.raw_body !== undefined) body = Buffer.from(http.raw_body);
  else if (http.body !== undefined && http.body !== '') body = Buffer.from(http.body, 'utf8');
  return {
    method: http.method ?? '',
    path: q === -1 ? path : path.slice(0, q),
    clientIp: headers.get('x-edge-client-ip') ?? req.attributes?.source?.address?.socket_address?.address ?? '',
    timestamp: headers.get('x-edge-timestamp'),
    nonce: headers.get('x-edge-nonce'),
    signature: headers.get('x-edge-signature'),
    requestId: headers.get('x-request-id'),
    body,
    // Offsets into raw_body are offsets into what Envoy forwards; into the sanitized string, not.
    ...(http.raw_body !== undefined ? { bodyExact: true } : {}),
    phase: req.attributes?.context_extensions?.['phase'] === 'headers' ? 'headers' : undefined,
    // A route value Envoy sent that is no route kind is kept as `unknown` (denied), never dropped.
    route: ((r) => (r === undefined ? undefined : ['ingest', 'order', 'read', 'geoblock'].includes(r) ? r as RouteKind : 'unknown' as const))(req.attributes?.context_extensions?.['route']),
  };
}

function plain(i: AuthzInput): Record<string, unknown> {
  return { ...i, body: i.body === undefined ? undefined : i.body.toString('hex') };
}

const BIN = Buffer.from([0x00, 0xff, 0xc3, 0x28, 0x7b, 0x00, 0x80]);
const SIGNED = { 'x-edge-timestamp': '1763700000', 'x-edge-nonce': '00112233445566778899aabbccddeeff', 'x-edge-signature': `v1=${'ab'.repeat(32)}` };

interface Case {
  spec: CheckSpec;
  expect: Partial<Record<keyof AuthzInput, unknown>>;
}

const cases: Record<string, Case> = {
  'GET with a query string: query stripped': { spec: { path: '/v1/markets?conditionId=a,b&limit=5' }, expect: { method: 'GET', path: '/v1/markets' } },
  'path with two ?': { spec: { path: '/v1/quotes?a=1?b=2' }, expect: { path: '/v1/quotes' } },
  'path with only ?': { spec: { path: '/healthz?' }, expect: { path: '/healthz' } },
  'root path': { spec: { path: '/' }, expect: { path: '/' } },
  'POST ingest path': { spec: { method: 'POST', path: '/internal/ingest/market?x=1' }, expect: { method: 'POST', path: '/internal/ingest/market' } },
  'x-edge-client-ip wins over the source address': {
    spec: { sourceAddress: '10.0.0.1', headers: { 'x-edge-client-ip': '203.0.113.9' } }, expect: { clientIp: '203.0.113.9' },
  },
  'source address when x-edge-client-ip is absent': { spec: { sourceAddress: '198.51.100.7' }, expect: { clientIp: '198.51.100.7' } },
  'IPv6 source address': { spec: { sourceAddress: '2001:db8::7' }, expect: { clientIp: '2001:db8::7' } },
  'an empty x-edge-client-ip header is kept (not the peer)': {
    spec: { sourceAddress: '127.0.0.1', headers: { 'x-edge-client-ip': '' } }, expect: { clientIp: '' },
  },
  'x-forwarded-for is never the client address': {
    spec: { sourceAddress: '198.51.100.7', headers: { 'x-forwarded-for': '192.0.2.1' } }, expect: { clientIp: '198.51.100.7' },
  },
  'the four x-edge headers and x-request-id': {
    spec: { method: 'POST', path: '/internal/ingest/market', headers: { ...SIGNED, 'x-request-id': 'req-1' } },
    expect: { ...{ timestamp: SIGNED['x-edge-timestamp'], nonce: SIGNED['x-edge-nonce'], signature: SIGNED['x-edge-signature'] }, requestId: 'req-1' },
  },
  'absent x-edge headers are undefined': { spec: { headers: {} }, expect: { timestamp: undefined, nonce: undefined, signature: undefined } },
  'upper-case header names are not the policy headers (Envoy lower-cases)': {
    spec: { headers: { 'X-Edge-Nonce': 'abc' } }, expect: { nonce: undefined },
  },
  'raw_body bytes exact (0x00, 0xff, invalid UTF-8)': { spec: { method: 'POST', body: BIN }, expect: { body: BIN.toString('hex') } },
  'raw_body of 64 KiB': { spec: { method: 'POST', body: Buffer.alloc(65_536, 0xfe) }, expect: { body: Buffer.alloc(65_536, 0xfe).toString('hex') } },
  'body string fallback (no pack_as_bytes)': {
    spec: { method: 'POST', body: Buffer.from('{"a":"é"}'), bodyAsString: true }, expect: { body: Buffer.from('{"a":"é"}').toString('hex') },
  },
  'no body': { spec: { method: 'GET' }, expect: { body: undefined } },
  'context_extensions phase=headers marks the header phase': {
    spec: { method: 'POST', path: '/internal/ingest/market', contextExtensions: { route: 'ingest', phase: 'headers' } }, expect: { phase: 'headers' },
  },
  'context_extensions without phase, or another phase, is no header phase': {
    spec: { method: 'POST', path: '/internal/ingest/market', contextExtensions: { route: 'ingest', phase: 'body' } }, expect: { phase: undefined },
  },
  'a client header named phase is no header phase': { spec: { headers: { phase: 'headers' } }, expect: { phase: undefined } },
  'context_extensions route names the route Envoy matched': {
    spec: { method: 'GET', path: '/v1/markets', contextExtensions: { route: 'read' } }, expect: { route: 'read' },
  },
  'fail closed – a route value the registry does not know is kept as unknown, never dropped (which would classify it)': {
    spec: { method: 'GET', path: '/v1/markets', contextExtensions: { route: 'admin' } }, expect: { route: 'unknown' },
  },
  'fail closed – an empty route value is unknown too': {
    spec: { method: 'POST', path: '/v1/orders', contextExtensions: { route: '' } }, expect: { route: 'unknown' },
  },
  'a route value named like an object key (constructor) is unknown': {
    spec: { method: 'GET', path: '/', contextExtensions: { route: 'constructor' } }, expect: { route: 'unknown' },
  },
  'the geoblock route value is the geoblock kind': {
    spec: { method: 'GET', path: '/v1/geoblock', contextExtensions: { route: 'geoblock' } }, expect: { route: 'geoblock' },
  },
  'a client header named route is no route (a hand-made Check: classified later)': {
    spec: { method: 'POST', path: '/v1/orders', headers: { route: 'read' } }, expect: { route: undefined },
  },
};

const modes: HeaderMode[] = ['headers', 'header_map raw_value', 'header_map value'];

for (const [name, c] of Object.entries(cases)) {
  for (const mode of modes) {
    test(`lean decoder – ${name} – via ${mode}`, () => {
      const wire = serialize(requestObject(c.spec, mode));
      const lean = decodeCheckRequest(wire);
      assert.deepEqual(plain(lean), plain(fullDecode(wire)), 'agrees with the full decoder');
      const p = plain(lean);
      for (const [k, v] of Object.entries(c.expect)) assert.deepEqual(p[k], v, k);
    });
  }
}

test('lean decoder – raw_value bytes that are not UTF-8 decode like the full decoder', () => {
  const obj = requestObject({ headers: { 'x-edge-nonce': 'placeholder' } }, 'header_map raw_value');
  const http = ((obj['attributes'] as Record<string, unknown>)['request'] as Record<string, unknown>)['http'] as FullHttp;
  for (const h of http.header_map?.headers ?? []) if (h.key === 'x-edge-nonce') h.raw_value = Buffer.from([0x61, 0xff, 0x62]);
  const wire = serialize(obj);
  assert.deepEqual(plain(decodeCheckRequest(wire)), plain(fullDecode(wire)));
  assert.equal(decodeCheckRequest(wire).nonce, 'a\ufffdb');
});

test('lean decoder – a raw_body wins over a body string when both are sent', () => {
  const obj = checkRequestObject({ method: 'POST', body: BIN });
  const http = ((obj['attributes'] as Record<string, unknown>)['request'] as Record<string, unknown>)['http'] as Record<string, unknown>;
  http['body'] = 'a different text body';
  const lean = decodeCheckRequest(serialize(obj));
  assert.deepEqual(lean.body, BIN);
});

// ---------------------------------------------------------------------------------------
// Property: the lean decoder agrees with the full decoder on arbitrary requests.
// ---------------------------------------------------------------------------------------
const headerName = fc.oneof(
  fc.constantFrom('x-edge-client-ip', 'x-edge-timestamp', 'x-edge-nonce', 'x-edge-signature', 'x-request-id',
    'content-type', ':path', 'x-edge', 'x-edge-nonce-', 'X-Edge-Nonce', 'x-forwarded-for'),
  fc.string({ minLength: 1, maxLength: 20 }),
).filter((k) => k !== '__proto__');

const specArb = fc.record({
  method: fc.oneof(fc.constantFrom('GET', 'POST', 'PUT', 'DELETE', 'post', ''), fc.string({ maxLength: 10 })),
  path: fc.oneof(
    fc.constantFrom('/', '/healthz', '/v1/orders', '/internal/ingest/market', '/internal/ingest/market?x=1', '/v1/markets?a=b?c', '?'),
    fc.string({ unit: 'binary', maxLength: 40 }),
  ),
  headers: fc.dictionary(headerName, fc.string({ unit: 'binary', maxLength: 40 }), { maxKeys: 12 }),
  body: fc.option(fc.uint8Array({ maxLength: 200 }).map((u) => Buffer.from(u)), { nil: undefined }),
  bodyAsString: fc.boolean(),
  sourceAddress: fc.oneof(fc.ipV4(), fc.ipV6(), fc.string({ maxLength: 20 })),
  contextExtensions: fc.option(fc.dictionary(fc.constantFrom('route', 'phase', 'x'), fc.constantFrom('headers', 'ingest', 'order', 'read', '', 'Headers')), { nil: undefined }),
  mode: fc.constantFrom<HeaderMode>(...modes),
});

test('lean decoder – property: agrees with the full proto-loader decode (1000 random requests)', () => {
  fc.assert(
    fc.property(specArb, ({ mode, ...spec }) => {
      const wire = serialize(requestObject(spec, mode));
      assert.deepEqual(plain(decodeCheckRequest(wire)), plain(fullDecode(wire)));
    }),
    { numRuns: 1000 },
  );
});

// ---------------------------------------------------------------------------------------
// Malformed wire data
// ---------------------------------------------------------------------------------------
const FEED = newFeedKey();
const NOW = 1763700000;
const ingest = ingestBody(marketDoc('0xm', 1), FEED);
const VALID_INGEST = serialize(requestObject({
  method: 'POST', path: '/internal/ingest/market', body: ingest, headers: { ...hmacHeaders(ingest, HMAC_KEY, NOW), 'x-edge-client-ip': '192.0.2.1' },
}));

function pipeline(geoUnknown: 'block' | 'allow'): PipelineDeps {
  const clock = fixedClock(NOW);
  return {
    classifyGeo: (ip) => (ip === '' ? (geoUnknown === 'allow' ? UNKNOWN_ALLOWED : UNKNOWN_BLOCKED) : GEO_TRUSTED),
    geoDenial: geoDenial('blocked', undefined),
    ingest: { hmacKeys: [new HmacSha256Key(HMAC_KEY)], feedKeys: [FEED.publicKey], nonces: new MemoryNonceStore(() => NOW * 1000), clock, replayWindowSecs: 300, nonceTtlSecs: 600 },
    order: { markets: fakeMarkets([]), clock, orderMaxTtlSecs: 86_400, orderMaxSize: undefined, orderPayloadMaxBytes: 32_768 },
    isSealed: () => false,
  };
}

test('lean decoder – precondition: the untouched signed ingest decodes and is allowed', async () => {
  const d = await evaluate(decodeCheckRequest(VALID_INGEST), pipeline('block'));
  assert.equal(d.allow, true);
});

test('lean decoder – every truncation of a valid request throws (never a half-filled input)', () => {
  for (let n = 1; n < VALID_INGEST.length; n++) {
    assert.throws(() => decodeCheckRequest(VALID_INGEST.subarray(0, n)), `prefix of ${n} bytes decoded silently`);
  }
});

const garbage: Record<string, Buffer> = {
  'a length prefix far past the end': Buffer.from([0x0a, 0xff, 0xff, 0xff, 0x0f]),
  'an invalid wire type 7': Buffer.from([0x0f, 0x00]),
  'an unterminated varint': Buffer.from([0x08, 0xff, 0xff, 0xff]),
  'a nested length past its parent': Buffer.concat([Buffer.from([0x0a, 0x04, 0x22, 0x7f]), Buffer.alloc(2)]),
  'http/1.1 text': Buffer.from('POST /internal/ingest/market HTTP/1.1\r\n\r\n'),
  'JSON': Buffer.from('{"attributes":{}}'),
};

for (const [name, bytes] of Object.entries(garbage)) {
  test(`lean decoder – garbage: ${name} throws (grpc-js answers INTERNAL → Envoy fails closed)`, () => {
    assert.throws(() => decodeCheckRequest(bytes));
  });
}

test('lean decoder – an empty message decodes to an empty input that can never pass an ingest or order policy', async () => {
  const input = decodeCheckRequest(Buffer.alloc(0));
  assert.deepEqual(plain(input), plain(fullDecode(Buffer.alloc(0))));
  assert.deepEqual([input.method, input.path, input.clientIp], ['', '', '']);
  // No client address → GEO_UNKNOWN decides; with the default (block) it is denied.
  const d = await evaluate(input, pipeline('block'));
  assert.equal(d.allow, false);
  assert.equal(d.httpStatus, 451);
});

test('lean decoder – single-byte corruptions of a signed ingest never produce an allow for a changed request', async () => {
  let threw = 0;
  let allowed = 0;
  for (let i = 0; i < VALID_INGEST.length; i++) {
    for (const x of [0x01, 0x80, 0xff]) {
      const wire = Buffer.from(VALID_INGEST);
      wire[i] = wire[i]! ^ x;
      let input: AuthzInput;
      try {
        input = decodeCheckRequest(wire);
      } catch {
        threw++;
        continue;
      }
      const d = await evaluate(input, pipeline('block'));
      if (!d.allow) continue;
      if (input.method !== 'POST' || input.path !== '/internal/ingest/market') continue; // not an ingest any more: geo only
      allowed++;
      // An allowed ingest must carry exactly the signed headers and body.
      const orig = decodeCheckRequest(VALID_INGEST);
      assert.deepEqual(
        [input.timestamp, input.nonce, input.signature?.toLowerCase(), input.body?.toString('hex')],
        [orig.timestamp, orig.nonce, orig.signature?.toLowerCase(), orig.body?.toString('hex')],
        `byte ${i} ^ ${x} allowed a modified ingest`,
      );
    }
  }
  assert.ok(threw > 0);
  void allowed;
});
