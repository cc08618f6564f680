/**
 * RateLimitRequest wire bytes → plain data, and the answer → RateLimitResponse wire bytes,
 * without materialising proto-loader objects (as authz/codec/ does for Check): the service is
 * asked once per request Envoy forwards.
 *
 * Field numbers (envoy/service/ratelimit/v3/rls.proto, envoy/extensions/common/ratelimit/v3/
 * ratelimit.proto, envoy/config/core/v3/base.proto, google/protobuf/duration.proto):
 *   RateLimitRequest: domain = 1, descriptors = 2, hits_addend = 3
 *   RateLimitDescriptor: entries = 1 (Entry: key = 1, value = 2), limit = 2 (ignored),
 *     hits_addend = 3 (google.protobuf.UInt64Value, value = 1; Envoy ≥ 1.33, absent from older protos)
 *   RateLimitResponse: overall_code = 1, statuses = 2, response_headers_to_add = 3
 *   DescriptorStatus: code = 1, current_limit = 2 (RateLimit: requests_per_unit = 1, unit = 2),
 *     limit_remaining = 3, duration_until_reset = 4 (Duration: seconds = 1, nanos = 2)
 *   HeaderValue: key = 1, value = 2
 */
import protobuf from 'protobufjs/minimal.js';
import type { Entry } from './bucket.ts';

const { Reader, Writer } = protobuf;
type ProtoReader = protobuf.Reader;
type ProtoWriter = protobuf.Writer;

/** RateLimitResponse.Code. */
export const CODE = { UNKNOWN: 0, OK: 1, OVER_LIMIT: 2 } as const;
export type Code = (typeof CODE)[keyof typeof CODE];
/** RateLimitResponse.RateLimit.Unit.SECOND. */
export const UNIT_SECOND = 1;

export interface Descriptor {
  readonly entries: Entry[];
  /** The descriptor's own hits_addend, when Envoy sent one. */
  hitsAddend: number | undefined;
}

export interface RateLimitRequest {
  domain: string;
  readonly descriptors: Descriptor[];
  /** 0 when unset; the service counts that as 1 (rls.proto). */
  hitsAddend: number;
}

function entry(r: ProtoReader, end: number): Entry {
  let key = '';
  let value = '';
  while (r.pos < end) {
    const tag = r.uint32();
    if (tag === 10) key = r.string();
    else if (tag === 18) value = r.string();
    else r.skipType(tag & 7);
  }
  return { key, value };
}

function wrappedUint(r: ProtoReader, end: number): number {
  let v = 0;
  while (r.pos < end) {
    const tag = r.uint32();
    if (tag === 8) v = r.uint32();
    else r.skipType(tag & 7);
  }
  return v;
}

function descriptor(r: ProtoReader, end: number): Descriptor {
  const d: Descriptor = { entries: [], hitsAddend: undefined };
  while (r.pos < end) {
    const tag = r.uint32();
    if (tag === 10) {
      const len = r.uint32();
      d.entries.push(entry(r, r.pos + len));
    } else if (tag === 26) {
      const len = r.uint32();
      d.hitsAddend = wrappedUint(r, r.pos + len);
    } else {
      r.skipType(tag & 7);
    }
  }
  return d;
}

/** grpc-js requestDeserialize: the request's domain, descriptors and hits_addend. */
export function decodeRateLimitRequest(buf: Buffer): RateLimitRequest {
  const r = Reader.create(buf);
  const req: RateLimitRequest = { domain: '', descriptors: [], hitsAddend: 0 };
  while (r.pos < r.len) {
    const tag = r.uint32();
    if (tag === 10) req.domain = r.string();
    else if (tag === 18) {
      const len = r.uint32();
      req.descriptors.push(descriptor(r, r.pos + len));
    } else if (tag === 24) req.hitsAddend = r.uint32();
    else r.skipType(tag & 7);
  }
  return req;
}

export interface DescriptorStatus {
  readonly code: Code;
  /** The limit in force (requests per second); undefined for a descriptor this service does not limit. */
  readonly limitPerSecond?: number;
  readonly remaining?: number;
  /** Milliseconds until the next token. */
  readonly resetMs?: number;
}

export interface RateLimitResponse {
  readonly overall: Code;
  readonly statuses: readonly DescriptorStatus[];
  readonly headers: readonly (readonly [string, string])[];
}

function status(w: ProtoWriter, s: DescriptorStatus): void {
  w.uint32(18).fork().uint32(8).uint32(s.code);
  if (s.limitPerSecond !== undefined) w.uint32(18).fork().uint32(8).uint32(s.limitPerSecond).uint32(16).uint32(UNIT_SECOND).ldelim();
  if (s.remaining !== undefined && s.remaining > 0) w.uint32(24).uint32(s.remaining);
  if (s.resetMs !== undefined && s.resetMs > 0) {
    const seconds = Math.floor(s.resetMs / 1000);
    const nanos = Math.round((s.resetMs - seconds * 1000) * 1e6);
    w.uint32(34).fork();
    if (seconds > 0) w.uint32(8).int64(seconds);
    if (nanos > 0) w.uint32(16).int32(nanos);
    w.ldelim();
  }
  w.ldelim();
}

/** grpc-js responseSerialize. */
export function encodeRateLimitResponse(res: RateLimitResponse): Buffer {
  const w = Writer.create();
  w.uint32(8).uint32(res.overall);
  for (const s of res.statuses) status(w, s);
  for (const [key, value] of res.headers) w.uint32(26).fork().uint32(10).string(key).uint32(18).string(value).ldelim();
  const bytes = w.finish();
  // protobufjs writes into a Buffer under Node (BufferWriter): no copy then.
  return Buffer.isBuffer(bytes) ? bytes : Buffer.from(bytes);
}
