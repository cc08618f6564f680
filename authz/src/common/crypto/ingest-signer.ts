/**
 * The ingest request signature (docs/api.md "POST /internal/ingest/market"): X-Edge-Signature is
 * `v1=` and the hex HMAC-SHA256 of `<X-Edge-Timestamp>.<X-Edge-Nonce>.<raw body>`, the timestamp
 * exactly as sent. ingestMac is the one place that message is written: the verifier
 * (authz/src/authz/stages/ingest.ts) and every signer (scripts/edge-client.ts,
 * deploy/policy/fill.ts, bench/lib/authz-scenarios.ts, the tests) call it, so the two cannot
 * drift; the known-answer vectors (authz/test/fixtures/ingest-vectors.json) pin it.
 */
import { HEADER } from '../contract.ts';
import { HmacSha256Key } from './hmac.ts';

/** X-Edge-Signature's scheme prefix; nothing else is accepted. */
export const SIGNATURE_SCHEME = 'v1=';

/** The MAC of one ingest request (no allocation beyond the MAC: the verifier calls it per key). */
export function ingestMac(key: HmacSha256Key, timestamp: string, nonce: string, body: string | Buffer): Buffer {
  return key.mac(timestamp, '.', nonce, '.', body);
}

/** Signs with one key (its pads computed once): the X-Edge-Signature value, `v1=<hex>`. */
export type IngestSigner = (timestamp: string | number, nonce: string, body: string | Buffer) => string;

export function ingestSigner(key: Buffer): IngestSigner {
  const k = new HmacSha256Key(key);
  return (timestamp, nonce, body) => `${SIGNATURE_SCHEME}${ingestMac(k, String(timestamp), nonce, body).toString('hex')}`;
}

/** The three signature headers of an ingest request signed with `key`. */
export function ingestSignatureHeaders(key: Buffer, timestamp: string | number, nonce: string, body: string | Buffer): Record<string, string> {
  const ts = String(timestamp);
  return { [HEADER.timestamp]: ts, [HEADER.nonce]: nonce, [HEADER.signature]: ingestSigner(key)(ts, nonce, body) };
}
