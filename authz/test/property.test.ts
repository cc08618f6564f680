/**
 * Properties (fast-check, 10,000 runs in all) of the whole decision path —
 * wire bytes → decodeCheckRequest → evaluate — with the stores up (in-memory nonces,
 * fake markets, geo allowing everyone):
 *   - it never throws for client input;
 *   - it never allows an ingest whose HMAC or Ed25519 signature does not verify (checked by
 *     an independent oracle: node:crypto HMAC + tweetnacl Ed25519);
 *   - it never answers ≥ 500 to malformed client input;
 *   - orders are only allowed when an independent re-check agrees;
 *   - the order stage's base64 length agrees with the strict decoder;
 *   - the geo classifier never throws and treats every IPv4-mapped spelling as the IPv4 address.
 */
import { HmacSha256Key } from '../src/common/crypto/hmac.ts';
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createHash, createHmac } from 'node:crypto';
import fc from 'fast-check';
import nacl from 'tweetnacl';
import { geoDenial, type Decision } from '../src/authz/decision.ts';
import { decodeCheckRequest, type AuthzInput } from '../src/authz/codec/request.ts';
import { MemoryNonceStore } from '../src/common/adapters/nonce-store.ts';
import { classify, PATHS } from '../src/common/routes.ts';
import { evaluate, type PipelineDeps } from '../src/authz/pipeline.ts';
import { decodeStrictBase64, PATTERN, strictBase64Length } from '../src/common/rules.ts';
import { createGeoClassifier, GEO_TRUSTED } from '../src/authz/stages/geo.ts';
import { GeoDatabase } from '../src/common/adapters/geoip.ts';
import { geoFixtures } from '../../testkit/geo-fixtures.ts';
import type { MarketMeta } from '../src/common/ports.ts';
import { encodeCheckRequest, type CheckSpec } from '../../testkit/check-request.ts';
import { envelopeFor, marketDoc, newFeedKey } from '../../testkit/feed.ts';
import { fakeMarkets, fixedClock, HMAC_KEY } from './helpers.ts';
import { ingestSigner } from '../src/common/crypto/ingest-signer.ts';

/** Signs like the feed pipeline (the signer module); hmacValid below is the independent model. */
const signIngest = ingestSigner(HMAC_KEY);

const NOW = 1763700000;
const FEED = newFeedKey();
const FEED_PUB = new Uint8Array(Buffer.from(FEED.publicHex, 'hex'));
const CID = '0xprop-market';
const MARKET: MarketMeta = { conditionId: CID, seq: 1, active: true, closed: false, minSize: '5', maxSize: '1000' };
const PAYLOAD_MAX = 4096;

function deps(): PipelineDeps {
  const clock = fixedClock(NOW);
  return {
    classifyGeo: () => GEO_TRUSTED,
    geoDenial: geoDenial('blocked', undefined),
    ingest: { hmacKeys: [new HmacSha256Key(HMAC_KEY)], feedKeys: [FEED.publicKey], nonces: new MemoryNonceStore(() => NOW * 1000), clock, replayWindowSecs: 300, nonceTtlSecs: 600 },
    order: { markets: fakeMarkets([MARKET]), clock, orderMaxTtlSecs: 86_400, orderMaxSize: undefined, orderPayloadMaxBytes: PAYLOAD_MAX },
    isSealed: () => false,
  };
}

// ---------------------------------------------------------------------------------------
// Independent oracles
// ---------------------------------------------------------------------------------------
const INT64_MAX = 2n ** 63n - 1n;
const INT64_MIN = -(2n ** 63n);

function hmacValid(i: AuthzInput): boolean {
  const { timestamp: ts, nonce, signature: sig } = i;
  if (ts === undefined || nonce === undefined || sig === undefined) return false;
  if (!/^-?[0-9]{1,19}$/.test(ts)) return false;
  const t = BigInt(ts);
  if (t > INT64_MAX || t < INT64_MIN) return false;
  if ((t > BigInt(NOW) ? t - BigInt(NOW) : BigInt(NOW) - t) > 300n) return false;
  if (!/^[0-9a-fA-F]{16,128}$/.test(nonce)) return false;
  const m = /^v1=([0-9a-fA-F]{64})$/.exec(sig);
  if (m === null) return false;
  const mac = createHmac('sha256', HMAC_KEY).update(Buffer.from(`${ts}.${nonce}.`, 'utf8')).update(i.body ?? Buffer.alloc(0)).digest('hex');
  return mac === m[1]!.toLowerCase();
}

