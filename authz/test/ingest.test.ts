/**
 * Ingest policy (docs/api.md "POST /internal/ingest/market", docs/api.md "POST /internal/ingest/market") at every boundary, with a fixed clock and the
 * in-memory nonce store: headers → window → HMAC → nonce → envelope → Ed25519 → document.
 */
import { HmacSha256Key } from '../src/common/crypto/hmac.ts';
import { ingestMac } from '../src/common/crypto/ingest-signer.ts';
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createHash, createHmac, randomBytes, sign } from 'node:crypto';
import { ALLOW, type Decision } from '../src/authz/decision.ts';
import { ERROR_STATUS } from '../src/common/errors.ts';
import { MemoryNonceStore } from '../src/common/adapters/nonce-store.ts';
import { checkIngestSignature, ingestStage, parseTimestamp, type IngestDeps, type IngestRequest } from '../src/authz/stages/ingest.ts';
import type { NonceResult, NonceStore } from '../src/common/ports.ts';
import { envelopeFor, marketDoc, newFeedKey, type FeedKey } from '../../testkit/feed.ts';
import { fixedClock, HMAC_KEY } from './helpers.ts';

const NOW = 1763700000;
const CID = '0xingest-market-1';
const FEED1 = newFeedKey();
const FEED2 = newFeedKey();
const STRANGER = newFeedKey();
const PREVIOUS_KEY = Buffer.from('the previous ingest key, still valid during rotation', 'utf8');

type Code = Decision['code'];

function makeDeps(over: Partial<IngestDeps> = {}): IngestDeps & { nonces: NonceStore } {
  const clock = fixedClock(NOW);
  return {
    hmacKeys: [new HmacSha256Key(HMAC_KEY), new HmacSha256Key(PREVIOUS_KEY)],
    feedKeys: [FEED1.publicKey, FEED2.publicKey],
    nonces: new MemoryNonceStore(() => clock.nowMs()),
    clock,
    replayWindowSecs: 300,
    nonceTtlSecs: 600,
    ...over,
  };
}

const freshNonce = (): string => randomBytes(16).toString('hex');

function mac(key: Buffer, ts: string, nonce: string, body: Buffer): string {
  return ingestMac(new HmacSha256Key(key), ts, nonce, body).toString('hex');
}

/** A correctly signed ingest request; any header can be overridden afterwards. */
function signed(body: Buffer, o: { ts?: string; nonce?: string; key?: Buffer } = {}): IngestRequest {
  const ts = o.ts ?? String(NOW);
  const nonce = o.nonce ?? freshNonce();
  return { timestamp: ts, nonce, signature: `v1=${mac(o.key ?? HMAC_KEY, ts, nonce, body)}`, body };
}

function validBody(doc: Record<string, unknown> = marketDoc(CID, 7), key: FeedKey = FEED1): Buffer {
  return Buffer.from(JSON.stringify({ conditionId: CID, ...envelopeFor(doc, key) }), 'utf8');
}

/** `n` arrays inside each other. */
function nested(n: number): unknown {
  return JSON.parse('['.repeat(n) + ']'.repeat(n)) as unknown;
}

const codeOf = (d: Decision | undefined): Code => (d === undefined ? 'ok' : d.code);

function assertDecision(d: Decision, code: Code): void {
  assert.equal(d.code, code, `expected ${code}, got ${d.code} (${d.reason})`);
  if (code === 'ok') {
    assert.equal(d, ALLOW);
    return;
  }
  assert.equal(d.allow, false);
  assert.equal(d.httpStatus, ERROR_STATUS[code]);
  const body = JSON.parse(d.body) as { error: string; message: string };
  assert.equal(body.error, code);
  assert.equal(typeof body.message, 'string');
  assert.ok(d.headers.some(([k, v]) => k === 'content-type' && v === 'application/json'));
}

const BODY = validBody();

