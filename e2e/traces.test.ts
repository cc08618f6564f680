/**
 * Traces end to end (issue 31 point 1): real Envoy 1.40 with its OpenTelemetry tracer, the real
 * TS service with the OpenTelemetry SDK, both exporting OTLP/gRPC to a real receiver
 * (e2e/lib/otlp-receiver.py, on the published OTLP protos). For a read, an order and a denied
 * ingest: one trace per request, Envoy's server span → its ext_authz egress span → the service's
 * Check span, and Envoy's upstream span to the market service or the order backend, each the
 * child of the right one; the Check span's attributes; the backend received `traceparent` of the
 * same trace naming Envoy's upstream span; the decision line names the same trace id; a client's
 * own `traceparent` is not honoured (docs/envoy.md "Traces"); and no secret (HMAC key,
 * signature, nonce, order payload, feed key) in anything exported over the whole run.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { createPublicKey, randomBytes } from 'node:crypto';
import { geoFixtures } from '../testkit/geo-fixtures.ts';
import { CHECK_SPAN_ATTRIBUTE_NAMES, CHECK_SPAN_NAME, SPAN_ATTRIBUTE } from '../authz/src/authz/tracing.ts';
import { DEFAULT_OTEL_SERVICE_NAME } from '../authz/src/common/config.ts';
import { CLUSTER } from '../envoy/render.ts';
import { startStack, type Stack } from './lib/driver.ts';
import { errorCode, ingest, orderBody, request, signed, uniqueId, type Reply } from './lib/client.ts';
import { startOtlpReceiver, type OtlpReceiver, type Span } from './lib/otlp.ts';
import { auditSpans } from '../scripts/trace-check.ts';

/** Envoy and the SDK each export at least every 5 s; a loaded machine gets four times that. */
const EXPORT_WAIT_MS = 20_000;
const ENVOY_SERVICE = `${DEFAULT_OTEL_SERVICE_NAME}-envoy`;
/** A client's own trace context, sampled: never honoured (the trace must not be this one). */
const CLIENT_TRACE_ID = 'c1c1c1c1c1c1c1c1c1c1c1c1c1c1c1c1';
const CLIENT_TRACEPARENT = `00-${CLIENT_TRACE_ID}-d2d2d2d2d2d2d2d2-01`;
/** The only attributes the service's Check span may carry (authz/tracing.ts). */
const CHECK_ATTRIBUTES = new Set(CHECK_SPAN_ATTRIBUTE_NAMES);

let receiver: OtlpReceiver;
let stack: Stack;
let market: string;
/** Every secret value sent during the run, searched for in every exported span at the end. */
const secrets: string[] = [];

before(async () => {
  receiver = await startOtlpReceiver();
  stack = await startStack({
    env: { XFF_NUM_TRUSTED_HOPS: '1', LOG_DECISIONS: 'all', OTEL_EXPORTER_OTLP_ENDPOINT: receiver.endpoint },
    geoipDb: geoFixtures().geoip2,
  });
  const feedPublic = Buffer.from(createPublicKey(stack.feedPrivateKey).export({ format: 'jwk' }).x ?? '', 'base64url');
  secrets.push(stack.hmacKey.toString('hex'), stack.hmacKey.toString('base64'), feedPublic.toString('hex'), feedPublic.toString('base64'));
  secrets.push(Buffer.from(stack.feedPrivateKey.export({ format: 'der', type: 'pkcs8' })).subarray(-32).toString('hex'));
  market = uniqueId('0xtrace');
  const r = await ingest(stack, market, 1);
  assert.equal(r.status, 200, r.text);
});
after(async () => {
  await stack?.stop();
  await receiver?.stop();
});

interface Trace {
  readonly id: string;
  readonly spans: Span[];
  /** Envoy's server span: the trace's root. */
  readonly server: Span;
}

/** The spans of the request `r` (found by its x-request-id on Envoy's server span) once `complete` holds. */
async function traceOf(r: Reply, complete: (t: Trace) => boolean): Promise<Trace> {
  const id = r.headers.get('x-request-id') ?? '';
  assert.match(id, /^[0-9a-f-]{36}$/);
  let found: Trace | undefined;
  await receiver.waitFor((all) => {
    const server = all.find((s) => s.service === ENVOY_SERVICE && s.kind === 'SPAN_KIND_SERVER' && s.attributes['guid:x-request-id'] === id);
    if (server === undefined) return false;
    found = { id: server.traceId, server, spans: all.filter((s) => s.traceId === server.traceId) };
    return complete(found);
  }, EXPORT_WAIT_MS, `the trace of request ${id}`);
  return found!;
}

