/**
 * The hand encoder of an order's allow (authz/codec/allow-encoder.ts) against proto-loader's
 * serializer of the same CheckResponse object: byte for byte, for random headers (UTF-8 included)
 * and metadata, payloads long enough for every varint length the limits allow.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import type { MethodDefinition } from '@grpc/proto-loader';
import { loadPackageDefinition, SERVICE_NAMES } from '../../proto/index.ts';
import { encodeAllowWithMetadata } from '../src/authz/codec/allow-encoder.ts';
import { encodeDecision, toCheckResponse, type Serialize } from '../src/authz/codec/response.ts';
import type { Decision, Header } from '../src/authz/decision.ts';

const checkDef = (loadPackageDefinition()[SERVICE_NAMES.authorization] as Record<string, MethodDefinition<object, object>>)['Check']!;
const serialize = checkDef.responseSerialize as Serialize;

const allow = (headers: Header[], metadata: Record<string, string> | undefined, responseHeaders?: Header[]): Decision => ({
  allow: true, code: 'ok', httpStatus: 200, reason: 'allowed', headers, body: '',
  ...(metadata === undefined ? {} : { metadata }), ...(responseHeaders === undefined ? {} : { responseHeaders }),
});

test('property – allow encoder (500): byte-identical to proto-loader\'s serialization of the same CheckResponse', () => {
  const text = fc.string({ unit: 'binary', maxLength: 300 });
  const header = fc.tuple(fc.string({ minLength: 1, maxLength: 40 }), text);
  const big = fc.nat({ max: 70_000 }).map((n) => 'A'.repeat(n));
  const metadata = fc.dictionary(fc.string({ minLength: 1, maxLength: 20 }).filter((k) => k !== '__proto__'), fc.oneof(text, big), { minKeys: 0, maxKeys: 3 });
  fc.assert(fc.property(fc.array(header, { maxLength: 8 }), metadata, (headers, meta) => {
    const d = allow(headers, meta);
    assert.deepEqual(encodeAllowWithMetadata(d.headers, meta), serialize(toCheckResponse(d)));
  }), { numRuns: 500 });
});

test('property – allow encoder with response headers (the global limit\'s x-ratelimit-*), with and without metadata (300): byte-identical to proto-loader', () => {
  const text = fc.string({ unit: 'binary', maxLength: 60 });
  const header = fc.tuple(fc.string({ minLength: 1, maxLength: 40 }), text);
  const metadata = fc.option(fc.dictionary(fc.string({ minLength: 1, maxLength: 20 }).filter((k) => k !== '__proto__'), text, { minKeys: 0, maxKeys: 2 }), { nil: undefined });
  fc.assert(fc.property(fc.array(header, { maxLength: 4 }), metadata, fc.array(header, { minLength: 1, maxLength: 4 }), (headers, meta, response) => {
    const d = allow(headers, meta, response);
    assert.deepEqual(encodeAllowWithMetadata(d.headers, meta, response), serialize(toCheckResponse(d)));
    assert.deepEqual(encodeDecision(d, serialize), serialize(toCheckResponse(d)));
  }), { numRuns: 300 });
});

test('allow encoder – a read\'s allow with the x-ratelimit-* headers decodes back as OkHttpResponse.response_headers_to_add, overwriting', () => {
  const rl: Header[] = [['x-ratelimit-limit', '40'], ['x-ratelimit-remaining', '39'], ['x-ratelimit-reset', '1']];
  const wire = checkDef.responseDeserialize(encodeDecision(allow([], undefined, rl), serialize)) as {
    status?: { code?: number }; ok_response?: { headers?: unknown[]; response_headers_to_add?: { header: { key: string; value: string }; append_action: unknown }[] };
    dynamic_metadata?: unknown;
  };
  assert.equal(wire.status?.code, 0);
  assert.deepEqual(wire.ok_response?.headers ?? [], []);
  assert.deepEqual(wire.ok_response?.response_headers_to_add?.map((h) => [h.header.key, h.header.value]), rl);
  for (const h of wire.ok_response?.response_headers_to_add ?? []) assert.ok([2, 'OVERWRITE_IF_EXISTS_OR_ADD'].includes(h.append_action as never));
  assert.equal(wire.dynamic_metadata ?? null, null);
});

test('allow encoder – encodeDecision uses it for a metadata allow: the order payload and headers decode back through the real protos', () => {
  const payload = Buffer.alloc(43_692, 0x41).toString('base64');
  const headers: Header[] = [['content-type', 'application/octet-stream'], ['x-edge-access', 'close-only'], ['x-edge-jurisdiction', 'CA-QC']];
  const wire = checkDef.responseDeserialize(encodeDecision(allow(headers, { order_payload: payload }), serialize)) as {
    status?: { code?: number }; ok_response?: { headers?: { header: { key: string; value: string }; append_action: unknown }[] };
    dynamic_metadata?: { fields?: Record<string, { stringValue?: string }> };
  };
  assert.equal(wire.status?.code, 0);
  assert.deepEqual(wire.ok_response?.headers?.map((h) => [h.header.key, h.header.value]), headers);
  for (const h of wire.ok_response?.headers ?? []) assert.ok([2, 'OVERWRITE_IF_EXISTS_OR_ADD'].includes(h.append_action as never));
  assert.equal(wire.dynamic_metadata?.fields?.['order_payload']?.stringValue, payload);
});