// ---------------------------------------------------------------------------------------
// X-Edge-Timestamp: format, int64 range, ±REPLAY_WINDOW_SECS (the HMAC covers it as sent).
// ---------------------------------------------------------------------------------------
const timestamps: Record<string, [ts: string, expected: Code]> = {
  'now': [String(NOW), 'ok'],
  'now + 300 (edge of window)': [String(NOW + 300), 'ok'],
  'now - 300 (edge of window)': [String(NOW - 300), 'ok'],
  'now + 301': [String(NOW + 301), 'timestamp expired'],
  'now - 301': [String(NOW - 301), 'timestamp expired'],
  'leading zeros, inside the window': [`000${NOW}`, 'ok'],
  'non-integer 1763700000.0': [`${NOW}.0`, 'unauthorized'],
  'non-integer 1763700000.5': [`${NOW}.5`, 'unauthorized'],
  'exponent 1.7637e9': ['1.7637e9', 'unauthorized'],
  'leading +': [`+${NOW}`, 'unauthorized'],
  'leading space': [` ${NOW}`, 'unauthorized'],
  'trailing space': [`${NOW} `, 'unauthorized'],
  'trailing newline': [`${NOW}\n`, 'unauthorized'],
  'tab inside': [`1763\t700000`, 'unauthorized'],
  'empty': ['', 'unauthorized'],
  'hex 0x…': ['0x69200a20', 'unauthorized'],
  'milliseconds (13 digits) far outside the window': [String(NOW * 1000), 'timestamp expired'],
  '19 digits inside int64': ['1000000000000000000', 'timestamp expired'],
  'int64 max 9223372036854775807': ['9223372036854775807', 'timestamp expired'],
  'int64 min -9223372036854775808': ['-9223372036854775808', 'timestamp expired'],
  'int64 max + 1 (overflow)': ['9223372036854775808', 'unauthorized'],
  'int64 min - 1 (overflow)': ['-9223372036854775809', 'unauthorized'],
  '19 nines (overflow)': ['9999999999999999999', 'unauthorized'],
  '20 digits': ['10000000000000000000', 'unauthorized'],
  '-0': ['-0', 'timestamp expired'],
  '0': ['0', 'timestamp expired'],
  'a lone minus': ['-', 'unauthorized'],
  'Unicode digits (Arabic-Indic)': ['١٧٦٣٧٠٠٠٠٠', 'unauthorized'],
};

for (const [name, [ts, expected]] of Object.entries(timestamps)) {
  test(`ingest timestamp – ${name} → ${expected}`, async () => {
    const deps = makeDeps();
    const req = signed(BODY, { ts });
    assert.equal(codeOf(checkIngestSignature(req, deps, NOW)), expected);
    // Through the whole stage too (an 'ok' here means the request is allowed).
    assertDecision(await ingestStage(req, deps), expected);
  });
}

test('ingest timestamp – parseTimestamp keeps -0 as zero and refuses what the regex refuses', () => {
  assert.equal(Math.abs(parseTimestamp('-0') ?? NaN), 0);
  assert.equal(parseTimestamp('9223372036854775807'), 2 ** 63);
  assert.equal(parseTimestamp('9223372036854775808'), undefined);
  assert.equal(parseTimestamp('+1'), undefined);
});

// ---------------------------------------------------------------------------------------
// X-Edge-Nonce: ^[0-9a-fA-F]{16,128}$
// ---------------------------------------------------------------------------------------
const nonces: Record<string, [nonce: string, expected: Code]> = {
  '15 hex chars': ['a'.repeat(15), 'unauthorized'],
  '16 hex chars': ['0123456789abcdef', 'ok'],
  '128 hex chars': ['f'.repeat(128), 'ok'],
  '129 hex chars': ['f'.repeat(129), 'unauthorized'],
  'upper-case hex': ['0123456789ABCDEF', 'ok'],
  'non-hex letter g': ['0123456789abcdeg', 'unauthorized'],
  'UUID with dashes': ['4b1c1a9e-3f0e-4a53-9d4e-7a3b2f1e0c11', 'unauthorized'],
  'base64-ish': ['AAAAAAAAAAAAAAAAAAAA+/==', 'unauthorized'],
  'trailing space': ['0123456789abcdef ', 'unauthorized'],
  'empty': ['', 'unauthorized'],
  'contains a dot (message separator)': ['01234567.89abcdef', 'unauthorized'],
};

for (const [name, [nonce, expected]] of Object.entries(nonces)) {
  test(`ingest nonce – ${name} → ${expected}`, async () => {
    const deps = makeDeps();
    const req = signed(BODY, { nonce });
    assert.equal(codeOf(checkIngestSignature(req, deps, NOW)), expected);
    assertDecision(await ingestStage(req, deps), expected);
  });
}

