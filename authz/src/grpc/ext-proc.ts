/**
 * The order body processor (envoy.service.ext_proc.v3.ExternalProcessor/Process).
 *
 * Envoy runs it on the orders route only, after ext_authz allowed the request, in BUFFERED
 * mode: we answer the request-headers message with CONTINUE, then replace the buffered JSON
 * envelope by the exact base64-decoded payload bytes. The same body response must set
 * `content-length` (else Envoy answers 500: notes/envoy.md §0) and header values travel in
 * `raw_value` (a processor that only sets `value` produces empty headers in Envoy 1.40).
 */
import type * as grpc from '@grpc/grpc-js';
import { errorJson } from '../errors.ts';

const SIZE = /^[0-9]+(\.[0-9]{1,18})?$/;
import { parseOrder } from '../stages/order.ts';

/** A header set on the upstream request. */
export type HeaderSet = readonly [string, string];

export type BodyTransform =
  | { readonly ok: true; readonly body: Buffer; readonly headers: readonly HeaderSet[] }
  | { readonly ok: false; readonly status: number; readonly body: string };

/**
 * Order envelope JSON → the bytes and headers the backend receives (CONTRACT §5).
 * ext_authz already validated the envelope; this re-parses defensively and fails closed.
 */
export function transformOrderBody(body: Buffer, payloadMax: number): BodyTransform {
  const parsed = parseOrder(body, payloadMax);
  if ('allow' in parsed) return { ok: false, status: parsed.httpStatus, body: parsed.body };
  // Never copy an unchecked client string into a backend header (CR/LF, NUL…).
  if (!SIZE.test(parsed.size)) return { ok: false, status: 422, body: errorJson('invalid_size') };
  const bytes = Buffer.from(parsed.payload, 'base64');
  return {
    ok: true,
    body: bytes,
    headers: [
      ['content-type', 'application/octet-stream'],
      ['content-length', String(bytes.length)],
      ['x-edge-market-id', parsed.marketId],
      ['x-edge-deadline', String(parsed.deadline)],
      ['x-edge-size', parsed.size],
    ],
  };
}

function headerOptions(headers: readonly HeaderSet[]): object[] {
  return headers.map(([key, value]) => ({
    header: { key, raw_value: Buffer.from(value, 'utf8') },
    append_action: 'OVERWRITE_IF_EXISTS_OR_ADD',
  }));
}

const JSON_HEADERS: readonly HeaderSet[] = [['content-type', 'application/json'], ['cache-control', 'no-store']];

/** The ProcessingResponse for one ProcessingRequest (plain proto-loader objects). */
export function processMessage(req: Record<string, unknown>, payloadMax: number): object | undefined {
  if (req['request_headers'] !== undefined) {
    // CONTINUE: the body phase does the work.
    return { request_headers: { response: {} } };
  }
  const rb = req['request_body'] as { body?: Buffer; end_of_stream?: boolean } | undefined;
  if (rb !== undefined) {
    const t = transformOrderBody(rb.body ?? Buffer.alloc(0), payloadMax);
    if (!t.ok) {
      return {
        immediate_response: {
          status: { code: t.status },
          headers: { set_headers: headerOptions(JSON_HEADERS) },
          body: Buffer.from(t.body, 'utf8'),
          details: 'edge_order_rejected_by_processor',
        },
      };
    }
    return {
      request_body: {
        response: {
          status: 'CONTINUE',
          header_mutation: { set_headers: headerOptions(t.headers) },
          body_mutation: { body: t.body },
        },
      },
    };
  }
  // Anything else (trailers, response phases we did not ask for): continue unchanged.
  if (req['request_trailers'] !== undefined) return { request_trailers: {} };
  if (req['response_headers'] !== undefined) return { response_headers: { response: {} } };
  if (req['response_body'] !== undefined) return { response_body: { response: {} } };
  if (req['response_trailers'] !== undefined) return { response_trailers: {} };
  return undefined;
}

export const PROCESSOR_FAILURE = errorJson('service_unavailable', 'order processor failed; the order was not sent');

/** The bidi-stream handler. */
export function createProcessHandler(
  payloadMax: number,
  onError: (err: unknown) => void,
): grpc.handleBidiStreamingCall<Record<string, unknown>, object> {
  return (call) => {
    call.on('data', (req: Record<string, unknown>) => {
      let res: object | undefined;
      try {
        res = processMessage(req, payloadMax);
      } catch (err) {
        onError(err);
        res = {
          immediate_response: {
            status: { code: 503 },
            headers: { set_headers: headerOptions(JSON_HEADERS) },
            body: Buffer.from(PROCESSOR_FAILURE),
          },
        };
      }
      if (res === undefined) return;
      call.write(res);
      // The body (or an immediate) response is the last message this route needs: end the
      // stream ourselves. Left open, Envoy resets every finished stream (RST_STREAM), and at
      // order rates that trips Node's HTTP/2 rapid-reset protection, which closes the whole
      // connection — failing every Check multiplexed on it.
      if ('request_body' in res || 'immediate_response' in res) call.end();
    });
    call.on('end', () => call.end());
    call.on('error', onError);
  };
}
