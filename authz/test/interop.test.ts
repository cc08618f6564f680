/**
 * Interop (docs/api.md "POST /internal/ingest/market"): a feed producer that signs with tweetnacl —
 * `nacl.sign.detached(sha256(document), secretKey)` — is accepted by the consumer
 * (verifyEnvelopeSignature / checkIngestContent / the whole pipeline), keys configured in
 * every documented form; and an HMAC computed by an independent implementation (Python's
 * hmac module) verifies. Tampering with one byte of the document, of `s`, or of the
 * HMAC'd body fails with the right code.
 */
import { HmacSha256Key } from '../src/common/crypto/hmac.ts';
import { ingestSigner } from '../src/common/crypto/ingest-signer.ts';
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { createHash, createHmac, randomBytes } from 'node:crypto';
import { fileURLToPath } from 'node:url';
import nacl from 'tweetnacl';
import { MemoryNonceStore } from '../src/common/adapters/nonce-store.ts';
import { loadCredentials, parseHmacKey } from '../src/common/credentials.ts';
import { ALLOW, geoDenial, type Decision } from '../src/authz/decision.ts';
import { GEO_TRUSTED } from '../src/authz/stages/geo.ts';
import { decodeCheckRequest } from '../src/authz/codec/request.ts';
import { verifyEnvelopeSignature } from '../src/common/feed/envelope.ts';
import { PATHS } from '../src/common/contract.ts';
import { evaluate, type PipelineDeps } from '../src/authz/pipeline.ts';
import { checkIngestContent } from '../src/authz/stages/ingest.ts';
import { encodeCheckRequest } from '../../testkit/check-request.ts';
import { fakeMarkets, fixedClock } from './helpers.ts';
import { marketDoc } from '../../testkit/feed.ts';

const NOW = 1763700000;
const CID = '0xinterop-market';
const SEED = new Uint8Array(createHash('sha256').update('interop test seed').digest());
const KP = nacl.sign.keyPair.fromSeed(SEED);
const OTHER = nacl.sign.keyPair();
const sha256 = (b: Uint8Array): Uint8Array => new Uint8Array(createHash('sha256').update(b).digest());

/** The producer, written only with tweetnacl (plus SHA-256). */
function naclEnvelope(doc: Buffer, secretKey: Uint8Array = KP.secretKey): { d: string; s: string; k: string } {
  const sig = nacl.sign.detached(sha256(doc), secretKey);
  return { d: doc.toString('base64'), s: Buffer.from(sig).toString('hex'), k: 'ed25519-sha256' };
}

const DOC = Buffer.from(JSON.stringify(marketDoc(CID, 11, { question: 'Will the interop test pass? ✓', note: 'ünïcödé' })), 'utf8');
const ENV = naclEnvelope(DOC);
const bodyOf = (env: { d: string; s: string; k: string }, conditionId = CID): Buffer =>
  Buffer.from(JSON.stringify({ conditionId, ...env }), 'utf8');

const HMAC_SETTING = `base64:${Buffer.from(createHash('sha256').update('interop hmac key').digest()).toString('base64')}`;
const HMAC = parseHmacKey('EDGE_INGEST_HMAC', HMAC_SETTING);

/** Feed key settings in every documented form; all must accept the tweetnacl producer. */
const keySettings: Record<string, Record<string, string>> = {
  'public key, hex': { EDGE_FEED_ED25519_PUBLIC_KEY: Buffer.from(KP.publicKey).toString('hex') },
  'public key, base64': { EDGE_FEED_ED25519_PUBLIC_KEY: Buffer.from(KP.publicKey).toString('base64') },
  'public key second in a rotation list': {
    EDGE_FEED_ED25519_PUBLIC_KEY: `${Buffer.from(OTHER.publicKey).toString('hex')},${Buffer.from(KP.publicKey).toString('base64')}`,
  },
  'tweetnacl 64-byte secret key, base64 (EDGE_FEED_ED25519_KEY)': { EDGE_FEED_ED25519_KEY: Buffer.from(KP.secretKey).toString('base64') },
  'tweetnacl 64-byte secret key, hex (EDGE_FEED_ED25519_KEY)': { EDGE_FEED_ED25519_KEY: Buffer.from(KP.secretKey).toString('hex') },
  '32-byte seed, hex (EDGE_FEED_ED25519_KEY)': { EDGE_FEED_ED25519_KEY: Buffer.from(SEED).toString('hex') },
};

