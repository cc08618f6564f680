/**
 * Credentials (docs/api.md "POST /internal/ingest/market", §7): HMAC key forms and their minimum length, the rotation key,
 * the feed public-key list, a private feed key reduced to its public key (cross-checked
 * against tweetnacl), zeroize(), and secrets removed from process.env.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createHash, randomBytes, sign, verify } from 'node:crypto';
import nacl from 'tweetnacl';
import { ConfigError, type Env } from '../src/common/config.ts';
import { loadCredentials, parseHmacKey, publicKeyFromPrivate } from '../src/common/credentials.ts';
import { decodeStrictBase64 } from '../src/common/rules.ts';
import { newFeedKey } from '../../testkit/feed.ts';
import { withTempDir } from '../../testkit/temp-dir.ts';

const KEY32 = Buffer.from('0102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f20', 'hex');
const KEY48 = Buffer.from(Array.from({ length: 48 }, (_, i) => (i * 37 + 11) & 0xff));
const FEED = newFeedKey();
/** A valid environment apart from what a case overrides. */
const BASE: Env = { EDGE_INGEST_HMAC: `hex:${KEY32.toString('hex')}`, EDGE_FEED_ED25519_PUBLIC_KEY: FEED.publicHex };

function assertConfigError(fn: () => unknown, variable: string): void {
  assert.throws(fn, (err: unknown) => {
    assert.ok(err instanceof ConfigError, `expected ConfigError, got ${String(err)}`);
    assert.equal(err.variable, variable);
    return true;
  });
}

function rawPublic(k: { export(o: { format: 'jwk' }): { x?: string } }): Buffer {
  return Buffer.from(k.export({ format: 'jwk' }).x ?? '', 'base64url');
}

// ---------------------------------------------------------------------------------------
// HMAC key forms
// ---------------------------------------------------------------------------------------
const keyForms: Record<string, [value: string, expected: Buffer]> = {
  'hex: lower case': [`hex:${KEY32.toString('hex')}`, KEY32],
  'hex: upper case': [`hex:${KEY32.toString('hex').toUpperCase()}`, KEY32],
  'hex: 48 bytes': [`hex:${KEY48.toString('hex')}`, KEY48],
  'base64: standard padded': [`base64:${KEY32.toString('base64')}`, KEY32],
  'base64: 48 bytes (no padding needed)': [`base64:${KEY48.toString('base64')}`, KEY48],
  'raw text: its UTF-8 bytes': ['correct horse battery staple 1234', Buffer.from('correct horse battery staple 1234', 'utf8')],
  'raw text that looks like hex but has no prefix: its UTF-8 bytes, not decoded': [
    KEY32.toString('hex'), Buffer.from(KEY32.toString('hex'), 'utf8'),
  ],
  'raw multi-byte text counted in bytes (11 × € = 33 bytes)': ['€'.repeat(11), Buffer.from('€'.repeat(11), 'utf8')],
};

for (const [name, [value, expected]] of Object.entries(keyForms)) {
  test(`hmac key form – ${name}`, () => {
    const key = parseHmacKey('EDGE_INGEST_HMAC', value);
    assert.deepEqual(key, expected);
    // The key owns its memory: zeroing it cannot miss a copy in Node's shared pool slab.
    assert.equal(key.byteOffset, 0);
    assert.equal(key.buffer.byteLength, key.length);
  });
}

const badKeys: Record<string, string> = {
  'hex: 31 bytes': `hex:${KEY32.subarray(1).toString('hex')}`,
  'base64: 31 bytes': `base64:${KEY32.subarray(1).toString('base64')}`,
  'raw text 31 bytes': 'a'.repeat(31),
  'raw multi-byte text 30 bytes (10 × €)': '€'.repeat(10),
  'hex: odd number of digits': `hex:${KEY32.toString('hex')}0`,
  'hex: non-hex digit': `hex:${KEY32.toString('hex').slice(0, -2)}zz`,
  'hex: empty': 'hex:',
  'hex: with spaces': `hex:${KEY32.toString('hex').slice(0, 32)} ${KEY32.toString('hex').slice(32)}`,
  'base64: missing padding': `base64:${KEY32.toString('base64').replace(/=+$/, '')}`,
  'base64: URL-safe alphabet': `base64:${Buffer.from(Array(33).fill(0xfb)).toString('base64url')}`,
  'base64: non-canonical padding bits': `base64:${KEY32.toString('base64').replace(/.=$/, (m) => String.fromCharCode(m.charCodeAt(0) + 1) + '=')}`,
  'base64: embedded newline': `base64:${KEY48.toString('base64').slice(0, 32)}\n${KEY48.toString('base64').slice(32)}`,
  'base64: empty': 'base64:',
};

