/**
 * Order policy (docs/api.md "POST /v1/orders"): strict base64 length, envelope shape (`field` names the bad
 * field), market state, deadline window, size rules, payload size — through the cached
 * (synchronous) and the cache-miss (Promise) market lookups alike, and a failing lookup.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import type { Decision } from '../src/authz/decision.ts';
import { ERROR_STATUS } from '../src/common/errors.ts';
import { ORDER_PAYLOAD_AT_METADATA_KEY, ORDER_PAYLOAD_METADATA_KEY } from '../src/common/contract.ts';
import { checkOrder, orderStage, parseOrder, type OrderDeps } from '../src/authz/stages/order.ts';
import { decodeStrictBase64, strictBase64Length } from '../src/common/rules.ts';
import type { MarketLookup, MarketMeta } from '../src/common/ports.ts';
import { fakeMarkets, fixedClock } from './helpers.ts';

const NOW = 1763700000;
type Code = Decision['code'];

// ---------------------------------------------------------------------------------------
// strictBase64Length
// ---------------------------------------------------------------------------------------
const b64cases: Record<string, [s: string, len: number]> = {
  'empty → refused': ['', -1],
  '1 char': ['A', -1],
  '2 chars (length % 4 = 2)': ['AA', -1],
  '3 chars (length % 4 = 3)': ['AAA', -1],
  '5 chars (length % 4 = 1)': ['AAAAA', -1],
  '4 chars, no padding → 3 bytes': ['AAAA', 3],
  '== padding → 1 byte': ['AA==', 1],
  '= padding → 2 bytes': ['AAA=', 2],
  '8 chars with = → 5 bytes': ['AAAAAAA=', 5],
  'all 64 alphabet chars': ['ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/', 48],
  '== with non-zero padding bits (AB==)': ['AB==', -1],
  '== with non-zero padding bits (A/==)': ['A/==', -1],
  '= with non-zero padding bits (AAB=)': ['AAB=', -1],
  '= with non-zero padding bits (AA/=)': ['AA/=', -1],
  '= canonical last char w (AAw=)': ['AAw=', 2],
  '== canonical last char w (Aw==)': ['Aw==', 1],
  '=== padding': ['A===', -1],
  '==== only padding': ['====', -1],
  '= at the start': ['=AAA', -1],
  '= in the middle': ['AA=A', -1],
  '= twice, split': ['A=A=', -1],
  '= in an earlier quantum': ['AA==AAAA', -1],
  'URL-safe - and _': ['AA-_', -1],
  'space inside': ['AA A', -1],
  'trailing newline': ['AAAA\n', -1],
  'non-ASCII letter': ['AAÄA', -1],
};

for (const [name, [s, len]] of Object.entries(b64cases)) {
  test(`strictBase64Length – ${name}`, () => {
    assert.equal(strictBase64Length(s), len);
    if (len >= 0) assert.equal(Buffer.from(s, 'base64').length, len, 'agrees with the decoder');
  });
}

test('decodeStrictBase64 – each result is its own copy (the check decodes into a shared scratch buffer)', () => {
  const a = decodeStrictBase64(Buffer.from('first value').toString('base64'));
  const b = decodeStrictBase64(Buffer.from('second, longer value').toString('base64'));
  assert.equal(a?.toString(), 'first value');
  assert.equal(b?.toString(), 'second, longer value');
});

test('strictBase64Length / decodeStrictBase64 – inputs past the scratch buffer (an ingest\'s d) are checked the same way', () => {
  const big = Buffer.alloc(300_000, 0x5a);
  const text = big.toString('base64');
  assert.equal(strictBase64Length(text), big.length);
  assert.deepEqual(decodeStrictBase64(text), big);
  assert.equal(strictBase64Length(`${text.slice(0, -4)}AB==`), -1, 'non-canonical padding bits');
  assert.equal(decodeStrictBase64(text.replace('W', '-')), undefined, 'URL-safe alphabet');
});

// ---------------------------------------------------------------------------------------
// The order stage
// ---------------------------------------------------------------------------------------
const market = (conditionId: string, over: Partial<MarketMeta> = {}): MarketMeta => ({
  conditionId, seq: 1, active: true, closed: false, minSize: '5', maxSize: '100000', ...over,
});

const MARKETS: MarketMeta[] = [
  market('0xopen'),
  market('0xnolimits', { minSize: undefined, maxSize: undefined }),
  market('0xinactive', { active: false }),
  market('0xclosed', { closed: true }),
  market('0xinactive-and-closed', { active: false, closed: true }),
  market('0xended', { endTime: NOW - 1 }),
  market('0xends-now', { endTime: NOW }),
  market('0xends-later', { endTime: NOW + 1 }),
  market('0xtiny', { minSize: '0.000000000000000001', maxSize: '0.000000000000000002' }),
];

function deps(markets: MarketLookup, over: Partial<OrderDeps> = {}): OrderDeps {
  return {
    markets, clock: fixedClock(NOW), orderMaxTtlSecs: 86_400, orderMaxSize: '50000', orderPayloadMaxBytes: 32_768, ...over,
  };
}

const PAYLOAD = Buffer.from([0x00, 0xff, 0x01]).toString('base64');
const orderObj = (over: Record<string, unknown> = {}): Record<string, unknown> => ({
  marketId: '0xopen', deadline: NOW + 60, size: '25.5', payload: PAYLOAD, ...over,
});
const order = (over: Record<string, unknown> = {}, drop: string[] = []): Buffer => {
  const o = orderObj(over);
  for (const k of drop) delete o[k];
  return Buffer.from(JSON.stringify(o), 'utf8');
};
const raw = (s: string): Buffer => Buffer.from(s, 'utf8');
/** An extra member nesting `levels` arrays, so the body nests `levels + 1` (the envelope is level 1). */
const nestedArrays = (levels: number): unknown => {
  let v: unknown = 1;
  for (let d = 0; d < levels; d++) v = [v];
  return v;
};
const bytes = (n: number): string => Buffer.alloc(n, 0xa5).toString('base64');

