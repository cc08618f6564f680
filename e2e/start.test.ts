/**
 * `npm start` as a newcomer runs it: the real scripts/start.ts on fresh ports and a fresh run
 * directory (DEV_RUN_DIR), its own redis-server and demo mTLS backend. The test follows the
 * banner's "try it" lines (a signed ingest, a read, an order), then presses Ctrl-C (SIGINT) and
 * checks that every process of the stack is gone and that no secret reached Envoy's or Redis's
 * environment.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { readdirSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { setTimeout as sleep } from 'node:timers/promises';
import { fileURLToPath } from 'node:url';
import { freshStart, keysOf, portOpen, startScript } from './lib/npm-start.ts';

const ROOT = fileURLToPath(new URL('../', import.meta.url));
const NODE = join(ROOT, 'scripts', 'node');

/** Processes whose command line mentions `needle`, with their environment. */
function processesMentioning(needle: string): { pid: number; cmd: string; env: string }[] {
  const out: { pid: number; cmd: string; env: string }[] = [];
  for (const d of readdirSync('/proc')) {
    if (!/^\d+$/.test(d) || Number(d) === process.pid) continue;
    try {
      const cmd = readFileSync(`/proc/${d}/cmdline`, 'utf8').replaceAll('\0', ' ');
      if (cmd.includes(needle)) out.push({ pid: Number(d), cmd, env: readFileSync(`/proc/${d}/environ`, 'utf8') });
    } catch { /* gone, or not ours */ }
  }
  return out;
}

test('npm start: ready on /healthz, the banner\'s ingest and order work, Ctrl-C stops every process; no process has the HMAC key in its environment', { timeout: 120_000 }, async () => {
  const { runDir, ports, env } = await freshStart();
  const stack = startScript(env);
  try {
    await stack.waitFor(/READY/, 60_000);
    const edge = `http://127.0.0.1:${ports.EDGE_PORT}`;
    assert.equal((await fetch(`${edge}/healthz`)).status, 200);

    // The banner's lines, as printed: the keys file, then the client with EDGE_PORT.
    const keysLine = /set -a; \. '([^']+)'; set \+a/.exec(stack.out);
    assert.ok(keysLine, `the banner names the keys file:\n${stack.out}`);
    assert.equal(keysLine[1], join(runDir, 'dev.env'));
    assert.match(stack.out, new RegExp(`EDGE_PORT=${ports.EDGE_PORT} scripts/node scripts/edge-client.ts demo-ingest 0xdemo`));
    // No INGEST_PORT: ingest stays on the client port, and the banner says so.
    assert.match(stack.out, new RegExp(`ingest +${edge}/internal/ingest/market +\\(the client port: INGEST_PORT unset\\)`));
    const keys = keysOf(keysLine[1]);
    const clientEnv = { ...env, ...keys, EDGE_PORT: String(ports.EDGE_PORT) };
    const client = (...args: string[]) => promisify(execFile)(NODE, [join(ROOT, 'scripts/edge-client.ts'), ...args], { cwd: ROOT, env: clientEnv });
    const ing = await client('demo-ingest', '0xdemo');
    assert.match(ing.stdout, /^200 .*"stored"/, ing.stdout);
    const markets = await (await fetch(`${edge}/v1/markets?conditionId=0xdemo`)).json() as { markets: unknown[] };
    assert.equal(markets.markets.length, 1);
    // The banner's example order file is under the run directory (not a shared /tmp path).
    const orderLine = /head -c 64 \/dev\/urandom > '([^']+)'\n.*edge-client\.ts order 0xdemo 10 '([^']+)'/.exec(stack.out);
    assert.ok(orderLine, `the banner names the order file:\n${stack.out}`);
    const orderFile = orderLine[1]!;
    assert.equal(orderFile, join(runDir, 'order.bin'));
    assert.equal(orderLine[2], orderFile);
    writeFileSync(orderFile, randomBytes(64));
    const order = await client('order', '0xdemo', '10', orderFile);
    assert.match(order.stdout, /^200 /, order.stdout);

    // Only the TS service holds the HMAC key; Envoy and Redis were started without it.
    // Envoy's and redis-server's command lines name the run directory (Redis runs with
    // --set-proc-title no: a retitled process shows an empty environment, which would prove nothing).
    const stackProcs = processesMentioning(runDir);
    const names = stackProcs.map((p) => p.cmd);
    assert.ok(names.some((c) => c.includes('envoy')) && names.some((c) => c.includes('redis-server')), names.join('\n'));
    for (const p of stackProcs) {
      assert.match(p.env, /DEV_RUN_DIR=/, `${p.cmd}: its environment is readable`);
      assert.doesNotMatch(p.env, /EDGE_INGEST_HMAC=|REDIS_URL=/, `${p.cmd} has the HMAC key or the Redis URL in its environment`);
    }
    // The TS service reads the key from a file: its environment (readable in /proc for the life
    // of the process, sealed or not) names the file and holds no key.
    const hmacHex = /^hex:([0-9a-f]+)$/.exec(keys['EDGE_INGEST_HMAC'] ?? '')?.[1];
    assert.ok(hmacHex !== undefined && hmacHex.length === 64, 'dev.env holds the development HMAC key');
    const authz = processesMentioning('authz/src/main.ts').filter((p) => p.env.includes(`DEV_RUN_DIR=${runDir}`));
    assert.equal(authz.length, 1, 'the TS service process');
    assert.match(authz[0]!.env, new RegExp(`EDGE_INGEST_HMAC_FILE=${runDir}/secrets/edge_ingest_hmac\0`));
    assert.doesNotMatch(authz[0]!.env, /EDGE_INGEST_HMAC=/);
    assert.ok(!authz[0]!.env.includes(hmacHex), 'the HMAC key is not in the TS service\'s environment');
    assert.equal(statSync(join(runDir, 'secrets/edge_ingest_hmac')).mode & 0o777, 0o600);
  } finally {
    await stack.stop();
  }
  assert.equal(stack.code, 0, stack.out);
  assert.match(stack.out, /start: stopped/);
  // Nothing of the stack is left: no process mentions the run directory, and the ports are free.
  await sleep(200);
  assert.deepEqual(processesMentioning(runDir).map((p) => p.cmd), []);
  for (const [k, port] of Object.entries(ports)) assert.equal(await portOpen(port), false, `${k} ${port} is closed`);
  rmSync(runDir, { recursive: true, force: true });
});