for (const [name, value] of Object.entries(badKeys)) {
  test(`hmac key refused – ${name}`, () => {
    assertConfigError(() => parseHmacKey('EDGE_INGEST_HMAC', value), 'EDGE_INGEST_HMAC');
    assertConfigError(() => loadCredentials({ ...BASE, EDGE_INGEST_HMAC: value }), 'EDGE_INGEST_HMAC');
    assertConfigError(() => loadCredentials({ ...BASE, EDGE_INGEST_HMAC_PREVIOUS: value }), 'EDGE_INGEST_HMAC_PREVIOUS');
  });
}

test('hmac key refused – EDGE_INGEST_HMAC missing or empty', () => {
  assertConfigError(() => loadCredentials({ EDGE_FEED_ED25519_PUBLIC_KEY: FEED.publicHex }), 'EDGE_INGEST_HMAC');
  assertConfigError(() => loadCredentials({ ...BASE, EDGE_INGEST_HMAC: '' }), 'EDGE_INGEST_HMAC');
});

test('hmac key – the ConfigError message never contains the key material', () => {
  const secret = 'hex:' + 'ab'.repeat(16) + 'zz';
  try {
    parseHmacKey('EDGE_INGEST_HMAC', secret);
    assert.fail('expected ConfigError');
  } catch (err) {
    assert.ok(err instanceof ConfigError);
    assert.ok(!err.message.includes('abab'), err.message);
  }
});

const rotation: Record<string, [env: Env, expected: Buffer[]]> = {
  'current only': [BASE, [KEY32]],
  'current then EDGE_INGEST_HMAC_PREVIOUS': [{ ...BASE, EDGE_INGEST_HMAC_PREVIOUS: `base64:${KEY48.toString('base64')}` }, [KEY32, KEY48]],
  'empty EDGE_INGEST_HMAC_PREVIOUS ignored': [{ ...BASE, EDGE_INGEST_HMAC_PREVIOUS: '' }, [KEY32]],
};

for (const [name, [env, expected]] of Object.entries(rotation)) {
  test(`hmac rotation – ${name}`, () => {
    assert.deepEqual([...loadCredentials(env).hmacKeys], expected);
  });
}

// ---------------------------------------------------------------------------------------
// Feed public keys
// ---------------------------------------------------------------------------------------
const K1 = newFeedKey();
const K2 = newFeedKey();
const b64 = (hex: string): string => Buffer.from(hex, 'hex').toString('base64');

const feedLists: Record<string, [value: string, expectedHex: string[]]> = {
  'one hex key': [K1.publicHex, [K1.publicHex]],
  'one upper-case hex key': [K1.publicHex.toUpperCase(), [K1.publicHex]],
  'one base64 key': [b64(K1.publicHex), [K1.publicHex]],
  'two hex keys': [`${K1.publicHex},${K2.publicHex}`, [K1.publicHex, K2.publicHex]],
  'mixed hex and base64 with spaces and an empty item': [` ${K1.publicHex} ,, ${b64(K2.publicHex)} `, [K1.publicHex, K2.publicHex]],
};

for (const [name, [value, expectedHex]] of Object.entries(feedLists)) {
  test(`feed public keys – ${name}`, () => {
    const c = loadCredentials({ ...BASE, EDGE_FEED_ED25519_PUBLIC_KEY: value });
    assert.deepEqual(c.feedKeys.map((k) => rawPublic(k).toString('hex')), expectedHex);
    assert.equal(c.feedKeyIds.length, expectedHex.length);
    for (const id of c.feedKeyIds) assert.match(id, /^[0-9a-f]{8}$/);
    // Every listed key really verifies what its private key signed.
    const msg = createHash('sha256').update('doc').digest();
    for (const [i, k] of [K1, K2].slice(0, expectedHex.length).entries()) {
      assert.ok(verify(null, msg, c.feedKeys[i]!, sign(null, msg, k.privateKey)));
    }
  });
}

const badFeedLists: Record<string, string> = {
  '31-byte hex key': K1.publicHex.slice(2),
  '33-byte hex key': `${K1.publicHex}00`,
  '64-byte key (a secret key is not a public key)': K1.publicHex.repeat(2),
  '31-byte base64 key': Buffer.from(K1.publicHex, 'hex').subarray(1).toString('base64'),
  'base64 without padding': b64(K1.publicHex).replace(/=+$/, ''),
  'URL-safe base64': Buffer.from(K1.publicHex, 'hex').toString('base64url'),
  'garbage item after a good key': `${K1.publicHex},not-a-key`,
  'odd hex': `${K1.publicHex}0`,
};

