/**
 * Decision → CheckResponse. Pure translation, plus caches of the encoded bytes:
 * - plain allows are shared constants, serialized once;
 * - an order's allow carries its own payload (`metadata`) and is encoded per request (allow-encoder.ts);
 * - a denial is a shared constant too, but its body ends with the request's id (docs/api.md "Errors"), so
 *   everything around the body is serialized once and each request only splices its body in
 *   (one buffer, no protobuf encoder; the bytes equal a full serialization, tested).
 */
import { denialBody, type Decision } from '../decision.ts';
import { REQUEST_ID_KEY, requestIdJson } from '../../common/errors.ts';
import { encodeAllowWithMetadata } from './allow-encoder.ts';

/** google.rpc.Code values used in CheckResponse.status. */
export const GRPC_CODE = { OK: 0, PERMISSION_DENIED: 7, UNAVAILABLE: 14, UNAUTHENTICATED: 16 } as const;

/** Envoy only distinguishes OK from not-OK; the finer code is for humans reading grpcurl output. */
function grpcCodeFor(d: Decision): number {
  if (d.allow) return GRPC_CODE.OK;
  if (d.httpStatus === 401) return GRPC_CODE.UNAUTHENTICATED;
  if (d.httpStatus === 503) return GRPC_CODE.UNAVAILABLE;
  return GRPC_CODE.PERMISSION_DENIED;
}

function headerOptions(d: Decision, headers: readonly (readonly [string, string])[] = d.headers): { header: { key: string; value: string }; append_action: string }[] {
  return headers.map(([key, value]) => ({
    header: { key, value },
    append_action: 'OVERWRITE_IF_EXISTS_OR_ADD',
  }));
}

/**
 * The CheckResponse as a proto-loader plain object (keepCase field names). A denial's body
 * carries `requestId` (null when undefined).
 */
export function toCheckResponse(d: Decision, requestId?: string): Record<string, unknown> {
  const headers = headerOptions(d);
  if (d.allow) {
    const ok: Record<string, unknown> = headers.length > 0 ? { headers } : {};
    if (d.responseHeaders !== undefined && d.responseHeaders.length > 0) ok['response_headers_to_add'] = headerOptions(d, d.responseHeaders);
    const res: Record<string, unknown> = { status: { code: GRPC_CODE.OK }, ok_response: ok };
    if (d.metadata !== undefined) {
      // google.protobuf.Value comes from protobufjs's bundled well-known types, whose field
      // names are camelCase even with keepCase: `string_value` would be dropped silently, and
      // Envoy 1.40 aborts (wrappers.cc "panic: not implemented") when the Lua filter reads a
      // Value with no kind set. Checked on the wire by authz/test/order-allow.test.ts.
      const fields: Record<string, { stringValue: string }> = {};
      for (const [k, v] of Object.entries(d.metadata)) fields[k] = { stringValue: v };
      res['dynamic_metadata'] = { fields };
    }
    return res;
  }
  return {
    status: statusOf(d),
    // The HTTP status must be the raw number: 451 is not in Envoy's StatusCode enum, and a
    // name or string would be encoded as 0, which Envoy turns into 403 (notes/envoy.md §0).
    denied_response: { status: { code: d.httpStatus }, headers, body: denialBody(d, requestId) },
  };
}

function statusOf(d: Decision): { code: number; message: string } {
  return { code: grpcCodeFor(d), message: d.reason };
}

export type Serialize = (value: object) => Buffer;

/**
 * The parts of a denial's CheckResponse that never change, as wire bytes:
 *   `status` (field 1, whole) · tag of `denied_response` (field 2) · its `status` and `headers`
 *   (fields 1 and 2 of DeniedHttpResponse) · `body` (field 3) = bodyPrefix + id suffix.
 */
interface DenialParts {
  /** CheckResponse.status, tag and length included. */
  readonly status: Buffer;
  /** DeniedHttpResponse's fields before `body` (status, headers), tags included. */
  readonly inner: Buffer;
  /** The body's prefix in UTF-8 (the whole body when the decision has no prefix). */
  readonly prefix: Buffer;
  /** Whether the request id is appended to `prefix` (false: a decision without bodyPrefix). */
  readonly withId: boolean;
  /** After the id's closing `}` (Decision.bodyEnd). */
  readonly end: string;
}