for (const [name, env] of Object.entries(keySettings)) {
  test(`interop tweetnacl producer – ${name}: verifies`, () => {
    const creds = loadCredentials({ EDGE_INGEST_HMAC: HMAC_SETTING, ...env });
    assert.ok(verifyEnvelopeSignature(DOC, Buffer.from(ENV.s, 'hex'), creds.feedKeys));
    assert.equal(checkIngestContent(bodyOf(ENV), creds.feedKeys), ALLOW);
  });
}

test('interop – the other direction: a node:crypto-made envelope verifies with tweetnacl', () => {
  const creds = loadCredentials({ EDGE_INGEST_HMAC: HMAC_SETTING, EDGE_FEED_ED25519_KEY: Buffer.from(SEED).toString('hex') });
  // Same key, same message: Ed25519 is deterministic, so both libraries produce the same bytes.
  const again = nacl.sign.detached(sha256(DOC), KP.secretKey);
  assert.equal(Buffer.from(again).toString('hex'), ENV.s);
  assert.ok(nacl.sign.detached.verify(sha256(DOC), new Uint8Array(Buffer.from(ENV.s, 'hex')), KP.publicKey));
  assert.equal(creds.feedKeys.length, 1);
});

// ---------------------------------------------------------------------------------------
// Tampering with the content
// ---------------------------------------------------------------------------------------
const FEED_KEYS = loadCredentials({ EDGE_INGEST_HMAC: HMAC_SETTING, EDGE_FEED_ED25519_PUBLIC_KEY: Buffer.from(KP.publicKey).toString('hex') }).feedKeys;

const flip = (b: Buffer, i: number, x = 0x01): Buffer => {
  const c = Buffer.from(b);
  c[i] = c[i]! ^ x;
  return c;
};
const flipHex = (s: string, i: number): string => s.slice(0, i) + (s[i] === '0' ? '1' : '0') + s.slice(i + 1);

const contentCases: Record<string, [body: Buffer, code: Decision['code']]> = {
  'untouched': [bodyOf(ENV), 'ok'],
  's in upper case': [bodyOf({ ...ENV, s: ENV.s.toUpperCase() }), 'ok'],
  'first byte of the document flipped': [bodyOf({ ...ENV, d: flip(DOC, 0).toString('base64') }), 'invalid_content_signature'],
  'middle byte of the document flipped': [bodyOf({ ...ENV, d: flip(DOC, DOC.length >> 1).toString('base64') }), 'invalid_content_signature'],
  'last byte of the document flipped': [bodyOf({ ...ENV, d: flip(DOC, DOC.length - 1).toString('base64') }), 'invalid_content_signature'],
  'a byte appended to the document': [bodyOf({ ...ENV, d: Buffer.concat([DOC, Buffer.from(' ')]).toString('base64') }), 'invalid_content_signature'],
  'the document truncated by one byte': [bodyOf({ ...ENV, d: DOC.subarray(0, -1).toString('base64') }), 'invalid_content_signature'],
  'first byte of s changed': [bodyOf({ ...ENV, s: flipHex(ENV.s, 0) }), 'invalid_content_signature'],
  'last byte of s changed': [bodyOf({ ...ENV, s: flipHex(ENV.s, 127) }), 'invalid_content_signature'],
  's of R from another signature (malleability)': [
    bodyOf({ ...ENV, s: naclEnvelope(Buffer.from('other')).s.slice(0, 64) + ENV.s.slice(64) }), 'invalid_content_signature',
  ],
  's one byte short': [bodyOf({ ...ENV, s: ENV.s.slice(0, 126) }), 'invalid_envelope'],
  'signed by another tweetnacl key': [bodyOf(naclEnvelope(DOC, OTHER.secretKey)), 'invalid_content_signature'],
  'tweetnacl signature over the document, not its SHA-256': [
    bodyOf({ ...ENV, s: Buffer.from(nacl.sign.detached(new Uint8Array(DOC), KP.secretKey)).toString('hex') }), 'invalid_content_signature',
  ],
  'tweetnacl signature over the hex of the SHA-256': [
    bodyOf({ ...ENV, s: Buffer.from(nacl.sign.detached(new Uint8Array(Buffer.from(Buffer.from(sha256(DOC)).toString('hex'))), KP.secretKey)).toString('hex') }),
    'invalid_content_signature',
  ],
  'a combined (attached) tweetnacl signature': [
    bodyOf({ ...ENV, s: Buffer.from(nacl.sign(sha256(DOC), KP.secretKey)).toString('hex') }), 'invalid_envelope',
  ],
  'valid signature, body conditionId differs': [bodyOf(ENV, '0xsomething-else'), 'invalid_envelope'],
};

