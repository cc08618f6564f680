/**
 * CheckRequests shaped exactly as Envoy 1.40 sends them (lower-case headers, pseudo-headers,
 * raw_body bytes), encoded with the real protos, and the CheckResponse read back: for the
 * service's tests and the authz benchmark.
 */
import type { MethodDefinition } from '@grpc/proto-loader';
import { loadPackageDefinition, SERVICE_NAMES } from '../proto/index.ts';

const pd = loadPackageDefinition();
const checkDef = (pd[SERVICE_NAMES.authorization] as Record<string, MethodDefinition<object, object>>)['Check']!;

export interface CheckSpec {
  method?: string;
  path?: string;
  headers?: Record<string, string>;
  body?: Buffer;
  /** Send the body in `body` (string) instead of `raw_body`, as without pack_as_bytes. */
  bodyAsString?: boolean;
  sourceAddress?: string;
  host?: string;
  /** CheckRequest.attributes.context_extensions (the route's ExtAuthzPerRoute check_settings). */
  contextExtensions?: Record<string, string>;
}

/** The CheckRequest as a proto-loader object, shaped like Envoy 1.40's. */
export function checkRequestObject(spec: CheckSpec): Record<string, unknown> {
  const method = spec.method ?? 'GET';
  const path = spec.path ?? '/v1/markets';
  const headers: Record<string, string> = {
    ':authority': spec.host ?? 'edge.example',
    ':method': method,
    ':path': path,
    ':scheme': 'http',
    'user-agent': 'curl/8.5.0',
    accept: '*/*',
    'x-forwarded-proto': 'http',
    'x-request-id': '4b1c1a9e-3f0e-4a53-9d4e-7a3b2f1e0c11',
    'x-envoy-expected-rq-timeout-ms': '15000',
    ...(spec.body !== undefined ? { 'content-length': String(spec.body.length), 'content-type': 'application/json' } : {}),
    ...spec.headers,
  };
  const http: Record<string, unknown> = {
    id: '1234567890', method, headers, path, host: spec.host ?? 'edge.example', scheme: 'http', protocol: 'HTTP/1.1',
    size: String(spec.body?.length ?? 0),
  };
  if (spec.body !== undefined) {
    if (spec.bodyAsString) http['body'] = spec.body.toString('utf8');
    else http['raw_body'] = spec.body;
  }
  return {
    attributes: {
      source: { address: { socket_address: { address: spec.sourceAddress ?? '127.0.0.1', port_value: 51234 } } },
      destination: { address: { socket_address: { address: '127.0.0.1', port_value: 8080 } } },
      request: { time: { seconds: '1763700000', nanos: 0 }, http },
      metadata_context: {},
      route_metadata_context: {},
      ...(spec.contextExtensions === undefined ? {} : { context_extensions: spec.contextExtensions }),
    },
  };
}

export function encodeCheckRequest(spec: CheckSpec): Buffer {
  return checkDef.requestSerialize(checkRequestObject(spec));
}

export function decodeCheckResponse(buf: Buffer): CheckResponseObject {
  return checkDef.responseDeserialize(buf) as CheckResponseObject;
}

export interface CheckResponseObject {
  status?: { code?: number; message?: string };
  denied_response?: { status?: { code?: number }; headers?: { header?: { key: string; value: string } }[]; body?: string };
  ok_response?: Record<string, unknown>;
}

/** HTTP status and parsed error body of a CheckResponse (200 for an allow). */
export function outcomeOf(res: CheckResponseObject): { status: number; error?: string; body?: Record<string, unknown> } {
  if (res.status?.code === 0 || res.status?.code === undefined) return { status: 200 };
  const body = JSON.parse(res.denied_response?.body ?? '{}') as Record<string, unknown>;
  return { status: res.denied_response?.status?.code ?? 403, error: body['error'] as string, body };
}