// ---------------------------------------------------------------------------------------
// X-Edge-Signature: v1= + 64 hex (either case); HMAC over ts.nonce.body; rotation key.
// ---------------------------------------------------------------------------------------
const N = '00112233445566778899aabbccddeeff';
const GOOD = mac(HMAC_KEY, String(NOW), N, BODY);
const signatures: Record<string, [signature: string, expected: Code]> = {
  'correct': [`v1=${GOOD}`, 'ok'],
  'correct, upper-case hex': [`v1=${GOOD.toUpperCase()}`, 'ok'],
  'correct, mixed-case hex': [`v1=${GOOD.slice(0, 32).toUpperCase()}${GOOD.slice(32)}`, 'ok'],
  '63 hex chars': [`v1=${GOOD.slice(0, 63)}`, 'unauthorized'],
  '65 hex chars': [`v1=${GOOD}0`, 'unauthorized'],
  'missing v1= prefix': [GOOD, 'unauthorized'],
  'v2= prefix (no downgrade/upgrade)': [`v2=${GOOD}`, 'unauthorized'],
  'V1= prefix': [`V1=${GOOD}`, 'unauthorized'],
  'v1: prefix': [`v1:${GOOD}`, 'unauthorized'],
  'space after v1=': [`v1= ${GOOD.slice(1)}`, 'unauthorized'],
  'two signatures (not supported)': [`v1=${GOOD},v1=${GOOD}`, 'unauthorized'],
  'base64 instead of hex': [`v1=${Buffer.from(GOOD, 'hex').toString('base64')}`, 'unauthorized'],
  'wrong HMAC, well-formed': [`v1=${GOOD.slice(0, 63)}${GOOD.endsWith('0') ? '1' : '0'}`, 'unauthorized'],
  'all zeros': [`v1=${'0'.repeat(64)}`, 'unauthorized'],
  'HMAC under a third key': [`v1=${mac(Buffer.alloc(32, 7), String(NOW), N, BODY)}`, 'unauthorized'],
  'HMAC under the previous (rotation) key': [`v1=${mac(PREVIOUS_KEY, String(NOW), N, BODY)}`, 'ok'],
  'HMAC over body only (no ts.nonce.)': [`v1=${createHmac('sha256', HMAC_KEY).update(BODY).digest('hex')}`, 'unauthorized'],
  'HMAC over ts.body (Stripe layout, no nonce)': [`v1=${createHmac('sha256', HMAC_KEY).update(`${NOW}.`).update(BODY).digest('hex')}`, 'unauthorized'],
  'HMAC with another separator (ts:nonce:body)': [`v1=${createHmac('sha256', HMAC_KEY).update(`${NOW}:${N}:`).update(BODY).digest('hex')}`, 'unauthorized'],
  'SHA-256 of the message (no key)': [`v1=${createHash('sha256').update(`${NOW}.${N}.`).update(BODY).digest('hex')}`, 'unauthorized'],
};

for (const [name, [signature, expected]] of Object.entries(signatures)) {
  test(`ingest signature – ${name} → ${expected}`, async () => {
    const deps = makeDeps();
    const req: IngestRequest = { timestamp: String(NOW), nonce: N, signature, body: BODY };
    assert.equal(codeOf(checkIngestSignature(req, deps, NOW)), expected);
    assertDecision(await ingestStage(req, deps), expected);
  });
}

test('ingest signature – the previous key is refused once it is no longer configured', () => {
  const req = signed(BODY, { key: PREVIOUS_KEY });
  assert.equal(codeOf(checkIngestSignature(req, makeDeps(), NOW)), 'ok');
  assert.equal(codeOf(checkIngestSignature(req, makeDeps({ hmacKeys: [new HmacSha256Key(HMAC_KEY)] }), NOW)), 'unauthorized');
});

// ---------------------------------------------------------------------------------------
// Missing headers
// ---------------------------------------------------------------------------------------
const missing: Record<string, keyof IngestRequest> = {
  'X-Edge-Timestamp': 'timestamp',
  'X-Edge-Nonce': 'nonce',
  'X-Edge-Signature': 'signature',
};

for (const [name, field] of Object.entries(missing)) {
  test(`ingest headers – missing ${name} → unauthorized, nothing recorded`, async () => {
    const deps = makeDeps();
    const store = deps.nonces as MemoryNonceStore;
    const req = { ...signed(BODY), [field]: undefined };
    assertDecision(await ingestStage(req, deps), 'unauthorized');
    assert.equal(store.size, 0);
  });
}

test('ingest headers – an absent body is HMAC-checked as empty (then invalid_json)', async () => {
  const deps = makeDeps();
  const req = signed(Buffer.alloc(0));
  assertDecision(await ingestStage({ ...req, body: undefined }, deps), 'invalid_json');
});

