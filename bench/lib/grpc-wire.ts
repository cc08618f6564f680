/**
 * gRPC-over-HTTP/2 wire helpers for load generators that send pre-encoded messages
 * (h2load, ./h2-client.ts) instead of going through a gRPC client library.
 */

/** Length-prefixed message: 1 byte "compressed" flag (0) + 4 bytes big-endian length + message. */
export function frameGrpc(message: Buffer): Buffer {
  const out = Buffer.allocUnsafe(5 + message.length);
  out[0] = 0;
  out.writeUInt32BE(message.length, 1);
  message.copy(out, 5);
  return out;
}

/** The first message of a (possibly multi-chunk) gRPC response body; undefined if incomplete. */
export function unframeGrpc(body: Buffer): Buffer | undefined {
  if (body.length < 5 || body[0] !== 0) return undefined;
  const len = body.readUInt32BE(1);
  return body.length >= 5 + len ? body.subarray(5, 5 + len) : undefined;
}

/** Request headers of a unary gRPC call as Envoy's gRPC client sends them (minus tracing). */
export function grpcRequestHeaders(path: string, authority: string): Record<string, string> {
  return {
    ':method': 'POST',
    ':scheme': 'http',
    ':path': path,
    ':authority': authority,
    'content-type': 'application/grpc',
    te: 'trailers',
  };
}

function varint(buf: Buffer, pos: number): [value: number, next: number] {
  let v = 0;
  let shift = 0;
  for (;;) {
    if (pos >= buf.length) throw new RangeError('truncated varint');
    const b = buf[pos++] as number;
    v += (b & 0x7f) * 2 ** shift;
    if (b < 0x80) return [v, pos];
    shift += 7;
  }
}

/**
 * CheckResponse.status.code (google.rpc.Code; 0 = allowed) read straight off the wire:
 * field 1 (status, google.rpc.Status) → its field 1 (code). Absent = 0 (proto3 default).
 * Cheap enough to run on every response inside a load generator.
 */
export function checkResponseCode(msg: Buffer): number {
  let pos = 0;
  while (pos < msg.length) {
    let tag: number;
    [tag, pos] = varint(msg, pos);
    const wire = tag & 7;
    if (wire === 2) {
      let len: number;
      [len, pos] = varint(msg, pos);
      if (tag >>> 3 === 1) {
        const end = pos + len;
        while (pos < end) {
          let t: number;
          [t, pos] = varint(msg, pos);
          if (t === 0x08) return varint(msg, pos)[0];
          if ((t & 7) === 2) {
            let l: number;
            [l, pos] = varint(msg, pos);
            pos += l;
          } else if ((t & 7) === 0) pos = varint(msg, pos)[1];
          else throw new RangeError(`unexpected wire type ${t & 7} in google.rpc.Status`);
        }
        return 0;
      }
      pos += len;
    } else if (wire === 0) {
      pos = varint(msg, pos)[1];
    } else {
      throw new RangeError(`unexpected wire type ${wire} in CheckResponse`);
    }
  }
  return 0;
}
