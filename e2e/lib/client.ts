/**
 * Ordinary HTTP clients for the e2e suite: everything goes through Envoy's port.
 * Client addresses are chosen with X-Forwarded-For (the stack trusts one hop), from the
 * documentation ranges of the generated GeoIP database (testkit/fixtures/make-mmdb.py):
 *   192.0.2.0/25, 2001:db8:3::/48 and 2001:db8:8000::/33 → CH (allowed); 198.51.100.0/25 → KP,
 *   198.51.100.128/25 → CU.
 */
import { randomBytes } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { getCACertificates, setDefaultCACertificates } from 'node:tls';
import { signedIngest, demoDocument } from '../../scripts/edge-client.ts';
import { HEADER } from '../../authz/src/common/contract.ts';
import { recordSecret, traceAudit } from '../../testkit/trace-ledger.ts';
import type { Stack } from './stack.ts';
import { validateResponse } from './openapi-validate.ts';

let counter = 1;
/** A fresh allowed client address (its own rate-limit buckets). */
export function allowedIp(): string {
  counter += 1;
  // A /48 of its own for each (32,768 of them in 2001:db8:8000::/33, then a new /64 in each):
  // the rate limit counts an IPv6 client per /64 and its subscriber per /48 (RATE_PREFIX_V6).
  return `2001:db8:${(0x8000 | (counter & 0x7fff)).toString(16)}:${((counter >>> 15) & 0xffff).toString(16)}::1`;
}

/**
 * Makes this process trust `caFile` (PEM) besides the bundled CAs, for every TLS connection that
 * names no CA of its own (`fetch`, hence request() below): a stack whose client port speaks TLS
 * with a development certificate (compose, the pod) is then reached over https as is.
 */
export function trustCa(caFile: string): void {
  setDefaultCACertificates([...getCACertificates('default'), readFileSync(caFile, 'utf8')]);
}

export const KP_IP = '198.51.100.7';
export const CU_IP = '198.51.100.200';

export interface Reply {
  status: number;
  headers: Headers;
  text: string;
  json(): Record<string, unknown>;
}

/** `baseUrl`: another listener of the stack (stack.ingestUrl); default the public one, stack.edgeUrl. */
export async function request(stack: Stack, method: string, path: string, opts: { ip?: string; body?: Buffer | string; headers?: Record<string, string>; baseUrl?: string } = {}): Promise<Reply> {
  const headers: Record<string, string> = { 'x-forwarded-for': opts.ip ?? allowedIp(), ...opts.headers };
  // The trace audit: whatever signed or authenticated header a test sends, however it made it.
  if (traceAudit) {
    for (const h of [HEADER.signature, HEADER.nonce, 'authorization']) recordSecret(`${h} header`, headers[h]);
    recordOrderPayload(opts.body);
  }
  const body = opts.body === undefined ? undefined : typeof opts.body === 'string' ? opts.body : new Uint8Array(opts.body);
  const res = await fetch(`${opts.baseUrl ?? stack.edgeUrl}${path}`, { method, headers, body });
  const text = await res.text();
  // Every response through Envoy must match the published contract.
  validateResponse(method, path, res.status, res.headers.get('content-type'), text);
  return { status: res.status, headers: res.headers, text, json: () => JSON.parse(text) as Record<string, unknown> };
}

/** Bytes as text when every byte is printable ASCII (a payload a test wrote as a string), else undefined. */
const printable = (b: Buffer): string | undefined => (/^[\x20-\x7e]+$/.test(b.toString('latin1')) ? b.toString('latin1') : undefined);

/** The trace audit: the payload of an order body however the test built it (as sent, and decoded). */
function recordOrderPayload(body: Buffer | string | undefined): void {
  let payload: unknown;
  try {
    payload = (JSON.parse(String(body)) as Record<string, unknown>)['payload'];
  } catch { return; }
  if (typeof payload !== 'string') return;
  const bytes = Buffer.from(payload, 'base64');
  recordSecret('order payload', payload, bytes, printable(bytes));
}

/** A signed ingest of `doc` with the stack's keys. */
export function signed(stack: Stack, doc: Buffer, conditionId: string): { body: Buffer; headers: Record<string, string> } {
  const s = signedIngest(doc, conditionId, stack.hmacKey, stack.feedPrivateKey);
  if (traceAudit) {
    recordSecret('signed ingest', s.headers[HEADER.signature], s.headers[HEADER.nonce], s.body.toString('base64'));
    recordSecret('feed signature', (JSON.parse(s.body.toString()) as { s: string }).s);
  }
  return s;
}

/** A signed ingest, sent where the stack serves ingest: its ingest listener (INGEST_PORT), else the public one. */
export function ingest(stack: Stack, conditionId: string, seq: number, extra: Record<string, unknown> = {}, ip?: string): Promise<Reply> {
  const base = JSON.parse(demoDocument(conditionId, seq).toString()) as Record<string, unknown>;
  const s = signed(stack, Buffer.from(JSON.stringify({ ...base, ...extra })), conditionId);
  return request(stack, 'POST', '/internal/ingest/market', { body: s.body, headers: s.headers, baseUrl: stack.ingestUrl ?? stack.edgeUrl, ...(ip === undefined ? {} : { ip }) });
}

export function orderBody(marketId: string, payload: Buffer, extra: Record<string, unknown> = {}): string {
  recordSecret('order payload', payload, printable(payload));
  return JSON.stringify({ marketId, deadline: Math.floor(Date.now() / 1000) + 60, size: '10', payload: payload.toString('base64'), ...extra });
}

export function uniqueId(prefix: string): string {
  return `${prefix}-${randomBytes(6).toString('hex')}`;
}

/**
 * Asserts the API error shape (docs/api.md "Errors": error, message, field?, requestId, in this order;
 * requestId is the x-request-id header of the same answer, null only when it has none) and
 * returns the code.
 */
export function errorCode(r: Reply): string {
  if (!(r.headers.get('content-type') ?? '').startsWith('application/json')) {
    throw new Error(`status ${r.status}: content-type ${r.headers.get('content-type')} body ${r.text.slice(0, 200)}`);
  }
  const body = r.json();
  if (typeof body['error'] !== 'string' || typeof body['message'] !== 'string') throw new Error(`not a API error body: ${r.text.slice(0, 200)}`);
  const keys = Object.keys(body).join(',');
  if (keys !== 'error,message,requestId' && keys !== 'error,message,field,requestId') throw new Error(`error body keys ${keys}: ${r.text.slice(0, 200)}`);
  const id = r.headers.get('x-request-id');
  if (body['requestId'] !== id) throw new Error(`requestId ${JSON.stringify(body['requestId'])} is not the x-request-id header ${JSON.stringify(id)}`);
  return body['error'];
}
