/**
 * Orders under sustained load through real Envoy, with the rate limit raised so the load
 * generator's one address is never throttled.
 */
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { join } from 'node:path';
import { startStack, type Stack } from './lib/driver.ts';
import { ingest, orderBody, uniqueId } from './lib/client.ts';

let stack: Stack;
let market: string;
before(async () => {
  stack = await startStack({ env: { RPS_PER_IP: '1000000', RATE_BURST: '1000000', LOG_LEVEL: 'warn' } });
  market = uniqueId('0xload');
  const r = await ingest(stack, market, 1);
  assert.equal(r.status, 200, r.text);
});
after(async () => stack?.stop());

test('sustained order load (h2load, 16 connections, 4 s): every order 200, none lost or failed', async () => {
  // Regression: when orders went through ext_proc, Envoy reset every finished stream; Node's
  // HTTP/2 rapid-reset guard then closed the authz connection and ~1 % of orders failed 503
  // (authz/src/authz/grpc-server.ts). The order-body Lua filter must hold the same load with no 5xx.
  // h2load (Debian nghttp2-client, installed by .ci/run) drives enough load to show it.
  const { execFile } = await import('node:child_process');
  const { promisify } = await import('node:util');
  const { writeFileSync } = await import('node:fs');
  const file = join(stack.dir, 'order-load.json');
  writeFileSync(file, orderBody(market, randomBytes(64)));
  const { stdout } = await promisify(execFile)('h2load', ['--h1', '-c', '16', '-D', '4', '-d', file, '-H', 'content-type: application/json', '-H', 'x-forwarded-for: 192.0.2.99', `${stack.edgeUrl}/v1/orders`]);
  const m = /status codes: (\d+) 2xx, (\d+) 3xx, (\d+) 4xx, (\d+) 5xx/.exec(stdout);
  assert.ok(m, stdout);
  const [ok, , c4, c5] = m.slice(1).map(Number) as [number, number, number, number];
  // Only that the load was real (the regression showed at ~1 % of orders); how fast is for the
  // benchmarks: a shared 2-vCPU machine gave 1,900–3,000 orders in these 4 s.
  assert.ok(ok > 1000, `load was real: ${ok} orders`);
  assert.deepEqual([c4, c5], [0, 0], stdout.split('\n').filter((l) => /status codes|requests:/.test(l)).join(' '));
});

