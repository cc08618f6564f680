/**
 * Decision → CheckResponse. Pure translation, plus a per-Decision cache of the encoded
 * bytes: denials and plain allows are shared constants, so each is serialized once; an order's
 * allow carries its own payload (`metadata`) and is serialized per request, never cached.
 */
import type { Decision } from '../decision.ts';
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

/** The CheckResponse as a proto-loader plain object (keepCase field names). */
export function toCheckResponse(d: Decision): Record<string, unknown> {
  const headers = d.headers.map(([key, value]) => ({
    header: { key, value },
    append_action: 'OVERWRITE_IF_EXISTS_OR_ADD',
  }));
  if (d.allow) {
    const res: Record<string, unknown> = { status: { code: GRPC_CODE.OK }, ok_response: headers.length > 0 ? { headers } : {} };
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
    status: { code: grpcCodeFor(d), message: d.reason },
    // The HTTP status must be the raw number: 451 is not in Envoy's StatusCode enum, and a
    // name or string would be encoded as 0, which Envoy turns into 403 (notes/envoy.md §0).
    denied_response: { status: { code: d.httpStatus }, headers, body: d.body },
  };
}

export type Serialize = (value: object) => Buffer;

/** Returns the encoded CheckResponse for `d`, serializing a shared decision only the first time. */
export function encodeDecision(d: Decision, serialize: Serialize): Buffer {
  // An order's allow, built per order: encoded by hand (codec/allow-encoder.ts, byte-identical).
  if (d.metadata !== undefined) return encodeAllowWithMetadata(d.headers, d.metadata);
  let bytes = d.encoded;
  if (bytes === undefined) {
    bytes = serialize(toCheckResponse(d));
    // Decisions are frozen-in-spirit constants; the cache slot is the one mutable field.
    d.encoded = bytes;
  }
  return bytes;
}
