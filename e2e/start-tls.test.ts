/**
 * `DEV_EDGE_TLS=1 npm start`: the real scripts/start.ts on fresh ports and a fresh run directory
 * serves the client port over TLS with the development certificate it generates there; the
 * banner's `curl --cacert` line answers 200 over TLS 1.3 and h2, its edge-client lines (with
 * NODE_EXTRA_CA_CERTS) ingest and order over TLS, plaintext on the port is refused; Ctrl-C stops it.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile, spawn } from 'node:child_process';
import { readFileSync, writeFileSync } from 'node:fs';
import { randomBytes } from 'node:crypto';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { setTimeout as sleep } from 'node:timers/promises';
import { fileURLToPath } from 'node:url';
import { freePort } from '../authz/test/redis-server.ts';
import { removeTempDir, tempDir } from '../authz/test/temp-dir.ts';
import { curl } from './lib/edge-tls.ts';

const ROOT = fileURLToPath(new URL('../', import.meta.url));
const NODE = join(ROOT, 'scripts', 'node');

test('DEV_EDGE_TLS=1 npm start: a development certificate under the run directory, the banner\'s curl --cacert and edge-client lines work over TLS, plaintext refused', { timeout: 150_000 }, async () => {
  const runDir = tempDir('edge-start-tls-');
  const ports = {
    EDGE_PORT: await freePort(), AUTHZ_GRPC_PORT: await freePort(), MARKET_PORT: await freePort(),
    AUTHZ_ADMIN_PORT: await freePort(), ENVOY_ADMIN_PORT: await freePort(), DEV_REDIS_PORT: await freePort(), DEV_BACKEND_PORT: await freePort(),
  };
  const env: Record<string, string> = { ...process.env as Record<string, string>, DEV_RUN_DIR: runDir, LOG_LEVEL: 'warn', DEV_EDGE_TLS: '1' };
  for (const k of ['REDIS_URL', 'ORDER_BACKEND_URL', 'EDGE_INGEST_HMAC', 'EDGE_FEED_ED25519_PUBLIC_KEY', 'EDGE_FEED_ED25519_KEY', 'EDGE_TLS_CERT_FILE', 'EDGE_TLS_KEY_FILE']) delete env[k];
  for (const [k, v] of Object.entries(ports)) env[k] = String(v);
  const child = spawn(NODE, [join(ROOT, 'scripts/start.ts')], { cwd: ROOT, env, stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '';
  child.stdout.on('data', (d: Buffer) => { out += d.toString(); });
  child.stderr.on('data', (d: Buffer) => { out += d.toString(); });
  const exited = new Promise<number | null>((resolve) => child.once('exit', (code) => resolve(code)));
  try {
    for (let i = 0; i < 900 && !out.includes('READY'); i++) await sleep(100);
    assert.match(out, /READY/, out);
    const edge = `https://localhost:${ports.EDGE_PORT}`;
    const ca = join(runDir, 'pki', 'edge-ca.crt');
    assert.match(out, new RegExp(`this machine +GET ${edge}/healthz → 200 over TLSv1\\.3`));
    assert.ok(out.includes(`curl --cacert '${ca}' ${edge}/healthz`), `the banner shows the curl --cacert form:\n${out}`);
    const r = await curl(['--cacert', ca, `${edge}/healthz`]);
    assert.equal(r.out, '200 2', r.err);
    // Plaintext on the TLS port: no HTTP answer.
    const plain = await curl([`http://127.0.0.1:${ports.EDGE_PORT}/healthz`]);
    assert.notEqual(plain.code, 0);

    // The banner's edge-client lines, as printed (NODE_EXTRA_CA_CERTS=<the CA> … --url https://…).
    const keysLine = /set -a; \. '([^']+)'; set \+a/.exec(out);
    assert.ok(keysLine, out);
    const keys = Object.fromEntries(readFileSync(keysLine[1] ?? '', 'utf8').split('\n').filter((l: string) => /^[A-Z0-9_]+=/.test(l)).map((l: string) => [l.slice(0, l.indexOf('=')), l.slice(l.indexOf('=') + 1)]));
    assert.ok(out.includes(`NODE_EXTRA_CA_CERTS='${ca}' scripts/node scripts/edge-client.ts demo-ingest 0xdemo --url ${edge}`), out);
    const clientEnv = { ...env, ...keys, NODE_EXTRA_CA_CERTS: ca };
    const client = (...args: string[]) => promisify(execFile)(NODE, [join(ROOT, 'scripts/edge-client.ts'), ...args], { cwd: ROOT, env: clientEnv });
    assert.match((await client('demo-ingest', '0xdemo', '--url', edge)).stdout, /^200 .*"stored"/);
    const order = join(runDir, 'order.bin');
    writeFileSync(order, randomBytes(64));
    assert.match((await client('order', '0xdemo', '10', order, '--url', edge)).stdout, /^200 .*"accepted"/);
  } finally {
    child.kill('SIGINT');
    const code = await Promise.race([exited, sleep(30_000).then(() => 'timeout' as const)]);
    if (code === 'timeout') child.kill('SIGKILL');
    removeTempDir(runDir);
  }
});
