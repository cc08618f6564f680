/**
 * The `npm-start` golden profile (envoy/golden/npm-start/, envoy/golden.ts) is what the real
 * `npm start` renders: scripts/start.ts is a program, so envoy/golden.ts restates what it gives the
 * renderer, and this test holds the two together. It starts the stack with no settings but fresh
 * ports and a fresh run directory, reads the envoy.yaml and sds.yaml it wrote, and compares them,
 * with the run directory written /DEV_RUN_DIR and each chosen port as its default, to the profile.
 *
 *   scripts/node --test e2e/start-golden.test.ts
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { freePort } from '../testkit/redis-server.ts';
import { removeTempDir, tempDir } from '../testkit/temp-dir.ts';
import { renderNpmStart, RUN_DIR } from '../envoy/golden.ts';
import { startScript } from './lib/npm-start.ts';

/** The port settings npm start listens on or renders, with their defaults (README "Ports and addresses", DEV_*). */
const DEFAULT_PORTS = {
  EDGE_PORT: 8080, AUTHZ_GRPC_PORT: 9191, MARKET_PORT: 8081, AUTHZ_ADMIN_PORT: 9464, ENVOY_ADMIN_PORT: 9901, DEV_REDIS_PORT: 6390, DEV_BACKEND_PORT: 8443,
} as const;

/** `text` with `run` written RUN_DIR and every port of `ports` (Envoy's `port_value`, a `host:port`) as its default. */
function normalized(text: string, run: string, ports: ReadonlyMap<number, number>): string {
  return text.replaceAll(run, RUN_DIR).replace(/(port_value: |localhost:)(\d+)\b/g, (m, pre: string, n: string) => {
    const def = ports.get(Number(n));
    return def === undefined ? m : `${pre}${def}`;
  });
}

test('npm start with no settings renders the npm-start golden profile (run directory and ports aside)', { timeout: 120_000 }, async () => {
  const run = tempDir('edge-golden-start-');
  const ports = new Map<number, number>();
  // Only what a shell needs: no setting of this process's environment may change the render
  // (not even the trace audit's OTEL_EXPORTER_OTLP_ENDPOINT: this one stack is never traced).
  const env: Record<string, string> = { PATH: process.env['PATH'] ?? '/usr/bin:/bin', HOME: process.env['HOME'] ?? run, DEV_RUN_DIR: run };
  if (process.env['TMPDIR'] !== undefined) env['TMPDIR'] = process.env['TMPDIR'];
  for (const [name, def] of Object.entries(DEFAULT_PORTS)) {
    const port = await freePort();
    env[name] = String(port);
    ports.set(port, def);
  }
  const stack = startScript(env);
  try {
    await stack.waitFor(/READY/, 90_000);
    const golden = renderNpmStart();
    for (const file of ['envoy.yaml', 'sds.yaml']) {
      const rendered = normalized(readFileSync(join(run, file), 'utf8'), run, ports);
      const lines = [rendered.split('\n'), (golden[file] ?? '').split('\n')] as const;
      const at = lines[0].findIndex((l, i) => l !== lines[1][i]);
      assert.ok(rendered === golden[file], `${file}: npm start wrote something else than envoy/golden.ts's npm-start profile, first at line ${at + 1}:\n`
        + `  npm start:  ${lines[0][at] ?? '(end)'}\n  golden.ts:  ${lines[1][at] ?? '(end)'}\n(make envoy/golden.ts's npmStartEnv follow scripts/start.ts, then npm run render:golden)\n${stack.out}`);
    }
    assert.equal(golden['sds-server-cert.yaml'], undefined);
  } finally {
    await stack.stop();
  }
  assert.equal(stack.code, 0, stack.out);
  removeTempDir(run);
});
