/**
 * The CheckResponse of an allow that carries dynamic metadata (an accepted order) or response
 * headers (the global rate limit's x-ratelimit-*, when the Check took the bucket), encoded by
 * hand: it is built per request (the payload is the order's own), and protobufjs (proto-loader's
 * fromObject + encode) spends ~1 µs per header and as much again on the Struct. The layout
 * (envoy/service/auth/v3/external_auth.proto, config/core/v3/base.proto, google/protobuf/struct.proto):
 *
 *   CheckResponse  status = 1 (google.rpc.Status, code = 1: 0) · ok_response = 3 · dynamic_metadata = 4
 *   OkHttpResponse headers = 2 (repeated HeaderValueOption) · response_headers_to_add = 6 (same)
 *   HeaderValueOption header = 1 (HeaderValue: key = 1, value = 2) · append_action = 3 (2: OVERWRITE_IF_EXISTS_OR_ADD)
 *   Struct         fields = 1 (map<string, Value>: entry key = 1, value = 2) · Value string_value = 3
 *
 * Byte for byte what proto-loader's serializer writes for the same object (authz/test/
 * allow-encoder.test.ts checks it for random orders, headers and payloads).
 */
import type { Header } from '../decision.ts';

const OVERWRITE_IF_EXISTS_OR_ADD = 2;
/** status (1): google.rpc.Status { code (1) = 0 }, written explicitly as protobufjs does. */
const STATUS_OK = Buffer.from([0x0a, 0x02, 0x08, 0x00]);

function varintLen(n: number): number {
  return n < 0x80 ? 1 : n < 0x4000 ? 2 : n < 0x200000 ? 3 : n < 0x10000000 ? 4 : 5;
}

/** Tag (one byte: every field number here is < 16) + length varint + `len` bytes. */
function fieldLen(len: number): number {
  return 1 + varintLen(len) + len;
}

function writeVarint(buf: Buffer, pos: number, n: number): number {
  let v = n;
  while (v > 127) {
    buf[pos++] = (v & 127) | 128;
    v >>>= 7;
  }
  buf[pos++] = v;
  return pos;
}

/** Writes tag and length; returns the position of the field's content. */
function head(buf: Buffer, pos: number, tag: number, len: number): number {
  buf[pos] = tag;
  return writeVarint(buf, pos + 1, len);
}

function str(buf: Buffer, pos: number, tag: number, s: string, len: number): number {
  const at = head(buf, pos, tag, len);
  return at + buf.write(s, at, 'utf8');
}

/** Size of the HeaderValueOption entries for `headers` (each: tag, length, HeaderValue, append_action). */
function headersLen(headers: readonly Header[], lens: number[], at: number): number {
  let total = 0;
  for (let i = 0; i < headers.length; i++) {
    const [k, v] = headers[i]!;
    const hv = fieldLen(Buffer.byteLength(k)) + fieldLen(Buffer.byteLength(v));
    lens[at + i] = hv;
    total += fieldLen(fieldLen(hv) + 2);
  }
  return total;
}

function writeHeaders(buf: Buffer, pos: number, tag: number, headers: readonly Header[], lens: readonly number[], at: number): number {
  for (let i = 0; i < headers.length; i++) {
    const [k, v] = headers[i]!;
    const hv = lens[at + i]!;
    pos = head(buf, pos, tag, fieldLen(hv) + 2);
    pos = head(buf, pos, 0x0a, hv);
    pos = str(buf, pos, 0x0a, k, Buffer.byteLength(k));
    pos = str(buf, pos, 0x12, v, Buffer.byteLength(v));
    buf[pos++] = 0x18;
    buf[pos++] = OVERWRITE_IF_EXISTS_OR_ADD;
  }
  return pos;
}

/**
 * The encoded CheckResponse: OK, `headers` to set upstream (overwriting), `responseHeaders` for
 * the client (OkHttpResponse.response_headers_to_add = 6, overwriting), `metadata` as string
 * Values (no dynamic_metadata field when undefined).
 */
export function encodeAllowWithMetadata(headers: readonly Header[], metadata: Readonly<Record<string, string>> | undefined, responseHeaders: readonly Header[] = []): Buffer {
  const lens = new Array<number>(headers.length + responseHeaders.length);
  const ok = headersLen(headers, lens, 0) + headersLen(responseHeaders, lens, headers.length);
  const entries = metadata === undefined ? [] : Object.entries(metadata);
  const m = entries.length;
  const mk = new Array<number>(m);
  const mv = new Array<number>(m);
  let struct = 0;
  for (let i = 0; i < m; i++) {
    const [k, v] = entries[i]!;
    mk[i] = Buffer.byteLength(k);
    mv[i] = Buffer.byteLength(v);
    struct += fieldLen(fieldLen(mk[i]!) + fieldLen(fieldLen(mv[i]!)));
  }
  const buf = Buffer.allocUnsafe(STATUS_OK.length + fieldLen(ok) + (metadata === undefined ? 0 : fieldLen(struct)));
  STATUS_OK.copy(buf, 0);
  let pos = head(buf, STATUS_OK.length, 0x1a, ok);
  pos = writeHeaders(buf, pos, 0x12, headers, lens, 0);
  pos = writeHeaders(buf, pos, 0x32, responseHeaders, lens, headers.length);
  if (metadata !== undefined) {
    pos = head(buf, pos, 0x22, struct);
    for (let i = 0; i < m; i++) {
      const [k, v] = entries[i]!;
      pos = head(buf, pos, 0x0a, fieldLen(mk[i]!) + fieldLen(fieldLen(mv[i]!)));
      pos = str(buf, pos, 0x0a, k, mk[i]!);
      pos = head(buf, pos, 0x12, fieldLen(mv[i]!));
      pos = str(buf, pos, 0x1a, v, mv[i]!);
    }
  }
  if (pos !== buf.length) throw new Error(`allow encoder: wrote ${pos} of ${buf.length} bytes`);
  return buf;
}