interface Case {
  body: Buffer | undefined;
  code: Code;
  field?: string;
  deps?: Partial<OrderDeps>;
}

const cases: Record<string, Case> = {
  // accepted
  'a valid order': { body: order(), code: 'ok' },
  'extra envelope fields ignored': { body: order({ clientRef: 'abc', nested: { a: 1 } }), code: 'ok' },
  'deadline written as 1763700060.0 is an integer': { body: raw(JSON.stringify(orderObj()).replace(`${NOW + 60}`, `${NOW + 60}.0`)), code: 'ok' },
  // invalid_json
  'no body': { body: undefined, code: 'invalid_json' },
  'empty body': { body: Buffer.alloc(0), code: 'invalid_json' },
  'not JSON': { body: raw('marketId=0xopen'), code: 'invalid_json' },
  'truncated JSON': { body: order().subarray(0, 20), code: 'invalid_json' },
  'JSON array': { body: raw(JSON.stringify([orderObj()])), code: 'invalid_json' },
  'JSON null': { body: raw('null'), code: 'invalid_json' },
  'JSON string': { body: raw('"order"'), code: 'invalid_json' },
  'JSON number': { body: raw('1'), code: 'invalid_json' },
  // nesting (docs/api.md "Limits"): refused before anything is built
  'nested 32 levels (the bound)': { body: order({ x: nestedArrays(31) }), code: 'ok' },
  'nested 33 levels': { body: order({ x: nestedArrays(32) }), code: 'invalid_json' },
  'nested 33 levels of objects': { body: raw(`{"marketId":"0xopen",${'"a":{'.repeat(32)}${'}'.repeat(32)}}`), code: 'invalid_json' },
  '32,700 [ and no order at all': { body: raw('['.repeat(32_700) + ']'.repeat(32_700)), code: 'invalid_json' },
  'brackets inside strings do not count': { body: order({ note: '['.repeat(100), [`${'{'.repeat(40)}"`]: '}' }), code: 'ok' },
  '7,000 distinct member names (read without building them)': {
    body: order(Object.fromEntries(Array.from({ length: 7000 }, (_, i) => [`k${i}`, 0]))), code: 'ok',
  },
  // invalid_order, field named
  'marketId missing': { body: order({}, ['marketId']), code: 'invalid_order', field: 'marketId' },
  'marketId a number': { body: order({ marketId: 7 }), code: 'invalid_order', field: 'marketId' },
  'marketId empty': { body: order({ marketId: '' }), code: 'invalid_order', field: 'marketId' },
  'marketId with a space': { body: order({ marketId: '0x open' }), code: 'invalid_order', field: 'marketId' },
  'marketId with a slash': { body: order({ marketId: '../0xopen' }), code: 'invalid_order', field: 'marketId' },
  'marketId of 129 chars': { body: order({ marketId: 'a'.repeat(129) }), code: 'invalid_order', field: 'marketId' },
  'deadline missing': { body: order({}, ['deadline']), code: 'invalid_order', field: 'deadline' },
  'deadline a string': { body: order({ deadline: String(NOW + 60) }), code: 'invalid_order', field: 'deadline' },
  'deadline a float': { body: order({ deadline: NOW + 60.5 }), code: 'invalid_order', field: 'deadline' },
  'deadline null': { body: order({ deadline: null }), code: 'invalid_order', field: 'deadline' },
  'deadline beyond 2^53': { body: raw(JSON.stringify(orderObj()).replace(`${NOW + 60}`, '9007199254740993')), code: 'invalid_order', field: 'deadline' },
  'deadline 1e400 (Infinity)': { body: raw(JSON.stringify(orderObj()).replace(`${NOW + 60}`, '1e400')), code: 'invalid_order', field: 'deadline' },
  'size missing': { body: order({}, ['size']), code: 'invalid_order', field: 'size' },
  'size a number': { body: order({ size: 25.5 }), code: 'invalid_order', field: 'size' },
  'size null': { body: order({ size: null }), code: 'invalid_order', field: 'size' },
  'payload missing': { body: order({}, ['payload']), code: 'invalid_order', field: 'payload' },
  'payload a number': { body: order({ payload: 12 }), code: 'invalid_order', field: 'payload' },
  'payload decoding to 0 bytes (empty)': { body: order({ payload: '' }), code: 'invalid_order', field: 'payload' },
  'payload without padding': { body: order({ payload: 'AP8B'.slice(0, 3) }), code: 'invalid_order', field: 'payload' },
  'payload URL-safe': { body: order({ payload: Buffer.from([0xfb, 0xff]).toString('base64url') + '=' }), code: 'invalid_order', field: 'payload' },
  'payload non-canonical bits': { body: order({ payload: 'AB==' }), code: 'invalid_order', field: 'payload' },
  'payload with a newline': { body: order({ payload: `${bytes(60).slice(0, 40)}\n${bytes(60).slice(40)}` }), code: 'invalid_order', field: 'payload' },
  'payload as a byte array': { body: order({ payload: [0, 255, 1] }), code: 'invalid_order', field: 'payload' },
  // payload size
  'payload of 1 byte': { body: order({ payload: bytes(1) }), code: 'ok' },
  'payload of exactly ORDER_PAYLOAD_MAX_BYTES (32768)': { body: order({ payload: bytes(32_768) }), code: 'ok' },
  'payload of ORDER_PAYLOAD_MAX_BYTES + 1': { body: order({ payload: bytes(32_769) }), code: 'invalid_order', field: 'payload' },
  'payload at a configured max of 16': { body: order({ payload: bytes(16) }), code: 'ok', deps: { orderPayloadMaxBytes: 16 } },
  'payload 1 over a configured max of 16': { body: order({ payload: bytes(17) }), code: 'invalid_order', field: 'payload', deps: { orderPayloadMaxBytes: 16 } },
  // market
  'unknown market': { body: order({ marketId: '0xnowhere' }), code: 'unknown_market' },
  'market inactive': { body: order({ marketId: '0xinactive' }), code: 'market_closed' },
  'market closed': { body: order({ marketId: '0xclosed' }), code: 'market_closed' },
  'market inactive and closed': { body: order({ marketId: '0xinactive-and-closed' }), code: 'market_closed' },
  'market endTime passed': { body: order({ marketId: '0xended' }), code: 'market_closed' },
  'market endTime == now': { body: order({ marketId: '0xends-now' }), code: 'market_closed' },
  'market endTime = now + 1': { body: order({ marketId: '0xends-later' }), code: 'ok' },
  'market closed wins over a bad deadline': { body: order({ marketId: '0xclosed', deadline: NOW - 5 }), code: 'market_closed' },
  // deadline
  'deadline == now': { body: order({ deadline: NOW }), code: 'deadline_expired' },
  'deadline now - 1': { body: order({ deadline: NOW - 1 }), code: 'deadline_expired' },
  'deadline 0': { body: order({ deadline: 0 }), code: 'deadline_expired' },
  'deadline negative': { body: order({ deadline: -1 }), code: 'deadline_expired' },
  'deadline now + 1': { body: order({ deadline: NOW + 1 }), code: 'ok' },
  'deadline now + ORDER_MAX_TTL_SECS': { body: order({ deadline: NOW + 86_400 }), code: 'ok' },
  'deadline now + ORDER_MAX_TTL_SECS + 1': { body: order({ deadline: NOW + 86_401 }), code: 'deadline_too_far' },
  'deadline in milliseconds': { body: order({ deadline: NOW * 1000 }), code: 'deadline_too_far' },
  'deadline at a configured TTL of 60': { body: order({ deadline: NOW + 60 }), code: 'ok', deps: { orderMaxTtlSecs: 60 } },
  'deadline 1 over a configured TTL of 60': { body: order({ deadline: NOW + 61 }), code: 'deadline_too_far', deps: { orderMaxTtlSecs: 60 } },
  // size
  "size '0'": { body: order({ size: '0' }), code: 'invalid_size' },
  "size '0.0'": { body: order({ size: '0.0' }), code: 'invalid_size' },
  "size '000'": { body: order({ size: '000' }), code: 'invalid_size' },
  "size '0.000000000000000000'": { body: order({ size: '0.000000000000000000', marketId: '0xnolimits' }), code: 'invalid_size' },
  "size '-1'": { body: order({ size: '-1' }), code: 'invalid_size' },
  "size '1e3'": { body: order({ size: '1e3' }), code: 'invalid_size' },
  "size '+10'": { body: order({ size: '+10' }), code: 'invalid_size' },
  "size ' 10'": { body: order({ size: ' 10' }), code: 'invalid_size' },
  "size '10.'": { body: order({ size: '10.' }), code: 'invalid_size' },
  "size '.5'": { body: order({ size: '.5' }), code: 'invalid_size' },
  "size '1,000'": { body: order({ size: '1,000' }), code: 'invalid_size' },
  "size ''": { body: order({ size: '' }), code: 'invalid_size' },
  "size 'NaN'": { body: order({ size: 'NaN' }), code: 'invalid_size' },
  'size with 19 fractional digits': { body: order({ size: '10.0000000000000000001' }), code: 'invalid_size' },
  'size with 18 fractional digits': { body: order({ size: '10.000000000000000001' }), code: 'ok' },
  'size exactly at minSize': { body: order({ size: '5' }), code: 'ok' },
  'size exactly at minSize, written 5.000': { body: order({ size: '5.000' }), code: 'ok' },
  'size exactly at minSize, leading zeros': { body: order({ size: '0005' }), code: 'ok' },
  'size just below minSize': { body: order({ size: '4.999999999999999999' }), code: 'invalid_size' },
  'size exactly at maxSize (ORDER_MAX_SIZE unset)': { body: order({ size: '100000' }), code: 'ok', deps: { orderMaxSize: undefined } },
  'size just above maxSize': { body: order({ size: '100000.000000000000000001' }), code: 'invalid_size', deps: { orderMaxSize: undefined } },
  'size exactly at ORDER_MAX_SIZE': { body: order({ size: '50000' }), code: 'ok' },
  'size just above ORDER_MAX_SIZE': { body: order({ size: '50000.000000000000000001' }), code: 'invalid_size' },
  'size above ORDER_MAX_SIZE on a market without limits': { body: order({ size: '50001', marketId: '0xnolimits' }), code: 'invalid_size' },
  'size huge on a market without limits and no ORDER_MAX_SIZE': {
    body: order({ size: '9'.repeat(60), marketId: '0xnolimits' }), code: 'ok', deps: { orderMaxSize: undefined },
  },
  'size of 1e-18 on a market whose minSize is 1e-18': { body: order({ size: '0.000000000000000001', marketId: '0xtiny' }), code: 'ok' },
  'size of 3e-18 above a maxSize of 2e-18': { body: order({ size: '0.000000000000000003', marketId: '0xtiny' }), code: 'invalid_size' },
};