for (const [name, [body, code]] of Object.entries(contentCases)) {
  test(`interop content – ${name} → ${code}`, () => {
    const d = checkIngestContent(body, FEED_KEYS);
    assert.equal(d.code, code, d.reason);
  });
}

/** s with its scalar S replaced by S + L (the group order): tweetnacl still accepts it. */
function malleated(sHex: string): string {
  const sig = Buffer.from(sHex, 'hex');
  const L = 2n ** 252n + 27742317777372353535851937790883648493n;
  let S = 0n;
  for (let i = 31; i >= 0; i--) S = (S << 8n) | BigInt(sig[32 + i]!);
  const S2 = S + L;
  for (let i = 0; i < 32; i++) sig[32 + i] = Number((S2 >> BigInt(8 * i)) & 0xffn);
  return sig.toString('hex');
}

test('interop content – a malleated signature (S + L) is refused, though tweetnacl would accept it', () => {
  const m = malleated(ENV.s);
  assert.ok(nacl.sign.detached.verify(sha256(DOC), new Uint8Array(Buffer.from(m, 'hex')), KP.publicKey), 'precondition: tweetnacl accepts');
  assert.equal(checkIngestContent(bodyOf({ ...ENV, s: m }), FEED_KEYS).code, 'invalid_content_signature');
});

test('interop content – a small-order feed key does not verify a forged (R = identity, S = 0) signature', () => {
  const identity = Buffer.alloc(32);
  identity[0] = 1;
  const forged = Buffer.concat([identity, Buffer.alloc(32)]).toString('hex');
  assert.ok(nacl.sign.detached.verify(sha256(DOC), new Uint8Array(Buffer.from(forged, 'hex')), new Uint8Array(identity)), 'precondition: tweetnacl accepts');
  const weak = loadCredentials({ EDGE_INGEST_HMAC: HMAC_SETTING, EDGE_FEED_ED25519_PUBLIC_KEY: identity.toString('hex') }).feedKeys;
  assert.equal(checkIngestContent(bodyOf({ ...ENV, s: forged }), weak).code, 'invalid_content_signature');
});

test('interop content – flipping any single byte of the document breaks the signature', () => {
  const sig = Buffer.from(ENV.s, 'hex');
  assert.ok(verifyEnvelopeSignature(DOC, sig, FEED_KEYS));
  for (let i = 0; i < DOC.length; i++) {
    assert.equal(verifyEnvelopeSignature(flip(DOC, i, 0x80), sig, FEED_KEYS), false, `byte ${i}`);
  }
});

test('interop content – flipping any single byte of the signature breaks it', () => {
  const sig = Buffer.from(ENV.s, 'hex');
  for (let i = 0; i < sig.length; i++) {
    assert.equal(verifyEnvelopeSignature(DOC, flip(sig, i), FEED_KEYS), false, `byte ${i}`);
  }
});