const children = (t: Trace, parent: Span): Span[] => t.spans.filter((s) => s.parentSpanId === parent.spanId);
/** The service's Check spans of a trace, each with the Envoy span that is its parent. */
function checks(t: Trace): { check: Span; egress: Span | undefined }[] {
  return t.spans.filter((s) => s.service === DEFAULT_OTEL_SERVICE_NAME && s.name === CHECK_SPAN_NAME)
    .map((check) => ({ check, egress: t.spans.find((s) => s.spanId === check.parentSpanId) }));
}
/** Envoy's upstream spans to `cluster` (spawn_upstream_span), children of the server span. */
const upstreams = (t: Trace, cluster: string): Span[] => children(t, t.server).filter((s) => s.kind === 'SPAN_KIND_CLIENT' && s.attributes['upstream_cluster'] === cluster);

/** The shape every request's trace has: one root, Envoy's; each Check under an ext_authz egress span of Envoy's under the root. */
function assertCheckChain(t: Trace, wantChecks: number): void {
  assert.notEqual(t.id, CLIENT_TRACE_ID, 'the client\'s traceparent is not honoured: the trace starts at Envoy');
  assert.equal(t.server.parentSpanId, '', 'Envoy\'s server span is the root');
  assert.deepEqual(t.spans.filter((s) => s.parentSpanId === '').map((s) => s.spanId), [t.server.spanId], 'one root per trace');
  const cs = checks(t);
  assert.equal(cs.length, wantChecks, `${wantChecks} Check span(s): ${JSON.stringify(t.spans.map((s) => [s.service, s.name]))}`);
  for (const { check, egress } of cs) {
    assert.equal(check.kind, 'SPAN_KIND_SERVER');
    assert.ok(egress !== undefined, 'the Check span\'s parent is a span Envoy exported');
    assert.equal(egress.service, ENVOY_SERVICE);
    assert.equal(egress.kind, 'SPAN_KIND_CLIENT', 'the parent is Envoy\'s ext_authz egress span');
    assert.equal(egress.attributes['upstream_cluster'], CLUSTER.authz);
    assert.equal(egress.parentSpanId, t.server.spanId, 'the egress span is the server span\'s child');
    for (const k of Object.keys(check.attributes)) assert.ok(CHECK_ATTRIBUTES.has(k), `unexpected attribute ${k} on the Check span`);
  }
}

/** The decision lines of the request `r` (LOG_DECISIONS=all). */
function decisionLines(r: Reply): Record<string, unknown>[] {
  const id = r.headers.get('x-request-id');
  return stack.logs().split('\n').map((l) => l.replace(/^\[[a-z]+\] /, '')).filter((l) => l.startsWith('{') && l.includes(String(id)))
    .map((l) => JSON.parse(l) as Record<string, unknown>).filter((l) => l['msg'] === 'decision' && l['requestId'] === id);
}