function ed25519Valid(body: Buffer | undefined): boolean {
  try {
    const o = JSON.parse((body ?? Buffer.alloc(0)).toString('utf8')) as Record<string, unknown>;
    const { d, s } = o;
    if (typeof d !== 'string' || typeof s !== 'string' || !/^[0-9a-fA-F]{128}$/.test(s)) return false;
    const doc = Buffer.from(d, 'base64');
    if (doc.length === 0 || doc.toString('base64') !== d) return false;
    const digest = createHash('sha256').update(doc).digest();
    return nacl.sign.detached.verify(new Uint8Array(digest), new Uint8Array(Buffer.from(s, 'hex')), FEED_PUB);
  } catch {
    return false;
  }
}

/** A decimal string as an integer number of 1e-18 units (exact). */
function atto(s: string): bigint {
  const [int = '0', frac = ''] = s.split('.');
  return BigInt(int + frac.padEnd(18, '0'));
}

/** Levels of arrays and objects in a parsed JSON value (docs/api.md "Limits": at most 32 in an order). */
function depthOf(v: unknown): number {
  if (v === null || typeof v !== 'object') return 0;
  return 1 + Math.max(0, ...Object.values(v).map(depthOf));
}

function orderValid(body: Buffer | undefined): boolean {
  try {
    const o = JSON.parse((body ?? Buffer.alloc(0)).toString('utf8')) as Record<string, unknown>;
    if (o === null || typeof o !== 'object' || Array.isArray(o) || depthOf(o) > 32) return false;
    const { marketId, deadline, size, payload } = o;
    if (marketId !== CID) return false;
    if (typeof deadline !== 'number' || !Number.isInteger(deadline) || deadline <= NOW || deadline > NOW + 86_400) return false;
    if (typeof size !== 'string' || !/^[0-9]+(\.[0-9]{1,18})?$/.test(size)) return false;
    const n = atto(size);
    if (n < atto('5') || n > atto('1000')) return false;
    if (typeof payload !== 'string') return false;
    const bytes = Buffer.from(payload, 'base64');
    return bytes.length >= 1 && bytes.length <= PAYLOAD_MAX && bytes.toString('base64') === payload;
  } catch {
    return false;
  }
}

interface Stats { runs: number; allowedIngest: number; allowedOrder: number; decodeErrors: number }

/** The invariants every decision must satisfy. */
async function check(wire: Buffer, stats: Stats, allowDecodeError = false): Promise<void> {
  stats.runs++;
  let input: AuthzInput;
  try {
    input = decodeCheckRequest(wire);
  } catch (err) {
    // Only corrupted wire bytes may fail to decode (grpc-js → INTERNAL → Envoy fails closed).
    if (!allowDecodeError) throw err;
    stats.decodeErrors++;
    return;
  }
  let d: Decision;
  try {
    d = await evaluate(input, deps());
  } catch (err) {
    assert.fail(`evaluate threw for client input: ${String(err)}`);
  }
  assert.ok(d.httpStatus < 500, `status ${d.httpStatus} (${d.reason}) for client input with the stores up`);
  assert.equal(d.allow, d.code === 'ok');
  if (!d.allow) {
    const body = JSON.parse(d.body) as { error: string };
    assert.equal(body.error, d.code);
  }
  const route = classify(input.method, input.path);
  if (route === 'ingest' && d.allow) {
    stats.allowedIngest++;
    assert.ok(hmacValid(input), 'allowed an ingest whose HMAC does not verify');
    assert.ok(ed25519Valid(input.body), 'allowed an ingest whose Ed25519 signature does not verify');
  }
  if (route === 'order' && d.allow) {
    stats.allowedOrder++;
    assert.ok(orderValid(input.body), `allowed an order the oracle refuses: ${input.body?.toString('utf8')}`);
  }
}

