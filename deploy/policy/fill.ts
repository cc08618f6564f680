/**
 * Turns a policy CheckRequest template (deploy/policy/*.json) into the request to send, for
 * the current time and, for signed ingests, signed with your keys:
 *
 *   scripts/node deploy/policy/fill.ts deploy/policy/order-good.json \
 *     | .venv/bin/grpcurl -plaintext -d @ 127.0.0.1:9191 envoy.service.auth.v3.Authorization/Check
 *
 * Placeholders:
 *   ${NOW}       unix seconds now              ${DEADLINE}  now + 60 (an order deadline)
 *   ${NONCE}     a fresh random 32-hex nonce
 *   ${DOC_B64}   base64 of the template's `_document` (removed from the output)
 *   ${DOC_SIG}   hex Ed25519 signature over SHA-256 of that document (the feed key)
 *   ${HMAC}      (the whole x-edge-signature header) v1=HMAC-SHA256 of "<timestamp>.<nonce>.<body>"
 *                computed over the final body (the ingest HMAC key)
 * Keys, only needed for ${DOC_SIG} / ${HMAC}, as the service reads them: EDGE_INGEST_HMAC or
 * EDGE_INGEST_HMAC_FILE (hex:/base64:/text), and the feed PRIVATE key EDGE_FEED_ED25519_KEY or
 * EDGE_FEED_ED25519_KEY_FILE (32-byte seed or 64-byte secret key, hex or base64).
 * `npm start` writes both to .run/dev.env; compose-setup.ts to deploy/.secrets/.
 */
import { createHash, createPrivateKey, randomBytes, sign, type KeyObject } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { parseHmacKey, secretSetting } from '../../authz/src/common/credentials.ts';
import { ingestSigner } from '../../authz/src/common/crypto/ingest-signer.ts';

export interface PolicyKeys {
  /** The ingest HMAC key bytes. */
  readonly hmacKey: Buffer;
  /** The feed signing key (private). */
  readonly feedKey: KeyObject;
}

const PKCS8_ED25519_PREFIX = Buffer.from('302e020100300506032b657004220420', 'hex');

/** An Ed25519 private KeyObject from a 32-byte seed or 64-byte secret key (hex or base64). */
export function feedPrivateKey(value: string): KeyObject {
  const v = value.trim();
  const raw = /^([0-9a-fA-F]{2})+$/.test(v) ? Buffer.from(v, 'hex') : Buffer.from(v, 'base64');
  if (raw.length !== 32 && raw.length !== 64) throw new Error('feed key: expected a 32-byte seed or 64-byte secret key, hex or base64');
  return createPrivateKey({ key: Buffer.concat([PKCS8_ED25519_PREFIX, raw.subarray(0, 32)]), format: 'der', type: 'pkcs8' });
}

/** The keys from the environment, as the service names them. */
export function keysFromEnv(env: Readonly<Record<string, string | undefined>> = process.env): PolicyKeys {
  const hmac = secretSetting(env, 'EDGE_INGEST_HMAC');
  const feed = secretSetting(env, 'EDGE_FEED_ED25519_KEY');
  if (hmac === undefined || feed === undefined) {
    throw new Error('signed templates need EDGE_INGEST_HMAC[_FILE] and the feed private key EDGE_FEED_ED25519_KEY[_FILE]');
  }
  return { hmacKey: parseHmacKey('EDGE_INGEST_HMAC', hmac), feedKey: feedPrivateKey(feed) };
}

interface Template {
  _document?: unknown;
  attributes: { request: { http: { headers: Record<string, string>; body?: string } } };
}

/** Fills a template (see the file comment). `keys` is called only when something must be signed. */
export function fillPolicy(text: string, opts: { nowSecs?: number; keys?: () => PolicyKeys } = {}): string {
  const now = opts.nowSecs ?? Math.floor(Date.now() / 1000);
  const t = JSON.parse(text
    .replaceAll('${NOW}', String(now))
    .replaceAll('${DEADLINE}', String(now + 60))
    .replaceAll('${NONCE}', randomBytes(16).toString('hex'))) as Template;
  let keys: PolicyKeys | undefined;
  const k = (): PolicyKeys => (keys ??= (opts.keys ?? keysFromEnv)());
  const http = t.attributes.request.http;
  if (t._document !== undefined) {
    const doc = Buffer.from(JSON.stringify(t._document));
    delete t._document;
    if (http.body?.includes('${DOC_SIG}') === true) {
      http.body = http.body.replaceAll('${DOC_SIG}', sign(null, createHash('sha256').update(doc).digest(), k().feedKey).toString('hex'));
    }
    http.body = http.body?.replaceAll('${DOC_B64}', doc.toString('base64'));
  }
  if (http.headers['x-edge-signature'] === '${HMAC}') {
    const { 'x-edge-timestamp': ts = '', 'x-edge-nonce': nonce = '' } = http.headers;
    http.headers['x-edge-signature'] = ingestSigner(k().hmacKey)(ts, nonce, http.body ?? '');
  }
  return `${JSON.stringify(t, null, 2)}\n`;
}

if (import.meta.main) {
  const file = process.argv[2];
  if (file === undefined) {
    process.stderr.write('usage: fill.ts <policy.json>   (prints the CheckRequest to send)\n');
    process.exit(2);
  }
  try {
    process.stdout.write(fillPolicy(readFileSync(file, 'utf8')));
  } catch (err) {
    process.stderr.write(`fill.ts: ${(err as Error).message}\n`);
    process.exit(1);
  }
}
