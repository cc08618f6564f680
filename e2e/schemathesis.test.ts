/**
 * schemathesis (PyPI, in .venv) fuzzes the running edge THROUGH ENVOY with docs/openapi.yaml:
 * every operation, coverage + fuzzing + stateful phases, a bounded number of examples.
 * Checks: no 5xx, documented status codes, response schemas, content types and headers.
 * Run 1 raises the rate limit for its one client address (so fuzzing reaches the service, not
 * the limiter); run 2 keeps the defaults (20/s, burst 40) so 429s are exercised and must conform.
 * The longer run: `npm run fuzz:api` (FUZZ_EXAMPLES, default 300).
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { fileURLToPath } from 'node:url';
import { startStack } from './lib/driver.ts';

const ROOT = fileURLToPath(new URL('../', import.meta.url));
const CHECKS = 'not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance,response_headers_conformance';
export const EXAMPLES = Number(process.env['FUZZ_EXAMPLES'] ?? 25);

export async function fuzz(env: Record<string, string>, examples: number): Promise<{ code: number; summary: string }> {
  const stack = await startStack({ env: { LOG_LEVEL: 'warn', ...env } });
  try {
    const r = await promisify(execFile)(`${ROOT}.venv/bin/schemathesis`, [
      'run', `${ROOT}docs/openapi.yaml`, '--url', stack.edgeUrl, '-n', String(examples), '--checks', CHECKS, '--seed', '20261122',
      '--request-timeout', '10',
    ], { maxBuffer: 1 << 26, env: { ...process.env, NO_COLOR: '1', SCHEMATHESIS_TELEMETRY: 'false' } }).then(
      (ok) => ({ code: 0, out: ok.stdout }),
      (err: { code?: number; stdout?: string }) => ({ code: err.code ?? 1, out: err.stdout ?? String(err) }),
    );
    // Keep the report readable: long generated values are cut.
    const summary = r.out.split('\n').map((l) => (l.length > 300 ? `${l.slice(0, 300)}…` : l)).slice(-80).join('\n');
    return { code: r.code, summary };
  } finally {
    await stack.stop();
  }
}

test('schemathesis through Envoy – raised rate limit: no 5xx, every status, body, content-type and header as documented', async () => {
  const r = await fuzz({ RPS_PER_IP: '100000', RATE_BURST: '100000' }, EXAMPLES);
  assert.equal(r.code, 0, r.summary);
});

test('schemathesis through Envoy – default rate limit: 429 answers conform too', async () => {
  const r = await fuzz({}, Math.max(5, Math.floor(EXAMPLES / 3)));
  assert.equal(r.code, 0, r.summary);
});