function assertDecision(d: Decision, c: Case): void {
  assert.equal(d.code, c.code, `expected ${c.code}, got ${d.code} (${d.reason})`);
  if (c.code === 'ok') {
    // The allow hands Envoy the payload (for the order-body Lua filter) and the docs/api.md "POST /v1/orders"
    // headers, all exactly as the client sent them.
    const sent = JSON.parse(String(c.body)) as { marketId: string; deadline: number; size: string; payload: string };
    assert.equal(d.allow, true);
    assert.deepEqual(d.metadata, { [ORDER_PAYLOAD_METADATA_KEY]: sent.payload });
    assert.deepEqual(Object.fromEntries(d.headers), {
      'content-type': 'application/octet-stream', 'x-edge-market-id': sent.marketId,
      'x-edge-deadline': String(sent.deadline), 'x-edge-size': sent.size,
    });
    return;
  }
  assert.equal(d.allow, false);
  assert.equal(d.httpStatus, ERROR_STATUS[c.code]);
  const body = JSON.parse(d.body) as { error: string; message: string; field?: string };
  assert.equal(body.error, c.code);
  assert.equal(typeof body.message, 'string');
  assert.equal(body.field, c.field, 'the field named in the body');
}

const modes: Record<string, { async: boolean }> = {
  'cached market (sync)': { async: false },
  'cache miss (Promise)': { async: true },
};

