/**
 * HMAC-SHA256 (RFC 2104) from precomputed pads.
 *
 * `createHmac('sha256', buffer)` re-imports the key on every call (~10 µs here), and a
 * KeyObject would be fast but cannot be zeroed when the service is sealed. So each key is
 * turned once into its inner and outer pads (key ⊕ 0x36…, key ⊕ 0x5c…), held in Buffers this
 * module owns and that `zeroize()` wipes; each MAC is then two SHA-256 passes (~3 µs).
 * Output is identical to createHmac (property-tested in authz/test/hmac.test.ts).
 */
import { createHash } from 'node:crypto';

const BLOCK = 64;

export class HmacSha256Key {
  readonly #ipad: Buffer;
  readonly #opad: Buffer;

  constructor(key: Buffer) {
    const k = Buffer.alloc(BLOCK);
    if (key.length > BLOCK) {
      // HMAC's rule for long keys; the digest is the effective key, so it is wiped like k.
      const digest = createHash('sha256').update(key).digest();
      digest.copy(k);
      digest.fill(0);
    } else {
      key.copy(k);
    }
    this.#ipad = Buffer.alloc(BLOCK);
    this.#opad = Buffer.alloc(BLOCK);
    for (let i = 0; i < BLOCK; i++) {
      this.#ipad[i] = (k[i] ?? 0) ^ 0x36;
      this.#opad[i] = (k[i] ?? 0) ^ 0x5c;
    }
    k.fill(0);
  }

  /** HMAC-SHA256 over the concatenation of `parts`. */
  mac(...parts: (string | Buffer)[]): Buffer {
    const inner = createHash('sha256').update(this.#ipad);
    for (const p of parts) inner.update(p);
    return createHash('sha256').update(this.#opad).update(inner.digest()).digest();
  }

  /** The pad buffers (secret material), for sealing. */
  get buffers(): readonly Buffer[] {
    return [this.#ipad, this.#opad];
  }
}
