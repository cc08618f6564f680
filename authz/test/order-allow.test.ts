/**
 * An allowed order on the wire: the CheckResponse Envoy receives carries the envelope's
 * payload as dynamic metadata (a google.protobuf.Value with its kind set: Envoy 1.40 aborts on
 * a kind-less Value when Lua reads it) and the docs/api.md "POST /v1/orders" headers as OkHttpResponse headers.
 * Pushed through the real Authorization protos, as Envoy would decode them. The live Envoy
 * half (the Lua filter decoding it byte-exact, fail-closed cases) is envoy/test/render.test.ts.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import type { MethodDefinition } from '@grpc/proto-loader';
import { loadPackageDefinition, SERVICE_NAMES } from '../../proto/index.ts';
import { ALLOW, deny } from '../src/authz/decision.ts';
import { encodeDecision, type Serialize } from '../src/authz/codec/response.ts';
import { ORDER_PAYLOAD_METADATA_KEY } from '../src/common/contract.ts';
import { orderAllow, parseOrder } from '../src/authz/stages/order.ts';

const pd = loadPackageDefinition();
const checkDef = (pd[SERVICE_NAMES.authorization] as Record<string, MethodDefinition<object, object>>)['Check']!;
const serialize = checkDef.responseSerialize as Serialize;

interface Wire {
  status?: { code?: number };
  ok_response?: { headers?: { header: { key: string; value: string }; append_action?: unknown }[] };
  denied_response?: object;
  dynamic_metadata?: { fields?: Record<string, { kind?: string; stringValue?: string }> };
}
const onTheWire = (bytes: Buffer): Wire => checkDef.responseDeserialize(bytes) as Wire;

const NOW = Math.floor(Date.now() / 1000);
const envelope = (payload: Buffer, over: Record<string, unknown> = {}): Buffer =>
  Buffer.from(JSON.stringify({ marketId: '0xmarket-1', deadline: NOW + 60, size: '25.5', payload: payload.toString('base64'), ...over }));

const payloads: Record<string, Buffer> = {
  '1 byte': Buffer.from([0x2a]),
  'a single 0x00': Buffer.from([0x00]),
  'NUL bytes and 0xff': Buffer.from([0x00, 0x00, 0xff, 0x00, 0xff]),
  'invalid UTF-8 (0xc3 0x28, lone continuation, overlong)': Buffer.from([0xc3, 0x28, 0x80, 0xc0, 0xaf]),
  'all 256 byte values': Buffer.from(Array.from({ length: 256 }, (_, i) => i)),
  'the maximum size (32 KiB, random)': randomBytes(32_768),
};

for (const [name, payload] of Object.entries(payloads)) {
  test(`order allow on the wire – ${name}: the metadata is the payload's base64, a string Value`, () => {
    const o = parseOrder(envelope(payload), 32_768);
    assert.ok(!('allow' in o), 'a valid envelope');
    const wire = onTheWire(encodeDecision(orderAllow(o), serialize));
    assert.equal(wire.status?.code, 0);
    assert.ok(wire.ok_response !== undefined && wire.denied_response === undefined);
    const v = wire.dynamic_metadata?.fields?.[ORDER_PAYLOAD_METADATA_KEY];
    assert.equal(v?.kind, 'stringValue', 'a Value with its kind set');
    assert.deepEqual(Buffer.from(v.stringValue ?? '', 'base64'), payload);
  });
}

test('order allow on the wire – the docs/api.md "POST /v1/orders" headers overwrite whatever the client sent', () => {
  const o = parseOrder(envelope(Buffer.from('hi'), { size: '0025.50' }), 32_768);
  assert.ok(!('allow' in o));
  const wire = onTheWire(encodeDecision(orderAllow(o), serialize));
  const headers = wire.ok_response?.headers ?? [];
  assert.deepEqual(Object.fromEntries(headers.map((h) => [h.header.key, h.header.value])), {
    'content-type': 'application/octet-stream',
    'x-edge-market-id': '0xmarket-1',
    'x-edge-deadline': String(NOW + 60),
    'x-edge-size': '0025.50',
  });
  // HeaderValueOption.HeaderAppendAction: 2 = OVERWRITE_IF_EXISTS_OR_ADD (enums decode as numbers).
  for (const h of headers) assert.equal(h.append_action, 2);
});

test('order allow – each order gets its own decision (no cached bytes shared between orders)', () => {
  const a = parseOrder(envelope(Buffer.from('a')), 32_768);
  const b = parseOrder(envelope(Buffer.from('b')), 32_768);
  assert.ok(!('allow' in a) && !('allow' in b));
  const [wa, wb] = [orderAllow(a), orderAllow(b)].map((d) => onTheWire(encodeDecision(d, serialize)));
  assert.equal(wa?.dynamic_metadata?.fields?.[ORDER_PAYLOAD_METADATA_KEY]?.stringValue, 'YQ==');
  assert.equal(wb?.dynamic_metadata?.fields?.[ORDER_PAYLOAD_METADATA_KEY]?.stringValue, 'Yg==');
});

test('order allow – reads and denials carry no dynamic metadata', () => {
  assert.equal(onTheWire(encodeDecision(ALLOW, serialize)).dynamic_metadata, undefined);
  assert.equal(onTheWire(encodeDecision(deny('invalid_order', 'x', 'payload'), serialize)).dynamic_metadata, undefined);
});