// ---------------------------------------------------------------------------------------
// The HMAC covers the raw body bytes, not a string decoding of them.
// ---------------------------------------------------------------------------------------
const binaryBodies: Record<string, Buffer> = {
  'NUL and 0xff bytes': Buffer.from([0x7b, 0x00, 0xff, 0x7d]),
  '0xff byte': Buffer.from([0xff]),
  'invalid UTF-8 (0xc3 0x28)': Buffer.from([0x41, 0xc3, 0x28, 0x42]),
  'lone continuation bytes': Buffer.from([0x80, 0x81, 0xbf]),
  'UTF-16 BOM then text': Buffer.concat([Buffer.from([0xff, 0xfe]), Buffer.from('{"a":1}', 'utf16le')]),
  'overlong encoding of /': Buffer.from([0xc0, 0xaf]),
  'all 256 byte values': Buffer.from(Array.from({ length: 256 }, (_, i) => i)),
};

for (const [name, body] of Object.entries(binaryBodies)) {
  test(`ingest HMAC over raw bytes – ${name}: verifies; a string-decoded body would not`, () => {
    const deps = makeDeps();
    assert.equal(codeOf(checkIngestSignature(signed(body), deps, NOW)), 'ok');
    assert.equal(codeOf(checkIngestSignature(signed(Buffer.concat([body, Buffer.from([0])])), deps, NOW)), 'ok', 'with a trailing NUL too');
    // What a server that did body.toString() before hashing would have produced:
    const reencoded = Buffer.from(body.toString('utf8'), 'utf8');
    assert.notDeepEqual(reencoded, body, 'precondition: the body does not survive a UTF-8 round trip');
    const nonce = freshNonce();
    const wrong: IngestRequest = { timestamp: String(NOW), nonce, signature: `v1=${mac(HMAC_KEY, String(NOW), nonce, reencoded)}`, body };
    assert.equal(codeOf(checkIngestSignature(wrong, deps, NOW)), 'unauthorized');
  });
}

// ---------------------------------------------------------------------------------------
// Order of checks and the nonce store
// ---------------------------------------------------------------------------------------
test('ingest order – window is checked before the HMAC (expired + wrong HMAC → timestamp expired)', () => {
  const req = { ...signed(BODY, { ts: String(NOW - 1000) }), signature: `v1=${'0'.repeat(64)}` };
  assert.equal(codeOf(checkIngestSignature(req, makeDeps(), NOW)), 'timestamp expired');
});

test('ingest order – the HMAC is checked before the envelope (wrong HMAC + bad body → unauthorized)', async () => {
  const deps = makeDeps();
  const req = { ...signed(Buffer.from('not json')), signature: `v1=${'0'.repeat(64)}` };
  assertDecision(await ingestStage(req, deps), 'unauthorized');
});

test('ingest nonce – recorded only after the HMAC verified (bad HMAC → store empty)', async () => {
  const deps = makeDeps();
  const store = deps.nonces as MemoryNonceStore;
  const req = signed(BODY);
  assertDecision(await ingestStage({ ...req, signature: `v1=${'a'.repeat(64)}` }, deps), 'unauthorized');
  assertDecision(await ingestStage({ ...req, timestamp: String(NOW - 301) }, deps), 'timestamp expired');
  assert.equal(store.size, 0);
  // The genuine request with the same nonce is then still accepted: nobody burnt it.
  assertDecision(await ingestStage(req, deps), 'ok');
  assert.equal(store.size, 1);
});

test('ingest nonce – replay of an accepted request → ingest_replay', async () => {
  const deps = makeDeps();
  const req = signed(BODY);
  assertDecision(await ingestStage(req, deps), 'ok');
  assertDecision(await ingestStage(req, deps), 'ingest_replay');
});

test('ingest nonce – same nonce, new timestamp and new valid HMAC → still ingest_replay', async () => {
  const deps = makeDeps();
  const nonce = freshNonce();
  assertDecision(await ingestStage(signed(BODY, { nonce }), deps), 'ok');
  assertDecision(await ingestStage(signed(BODY, { nonce, ts: String(NOW + 5) }), deps), 'ingest_replay');
});

test('ingest nonce – case-folded: the same nonce in upper case is a replay', async () => {
  const deps = makeDeps();
  const nonce = 'abcdef0123456789abcdef0123456789';
  assertDecision(await ingestStage(signed(BODY, { nonce }), deps), 'ok');
  assertDecision(await ingestStage(signed(BODY, { nonce: nonce.toUpperCase() }), deps), 'ingest_replay');
  assertDecision(await ingestStage(signed(BODY, { nonce: 'ABCDEF0123456789abcdef0123456789' }), deps), 'ingest_replay');
});