for (const [name, c] of Object.entries(cases)) {
  for (const [mode, opts] of Object.entries(modes)) {
    test(`order – ${name} → ${c.code}${c.field === undefined ? '' : ` (${c.field})`} – ${mode}`, async () => {
      const r = orderStage(c.body, deps(fakeMarkets(MARKETS, opts), c.deps));
      // The hot path (cached market) answers without a Promise.
      if (!opts.async) assert.ok(!(r instanceof Promise), 'a cached market answers synchronously');
      assertDecision(await r, c);
    });
  }
}

test('order – the status numbers of every order code match docs/api.md "Errors"', () => {
  assert.deepEqual(
    [ERROR_STATUS.invalid_json, ERROR_STATUS.invalid_order, ERROR_STATUS.unknown_market, ERROR_STATUS.market_closed,
      ERROR_STATUS.deadline_expired, ERROR_STATUS.deadline_too_far, ERROR_STATUS.invalid_size, ERROR_STATUS.service_unavailable],
    [400, 400, 404, 409, 422, 422, 422, 503],
  );
});

test('order – a body nested past the bound is refused with a message naming the bound', () => {
  const d = parseOrder(order({ x: nestedArrays(32) }), 32_768) as Decision;
  assert.equal(d.code, 'invalid_json');
  assert.match((JSON.parse(d.body) as { message: string }).message, /more than 32 levels/);
  const flat = parseOrder(raw('not json'), 32_768) as Decision;
  assert.doesNotMatch((JSON.parse(flat.body) as { message: string }).message, /levels/, 'a syntax error keeps the plain message');
});