// ---------------------------------------------------------------------------------------
// Generators
// ---------------------------------------------------------------------------------------
const hex = (min: number, max: number) => fc.stringMatching(new RegExp(`^[0-9a-fA-F]{${min},${max}}$`));
const tsArb = fc.oneof(
  fc.integer({ min: NOW - 400, max: NOW + 400 }).map(String),
  fc.bigInt({ min: -(2n ** 64n), max: 2n ** 64n }).map(String),
  fc.constantFrom('-0', '+1763700000', ' 1763700000', '1763700000.0', '9223372036854775807', '9223372036854775808', ''),
  fc.string({ maxLength: 24 }),
);
const nonceArb = fc.oneof(hex(14, 130), fc.string({ maxLength: 40 }));
const sigArb = fc.oneof(
  hex(64, 64).map((h) => `v1=${h}`),
  fc.stringMatching(/^v[12]=[0-9a-fA-F]{62,66}$/),
  fc.string({ maxLength: 80 }),
);

const docArb = fc.record({
  seq: fc.oneof(fc.nat(), fc.integer({ min: -5, max: -1 }), fc.double(), fc.string({ maxLength: 3 })),
  question: fc.string({ maxLength: 30 }),
  active: fc.oneof(fc.boolean(), fc.constant('true')),
  minSize: fc.oneof(fc.constantFrom('5', '1.', '.5', '1e3', '-1', '0.000000000000000001'), fc.string({ maxLength: 6 })),
}).map((r) => marketDoc(CID, 0, r));

const ingestBodyArb: fc.Arbitrary<Buffer> = fc.oneof(
  fc.uint8Array({ maxLength: 300 }).map((u) => Buffer.from(u)),
  fc.json({ maxDepth: 3 }).map((j) => Buffer.from(j, 'utf8')),
  // Well-formed envelopes around valid and invalid documents, signed by the feed key.
  docArb.map((doc) => Buffer.from(JSON.stringify({ conditionId: CID, ...envelopeFor(doc, FEED) }))),
  // Envelopes with random fields.
  fc.record({
    conditionId: fc.oneof(fc.constant(CID), fc.string({ maxLength: 10 })),
    d: fc.oneof(fc.base64String({ maxLength: 60 }), fc.string({ maxLength: 60 }), fc.constant(envelopeFor(marketDoc(CID, 1), FEED).d)),
    s: fc.oneof(hex(128, 128), hex(126, 130), fc.constant(envelopeFor(marketDoc(CID, 1), FEED).s)),
    k: fc.oneof(fc.constant('ed25519-sha256'), fc.string({ maxLength: 16 })),
  }, { requiredKeys: [] }).map((o) => Buffer.from(JSON.stringify(o))),
);

const orderBodyArb: fc.Arbitrary<Buffer> = fc.oneof(
  fc.uint8Array({ maxLength: 200 }).map((u) => Buffer.from(u)),
  fc.json({ maxDepth: 2 }).map((j) => Buffer.from(j, 'utf8')),
  fc.record({
    marketId: fc.oneof(fc.constant(CID), fc.constant('0xother'), fc.string({ maxLength: 10 }), fc.integer()),
    deadline: fc.oneof(
      fc.integer({ min: NOW - 10, max: NOW + 86_410 }),
      fc.double(),
      fc.constantFrom(NOW, NOW + 1, NOW + 86_400, NOW + 86_401, 2 ** 53, -1),
      fc.string({ maxLength: 12 }),
    ),
    size: fc.oneof(
      fc.constantFrom('5', '1000', '4.999999999999999999', '1000.000000000000000001', '0', '0.0', '1e3', '-1', '25.5', '10.0000000000000000001'),
      fc.stringMatching(/^[0-9]{1,5}(\.[0-9]{1,20})?$/),
      fc.string({ maxLength: 8 }),
      fc.double(),
    ),
    payload: fc.oneof(
      fc.uint8Array({ minLength: 0, maxLength: 64 }).map((u) => Buffer.from(u).toString('base64')),
      fc.base64String({ maxLength: 40 }),
      fc.string({ maxLength: 40 }),
      fc.constant(Buffer.alloc(PAYLOAD_MAX + 1).toString('base64')),
    ),
  }, { requiredKeys: [] }).map((o) => Buffer.from(JSON.stringify(o))),
);