// ---------------------------------------------------------------------------------------
// HMAC interop and tampering with the HMAC'd body, through the whole pipeline
// ---------------------------------------------------------------------------------------
function pipeline(): PipelineDeps {
  const clock = fixedClock(NOW);
  return {
    classifyGeo: () => GEO_TRUSTED,
    geoDenial: geoDenial('blocked', undefined),
    ingest: { hmacKeys: [new HmacSha256Key(HMAC)], feedKeys: FEED_KEYS, nonces: new MemoryNonceStore(() => NOW * 1000), clock, replayWindowSecs: 300, nonceTtlSecs: 600 },
    order: { markets: fakeMarkets([]), clock, orderMaxTtlSecs: 86_400, orderMaxSize: undefined, orderPayloadMaxBytes: 32_768 },
    isSealed: () => false,
  };
}

const ROOT = fileURLToPath(new URL('../../', import.meta.url));

/** HMAC-SHA256 computed by Python's standard library (an independent implementation). */
function pythonHmac(key: Buffer, message: Buffer): string {
  const script = 'import hmac,hashlib,sys,base64;k=base64.b64decode(sys.argv[1]);m=sys.stdin.buffer.read();print(hmac.new(k,m,hashlib.sha256).hexdigest())';
  return execFileSync(`${ROOT}.venv/bin/python`, ['-c', script, key.toString('base64')], { input: message, encoding: 'utf8' }).trim();
}

const BODY = bodyOf(ENV);
const TS = String(NOW - 3);
const NONCE = randomBytes(24).toString('hex');
const message = (body: Buffer): Buffer => Buffer.concat([Buffer.from(`${TS}.${NONCE}.`, 'utf8'), body]);
const PY_MAC = pythonHmac(HMAC, message(BODY));

async function ingest(body: Buffer, mac: string): Promise<Decision> {
  const wire = encodeCheckRequest({
    method: 'POST', path: PATHS.ingest, body,
    headers: { 'x-edge-timestamp': TS, 'x-edge-nonce': NONCE, 'x-edge-signature': `v1=${mac}`, 'x-edge-client-ip': '192.0.2.1' },
  });
  return evaluate(decodeCheckRequest(wire), pipeline());
}

test('interop HMAC – Python hmac over the documented message, node:crypto and the signer module (common/crypto/ingest-signer.ts) agree', () => {
  assert.equal(PY_MAC, createHmac('sha256', HMAC).update(message(BODY)).digest('hex'));
  assert.equal(ingestSigner(HMAC)(TS, NONCE, BODY), `v1=${PY_MAC}`);
});

const hmacCases: Record<string, [body: Buffer, mac: string, code: Decision['code']]> = {
  'Python-signed request accepted': [BODY, PY_MAC, 'ok'],
  'first body byte flipped': [flip(BODY, 0), PY_MAC, 'unauthorized'],
  'a byte inside d flipped': [flip(BODY, BODY.indexOf('"d":"') + 10), PY_MAC, 'unauthorized'],
  'a byte inside s flipped': [flip(BODY, BODY.indexOf('"s":"') + 10), PY_MAC, 'unauthorized'],
  'last body byte flipped': [flip(BODY, BODY.length - 1), PY_MAC, 'unauthorized'],
  'body with a trailing newline': [Buffer.concat([BODY, Buffer.from('\n')]), PY_MAC, 'unauthorized'],
  'body re-serialized with spaces (same JSON, other bytes)': [
    Buffer.from(JSON.stringify(JSON.parse(BODY.toString()), null, 1)), PY_MAC, 'unauthorized',
  ],
  'HMAC re-computed over a tampered document (content layer catches it)': [
    bodyOf({ ...ENV, d: flip(DOC, 5).toString('base64') }),
    pythonHmac(HMAC, message(bodyOf({ ...ENV, d: flip(DOC, 5).toString('base64') }))),
    'invalid_content_signature',
  ],
};

for (const [name, [body, mac, code]] of Object.entries(hmacCases)) {
  test(`interop HMAC – ${name} → ${code}`, async () => {
    const d = await ingest(body, mac);
    assert.equal(d.code, code, d.reason);
    if (code !== 'ok') assert.equal((JSON.parse(d.body) as { error: string }).error, code);
  });
}