test('ingest nonce – stays recorded when a later check fails (bad envelope, then a retry is a replay)', async () => {
  const deps = makeDeps();
  const store = deps.nonces as MemoryNonceStore;
  const req = signed(Buffer.from('{"conditionId":"x"}'));
  assertDecision(await ingestStage(req, deps), 'invalid_envelope');
  assert.equal(store.size, 1);
  assertDecision(await ingestStage(req, deps), 'ingest_replay');
});

test('ingest nonce – handed to the store lower-cased with NONCE_TTL_SECS', async () => {
  const calls: [string, number][] = [];
  const spy: NonceStore = {
    recordIfAbsent(n, ttl): Promise<NonceResult> {
      calls.push([n, ttl]);
      return Promise.resolve('recorded');
    },
  };
  assertDecision(await ingestStage(signed(BODY, { nonce: 'ABCDEF0123456789' }), makeDeps({ nonces: spy, nonceTtlSecs: 600 })), 'ok');
  assert.deepEqual(calls, [['abcdef0123456789', 600]]);
});

test('ingest nonce – retention: a replay inside 600 s, accepted again after it', async () => {
  const clock = fixedClock(NOW);
  const store = new MemoryNonceStore(() => clock.nowMs());
  const deps = makeDeps({ clock, nonces: store });
  const nonce = freshNonce();
  assertDecision(await ingestStage(signed(BODY, { nonce, ts: String(NOW) }), deps), 'ok');
  clock.set(NOW + 599);
  assertDecision(await ingestStage(signed(BODY, { nonce, ts: String(NOW + 599) }), deps), 'ingest_replay');
  clock.set(NOW + 601);
  assertDecision(await ingestStage(signed(BODY, { nonce, ts: String(NOW + 601) }), deps), 'ok');
});

// A nonce is remembered for as long as its timestamp can still pass the window, i.e. until
// ts + REPLAY_WINDOW_SECS has passed, whatever NONCE_TTL_SECS says: recorded with
// ttl = max(nonceTtlSecs, ts + replayWindowSecs + 1 - now). A request stamped at the future
// edge (ts = now + 300) stays inside the window until now + 600, exactly when a 600 s nonce
// would expire; and a NONCE_TTL_SECS below the window (loadConfig refuses < 2 × window, see
// config.test.ts) must not reopen a replay window.
const retention: Record<string, [ttl: number, tsOffset: number, replayAfter: number, expected: Code]> = {
  'ts = now, replayed 300 s later (last second of the window)': [600, 0, 300, 'ingest_replay'],
  'ts = now, replayed 301 s later (window closed)': [600, 0, 301, 'timestamp expired'],
  'ts = now - 300, replayed at once': [600, -300, 0, 'ingest_replay'],
  'ts = now + 300, replayed 599 s later': [600, 300, 599, 'ingest_replay'],
  'ts = now + 300, replayed 600 s later (still inside the window: kept past NONCE_TTL_SECS)': [600, 300, 600, 'ingest_replay'],
  'ts = now + 300, replayed 601 s later (window closed)': [600, 300, 601, 'timestamp expired'],
  'NONCE_TTL_SECS=60, ts = now, replayed 61 s later (kept for the window, not the TTL)': [60, 0, 61, 'ingest_replay'],
};

for (const [name, [ttl, tsOffset, replayAfter, expected]] of Object.entries(retention)) {
  test(`ingest nonce retention – ${name} → ${expected}`, async () => {
    const clock = fixedClock(NOW);
    const deps = makeDeps({ clock, nonces: new MemoryNonceStore(() => clock.nowMs()), nonceTtlSecs: ttl });
    const req = signed(BODY, { ts: String(NOW + tsOffset) });
    assertDecision(await ingestStage(req, deps), 'ok');
    clock.set(NOW + replayAfter);
    assertDecision(await ingestStage(req, deps), expected);
  });
}

const failingStores: Record<string, NonceStore> = {
  'rejects (Redis unreachable)': { recordIfAbsent: () => Promise.reject(new Error('ECONNREFUSED')) },
  'throws synchronously': { recordIfAbsent: () => { throw new Error('client closed'); } },
  'rejects after a delay (command timeout)': {
    recordIfAbsent: () => new Promise((_, rej) => setTimeout(() => rej(new Error('timeout')), 5)),
  },
};