test('order – parseOrder returns the envelope fields unchanged', () => {
  const o = parseOrder(order({ size: '0025.50' }), 32_768);
  assert.ok(!('allow' in o));
  assert.deepEqual(o, { marketId: '0xopen', deadline: NOW + 60, size: '0025.50', payload: PAYLOAD });
});

test('order – a body Envoy sent as exact bytes: the allow says where the payload\'s text lies in it, not the text', () => {
  const body = Buffer.from(`{"marketId":"0xopen", "deadline":${NOW + 60},"size":"10",  "payload" : "${PAYLOAD}","x":[1]}`);
  const o = parseOrder(body, 32_768, true);
  assert.ok(!('allow' in o));
  const [start, length] = o.payloadAt!.split(':').map(Number) as [number, number];
  assert.equal(body.toString('latin1', start, start + length), PAYLOAD);
  assert.equal(body[start - 1], 0x22, 'just after the opening quote');
  assert.equal(body[start + length], 0x22, 'just before the closing quote');
  const d = checkOrder(o, MARKETS[0], deps(fakeMarkets(MARKETS)), NOW);
  assert.deepEqual(d.metadata, { [ORDER_PAYLOAD_AT_METADATA_KEY]: o.payloadAt });
});

test('order – the payload text itself when its JSON string has escapes or the body is not the exact bytes', () => {
  // `\/` is `/`: the text JSON.parse gives differs from the bytes, so the position would be wrong.
  const text = Buffer.from([0xfb, 0xff, 0x01]).toString('base64');
  assert.ok(text.includes('/'));
  const escaped = Buffer.from(`{"marketId":"0xopen","deadline":${NOW + 60},"size":"10","payload":${JSON.stringify(text).replaceAll('/', '\\/')}}`);
  const o = parseOrder(escaped, 32_768, true);
  assert.ok(!('allow' in o));
  assert.equal(o.payload, text);
  assert.equal(o.payloadAt, undefined);
  assert.deepEqual(checkOrder(o, MARKETS[0], deps(fakeMarkets(MARKETS)), NOW).metadata, { [ORDER_PAYLOAD_METADATA_KEY]: text });
  const fromString = parseOrder(order({}), 32_768, false);
  assert.ok(!('allow' in fromString));
  assert.equal(fromString.payloadAt, undefined, 'a body from the sanitized `body` string is not the bytes Envoy forwards');
});