const denialParts = new WeakMap<Decision, DenialParts>();

function varintLength(n: number): number {
  let len = 1;
  while (n >= 0x80) {
    n >>>= 7;
    len++;
  }
  return len;
}

function writeVarint(buf: Buffer, pos: number, n: number): number {
  while (n >= 0x80) {
    buf[pos++] = (n & 0x7f) | 0x80;
    n >>>= 7;
  }
  buf[pos++] = n;
  return pos;
}

/** Field 2 (denied_response) and field 3 (body), length-delimited: (2 << 3) | 2 and (3 << 3) | 2. */
const TAG_DENIED_RESPONSE = 0x12;
const TAG_BODY = 0x1a;

function partsOf(d: Decision, serialize: Serialize): DenialParts {
  let parts = denialParts.get(d);
  if (parts === undefined) {
    const status = serialize({ status: statusOf(d) });
    // A CheckResponse holding only denied_response without a body: tag, length, then the inner fields.
    const denied = serialize({ denied_response: { status: { code: d.httpStatus }, headers: headerOptions(d) } });
    if (denied[0] !== TAG_DENIED_RESPONSE) throw new Error('CheckResponse.denied_response did not encode as field 2');
    let innerLength = 0;
    let pos = 1;
    for (let shift = 0; ; shift += 7) {
      const b = denied[pos++]!;
      innerLength |= (b & 0x7f) << shift;
      if (b < 0x80) break;
    }
    if (pos + innerLength !== denied.length) throw new Error('CheckResponse.denied_response holds more than expected');
    const inner = denied.subarray(pos);
    const withId = d.bodyPrefix !== undefined;
    parts = { status, inner: Buffer.from(inner), prefix: Buffer.from(d.bodyPrefix ?? d.body, 'utf8'), withId, end: withId ? d.bodyEnd ?? '' : '' };
    denialParts.set(d, parts);
  }
  return parts;
}

/**
 * A denial's CheckResponse for one request: the cached parts with the body (bodyPrefix, then
 * `,"requestId":<id>}`) spliced in. Byte-identical to serialize(toCheckResponse(d, requestId)).
 */
export function encodeDenial(d: Decision, requestId: string | undefined, serialize: Serialize): Buffer {
  const p = partsOf(d, serialize);
  const suffix = p.withId ? `${REQUEST_ID_KEY}${requestIdJson(requestId)}}${p.end}` : '';
  const suffixLength = Buffer.byteLength(suffix, 'utf8');
  const bodyLength = p.prefix.length + suffixLength;
  const deniedLength = p.inner.length + 1 + varintLength(bodyLength) + bodyLength;
  const out = Buffer.allocUnsafe(p.status.length + 1 + varintLength(deniedLength) + deniedLength);
  let pos = p.status.copy(out, 0);
  out[pos++] = TAG_DENIED_RESPONSE;
  pos = writeVarint(out, pos, deniedLength);
  pos += p.inner.copy(out, pos);
  out[pos++] = TAG_BODY;
  pos = writeVarint(out, pos, bodyLength);
  pos += p.prefix.copy(out, pos);
  out.write(suffix, pos, 'utf8');
  return out;
}

/**
 * Returns the encoded CheckResponse for `d`: a shared allow is serialized only the first time,
 * an order's allow per request, a denial with `requestId` in its body (encodeDenial).
 */
export function encodeDecision(d: Decision, serialize: Serialize, requestId?: string): Buffer {
  if (!d.allow) return encodeDenial(d, requestId, serialize);
  // An order's allow, built per order: encoded by hand (codec/allow-encoder.ts, byte-identical).
  if (d.metadata !== undefined) return encodeAllowWithMetadata(d.headers, d.metadata, d.responseHeaders);
  let bytes = d.encoded;
  if (bytes === undefined) {
    // An allow carrying the global limit's x-ratelimit-* headers is one object per (allow, header
    // triple) (ratelimit/check-limit.ts withGlobalLimit): encoded once too, by hand.
    bytes = d.responseHeaders !== undefined ? encodeAllowWithMetadata(d.headers, undefined, d.responseHeaders) : serialize(toCheckResponse(d));
    // Decisions are frozen-in-spirit constants; the cache slot is the one mutable field.
    d.encoded = bytes;
  }
  return bytes;
}