describe('one trace per request: Envoy → Check → upstream, correctly parented', () => {
  test('a read: server span → ext_authz → Check (allow, read, full, 200) and the upstream span to the market service', async () => {
    const r = await request(stack, 'GET', '/v1/markets', { headers: { traceparent: CLIENT_TRACEPARENT } });
    assert.equal(r.status, 200, r.text);
    const t = await traceOf(r, (tr) => checks(tr).length === 1 && upstreams(tr, CLUSTER.market).length === 1);
    assertCheckChain(t, 1);
    const { check } = checks(t)[0]!;
    assert.deepEqual(
      [check.attributes[SPAN_ATTRIBUTE.decision], check.attributes[SPAN_ATTRIBUTE.route], check.attributes[SPAN_ATTRIBUTE.tier], check.attributes[SPAN_ATTRIBUTE.httpStatus]],
      ['allow', 'read', 'full', 200],
    );
    assert.equal(check.attributes[SPAN_ATTRIBUTE.errorCode], undefined, 'an allow has no error code');
    assert.deepEqual(decisionLines(r).map((l) => l['traceId']), [t.id], 'the decision line names the same trace');
  });

  test('an order: two Checks (header phase, body), the upstream span to the order backend, and the backend got traceparent of that span', async () => {
    const payload = randomBytes(48);
    secrets.push(payload.toString('base64'), payload.toString('hex'));
    const before = stack.backend.deliveries.length;
    const r = await request(stack, 'POST', '/v1/orders', { body: orderBody(market, payload), headers: { 'content-type': 'application/json', traceparent: CLIENT_TRACEPARENT } });
    assert.equal(r.status, 200, r.text);
    const t = await traceOf(r, (tr) => checks(tr).length === 2 && upstreams(tr, CLUSTER.orderBackend).length === 1);
    assertCheckChain(t, 2);
    const labels = checks(t).map(({ check }) => [check.attributes[SPAN_ATTRIBUTE.route], check.attributes[SPAN_ATTRIBUTE.decision], check.attributes[SPAN_ATTRIBUTE.httpStatus]]);
    assert.deepEqual(labels.sort(), [['order', 'allow', 200], ['order_headers', 'allow', 200]]);
    const [upstream] = upstreams(t, CLUSTER.orderBackend) as [Span];
    const delivered = stack.backend.deliveries.slice(before).find((d) => d.headers['x-request-id'] === r.headers.get('x-request-id'));
    assert.ok(delivered !== undefined, 'the order reached the backend');
    assert.equal(delivered.headers['traceparent'], `00-${t.id}-${upstream.spanId}-01`, 'the backend received traceparent of the same trace, naming Envoy\'s upstream span');
    assert.deepEqual(decisionLines(r).map((l) => l['traceId']), [t.id, t.id], 'both decision lines name the same trace');
  });

  test('a denied ingest (bad signature): Check deny, unauthorized, 401; no upstream span', async () => {
    const s = signed(stack, Buffer.from(JSON.stringify({ conditionId: market, seq: 99 })), market);
    const badSignature = `v1=${randomBytes(32).toString('hex')}`;
    secrets.push(s.headers['x-edge-nonce'] ?? '', s.headers['x-edge-signature'] ?? '', badSignature, s.body.toString('base64'));
    const r = await request(stack, 'POST', '/internal/ingest/market', { body: s.body, headers: { ...s.headers, 'x-edge-signature': badSignature, traceparent: CLIENT_TRACEPARENT } });
    assert.deepEqual([r.status, errorCode(r)], [401, 'unauthorized']);
    const t = await traceOf(r, (tr) => checks(tr).some(({ check }) => check.attributes[SPAN_ATTRIBUTE.decision] === 'deny'));
    const denied = checks(t).find(({ check }) => check.attributes[SPAN_ATTRIBUTE.decision] === 'deny')!.check;
    assertCheckChain(t, checks(t).length);
    assert.deepEqual(
      [denied.attributes[SPAN_ATTRIBUTE.errorCode], denied.attributes[SPAN_ATTRIBUTE.httpStatus], denied.attributes[SPAN_ATTRIBUTE.tier]],
      ['unauthorized', 401, 'full'],
    );
    assert.match(String(denied.attributes[SPAN_ATTRIBUTE.route]), /^ingest/);
    assert.equal(upstreams(t, CLUSTER.market).length, 0, 'a denied ingest never reaches the market service');
    assert.ok(decisionLines(r).some((l) => l['traceId'] === t.id && l['outcome'] === 'deny'), 'the denial\'s decision line names the same trace');
  });
});

describe('nothing secret is exported', () => {
  test('no HMAC key, signature, nonce, payload or feed key in any span of the run, and no attribute outside the allow-list', async () => {
    // Every span of the run is in: wait until the service's last batch (≤ 5 s) has arrived.
    await receiver.waitFor((all) => all.filter((s) => s.name === CHECK_SPAN_NAME).length >= 4, EXPORT_WAIT_MS, 'every Check span');
    const raw = receiver.raw();
    const audit = await auditSpans(receiver.spans(), [{ kind: 'sent by this test', values: secrets }]);
    assert.ok(audit.spans > 0 && audit.secrets >= secrets.length, JSON.stringify(audit));
    assert.deepEqual(audit.findings, [], 'no secret and no attribute outside the allow-list (scripts/trace-check.ts) in any span');
    assert.ok(!raw.includes('x-edge-signature') && !raw.includes('x-edge-nonce'), 'no signed header is named in a span');
  });
});
