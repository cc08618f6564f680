/**
 * `npm run audit:traces` (issue 31: "no secret in any span, checked over a full e2e run"): the
 * local e2e suite (e2e/*.test.ts, not e2e/containers) with every edge it starts tracing into one
 * OTLP receiver (e2e/lib/otlp.ts) and every secret it makes or sends recorded
 * (testkit/trace-ledger.ts), then the checker (scripts/trace-check.ts) over everything exported.
 *
 * The run's settings: EDGE_E2E_TRACE_AUDIT=<dir> (the audit mode: the ledger, the exports) and
 * OTEL_EXPORTER_OTLP_ENDPOINT=<the receiver>, inherited by every process the tests start (npm
 * start, the docs' walkthroughs, the e2e stack, which also renders Envoy's tracer with it).
 * Arguments: test files instead of the whole suite (e.g. e2e/traces.test.ts). The directory
 * (~230 MB for the whole suite) is removed when everything passed and kept for a look when a test
 * or the checker failed (exit 1; its path printed), or always with EDGE_E2E_TRACE_AUDIT_KEEP=1.
 */
import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { fileURLToPath } from 'node:url';
import { startOtlpReceiver } from '../e2e/lib/otlp.ts';
import { EXPORTS_FILE, TRACE_AUDIT_ENV } from '../testkit/trace-ledger.ts';
import { checkDir, report } from './trace-check.ts';

const ROOT = fileURLToPath(new URL('../', import.meta.url));
/** Envoy exports every 5 s, and a stack's last batch may still be on its way when its test ends. */
const LAST_EXPORT_WAIT_MS = 6000;

const started = Date.now();
const dir = mkdtempSync(join(tmpdir(), 'edge-trace-audit-'));
const files = process.argv.slice(2);
const receiver = await startOtlpReceiver({ file: join(dir, EXPORTS_FILE) });
process.stdout.write(`trace audit: ${dir}, receiver ${receiver.endpoint}\n`);
const code = await new Promise<number | null>((resolve) => {
  const child = spawn(join(ROOT, 'scripts/node'), ['--test', '--test-concurrency=1', ...(files.length > 0 ? files : ['e2e/*.test.ts'])], {
    cwd: ROOT, stdio: 'inherit', env: { ...process.env, [TRACE_AUDIT_ENV]: dir, OTEL_EXPORTER_OTLP_ENDPOINT: receiver.endpoint },
  });
  child.once('exit', (c) => resolve(c));
});
await sleep(LAST_EXPORT_WAIT_MS);
await receiver.stop();
const result = await checkDir(dir);
const minutes = ((Date.now() - started) / 60_000).toFixed(1);
const passed = code === 0 && result.findings.length === 0;
const keep = !passed || process.env['EDGE_E2E_TRACE_AUDIT_KEEP'] === '1';
if (!keep) rmSync(dir, { recursive: true, force: true });
process.stdout.write(`${report(result)}\ntests: ${code === 0 ? 'passed' : `FAILED (exit ${code})`}; ${minutes} min; exports and ledger ${keep ? `kept in ${dir}` : 'removed'}\n`);
process.exitCode = passed ? 0 : 1;
