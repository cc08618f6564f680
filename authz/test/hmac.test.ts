import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createHmac } from 'node:crypto';
import fc from 'fast-check';
import { HmacSha256Key } from '../src/common/crypto/hmac.ts';

test('hmac – precomputed pads give exactly createHmac for any key length (incl. > 64 bytes) and message', () => {
  fc.assert(
    fc.property(fc.uint8Array({ minLength: 0, maxLength: 200 }), fc.array(fc.uint8Array({ maxLength: 300 }), { maxLength: 5 }), (key, parts) => {
      const k = Buffer.from(key);
      const bufs = parts.map((p) => Buffer.from(p));
      const want = createHmac('sha256', k);
      for (const b of bufs) want.update(b);
      assert.deepEqual(new HmacSha256Key(k).mac(...bufs), want.digest());
    }),
    { numRuns: 500 },
  );
});

test('hmac – zeroing the pads changes the MAC (sealed keys no longer verify)', () => {
  const k = new HmacSha256Key(Buffer.alloc(32, 7));
  const before = k.mac('x');
  for (const b of k.buffers) b.fill(0);
  assert.notDeepEqual(k.mac('x'), before);
  assert.ok(k.buffers.every((b) => b.every((x) => x === 0)));
});