const routeArb = fc.oneof(
  fc.constantFrom(
    ['POST', PATHS.ingest], ['POST', `${PATHS.ingest}?x=1`], ['POST', PATHS.orders], ['GET', PATHS.ingest], ['GET', '/'],
    ['GET', '/healthz'], ['GET', '/v1/markets?limit=5'], ['PUT', PATHS.orders], ['post', PATHS.ingest], ['POST', `${PATHS.orders}/`],
    ['GET', PATHS.geoblock], ['HEAD', PATHS.geoblock], ['POST', PATHS.geoblock], ['GET', `${PATHS.geoblock}?ip=1.2.3.4`],
  ),
  fc.tuple(fc.string({ maxLength: 8 }), fc.string({ maxLength: 30 })),
);

const VALID_DOC_BODY = fc.nat({ max: 1000 }).map((seq) => Buffer.from(JSON.stringify({ conditionId: CID, ...envelopeFor(marketDoc(CID, seq), FEED) })));
const VALID_ORDER_BODY = fc.record({
  deadline: fc.integer({ min: NOW + 1, max: NOW + 86_400 }),
  size: fc.constantFrom('5', '25.5', '1000', '999.999999999999999999'),
  payload: fc.uint8Array({ minLength: 1, maxLength: 64 }).map((u) => Buffer.from(u).toString('base64')),
}).map((o) => Buffer.from(JSON.stringify({ marketId: CID, ...o })));

/** Mostly-valid parts with random ones mixed in, so every layer of every route is reached. */
const randomRequestArb = fc.record({
  route: routeArb,
  ts: fc.oneof({ weight: 2, arbitrary: fc.integer({ min: NOW - 300, max: NOW + 300 }).map(String) }, { weight: 1, arbitrary: tsArb }),
  nonce: fc.oneof({ weight: 2, arbitrary: hex(16, 128) }, { weight: 1, arbitrary: nonceArb }),
  sig: sigArb,
  signCorrectly: fc.oneof({ weight: 2, arbitrary: fc.constant(true) }, { weight: 1, arbitrary: fc.constant(false) }),
  body: fc.oneof(
    { weight: 2, arbitrary: VALID_DOC_BODY },
    { weight: 2, arbitrary: VALID_ORDER_BODY },
    { weight: 2, arbitrary: ingestBodyArb },
    { weight: 2, arbitrary: orderBodyArb },
    { weight: 1, arbitrary: fc.constant(undefined) },
  ),
  bodyAsString: fc.boolean(),
  extra: fc.dictionary(fc.string({ minLength: 1, maxLength: 12 }).filter((k) => k !== '__proto__'), fc.string({ maxLength: 20 }), { maxKeys: 4 }),
  drop: fc.oneof({ weight: 3, arbitrary: fc.constant([] as string[]) }, { weight: 1, arbitrary: fc.subarray(['x-edge-timestamp', 'x-edge-nonce', 'x-edge-signature']) }),
});

// ---------------------------------------------------------------------------------------
// Properties
// ---------------------------------------------------------------------------------------
test('property – random CheckRequests (3000): never throws, never ≥ 500, never an unauthenticated ingest allowed', async () => {
  const stats: Stats = { runs: 0, allowedIngest: 0, allowedOrder: 0, decodeErrors: 0 };
  await fc.assert(
    fc.asyncProperty(randomRequestArb, async (r) => {
      const [method, path] = r.route;
      const body = r.body;
      const headers: Record<string, string> = { ...r.extra, 'x-edge-timestamp': r.ts, 'x-edge-nonce': r.nonce, 'x-edge-signature': r.sig };
      if (r.signCorrectly) {
        headers['x-edge-signature'] = signIngest(r.ts, r.nonce, body ?? Buffer.alloc(0));
      }
      for (const h of r.drop) delete headers[h];
      const spec: CheckSpec = { method, path, headers, bodyAsString: r.bodyAsString, ...(body === undefined ? {} : { body }) };
      await check(encodeCheckRequest(spec), stats);
    }),
    { numRuns: 3000 },
  );
  assert.ok(stats.runs >= 3000, `ran ${stats.runs}`);
  assert.ok(stats.allowedIngest > 0, 'the generators reach accepted ingests too');
  assert.ok(stats.allowedOrder > 0, 'the generators reach accepted orders too');
});

