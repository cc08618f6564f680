/**
 * The trace audit's checker (scripts/trace-check.ts) can fail: spans exported by the real
 * OpenTelemetry SDK over OTLP/gRPC to the real receiver (e2e/lib/otlp-receiver.py, writing the
 * audit's exports file), a ledger as testkit/trace-ledger.ts writes it, then the checker as
 * `npm run audit:traces` runs it. A clean run passes with its counts; a secret planted in a span
 * (in another encoding than recorded, or upper-case) and a foreign attribute key on a span, an
 * event or a resource are each found; an audit that saw no span or no secret fails.
 */
import { after, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { SpanKind, type Attributes } from '@opentelemetry/api';
import { resourceFromAttributes } from '@opentelemetry/resources';
import { SimpleSpanProcessor, TracerProvider } from '@opentelemetry/sdk-trace';
import { OTLPTraceExporter } from '@opentelemetry/exporter-trace-otlp-grpc';
import { ROOT } from '../../deploy/paths.ts';
import { CHECK_SPAN_NAME, RPC_ATTRIBUTES, SPAN_ATTRIBUTE } from '../../authz/src/authz/tracing.ts';
import { startOtlpReceiver } from '../../e2e/lib/otlp.ts';
import { removeTempDir, tempDir } from '../../testkit/temp-dir.ts';
import { EXPORTS_FILE, LEDGER_FILE, type LedgerEntry } from '../../testkit/trace-ledger.ts';
import { checkDir, report, secretForms } from '../trace-check.ts';

const KEY = randomBytes(32);
const NONCE = randomBytes(16).toString('hex');
const LEDGER: LedgerEntry[] = [{ kind: 'ingest HMAC key', values: [KEY.toString('hex')] }, { kind: 'x-edge-nonce header', values: [NONCE] }];
const dirs: string[] = [];
after(() => { for (const d of dirs) removeTempDir(d); });

interface PlannedSpan {
  readonly name: string;
  readonly attributes: Attributes;
  readonly event?: { name: string; attributes?: Attributes };
}

/** An audit directory: `spans` exported through the SDK to the receiver (one resource with `resource`), and `ledger`. */
async function auditDir(spans: readonly PlannedSpan[], ledger: readonly LedgerEntry[], resource: Attributes = {}): Promise<string> {
  const dir = tempDir('edge-trace-check-');
  dirs.push(dir);
  writeFileSync(join(dir, LEDGER_FILE), ledger.map((e) => `${JSON.stringify(e)}\n`).join(''));
  const receiver = await startOtlpReceiver({ file: join(dir, EXPORTS_FILE) });
  try {
    const provider = new TracerProvider({
      resource: resourceFromAttributes({ 'service.name': 'edge-authz', ...resource }),
      spanProcessors: [new SimpleSpanProcessor({ exporter: new OTLPTraceExporter({ url: receiver.endpoint }) })],
    });
    const tracer = provider.getTracer('trace-check-test');
    for (const s of spans) {
      const span = tracer.startSpan(s.name, { kind: SpanKind.SERVER, attributes: s.attributes });
      if (s.event !== undefined) span.addEvent(s.event.name, s.event.attributes);
      span.end();
    }
    await provider.shutdown();
  } finally {
    await receiver.stop();
  }
  return dir;
}

const check: PlannedSpan = { name: CHECK_SPAN_NAME, attributes: { ...RPC_ATTRIBUTES, [SPAN_ATTRIBUTE.decision]: 'allow', [SPAN_ATTRIBUTE.httpStatus]: 200 } };
const envoy: PlannedSpan = { name: 'ingress', attributes: { 'http.url': 'http://127.0.0.1/v1/markets', 'guid:x-request-id': '6b1f0c1e-6a4e-4b8e-9d6c-0d5b8f1f2a3b', upstream_cluster: 'market' } };

test('a clean run passes: every span, value and secret form counted, no finding', async () => {
  const r = await checkDir(await auditDir([check, envoy], LEDGER));
  assert.deepEqual(r.findings, [], report(r));
  assert.equal(r.spans, 2);
  assert.equal(r.traces, 2);
  assert.equal(r.unparented, 0);
  // Per span: name, status message, trace state, its attributes, the resource's (service.name), scope name and version.
  assert.equal(r.values, (3 + 5 + 1 + 2) + (3 + 3 + 1 + 2));
  assert.equal(r.secrets, secretForms(KEY.toString('hex')).length + secretForms(NONCE).length);
  assert.match(report(r), /^trace audit: 2 traces, 2 spans \(0 whose parent was not exported\), 20 values checked, \d+ secret forms searched \(0 recorded values under 16 chars not searched\): no finding$/);
});

test('a secret planted in a span is found: the HMAC key as base64 in Envoy\'s URL tag, the nonce upper-case in an event name', async () => {
  const r = await checkDir(await auditDir([
    { ...envoy, attributes: { ...envoy.attributes, 'http.url': `http://127.0.0.1/v1/markets?k=${encodeURIComponent(KEY.toString('base64'))}` } },
    { ...check, event: { name: `nonce ${NONCE.toUpperCase()}` } },
  ], LEDGER));
  assert.deepEqual(r.findings.map((f) => [f.what, f.span, f.detail.replace(/\(.{6}…\)/, '(…)')]).sort(), [
    ['secret', CHECK_SPAN_NAME, 'event carries x-edge-nonce header (…)'],
    ['secret', 'ingress', 'span attribute "http.url" carries ingest HMAC key (…)'],
  ]);
  assert.ok(!report(r).includes(NONCE) && !report(r).includes(KEY.toString('hex')), 'the report names a secret by its kind and first characters only');
});

test('a foreign attribute key is found: on the Check span, on an Envoy span, on an event, on the resource', async () => {
  const r = await checkDir(await auditDir([
    { ...check, attributes: { ...check.attributes, 'edge.client_ip': '192.0.2.1' } },
    { ...envoy, attributes: { ...envoy.attributes, 'x-edge-signature': 'redacted' }, event: { name: 'retry', attributes: { attempt: 1 } } },
  ], LEDGER, { 'host.name': 'edge-1' }));
  assert.deepEqual(r.findings.map((f) => [f.what, f.span, f.detail]).sort(), [
    ['key', CHECK_SPAN_NAME, 'resource attribute "host.name"'],
    ['key', CHECK_SPAN_NAME, 'span attribute "edge.client_ip"'],
    ['key', 'ingress', 'event attribute "attempt"'],
    ['key', 'ingress', 'resource attribute "host.name"'],
    ['key', 'ingress', 'span attribute "x-edge-signature"'],
  ]);
});

test('an audit that saw nothing fails: no span exported, or no secret recorded', async () => {
  const none = await checkDir(await auditDir([], LEDGER));
  assert.deepEqual(none.findings.map((f) => f.detail.replace(/ \(.*/, '')), ['no span exported']);
  const nothing = await checkDir(await auditDir([check], []));
  assert.deepEqual(nothing.findings.map((f) => f.detail.replace(/ \(.*/, '')), ['no secret recorded']);
});

test('the command line: exit 1 and the findings printed when a secret was exported, exit 0 and the counts otherwise', async () => {
  const run = (dir: string) => promisify(execFile)(join(ROOT, 'scripts/node'), [join(ROOT, 'scripts/trace-check.ts'), dir]).then(
    (r) => ({ code: 0, out: r.stdout }), (e: { code: number; stdout: string }) => ({ code: e.code, out: e.stdout }));
  const leaky = await run(await auditDir([{ ...envoy, attributes: { ...envoy.attributes, user_agent: `feed/${KEY.toString('hex')}` } }], LEDGER));
  assert.equal(leaky.code, 1, leaky.out);
  assert.match(leaky.out, /1 finding\(s\)\n {2}secret: span attribute "user_agent" carries ingest HMAC key/);
  const clean = await run(await auditDir([envoy], LEDGER));
  assert.equal(clean.code, 0, clean.out);
  assert.match(clean.out, /^trace audit: 1 traces, 1 spans \(0 whose parent was not exported\), \d+ values checked, \d+ secret forms searched .*: no finding\n$/);
});