test('order – checkOrder reads the clock it is given (deadline window moves with now)', () => {
  const o = { marketId: '0xopen', deadline: NOW + 10, size: '10', payload: PAYLOAD };
  const d = deps(fakeMarkets(MARKETS));
  assert.equal(checkOrder(o, MARKETS[0], d, NOW).code, 'ok');
  assert.equal(checkOrder(o, MARKETS[0], d, NOW + 10).code, 'deadline_expired');
  assert.equal(checkOrder(o, MARKETS[0], d, NOW + 10 - 86_401).code, 'deadline_too_far');
});

// ---------------------------------------------------------------------------------------
// Market store failures: 503, never a 4xx and never an allow.
// ---------------------------------------------------------------------------------------
const failing: Record<string, MarketLookup> = {
  'Promise rejects (Redis down on a cache miss)': fakeMarkets([], { fail: true }),
  'get throws synchronously': { get: () => { throw new Error('cache corrupted'); } },
  'Promise rejects later': { get: () => new Promise((_, rej) => setTimeout(() => rej(new Error('timeout')), 5)) },
};

for (const [name, lookup] of Object.entries(failing)) {
  test(`order market store down – ${name} → 503 service_unavailable, reported`, async () => {
    const errors: unknown[] = [];
    const d = await orderStage(order(), { ...deps(lookup), onStoreError: (e) => errors.push(e) });
    assert.equal(d.code, 'service_unavailable');
    assert.equal(d.httpStatus, 503);
    assert.equal(d.allow, false);
    assert.equal((JSON.parse(d.body) as { error: string }).error, 'service_unavailable');
    assert.equal(errors.length, 1);
  });
}

test('order market store down – a malformed order is still a 400, the store is not asked', async () => {
  let asked = 0;
  const lookup: MarketLookup = { get: () => { asked++; return Promise.reject(new Error('down')); } };
  const d = await orderStage(order({ payload: '' }), deps(lookup));
  assert.equal(d.code, 'invalid_order');
  assert.equal(asked, 0);
});