const validIngest = (() => {
  const body = Buffer.from(JSON.stringify({ conditionId: CID, ...envelopeFor(marketDoc(CID, 3), FEED) }));
  const ts = String(NOW - 17);
  const nonce = '0123456789abcdef0123456789abcdef';
  const sig = signIngest(ts, nonce, body);
  return { body, ts, nonce, sig };
})();

const specOf = (v: typeof validIngest): CheckSpec => ({
  method: 'POST', path: PATHS.ingest, body: v.body,
  headers: { 'x-edge-timestamp': v.ts, 'x-edge-nonce': v.nonce, 'x-edge-signature': v.sig, 'x-edge-client-ip': '192.0.2.1' },
});

function flipChar(s: string, i: number, x: number): string {
  const at = i % s.length;
  return s.slice(0, at) + String.fromCharCode(s.charCodeAt(at) ^ x) + s.slice(at + 1);
}

test('property – mutations of a valid signed ingest (3000): no allow unless both signatures still verify', async () => {
  const stats: Stats = { runs: 0, allowedIngest: 0, allowedOrder: 0, decodeErrors: 0 };
  // Precondition: the unmutated request is accepted.
  await check(encodeCheckRequest(specOf(validIngest)), stats);
  assert.equal(stats.allowedIngest, 1);

  const target = fc.constantFrom('body', 'signature', 'nonce', 'timestamp', 'wire', 'envelope-d', 'envelope-s');
  await fc.assert(
    fc.asyncProperty(target, fc.nat(), fc.integer({ min: 1, max: 255 }), async (what, i, x) => {
      const v = { ...validIngest };
      if (what === 'body') {
        const b = Buffer.from(v.body);
        b[i % b.length] = b[i % b.length]! ^ x;
        v.body = b;
      } else if (what === 'signature') v.sig = flipChar(v.sig, i, x);
      else if (what === 'nonce') v.nonce = flipChar(v.nonce, i, x);
      else if (what === 'timestamp') v.ts = flipChar(v.ts, i, x);
      else if (what === 'envelope-d' || what === 'envelope-s') {
        // Re-sign the HMAC so only the Ed25519 layer is under test.
        const o = JSON.parse(v.body.toString()) as Record<string, string>;
        if (what === 'envelope-d') {
          const doc = Buffer.from(o['d']!, 'base64');
          doc[i % doc.length] = doc[i % doc.length]! ^ x;
          o['d'] = doc.toString('base64');
        } else {
          o['s'] = flipChar(o['s']!, i, x);
        }
        v.body = Buffer.from(JSON.stringify(o));
        v.sig = signIngest(v.ts, v.nonce, v.body);
      }
      let wire = encodeCheckRequest(specOf(v));
      if (what === 'wire') {
        wire = Buffer.from(wire);
        wire[i % wire.length] = wire[i % wire.length]! ^ x;
      }
      await check(wire, stats, what === 'wire');
    }),
    { numRuns: 3000 },
  );
  assert.ok(stats.runs >= 3001, `ran ${stats.runs}`);
  assert.ok(stats.decodeErrors > 0, 'some wire corruptions were caught by the decoder');
});

test('property – random order envelopes on POST /v1/orders (2000): 4xx or an allow the oracle agrees with, never ≥ 500', async () => {
  const stats: Stats = { runs: 0, allowedIngest: 0, allowedOrder: 0, decodeErrors: 0 };
  await fc.assert(
    fc.asyncProperty(fc.oneof(orderBodyArb, VALID_ORDER_BODY), fc.boolean(), async (body, asString) => {
      const wire = encodeCheckRequest({ method: 'POST', path: PATHS.orders, body, bodyAsString: asString, headers: { 'x-edge-client-ip': '192.0.2.1' } });
      await check(wire, stats);
      const d = await evaluate(decodeCheckRequest(wire), deps());
      assert.ok(d.allow || [400, 404, 409, 422].includes(d.httpStatus), `unexpected ${d.httpStatus} ${d.code}`);
      if (orderValid(decodeCheckRequest(wire).body)) assert.equal(d.allow, true, `the oracle accepts but the stage refused: ${d.reason}`);
    }),
    { numRuns: 2000 },
  );
  assert.ok(stats.runs >= 2000, `ran ${stats.runs}`);
  assert.ok(stats.allowedOrder > 0);
});