for (const [name, value] of Object.entries(badFeedLists)) {
  test(`feed public keys refused – ${name}`, () => {
    assertConfigError(() => loadCredentials({ ...BASE, EDGE_FEED_ED25519_PUBLIC_KEY: value }), 'EDGE_FEED_ED25519_PUBLIC_KEY');
  });
}

test('feed public keys refused – none configured at all', () => {
  assertConfigError(() => loadCredentials({ EDGE_INGEST_HMAC: BASE['EDGE_INGEST_HMAC'] }), 'EDGE_FEED_ED25519_PUBLIC_KEY');
  assertConfigError(() => loadCredentials({ ...BASE, EDGE_FEED_ED25519_PUBLIC_KEY: ' , ' }), 'EDGE_FEED_ED25519_PUBLIC_KEY');
});

// ---------------------------------------------------------------------------------------
// EDGE_FEED_ED25519_KEY: a private key (seed or tweetnacl secret key) → its public key.
// ---------------------------------------------------------------------------------------
const SEED = Buffer.from(Array.from({ length: 32 }, (_, i) => (i * 7 + 3) & 0xff));
const NACL = nacl.sign.keyPair.fromSeed(new Uint8Array(SEED));
const NACL_PUB_HEX = Buffer.from(NACL.publicKey).toString('hex');
const SECRET64 = Buffer.from(NACL.secretKey);

const privateForms: Record<string, string> = {
  '32-byte seed, hex': SEED.toString('hex'),
  '32-byte seed, upper-case hex': SEED.toString('hex').toUpperCase(),
  '32-byte seed, base64': SEED.toString('base64'),
  '64-byte secret key (tweetnacl layout), hex': SECRET64.toString('hex'),
  '64-byte secret key (tweetnacl layout), base64': SECRET64.toString('base64'),
  'surrounded by whitespace': `  ${SEED.toString('hex')}\n`,
};

for (const [name, value] of Object.entries(privateForms)) {
  test(`feed private key – ${name} derives tweetnacl's public key and warns`, () => {
    const out = { warnings: [] as string[] };
    const c = loadCredentials({ EDGE_INGEST_HMAC: BASE['EDGE_INGEST_HMAC'], EDGE_FEED_ED25519_KEY: value }, out);
    assert.equal(c.feedKeys.length, 1);
    assert.equal(rawPublic(c.feedKeys[0]!).toString('hex'), NACL_PUB_HEX);
    assert.equal(out.warnings.length, 1);
    assert.match(out.warnings[0]!, /EDGE_FEED_ED25519_PUBLIC_KEY/);
    assert.ok(!out.warnings[0]!.toLowerCase().includes(SEED.toString('hex')), 'the warning never quotes the key');
    // And the derived key verifies a tweetnacl signature over a SHA-256 digest.
    const digest = createHash('sha256').update('feed document').digest();
    const sig = Buffer.from(nacl.sign.detached(new Uint8Array(digest), NACL.secretKey));
    assert.ok(verify(null, digest, c.feedKeys[0]!, sig));
    // The private key is not kept as a secret buffer: only the HMAC key is held.
    assert.equal(c.secretBuffers.length, 3);
  });
}

test('feed private key – appended after the public key list (both accepted)', () => {
  const c = loadCredentials({ ...BASE, EDGE_FEED_ED25519_KEY: SEED.toString('hex') });
  assert.deepEqual(c.feedKeys.map((k) => rawPublic(k).toString('hex')), [FEED.publicHex, NACL_PUB_HEX]);
});

const badPrivate: Record<string, string> = {
  '31 bytes': SEED.subarray(1).toString('hex'),
  '48 bytes': Buffer.concat([SEED, SEED.subarray(0, 16)]).toString('hex'),
  '64 bytes whose public half does not match the seed': Buffer.concat([SEED, Buffer.from(K1.publicHex, 'hex')]).toString('hex'),
  'not hex nor base64': 'seed-' + 'x'.repeat(40),
};

for (const [name, value] of Object.entries(badPrivate)) {
  test(`feed private key refused – ${name}`, () => {
    assertConfigError(() => publicKeyFromPrivate('EDGE_FEED_ED25519_KEY', value), 'EDGE_FEED_ED25519_KEY');
    assertConfigError(() => loadCredentials({ ...BASE, EDGE_FEED_ED25519_KEY: value }), 'EDGE_FEED_ED25519_KEY');
  });
}

// ---------------------------------------------------------------------------------------
// zeroize() and process.env
// ---------------------------------------------------------------------------------------
const zeroCases: Record<string, Env> = {
  'current key only': BASE,
  'current and previous keys': { ...BASE, EDGE_INGEST_HMAC_PREVIOUS: 'a rotation key that is long enough to use!' },
  'with a private feed key': { ...BASE, EDGE_FEED_ED25519_KEY: SECRET64.toString('base64') },
};

