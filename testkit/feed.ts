/**
 * What a market-data feed sends (docs/api.md "POST /internal/ingest/market"): its Ed25519 key, a
 * market document, the signed envelope and the ingest body: for tests, e2e and benchmarks.
 */
import { createHash, generateKeyPairSync, sign, type KeyObject } from 'node:crypto';

export interface FeedKey {
  readonly privateKey: KeyObject;
  readonly publicKey: KeyObject;
  readonly publicHex: string;
}

export function newFeedKey(): FeedKey {
  const { privateKey, publicKey } = generateKeyPairSync('ed25519');
  const publicHex = Buffer.from(publicKey.export({ format: 'jwk' }).x ?? '', 'base64url').toString('hex');
  return { privateKey, publicKey, publicHex };
}

/** Signs a feed document as the producer does (docs/api.md "POST /internal/ingest/market"): Ed25519 over SHA-256(document). */
export function envelopeFor(doc: object | Buffer, key: FeedKey): { d: string; s: string; k: string } {
  const bytes = Buffer.isBuffer(doc) ? doc : Buffer.from(JSON.stringify(doc), 'utf8');
  const sig = sign(null, createHash('sha256').update(bytes).digest(), key.privateKey);
  return { d: bytes.toString('base64'), s: sig.toString('hex'), k: 'ed25519-sha256' };
}

export function ingestBody(doc: { conditionId: string } & Record<string, unknown>, key: FeedKey): Buffer {
  return Buffer.from(JSON.stringify({ conditionId: doc.conditionId, ...envelopeFor(doc, key) }), 'utf8');
}

export function marketDoc(conditionId: string, seq: number, extra: Record<string, unknown> = {}): Record<string, unknown> & { conditionId: string } {
  return {
    conditionId, seq, question: `Will ${conditionId} resolve yes?`, active: true, closed: false,
    minSize: '5', maxSize: '100000', tickSize: '0.01',
    outcomes: [
      { tokenId: '1', name: 'Yes', bid: '0.51', ask: '0.53', last: '0.52' },
      { tokenId: '2', name: 'No', bid: '0.47', ask: '0.49', last: '0.48' },
    ],
    updatedAt: 1763700000,
    ...extra,
  };
}