for (const [name, store] of Object.entries(failingStores)) {
  test(`ingest nonce store down – ${name} → 503 service_unavailable, reported, content never checked`, async () => {
    const errors: unknown[] = [];
    const deps = makeDeps({ nonces: store, onStoreError: (e) => errors.push(e) });
    const d = await ingestStage(signed(BODY), deps);
    assertDecision(d, 'service_unavailable');
    assert.equal(d.httpStatus, 503);
    assert.equal(errors.length, 1);
  });
}

test('ingest nonce store down – nothing recorded: the same request succeeds once the store is back', async () => {
  const real = new MemoryNonceStore(() => NOW * 1000);
  let up = false;
  const flaky: NonceStore = { recordIfAbsent: (n, t) => (up ? real.recordIfAbsent(n, t) : Promise.reject(new Error('down'))) };
  const deps = makeDeps({ nonces: flaky });
  const req = signed(BODY);
  assertDecision(await ingestStage(req, deps), 'service_unavailable');
  assert.equal(real.size, 0);
  up = true;
  assertDecision(await ingestStage(req, deps), 'ok');
});

// ---------------------------------------------------------------------------------------
// Envelope, Ed25519 and document checks (after a valid HMAC; the nonce stays recorded).
// ---------------------------------------------------------------------------------------
function bodyWith(fields: Record<string, unknown>, drop: string[] = []): Buffer {
  const b: Record<string, unknown> = { conditionId: CID, ...envelopeFor(marketDoc(CID, 7), FEED1), ...fields };
  for (const k of drop) delete b[k];
  return Buffer.from(JSON.stringify(b), 'utf8');
}

/** An envelope for `doc` whose base64 `d` satisfies `pred` (by padding the question). */
function envelopeWhere(pred: (d: string) => boolean): { d: string; s: string; k: string } {
  for (let i = 0; i < 64; i++) {
    const env = envelopeFor(marketDoc(CID, 7, { question: `Will it ??>>~~ ${'x'.repeat(i)}?` }), FEED1);
    if (pred(env.d)) return env;
  }
  throw new Error('no such envelope');
}

function signedDocBody(docBytes: Buffer, key: FeedKey = FEED1, conditionId = CID): Buffer {
  return Buffer.from(JSON.stringify({ conditionId, ...envelopeFor(docBytes, key) }), 'utf8');
}

const docJson = (doc: unknown): Buffer => Buffer.from(JSON.stringify(doc), 'utf8');

const ENV_OK = envelopeFor(marketDoc(CID, 7), FEED1);
const PAD1 = envelopeWhere((d) => d.endsWith('=') && !d.endsWith('=='));
const PLUS_SLASH = envelopeWhere((d) => /[+/]/.test(d));

