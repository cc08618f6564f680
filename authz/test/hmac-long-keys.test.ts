/**
 * HMAC keys around and past SHA-256's 64-byte block (authz/src/common/crypto/hmac.ts): a key longer
 * than the block is hashed first (RFC 2104), a branch the property test in hmac.test.ts never
 * reached — fast-check's default size keeps its generated keys to ~10 bytes whatever `maxLength`
 * says. EDGE_INGEST_HMAC accepts any key of at least 32 bytes (a 100-character passphrase, `hex:`
 * of `openssl rand -hex 96`), so the ingest signature check must agree with createHmac there too.
 *
 *   scripts/node --test authz/test/hmac-long-keys.test.ts
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createHash, createHmac, randomBytes } from 'node:crypto';
import fc from 'fast-check';
import { parseHmacKey } from '../src/common/credentials.ts';
import { HmacSha256Key } from '../src/common/crypto/hmac.ts';

const reference = (key: Buffer, ...parts: Buffer[]): Buffer => {
  const h = createHmac('sha256', key);
  for (const p of parts) h.update(p);
  return h.digest();
};

for (const length of [32, 63, 64, 65, 96, 128, 129, 1000]) {
  test(`hmac – a ${length}-byte key gives createHmac's MAC`, () => {
    const key = randomBytes(length);
    const msg = Buffer.from(`POST\n/internal/ingest/market\n1764201600\nnonce-${length}\n`);
    assert.deepEqual(new HmacSha256Key(Buffer.from(key)).mac(msg), reference(key, msg));
  });
}

test('hmac – keys of 65 to 300 bytes (the hashed-key branch), any message in parts: createHmac\'s MAC', () => {
  fc.assert(
    fc.property(fc.uint8Array({ minLength: 65, maxLength: 300, size: 'max' }), fc.array(fc.uint8Array({ maxLength: 300, size: 'max' }), { maxLength: 5 }), (key, parts) => {
      const bufs = parts.map((p) => Buffer.from(p));
      assert.deepEqual(new HmacSha256Key(Buffer.from(key)).mac(...bufs), reference(Buffer.from(key), ...bufs));
    }),
    { numRuns: 200 },
  );
});

test('hmac – a long key and the 64-byte digest it hashes to sign alike (RFC 2104), and differ from a key one byte shorter', () => {
  const long = randomBytes(100);
  // RFC 2104: "Applications that use keys longer than B bytes will first hash the key using H".
  const digest = createHash('sha256').update(long).digest();
  const msg = Buffer.from('body');
  assert.deepEqual(new HmacSha256Key(Buffer.from(long)).mac(msg), new HmacSha256Key(digest).mac(msg));
  assert.notDeepEqual(new HmacSha256Key(Buffer.from(long)).mac(msg), new HmacSha256Key(long.subarray(0, 99)).mac(msg));
});

test('hmac – EDGE_INGEST_HMAC given as a 100-character passphrase and as hex: of 96 bytes: the parsed key signs as createHmac with those bytes', () => {
  const passphrase = 'correct horse battery staple '.repeat(4).slice(0, 100);
  const bytes = randomBytes(96);
  for (const [value, raw] of [[passphrase, Buffer.from(passphrase)], [`hex:${bytes.toString('hex')}`, bytes]] as const) {
    const key = parseHmacKey('EDGE_INGEST_HMAC', value);
    assert.deepEqual(new HmacSha256Key(key).mac('x'), reference(raw, Buffer.from('x')));
  }
});
