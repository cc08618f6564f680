/**
 * docs/openapi.yaml is generated from the service's own schemas and error table
 * (scripts/openapi.ts): it must equal a fresh generation, lint clean with @redocly/cli, and
 * name every API error code.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { promisify } from 'node:util';
import { fileURLToPath } from 'node:url';
import { ERROR_STATUS } from '../src/common/errors.ts';
import { OPENAPI_FILE, buildOpenApi, renderOpenApi } from '../../scripts/openapi.ts';

const require = createRequire(import.meta.url);
const ROOT = fileURLToPath(new URL('../../', import.meta.url));

test('openapi – the committed document equals a fresh generation from the code (no drift)', () => {
  assert.equal(readFileSync(OPENAPI_FILE, 'utf8'), renderOpenApi());
});

test('openapi – every API error code is documented, each under its own status', () => {
  const text = JSON.stringify(buildOpenApi());
  for (const [code, status] of Object.entries(ERROR_STATUS)) {
    assert.ok(text.includes(JSON.stringify(code)), code);
    assert.ok(text.includes(`"${status}":`), `${code} → ${status}`);
  }
});

test('openapi – the document lints clean with @redocly/cli', async () => {
  const cli = require.resolve('@redocly/cli/bin/cli.js');
  const { stdout, stderr } = await promisify(execFile)(process.execPath, [cli, 'lint', OPENAPI_FILE, '--format=stylish'], { cwd: ROOT, env: { ...process.env, REDOCLY_TELEMETRY: 'off', REDOCLY_SUPPRESS_UPDATE_NOTICE: 'true' } });
  assert.match(`${stdout}${stderr}`, /Your API description is valid/);
  assert.doesNotMatch(`${stdout}${stderr}`, /\berror\b/);
});