const envelopeCases: Record<string, [body: Buffer, expected: Code]> = {
  // accepted
  'valid envelope': [BODY, 'ok'],
  'signed by the second feed key in the list': [validBody(marketDoc(CID, 7), FEED2), 'ok'],
  's in upper-case hex': [bodyWith({ s: ENV_OK.s.toUpperCase() }), 'ok'],
  'unknown extra body fields are ignored': [bodyWith({ extra: { nested: true }, note: 'x' }), 'ok'],
  'unknown extra document fields are kept (allowed)': [validBody(marketDoc(CID, 7, { venueNote: 'hi', tags: ['a'] })), 'ok'],
  'document without optional fields': [signedDocBody(docJson({ conditionId: CID, seq: 0, question: 'q', active: true, closed: false, outcomes: [], updatedAt: 0 })), 'ok'],
  // body shape
  'body not JSON': [Buffer.from('conditionId=x&d=y'), 'invalid_json'],
  'body empty': [Buffer.alloc(0), 'invalid_json'],
  'body a JSON array': [Buffer.from(JSON.stringify([{ conditionId: CID, ...ENV_OK }])), 'invalid_json'],
  'body JSON null': [Buffer.from('null'), 'invalid_json'],
  'body a JSON string': [Buffer.from('"hello"'), 'invalid_json'],
  'body a JSON number': [Buffer.from('42'), 'invalid_json'],
  'body truncated JSON': [BODY.subarray(0, BODY.length - 1), 'invalid_json'],
  'missing conditionId': [bodyWith({}, ['conditionId']), 'invalid_envelope'],
  'missing d': [bodyWith({}, ['d']), 'invalid_envelope'],
  'missing s': [bodyWith({}, ['s']), 'invalid_envelope'],
  'missing k': [bodyWith({}, ['k']), 'invalid_envelope'],
  'conditionId not a string': [bodyWith({ conditionId: 7 }), 'invalid_envelope'],
  'conditionId with a space': [bodyWith({ conditionId: 'a b' }), 'invalid_envelope'],
  'conditionId of 129 chars': [bodyWith({ conditionId: 'a'.repeat(129) }), 'invalid_envelope'],
  'conditionId empty': [bodyWith({ conditionId: '' }), 'invalid_envelope'],
  // k
  'k = ed25519': [bodyWith({ k: 'ed25519' }), 'invalid_envelope'],
  'k = ED25519-SHA256': [bodyWith({ k: 'ED25519-SHA256' }), 'invalid_envelope'],
  'k = ed25519-sha512': [bodyWith({ k: 'ed25519-sha512' }), 'invalid_envelope'],
  'k not a string': [bodyWith({ k: ['ed25519-sha256'] }), 'invalid_envelope'],
  // s
  's of 127 hex chars': [bodyWith({ s: ENV_OK.s.slice(0, 127) }), 'invalid_envelope'],
  's of 129 hex chars': [bodyWith({ s: `${ENV_OK.s}0` }), 'invalid_envelope'],
  's of 126 hex chars (63 bytes)': [bodyWith({ s: ENV_OK.s.slice(0, 126) }), 'invalid_envelope'],
  's with a non-hex char': [bodyWith({ s: `${ENV_OK.s.slice(0, 127)}g` }), 'invalid_envelope'],
  's base64-encoded': [bodyWith({ s: Buffer.from(ENV_OK.s, 'hex').toString('base64') }), 'invalid_envelope'],
  's with 0x prefix': [bodyWith({ s: `0x${ENV_OK.s.slice(2)}` }), 'invalid_envelope'],
  's all zeros (128 hex)': [bodyWith({ s: '0'.repeat(128) }), 'invalid_content_signature'],
  's one bit flipped': [bodyWith({ s: ENV_OK.s.slice(0, 10) + (ENV_OK.s[10] === '0' ? '1' : '0') + ENV_OK.s.slice(11) }), 'invalid_content_signature'],
  // d
  'd empty': [bodyWith({ d: '' }), 'invalid_envelope'],
  'd not a string': [bodyWith({ d: 12 }), 'invalid_envelope'],
  'd with padding stripped': [bodyWith({ ...PAD1, d: PAD1.d.replace(/=+$/, '') }), 'invalid_envelope'],
  'd with an extra =': [bodyWith({ ...PAD1, d: `${PAD1.d}=` }), 'invalid_envelope'],
  'd with non-canonical padding bits': [
    bodyWith({ ...PAD1, d: PAD1.d.slice(0, -2) + String.fromCharCode(PAD1.d.charCodeAt(PAD1.d.length - 2) + 1) + '=' }),
    'invalid_envelope',
  ],
  'd in the URL-safe alphabet': [bodyWith({ ...PLUS_SLASH, d: PLUS_SLASH.d.replace(/\+/g, '-').replace(/\//g, '_') }), 'invalid_envelope'],
  'd with MIME line breaks': [bodyWith({ d: ENV_OK.d.replace(/(.{76})/g, '$1\r\n') }), 'invalid_envelope'],
  'd with a trailing newline': [bodyWith({ d: `${ENV_OK.d}\n` }), 'invalid_envelope'],
  'd with spaces in place of padding': [bodyWith({ ...PAD1, d: PAD1.d.replace(/=$/, ' ') }), 'invalid_envelope'],
  // Ed25519
  'signed by an unknown key': [validBody(marketDoc(CID, 7), STRANGER), 'invalid_content_signature'],
  'signature over the raw document, not its SHA-256': [
    bodyWith({ s: sign(null, docJson(marketDoc(CID, 7)), FEED1.privateKey).toString('hex') }),
    'invalid_content_signature',
  ],
  'signature over SHA-256 of another document': [bodyWith({ s: envelopeFor(marketDoc(CID, 8), FEED1).s }), 'invalid_content_signature'],
  'd of another document with the original s': [bodyWith({ d: envelopeFor(marketDoc(CID, 8), FEED1).d }), 'invalid_content_signature'],
  // document
  'document a JSON array': [signedDocBody(Buffer.from('[1,2,3]')), 'invalid_envelope'],
  'document a JSON string': [signedDocBody(Buffer.from('"x"')), 'invalid_envelope'],
  'document not JSON': [signedDocBody(Buffer.from('conditionId=0x')), 'invalid_envelope'],
  'document invalid UTF-8': [signedDocBody(Buffer.concat([Buffer.from(`{"conditionId":"${CID}","question":"`), Buffer.from([0xc3, 0x28]), Buffer.from('"}')])), 'invalid_envelope'],
  'document conditionId differs from the body': [validBody(marketDoc('0xother-market', 7)), 'invalid_envelope'],
  'document conditionId missing': [signedDocBody(docJson({ ...marketDoc(CID, 7), conditionId: undefined })), 'invalid_envelope'],
  'seq negative': [validBody(marketDoc(CID, -1)), 'invalid_envelope'],
  'seq float': [validBody(marketDoc(CID, 1.5)), 'invalid_envelope'],
  'seq a string': [validBody({ ...marketDoc(CID, 7), seq: '7' }), 'invalid_envelope'],
  'seq above MAX_SAFE_INTEGER': [signedDocBody(Buffer.from(JSON.stringify(marketDoc(CID, 7)).replace('"seq":7', '"seq":9007199254740993'))), 'invalid_envelope'],
  'missing question': [signedDocBody(docJson({ ...marketDoc(CID, 7), question: undefined })), 'invalid_envelope'],
  'active a string': [validBody(marketDoc(CID, 7, { active: 'true' })), 'invalid_envelope'],
  "minSize '1.'": [validBody(marketDoc(CID, 7, { minSize: '1.' })), 'invalid_envelope'],
  "minSize '.5'": [validBody(marketDoc(CID, 7, { minSize: '.5' })), 'invalid_envelope'],
  "minSize '1e3'": [validBody(marketDoc(CID, 7, { minSize: '1e3' })), 'invalid_envelope'],
  "minSize '-1'": [validBody(marketDoc(CID, 7, { minSize: '-1' })), 'invalid_envelope'],
  'minSize a number': [validBody(marketDoc(CID, 7, { minSize: 5 })), 'invalid_envelope'],
  "maxSize '1,000'": [validBody(marketDoc(CID, 7, { maxSize: '1,000' })), 'invalid_envelope'],
  'minSize > maxSize': [validBody(marketDoc(CID, 7, { minSize: '10', maxSize: '9.99' })), 'invalid_envelope'],
  "tickSize with 19 fractional digits": [validBody(marketDoc(CID, 7, { tickSize: '0.0000000000000000001' })), 'invalid_envelope'],
  "outcome bid '0.5.1'": [validBody(marketDoc(CID, 7, { outcomes: [{ tokenId: '1', name: 'Yes', bid: '0.5.1' }] })), 'invalid_envelope'],
  'outcome without tokenId': [validBody(marketDoc(CID, 7, { outcomes: [{ name: 'Yes' }] })), 'invalid_envelope'],
  'endTime negative': [validBody(marketDoc(CID, 7, { endTime: -1 })), 'invalid_envelope'],
  'updatedAt a float': [validBody(marketDoc(CID, 7, { updatedAt: 1.5 })), 'invalid_envelope'],
  // nesting: MAX_DOCUMENT_DEPTH (64) levels, the document object being the first
  'an unknown field nesting 64 levels': [validBody(marketDoc(CID, 7, { extra: nested(63) })), 'ok'],
  'an unknown field nesting 65 levels': [validBody(marketDoc(CID, 7, { extra: nested(64) })), 'invalid_envelope'],
  'an unknown field nesting 5,000 levels (past what JSON.stringify can serialise)': [
    signedDocBody(Buffer.from(`${JSON.stringify(marketDoc(CID, 7)).slice(0, -1)},"extra":${'['.repeat(4999)}${']'.repeat(4999)}}`)),
    'invalid_envelope',
  ],
};

for (const [name, [body, expected]] of Object.entries(envelopeCases)) {
  test(`ingest envelope – ${name} → ${expected}`, async () => {
    const deps = makeDeps();
    const store = deps.nonces as MemoryNonceStore;
    assertDecision(await ingestStage(signed(body), deps), expected);
    // The HMAC was valid, so the nonce is recorded whatever the content check said.
    assert.equal(store.size, 1);
  });
}

test('ingest envelope – precondition: the crafted d values really have the intended shape', () => {
  assert.ok(PAD1.d.endsWith('=') && !PAD1.d.endsWith('=='));
  assert.ok(/[+/]/.test(PLUS_SLASH.d));
  assert.ok(ENV_OK.d.length > 76);
});