test('property – strict base64: strictBase64Length, the published pattern (PATTERN.strictBase64) and Node\'s canonical round trip agree (1000)', () => {
  const b64ish = fc.string({ unit: fc.constantFrom(...'AQgwBEIMRZcs09+/=-_ \n'.split('')), maxLength: 16 });
  const canonical = fc.uint8Array({ minLength: 1, maxLength: 64 }).map((u) => Buffer.from(u).toString('base64'));
  const pattern = new RegExp(PATTERN.strictBase64);
  let runs = 0;
  let accepted = 0;
  fc.assert(
    fc.property(fc.oneof(b64ish, canonical, fc.string({ maxLength: 12 })), (s) => {
      runs++;
      const len = strictBase64Length(s);
      if (len >= 0) accepted++;
      // The oracle: Node decodes leniently, so strict = re-encoding gives back exactly `s`.
      const bytes = Buffer.from(s, 'base64');
      const expected = s !== '' && bytes.toString('base64') === s ? bytes.length : -1;
      assert.equal(len, expected, JSON.stringify(s));
      assert.equal(pattern.test(s), expected >= 0, `pattern vs code: ${JSON.stringify(s)}`);
      assert.deepEqual(decodeStrictBase64(s), expected >= 0 ? bytes : undefined);
    }),
    { numRuns: 1000 },
  );
  assert.ok(runs >= 1000, `ran ${runs}`);
  assert.ok(accepted > 0 && accepted < runs, 'both outcomes exercised');
});

test('property – geo classifier on a real database (1000): never throws; every IPv4-mapped spelling gets the IPv4 verdict', () => {
  const db = new GeoDatabase(geoFixtures().geoip2);
  const classifyGeo = createGeoClassifier({
    blockedCountries: new Set(['KP', 'CU', 'IR']), blockedRegions: new Set(['CA-ON']), geoUnknown: 'block', geoTrustedCidrs: ['127.0.0.0/8', '::1/128'],
  }, db);
  const VERDICTS = new Set(['trusted', 'allowed', 'blocked_country', 'blocked_region', 'unknown_blocked', 'unknown_allowed']);
  const docV4 = fc.tuple(fc.constantFrom('198.51.100', '203.0.113', '192.0.2', '127.0.0'), fc.nat(255)).map(([n, h]) => `${n}.${h}`);
  const v4 = fc.oneof(docV4, fc.ipV4());
  const anyAddress = fc.oneof(v4, fc.ipV6(), fc.ipV4Extended(), fc.string({ maxLength: 45 }), fc.string({ unit: fc.constantFrom(...'0123456789abcdefABCDEF:.[]%'.split('')), maxLength: 45 }));
  const seen = new Set<string>();
  try {
    fc.assert(
      fc.property(anyAddress, v4, (any, a) => {
        assert.ok(VERDICTS.has(classifyGeo(any).verdict), any);
        const verdict = classifyGeo(a).verdict;
        seen.add(verdict);
        const [w = 0, x = 0, y = 0, z = 0] = a.split('.').map(Number);
        const hexForm = `${((w << 8) | x).toString(16)}:${((y << 8) | z).toString(16)}`;
        for (const form of [`::ffff:${a}`, `::FFFF:${a}`, `[::ffff:${a}]`, `0:0:0:0:0:ffff:${a}`, `::ffff:${hexForm}`, `0000:0000:0000:0000:0000:ffff:${hexForm}`]) {
          assert.equal(classifyGeo(form).verdict, verdict, `${form} vs ${a}`);
        }
      }),
      { numRuns: 1000 },
    );
  } finally {
    db.close();
  }
  for (const v of ['trusted', 'allowed', 'blocked_country', 'blocked_region', 'unknown_blocked']) assert.ok(seen.has(v), `verdict ${v} exercised`);
});
