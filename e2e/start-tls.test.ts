/**
 * `DEV_EDGE_TLS=1 npm start`: the real scripts/start.ts on fresh ports and a fresh run directory
 * serves the client port over TLS with the development certificate it generates there; the
 * banner's `curl --cacert` line answers 200 over TLS 1.3 and h2, its edge-client lines (with
 * NODE_EXTRA_CA_CERTS) ingest and order over TLS, plaintext on the port is refused; Ctrl-C stops it.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { writeFileSync } from 'node:fs';
import { randomBytes } from 'node:crypto';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { fileURLToPath } from 'node:url';
import { removeTempDir } from '../testkit/temp-dir.ts';
import { curl } from './lib/edge-tls.ts';
import { freshStart, keysOf, startScript } from './lib/npm-start.ts';

const ROOT = fileURLToPath(new URL('../', import.meta.url));
const NODE = join(ROOT, 'scripts', 'node');

test('DEV_EDGE_TLS=1 npm start: a development certificate under the run directory, the banner\'s curl --cacert and edge-client lines work over TLS, plaintext refused', { timeout: 150_000 }, async () => {
  const { runDir, ports, env } = await freshStart({ prefix: 'edge-start-tls-', unset: ['EDGE_TLS_CERT_FILE', 'EDGE_TLS_KEY_FILE'], extra: { DEV_EDGE_TLS: '1' } });
  const stack = startScript(env);
  try {
    await stack.waitFor(/READY/, 90_000);
    const edge = `https://localhost:${ports.EDGE_PORT}`;
    const ca = join(runDir, 'pki', 'edge-ca.crt');
    assert.match(stack.out, new RegExp(`this machine +GET ${edge}/healthz → 200 over TLSv1\\.3`));
    assert.ok(stack.out.includes(`curl --cacert '${ca}' ${edge}/healthz`), `the banner shows the curl --cacert form:\n${stack.out}`);
    const r = await curl(['--cacert', ca, `${edge}/healthz`]);
    assert.equal(r.out, '200 2', r.err);
    // Plaintext on the TLS port: no HTTP answer.
    const plain = await curl([`http://127.0.0.1:${ports.EDGE_PORT}/healthz`]);
    assert.notEqual(plain.code, 0);

    // The banner's edge-client lines, as printed (NODE_EXTRA_CA_CERTS=<the CA> … --url https://…).
    const keysLine = /set -a; \. '([^']+)'; set \+a/.exec(stack.out);
    assert.ok(keysLine, stack.out);
    const keys = keysOf(keysLine[1] ?? '');
    assert.ok(stack.out.includes(`NODE_EXTRA_CA_CERTS='${ca}' scripts/node scripts/edge-client.ts demo-ingest 0xdemo --url ${edge}`), stack.out);
    const clientEnv = { ...env, ...keys, NODE_EXTRA_CA_CERTS: ca };
    const client = (...args: string[]) => promisify(execFile)(NODE, [join(ROOT, 'scripts/edge-client.ts'), ...args], { cwd: ROOT, env: clientEnv });
    assert.match((await client('demo-ingest', '0xdemo', '--url', edge)).stdout, /^200 .*"stored"/);
    const order = join(runDir, 'order.bin');
    writeFileSync(order, randomBytes(64));
    assert.match((await client('order', '0xdemo', '10', order, '--url', edge)).stdout, /^200 .*"accepted"/);
  } finally {
    await stack.stop();
    removeTempDir(runDir);
  }
});
