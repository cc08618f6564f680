/**
 * scripts/edge-client.ts as the feed: an ingest answered 503 or 504 is sent again signed anew (a
 * new nonce), at most INGEST_ATTEMPTS times, stdout holding the last answer; a 401 is not resent;
 * an order is never resent. A real HTTP server on 127.0.0.1:0 answers as scripted; the client runs
 * as a process, as the docs run it.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { createServer, type IncomingMessage } from 'node:http';
import { randomBytes } from 'node:crypto';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { ROOT } from '../../deploy/paths.ts';
import { removeTempDir, tempDir } from '../../testkit/temp-dir.ts';

const NODE = join(ROOT, 'scripts/node');
const KEYS = { EDGE_INGEST_HMAC: `hex:${randomBytes(32).toString('hex')}`, EDGE_FEED_ED25519_KEY: randomBytes(32).toString('hex') };

async function scripted(statuses: number[], args: (url: string) => string[]): Promise<{ stdout: string; stderr: string; code: number; seen: IncomingMessage['headers'][] }> {
  const seen: IncomingMessage['headers'][] = [];
  const server = createServer((req, res) => {
    req.resume();
    req.on('end', () => {
      seen.push(req.headers);
      const status = statuses[Math.min(seen.length - 1, statuses.length - 1)]!;
      res.writeHead(status, { 'content-type': 'application/json' }).end(JSON.stringify({ status }));
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const port = (server.address() as { port: number }).port;
  try {
    const r = await promisify(execFile)(NODE, [join(ROOT, 'scripts/edge-client.ts'), ...args(`http://127.0.0.1:${port}`)], { env: { ...process.env, ...KEYS } })
      .then((o) => ({ ...o, code: 0 }), (e: { stdout: string; stderr: string; code: number }) => ({ stdout: e.stdout, stderr: e.stderr, code: e.code }));
    return { ...r, seen };
  } finally {
    server.close();
  }
}

test('edge-client: an ingest answered 503, then 504, is sent again signed anew each time; the 200 after is what stdout shows', async () => {
  const r = await scripted([503, 504, 200], (url) => ['demo-ingest', '0xretry', '5', '--url', url]);
  assert.equal(r.seen.length, 3);
  assert.equal(new Set(r.seen.map((h) => h['x-edge-nonce'])).size, 3, 'a new nonce on every attempt');
  assert.match(r.stdout, /^200 /);
  assert.equal(r.stderr.match(/sending it again, signed anew/g)?.length, 2);
  assert.equal(r.code, 0);
});

test('edge-client: three 503s end it with the last answer and exit 1; a 401 is not resent', async () => {
  const r = await scripted([503], (url) => ['demo-ingest', '0xretry', '5', '--url', url]);
  assert.equal(r.seen.length, 3, 'INGEST_ATTEMPTS');
  assert.match(r.stdout, /^503 /);
  assert.equal(r.code, 1);
  const refused = await scripted([401], (url) => ['demo-ingest', '0xretry', '5', '--url', url]);
  assert.equal(refused.seen.length, 1);
  assert.match(refused.stdout, /^401 /);
});

test('edge-client: an order answered 503 is never sent again (the backend may hold it)', async () => {
  const dir = tempDir('edge-client-');
  try {
    writeFileSync(join(dir, 'o.bin'), randomBytes(16));
    const r = await scripted([503], (url) => ['order', '0xretry', '1', join(dir, 'o.bin'), '--url', url]);
    assert.equal(r.seen.length, 1);
    assert.match(r.stdout, /^503 /);
  } finally {
    removeTempDir(dir);
  }
});
