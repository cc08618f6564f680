/**
 * Traces in the TS service (issue 31 point 1; authz/tracing.ts): the settings as the
 * OpenTelemetry specification defines them, each bad value refused naming the variable; the SDK
 * not loaded at all without OTEL_EXPORTER_OTLP_ENDPOINT; and, with it, one span per Check,
 * exported over real OTLP/gRPC to a real receiver (e2e/lib/otlp-receiver.py), the child of the
 * call metadata's `traceparent`, with the decision's attributes and nothing else.
 *
 *   scripts/node --test authz/test/tracing.test.ts
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { Writable } from 'node:stream';
import { setTimeout as sleep } from 'node:timers/promises';
import { fileURLToPath } from 'node:url';
import * as grpc from '@grpc/grpc-js';
import { ConfigError, KNOWN_SETTINGS, loadConfig, unknownSettings, type Env } from '../src/common/config.ts';
import { CHECK_SPAN_NAME, rootRule, SPAN_ATTRIBUTE, startTracing, type CheckTracer } from '../src/authz/tracing.ts';
import type { AuthzInput } from '../src/authz/codec/request.ts';
import { ALLOW, deny } from '../src/authz/decision.ts';
import { traceIdOf } from '../src/authz/decision-log.ts';
import { createLogger } from '../src/common/log.ts';
import { createGrpcServer } from '../src/authz/grpc-server.ts';
import { loadPackageDefinition } from '../../proto/index.ts';
import { checkRequestObject, decodeCheckResponse, outcomeOf } from '../../testkit/check-request.ts';
import { startOtlpReceiver, type OtlpReceiver } from '../../e2e/lib/otlp.ts';
import { freePort } from '../../testkit/redis-server.ts';

const ENDPOINT = 'http://127.0.0.1:4317';

describe('settings: OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_TRACES_SAMPLER(_ARG), OTEL_SERVICE_NAME', () => {
  test('unset: no tracing; each is a known setting, and other OTEL_ variables (the SDK\'s own) are not reported', () => {
    assert.equal(loadConfig({}).tracing, undefined);
    for (const n of ['OTEL_EXPORTER_OTLP_ENDPOINT', 'OTEL_EXPORTER_OTLP_PROTOCOL', 'OTEL_TRACES_SAMPLER', 'OTEL_TRACES_SAMPLER_ARG', 'OTEL_SERVICE_NAME']) assert.ok(KNOWN_SETTINGS.has(n), n);
    assert.deepEqual(unknownSettings({ OTEL_EXPORTER_OTLP_HEADERS: 'a=b', OTEL_RESOURCE_ATTRIBUTES: 'x=y' }), []);
  });

  test('the defaults: the specification\'s parentbased_always_on (every new trace), service "edge"', () => {
    assert.deepEqual(loadConfig({ OTEL_EXPORTER_OTLP_ENDPOINT: ENDPOINT }).tracing, {
      endpoint: ENDPOINT, host: '127.0.0.1', port: 4317, sampler: 'parentbased_always_on', ratio: 1, serviceName: 'edge',
    });
  });

  const good: Record<string, [Env, { sampler: string; ratio: number; host?: string }]> = {
    'traceidratio with an argument': [{ OTEL_TRACES_SAMPLER: 'traceidratio', OTEL_TRACES_SAMPLER_ARG: '0.25' }, { sampler: 'traceidratio', ratio: 0.25 }],
    'parentbased_traceidratio without one: 1': [{ OTEL_TRACES_SAMPLER: 'parentbased_traceidratio' }, { sampler: 'parentbased_traceidratio', ratio: 1 }],
    'always_off: 0': [{ OTEL_TRACES_SAMPLER: 'ALWAYS_OFF' }, { sampler: 'always_off', ratio: 0 }],
    'an IPv6 endpoint': [{ OTEL_EXPORTER_OTLP_ENDPOINT: 'http://[::1]:4317/' }, { sampler: 'parentbased_always_on', ratio: 1, host: '::1' }],
    'OTEL_EXPORTER_OTLP_PROTOCOL=grpc': [{ OTEL_EXPORTER_OTLP_PROTOCOL: 'grpc' }, { sampler: 'parentbased_always_on', ratio: 1 }],
  };
  for (const [name, [env, want]] of Object.entries(good)) {
    test(`accepted – ${name}`, () => {
      const t = loadConfig({ OTEL_EXPORTER_OTLP_ENDPOINT: ENDPOINT, ...env }).tracing;
      assert.deepEqual([t?.sampler, t?.ratio, t?.host], [want.sampler, want.ratio, want.host ?? '127.0.0.1']);
    });
  }

  const bad: Record<string, [Env, string]> = {
    'no port': [{ OTEL_EXPORTER_OTLP_ENDPOINT: 'http://collector' }, 'OTEL_EXPORTER_OTLP_ENDPOINT'],
    'https (TLS to the collector is not supported)': [{ OTEL_EXPORTER_OTLP_ENDPOINT: 'https://collector:4317' }, 'OTEL_EXPORTER_OTLP_ENDPOINT'],
    'a path (OTLP/HTTP\'s /v1/traces)': [{ OTEL_EXPORTER_OTLP_ENDPOINT: 'http://collector:4318/v1/traces' }, 'OTEL_EXPORTER_OTLP_ENDPOINT'],
    'not a URL': [{ OTEL_EXPORTER_OTLP_ENDPOINT: 'collector:4317' }, 'OTEL_EXPORTER_OTLP_ENDPOINT'],
    'OTLP over HTTP': [{ OTEL_EXPORTER_OTLP_ENDPOINT: ENDPOINT, OTEL_EXPORTER_OTLP_PROTOCOL: 'http/protobuf' }, 'OTEL_EXPORTER_OTLP_PROTOCOL'],
    'an unknown sampler': [{ OTEL_EXPORTER_OTLP_ENDPOINT: ENDPOINT, OTEL_TRACES_SAMPLER: 'jaeger_remote' }, 'OTEL_TRACES_SAMPLER'],
    'a ratio above 1': [{ OTEL_EXPORTER_OTLP_ENDPOINT: ENDPOINT, OTEL_TRACES_SAMPLER: 'traceidratio', OTEL_TRACES_SAMPLER_ARG: '1.5' }, 'OTEL_TRACES_SAMPLER_ARG'],
    'a ratio that is no number': [{ OTEL_EXPORTER_OTLP_ENDPOINT: ENDPOINT, OTEL_TRACES_SAMPLER: 'traceidratio', OTEL_TRACES_SAMPLER_ARG: 'abc' }, 'OTEL_TRACES_SAMPLER_ARG'],
    'an argument for a sampler that takes none': [{ OTEL_EXPORTER_OTLP_ENDPOINT: ENDPOINT, OTEL_TRACES_SAMPLER_ARG: '0.5' }, 'OTEL_TRACES_SAMPLER_ARG'],
    'a service name with a space': [{ OTEL_EXPORTER_OTLP_ENDPOINT: ENDPOINT, OTEL_SERVICE_NAME: 'my edge' }, 'OTEL_SERVICE_NAME'],
    'a sampler without the endpoint': [{ OTEL_TRACES_SAMPLER: 'always_on' }, 'OTEL_TRACES_SAMPLER'],
    'a service name without the endpoint': [{ OTEL_SERVICE_NAME: 'edge' }, 'OTEL_SERVICE_NAME'],
  };
  for (const [name, [env, variable]] of Object.entries(bad)) {
    test(`refused naming ${variable} – ${name}`, () => {
      assert.throws(() => loadConfig(env), (e: unknown) => e instanceof ConfigError && e.variable === variable);
    });
  }

  test('the root rule of each sampler (a Check without a parent)', () => {
    assert.deepEqual(['always_on', 'parentbased_always_off', 'parentbased_traceidratio'].map((s) => rootRule(s as never)), ['on', 'off', 'ratio']);
  });
});

test('without the endpoint the OpenTelemetry SDK is not loaded: the service\'s whole static module graph imports none of it', () => {
  // A child process (this one has loaded the SDK below): every specifier resolved while importing
  // the entry points' modules. @opentelemetry/api alone is allowed: prom-client has always loaded it
  // (the no-op API, for exemplars), before traces existed.
  const root = fileURLToPath(new URL('../../', import.meta.url));
  const code = `
    import { registerHooks } from 'node:module';
    const seen = [];
    registerHooks({ resolve(spec, ctx, next) { if (spec.startsWith('@opentelemetry/') && spec !== '@opentelemetry/api') seen.push(spec); return next(spec, ctx); } });
    await import('./authz/src/app.ts');
    await import('./authz/src/process.ts');
    await import('./authz/src/authz/grpc-server.ts');
    process.stdout.write(JSON.stringify(seen));`;
  const out = execFileSync(`${root}scripts/node`, ['--input-type=module', '-e', code], { cwd: root, encoding: 'utf8' });
  assert.deepEqual(JSON.parse(out), []);
});

describe('one span per Check, exported to a real OTLP receiver', () => {
  let receiver: OtlpReceiver;
  let tracer: CheckTracer;
  before(async () => {
    receiver = await startOtlpReceiver();
    tracer = await startTracing({ ...loadConfig({ OTEL_EXPORTER_OTLP_ENDPOINT: receiver.endpoint, OTEL_SERVICE_NAME: 'edge-test' }).tracing! }, createLogger('silent'));
  });
  after(async () => receiver?.stop());

  const input = (): AuthzInput => ({
    method: 'POST', path: '/internal/ingest/market', clientIp: '192.0.2.1', timestamp: '1700000000', nonce: 'n'.repeat(32), signature: `v1=${'ab'.repeat(32)}`,
    requestId: 'req-1', body: Buffer.from('{"secret-body":1}'), phase: undefined, route: 'ingest',
  });

  test('a child of the metadata\'s traceparent, its attributes, the decision line\'s trace id the same; an allow without a parent is a root', async () => {
    const parentId = 'b7ad6b7169203331';
    const traceId = '0af7651916cd43dd8448eb211c80319c';
    const md = new grpc.Metadata();
    md.set('traceparent', `00-${traceId}-${parentId}-01`);
    const denied = input();
    const span = tracer.start(md, denied);
    assert.equal(traceIdOf(denied.traceparent), traceId, 'the decision line names the trace');
    denied.geo = { access: 'full' } as never;
    span.end(denied, deny('unauthorized', 'bad signature'));
    const root = input();
    tracer.start(new grpc.Metadata(), root).end(root, ALLOW);
    await tracer.shutdown();
    const spans = await receiver.waitFor((s) => s.length >= 2, 10_000, 'two Check spans');
    const child = spans.find((s) => s.traceId === traceId)!;
    assert.deepEqual([child.name, child.kind, child.parentSpanId, child.service], [CHECK_SPAN_NAME, 'SPAN_KIND_SERVER', parentId, 'edge-test']);
    assert.deepEqual(
      [child.attributes[SPAN_ATTRIBUTE.decision], child.attributes[SPAN_ATTRIBUTE.route], child.attributes[SPAN_ATTRIBUTE.tier], child.attributes[SPAN_ATTRIBUTE.errorCode], child.attributes[SPAN_ATTRIBUTE.httpStatus]],
      ['deny', 'ingest', 'full', 'unauthorized', 401],
    );
    const other = spans.find((s) => s.traceId !== traceId)!;
    assert.equal(other.parentSpanId, '');
    assert.equal(other.attributes[SPAN_ATTRIBUTE.errorCode], undefined);
    assert.equal(traceIdOf(root.traceparent), other.traceId);
    const raw = receiver.raw();
    for (const secret of ['n'.repeat(32), 'ab'.repeat(32), 'secret-body', '192.0.2.1', '1700000000']) assert.ok(!raw.includes(secret), `${secret} exported`);
  });

  test('a parent Envoy did not sample: the Check span is not exported either', async () => {
    const t = await startTracing(loadConfig({ OTEL_EXPORTER_OTLP_ENDPOINT: receiver.endpoint }).tracing!, createLogger('silent'));
    const check = (traceId: string, flags: string): AuthzInput => {
      const md = new grpc.Metadata();
      md.set('traceparent', `00-${traceId}-${'2'.repeat(16)}-${flags}`);
      const i = input();
      t.start(md, i).end(i, ALLOW);
      return i;
    };
    const unsampled = check('1'.repeat(32), '00');
    assert.equal(traceIdOf(unsampled.traceparent), '1'.repeat(32), 'the decision line still names the trace');
    // A sampled Check after it, through the same exporter: once it has arrived, the first would have too.
    check('3'.repeat(32), '01');
    await t.shutdown();
    const spans = await receiver.waitFor((s) => s.some((x) => x.traceId === '3'.repeat(32)), 10_000, 'the sampled Check span');
    assert.equal(spans.filter((x) => x.traceId === '1'.repeat(32)).length, 0);
  });
});

test('a receiver that is not there: the Check is unaffected, the failed export is one warning (throttled), never a throw', async () => {
  const lines: Record<string, unknown>[] = [];
  const logger = createLogger('info', new Writable({
    write: (chunk: Buffer, _e, cb) => {
      lines.push(JSON.parse(chunk.toString()) as Record<string, unknown>);
      cb();
    },
  }));
  const port = await freePort();
  const t = await startTracing(loadConfig({ OTEL_EXPORTER_OTLP_ENDPOINT: `http://127.0.0.1:${port}` }).tracing!, logger, 50);
  for (let i = 0; i < 3; i++) {
    const input: AuthzInput = { method: 'GET', path: '/', clientIp: '192.0.2.1', timestamp: undefined, nonce: undefined, signature: undefined, requestId: undefined, body: undefined, phase: undefined, route: 'read' };
    t.start(new grpc.Metadata(), input).end(input, ALLOW);
    await sleep(300);
  }
  await t.shutdown().catch(() => undefined);
  const failed = lines.filter((l) => l['msg'] === 'trace export failed (OTEL_EXPORTER_OTLP_ENDPOINT): spans are dropped, requests are not affected');
  assert.equal(failed.length, 1, `one warning for three failed exports within 10 s: ${JSON.stringify(lines)}`);
  assert.equal(failed[0]?.['endpoint'], `http://127.0.0.1:${port}`);
});

test('the traced Check handler: the span is started with the call\'s metadata and ended with the decision after the answer; a span that throws at its end does not hold the answer', async () => {
  const seen: { traceparent?: string; decision?: string }[] = [];
  const errors: string[] = [];
  const fake: CheckTracer = {
    start(md) {
      const entry: { traceparent?: string; decision?: string } = { traceparent: String(md.get('traceparent')[0]) };
      seen.push(entry);
      return {
        end(done, d) {
          entry.decision = `${done.route}:${d.code}`;
          throw new Error('exporter bug');
        },
      };
    },
    shutdown: async () => undefined,
  };
  const server = createGrpcServer({ evaluate: () => ALLOW, observe: () => undefined, onError: (where) => errors.push(where), tracer: fake });
  const port = await server.listen('127.0.0.1', 0);
  const Ctor = grpc.loadPackageDefinition(loadPackageDefinition())['envoy'] as unknown as Record<string, Record<string, Record<string, Record<string, grpc.ServiceClientConstructor>>>>;
  const client = new (Ctor['service']!['auth']!['v3']!['Authorization']!)(`127.0.0.1:${port}`, grpc.credentials.createInsecure());
  try {
    const md = new grpc.Metadata();
    md.set('traceparent', `00-${'a'.repeat(32)}-${'b'.repeat(16)}-01`);
    const res = await new Promise<ReturnType<typeof decodeCheckResponse>>((resolve, reject) => {
      (client as unknown as { Check: (req: object, md: grpc.Metadata, cb: (err: grpc.ServiceError | null, res: object) => void) => void })
        .Check(checkRequestObject({ method: 'GET', path: '/v1/markets', contextExtensions: { route: 'read' } }), md, (err, r) => (err ? reject(err) : resolve(r as never)));
    });
    assert.equal(outcomeOf(res).status, 200, 'answered although the span threw');
    assert.deepEqual(seen, [{ traceparent: `00-${'a'.repeat(32)}-${'b'.repeat(16)}-01`, decision: 'read:ok' }]);
    assert.deepEqual(errors, ['trace']);
  } finally {
    client.close();
    await server.close(100);
  }
});
