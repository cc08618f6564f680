/**
 * Known-answer vectors (fixtures/ingest-vectors.json, the interface's published ingest vectors,
 * kept in the repository so it tests itself): every case, evaluated alone
 * against an empty nonce store with the clock at `now`, through the real pipeline
 * (lean CheckRequest decoding included).
 */
import { HmacSha256Key } from '../src/common/crypto/hmac.ts';
import { ingestSigner } from '../src/common/crypto/ingest-signer.ts';
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { ALLOW } from '../src/authz/decision.ts';
import { decodeCheckRequest } from '../src/authz/codec/request.ts';
import { evaluate, type PipelineDeps } from '../src/authz/pipeline.ts';
import { parseHmacKey, ed25519PublicKey } from '../src/common/credentials.ts';
import { geoDenial } from '../src/authz/decision.ts';
import { GEO_TRUSTED } from '../src/authz/stages/geo.ts';
import { MemoryNonceStore } from '../src/common/adapters/nonce-store.ts';
import { encodeCheckRequest } from '../../testkit/check-request.ts';
import { fakeMarkets, fixedClock } from './helpers.ts';

interface Vector {
  name: string;
  key: string;
  headers: Record<string, string>;
  body_b64?: string;
  expect: { status: number; error?: string; nonce_recorded?: boolean };
}
const path = fileURLToPath(new URL('./fixtures/ingest-vectors.json', import.meta.url));
const vectors = JSON.parse(readFileSync(path, 'utf8')) as {
  now: number; body_b64: string; feed: { ed25519_public_key_hex: string }; cases: Vector[];
};

for (const c of vectors.cases) {
  test(`ingest vector – ${c.name}`, async () => {
    const nonces = new MemoryNonceStore(() => vectors.now * 1000);
    const deps: PipelineDeps = {
      classifyGeo: () => GEO_TRUSTED,
      geoDenial: geoDenial('x', undefined),
      ingest: {
        hmacKeys: [new HmacSha256Key(parseHmacKey('EDGE_INGEST_HMAC', c.key))],
        feedKeys: [ed25519PublicKey(Buffer.from(vectors.feed.ed25519_public_key_hex, 'hex'))],
        nonces,
        clock: fixedClock(vectors.now),
        replayWindowSecs: 300,
        nonceTtlSecs: 600,
      },
      order: { markets: fakeMarkets([]), clock: fixedClock(vectors.now), orderMaxTtlSecs: 86400, orderMaxSize: undefined, orderPayloadMaxBytes: 32768 },
      isSealed: () => false,
    };
    const body = Buffer.from(c.body_b64 ?? vectors.body_b64, 'base64');
    const wire = encodeCheckRequest({ method: 'POST', path: '/internal/ingest/market', headers: c.headers, body });
    const d = await evaluate(decodeCheckRequest(wire), deps);
    if (c.expect.status === 200) {
      assert.equal(d, ALLOW);
    } else {
      assert.equal(d.httpStatus, c.expect.status);
      assert.equal(JSON.parse(d.body).error, c.expect.error);
    }
    if (c.expect.nonce_recorded !== undefined) assert.equal(nonces.size === 1, c.expect.nonce_recorded);
  });
}

// The signer module (common/crypto/ingest-signer.ts, which the verifier's ingestMac also serves)
// writes the vectors' signatures: every case the HMAC check lets through (accepted, or refused
// later with its nonce recorded), and not the one signed with another key.
for (const c of vectors.cases) {
  const passesHmac = c.expect.status === 200 || c.expect.nonce_recorded === true;
  if (!passesHmac && c.name !== 'signature for another key') continue;
  test(`ingest vector – the signer module ${passesHmac ? 'writes' : 'does not write'} the signature of "${c.name}"`, () => {
    const body = Buffer.from(c.body_b64 ?? vectors.body_b64, 'base64');
    const { 'x-edge-timestamp': ts = '', 'x-edge-nonce': nonce = '', 'x-edge-signature': sig = '' } = c.headers;
    const signed = ingestSigner(parseHmacKey('EDGE_INGEST_HMAC', c.key))(ts, nonce, body);
    assert.equal(signed === sig.toLowerCase(), passesHmac, `${signed} vs ${sig}`);
  });
}