for (const [name, env] of Object.entries(zeroCases)) {
  test(`zeroize – ${name}: every secret buffer is all-zero afterwards`, () => {
    const c = loadCredentials(env);
    assert.ok(c.secretBuffers.length >= 1);
    // Each HMAC key is held as its bytes plus its two precomputed pads (common/crypto/hmac.ts).
    assert.equal(c.secretBuffers.length, 3 * c.hmacKeys.length);
    for (const k of c.hmacKeys) assert.ok(c.secretBuffers.includes(k), 'every HMAC key is a registered secret buffer');
    for (const b of c.secretBuffers) assert.ok(b.some((x) => x !== 0), 'precondition: every secret buffer is non-zero');
    c.zeroize();
    for (const b of c.secretBuffers) {
      assert.ok(b.length >= 32);
      assert.ok(b.every((x) => x === 0), 'all-zero after');
      // The whole backing store is the key: nothing of it survives elsewhere in the slab.
      assert.ok(new Uint8Array(b.buffer).every((x) => x === 0));
    }
    c.zeroize(); // idempotent
    for (const b of c.hmacKeys) assert.ok(b.every((x) => x === 0));
  });
}

const SECRET_VARS = ['EDGE_INGEST_HMAC', 'EDGE_INGEST_HMAC_PREVIOUS', 'EDGE_FEED_ED25519_KEY'] as const;

test('process.env – secrets are deleted once parsed when env === process.env; the public key list stays', () => {
  const saved = Object.fromEntries([...SECRET_VARS, 'EDGE_FEED_ED25519_PUBLIC_KEY'].map((k) => [k, process.env[k]]));
  try {
    process.env['EDGE_INGEST_HMAC'] = `base64:${randomBytes(32).toString('base64')}`;
    process.env['EDGE_INGEST_HMAC_PREVIOUS'] = `hex:${randomBytes(32).toString('hex')}`;
    process.env['EDGE_FEED_ED25519_KEY'] = SEED.toString('hex');
    process.env['EDGE_FEED_ED25519_PUBLIC_KEY'] = FEED.publicHex;
    const c = loadCredentials();
    assert.equal(c.hmacKeys.length, 2);
    assert.equal(c.feedKeys.length, 2);
    for (const v of SECRET_VARS) assert.equal(process.env[v], undefined, `${v} still in process.env`);
    assert.equal(process.env['EDGE_FEED_ED25519_PUBLIC_KEY'], FEED.publicHex);
  } finally {
    for (const [k, v] of Object.entries(saved)) {
      if (v === undefined) delete process.env[k];
      else process.env[k] = v;
    }
  }
});

test('process.env – a plain env object passed in is not mutated', () => {
  const env: Record<string, string | undefined> = { ...BASE, EDGE_INGEST_HMAC_PREVIOUS: `hex:${KEY48.toString('hex')}` };
  const before = { ...env };
  loadCredentials(env);
  assert.deepEqual(env, before);
});

test('decodeStrictBase64 – canonical only, at least one byte (the published strict-base64 rule)', () => {
  assert.deepEqual(decodeStrictBase64('AAEC'), Buffer.from([0, 1, 2]));
  for (const bad of ['', 'AAE', 'AAF=', 'AB==', 'A===', '=AAA', 'AA-_', 'AA A', 'AAEC\n']) assert.equal(decodeStrictBase64(bad), undefined, bad);
});

test('secret files – EDGE_INGEST_HMAC_FILE and EDGE_FEED_ED25519_PUBLIC_KEY_FILE are read (trailing newline dropped); a missing file names the variable', async () => {
  const { writeFileSync } = await import('node:fs');
  const { join } = await import('node:path');
  const { generateKeyPairSync } = await import('node:crypto');
  await withTempDir('edge-secret-', (dir) => {
    const pub = Buffer.from(generateKeyPairSync('ed25519').publicKey.export({ format: 'jwk' }).x ?? '', 'base64url').toString('hex');
    writeFileSync(join(dir, 'hmac'), `hex:${'ab'.repeat(32)}\n`, { mode: 0o400 });
    writeFileSync(join(dir, 'feed'), `${pub}\n`, { mode: 0o400 });
    const c = loadCredentials({ EDGE_INGEST_HMAC_FILE: join(dir, 'hmac'), EDGE_FEED_ED25519_PUBLIC_KEY_FILE: join(dir, 'feed') });
    assert.deepEqual(c.hmacKeys[0], Buffer.alloc(32, 0xab));
    assert.equal(c.feedKeys.length, 1);
    assert.throws(() => loadCredentials({ EDGE_INGEST_HMAC_FILE: join(dir, 'missing'), EDGE_FEED_ED25519_PUBLIC_KEY: pub }), /EDGE_INGEST_HMAC_FILE/);
  });
});
