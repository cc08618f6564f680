/**
 * A small client that signs requests the way the feed pipeline and traders do.
 *
 *   scripts/node scripts/edge-client.ts ingest <document.json | -> [--url http://127.0.0.1:8080]
 *   scripts/node scripts/edge-client.ts demo-ingest <conditionId> [seq] [--url http://127.0.0.1:8080]
 *   scripts/node scripts/edge-client.ts order <marketId> <size> <payload-file | -> [--ttl 60]
 *   scripts/node scripts/edge-client.ts check-request <conditionId>   (prints a signed ingest CheckRequest JSON for grpcurl)
 *
 * Keys: EDGE_INGEST_HMAC (same formats as the service) and EDGE_FEED_ED25519_KEY (private key,
 * 32-byte seed hex/base64) — `npm start` writes both to .run/dev.env. Nothing is logged but
 * the response.
 *
 * An ingest answered 503 (nothing accepted: the nonce store or the market store did not answer in
 * time) or 504 (outcome unknown) is sent again as the feed pipeline does (docs/api.md "POST
 * /internal/ingest/market"): signed anew (a new nonce and timestamp), up to INGEST_ATTEMPTS (3)
 * times, 250 ms apart; each resend is named on stderr, stdout has the last answer. A 409 after a
 * 504 means the first attempt was stored. Orders are never resent (the backend may have one).
 */
import { createHash, createPrivateKey, randomBytes, sign } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { parseHmacKey } from '../authz/src/common/credentials.ts';
import { ingestSignatureHeaders } from '../authz/src/common/crypto/ingest-signer.ts';

const PKCS8_ED25519_PREFIX = Buffer.from('302e020100300506032b657004220420', 'hex');

function feedPrivateKey() {
  const raw = process.env['EDGE_FEED_ED25519_KEY'];
  if (!raw) throw new Error('EDGE_FEED_ED25519_KEY (the feed private key) is required to sign documents');
  const seed = /^[0-9a-fA-F]{64,128}$/.test(raw) ? Buffer.from(raw, 'hex') : Buffer.from(raw, 'base64');
  return createPrivateKey({ key: Buffer.concat([PKCS8_ED25519_PREFIX, seed.subarray(0, 32)]), format: 'der', type: 'pkcs8' });
}

function hmacKey(): Buffer {
  const raw = process.env['EDGE_INGEST_HMAC'];
  if (!raw) throw new Error('EDGE_INGEST_HMAC is required to sign ingests');
  return parseHmacKey('EDGE_INGEST_HMAC', raw);
}

/** Signs a document: Ed25519 over SHA-256(document) (docs/api.md "POST /internal/ingest/market"), then the HMAC headers (docs/api.md "POST /internal/ingest/market"). */
export function signedIngest(doc: Buffer, conditionId: string, key = hmacKey(), feed = feedPrivateKey()): { body: Buffer; headers: Record<string, string> } {
  const s = sign(null, createHash('sha256').update(doc).digest(), feed).toString('hex');
  const body = Buffer.from(JSON.stringify({ conditionId, d: doc.toString('base64'), s, k: 'ed25519-sha256' }));
  const ts = String(Math.floor(Date.now() / 1000));
  const nonce = randomBytes(16).toString('hex');
  return { body, headers: { 'content-type': 'application/json', ...ingestSignatureHeaders(key, ts, nonce, body) } };
}

export function demoDocument(conditionId: string, seq: number): Buffer {
  return Buffer.from(JSON.stringify({
    conditionId, seq, question: `Demo market ${conditionId}?`, active: true, closed: false,
    minSize: '1', maxSize: '100000', tickSize: '0.01',
    outcomes: [{ tokenId: '1', name: 'Yes', bid: '0.50', ask: '0.52', last: '0.51' }, { tokenId: '2', name: 'No', bid: '0.48', ask: '0.50', last: '0.49' }],
    updatedAt: Math.floor(Date.now() / 1000),
  }));
}

function arg(name: string, def: string): string {
  const i = process.argv.indexOf(name);
  return i === -1 ? def : (process.argv[i + 1] ?? def);
}

async function send(path: string, body: Buffer, headers: Record<string, string>): Promise<void> {
  const res = await post(path, body, headers);
  process.stdout.write(`${res.status} ${res.text}\n`);
  if (res.status >= 400) process.exitCode = 1;
}

async function post(path: string, body: Buffer, headers: Record<string, string>): Promise<{ status: number; text: string }> {
  const url = `${arg('--url', `http://127.0.0.1:${process.env['EDGE_PORT'] ?? '8080'}`)}${path}`;
  const res = await fetch(url, { method: 'POST', body: new Uint8Array(body), headers });
  return { status: res.status, text: await res.text() };
}

export const INGEST_ATTEMPTS = 3;

/** An ingest as the feed sends it: re-signed and resent on 503/504 (see the header). */
async function sendIngest(sign: () => { body: Buffer; headers: Record<string, string> }): Promise<void> {
  let res = { status: 0, text: '' };
  for (let attempt = 1; attempt <= INGEST_ATTEMPTS; attempt++) {
    const s = sign();
    res = await post('/internal/ingest/market', s.body, s.headers);
    if ((res.status !== 503 && res.status !== 504) || attempt === INGEST_ATTEMPTS) break;
    process.stderr.write(`edge-client: ${res.status} ${res.text.trim()}: sending it again, signed anew (attempt ${attempt + 1} of ${INGEST_ATTEMPTS})\n`);
    await new Promise((r) => setTimeout(r, 250));
  }
  process.stdout.write(`${res.status} ${res.text}\n`);
  if (res.status >= 400) process.exitCode = 1;
}

async function main(): Promise<void> {
  // Positional arguments: everything but the `--url <u>` and `--ttl <n>` options, wherever they stand.
  const args = process.argv.slice(2).filter((a, i, all) => !['--url', '--ttl'].includes(a) && !['--url', '--ttl'].includes(all[i - 1] ?? ''));
  const [cmd, a1, a2, a3] = args;
  if (cmd === 'ingest' && a1) {
    const doc = readFileSync(a1 === '-' ? 0 : a1);
    const { conditionId } = JSON.parse(doc.toString('utf8')) as { conditionId: string };
    await sendIngest(() => signedIngest(doc, conditionId));
  } else if (cmd === 'demo-ingest' && a1) {
    const doc = demoDocument(a1, Number(a2 ?? Date.now()));
    await sendIngest(() => signedIngest(doc, a1));
  } else if (cmd === 'order' && a1 && a2 && a3) {
    const payload = readFileSync(a3 === '-' ? 0 : a3).toString('base64');
    const deadline = Math.floor(Date.now() / 1000) + Number(arg('--ttl', '60'));
    await send('/v1/orders', Buffer.from(JSON.stringify({ marketId: a1, deadline, size: a2, payload })), { 'content-type': 'application/json' });
  } else if (cmd === 'check-request' && a1) {
    const s = signedIngest(demoDocument(a1, Number(a2 ?? Date.now())), a1);
    const headers = Object.fromEntries(Object.entries(s.headers));
    process.stdout.write(JSON.stringify({
      attributes: {
        source: { address: { socket_address: { address: '127.0.0.1', port_value: 40000 } } },
        request: { http: { method: 'POST', path: '/internal/ingest/market', headers, raw_body: s.body.toString('base64') } },
      },
    }) + '\n');
  } else {
    process.stderr.write('usage: edge-client.ts ingest <file|-> | demo-ingest <conditionId> [seq] | order <marketId> <size> <payload-file|-> | check-request <conditionId>\n');
    process.exitCode = 2;
  }
}

if (import.meta.main) await main();
