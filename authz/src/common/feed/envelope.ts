/**
 * The signed envelope `{d, s, k}` (docs/api.md "POST /internal/ingest/market" "Ed25519 content signature") and the ingest body
 * `{conditionId, d, s, k}` (docs/api.md "POST /internal/ingest/market"). Pure functions, shared by the authz ingest stage
 * and the market service's write path (which re-verifies: defence in depth).
 */
import { createHash, verify, type KeyObject } from 'node:crypto';
import { decodeStrictBase64, PATTERN, RE } from '../rules.ts';
import { validateDocument, type MarketDocument } from './schema.ts';

export const ENVELOPE_SCHEME = 'ed25519-sha256';

export interface Envelope {
  readonly d: string;
  readonly s: string;
  readonly k: typeof ENVELOPE_SCHEME;
}

/** A parsed ingest body: the envelope plus its decoded bytes. */
export interface ParsedIngest {
  readonly conditionId: string;
  readonly envelope: Envelope;
  readonly document: Buffer;
  readonly signature: Buffer;
}

export type IngestParse =
  | { readonly ok: true; readonly value: ParsedIngest }
  | { readonly ok: false; readonly code: 'invalid_json' | 'invalid_envelope'; readonly message: string };

const fail = (code: 'invalid_json' | 'invalid_envelope', message: string): IngestParse => ({ ok: false, code, message });

/** Parses the raw ingest body. Unknown extra fields are ignored (docs/api.md "POST /internal/ingest/market"). */
export function parseIngestBody(raw: Buffer): IngestParse {
  let body: unknown;
  try {
    body = JSON.parse(raw.toString('utf8'));
  } catch {
    return fail('invalid_json', 'body is not valid JSON');
  }
  if (typeof body !== 'object' || body === null || Array.isArray(body)) return fail('invalid_json', 'body is not a JSON object');
  const { conditionId, d, s, k } = body as Record<string, unknown>;
  if (typeof conditionId !== 'string' || !RE.conditionId.test(conditionId)) {
    return fail('invalid_envelope', `conditionId must match ${PATTERN.conditionId}`);
  }
  if (typeof d !== 'string') return fail('invalid_envelope', 'd must be a base64 string');
  if (typeof s !== 'string' || !RE.signatureHex.test(s)) return fail('invalid_envelope', 's must be 128 hex characters (64 bytes)');
  if (k !== ENVELOPE_SCHEME) return fail('invalid_envelope', `k must be "${ENVELOPE_SCHEME}"`);
  const document = decodeStrictBase64(d);
  if (document === undefined || document.length === 0) return fail('invalid_envelope', 'd must be non-empty strict standard base64');
  return { ok: true, value: { conditionId, envelope: { d, s, k }, document, signature: Buffer.from(s, 'hex') } };
}

/** SHA-256 of the document, verified as an Ed25519 message against each key in turn. */
export function verifyEnvelopeSignature(document: Buffer, signature: Buffer, keys: readonly KeyObject[]): boolean {
  const digest = createHash('sha256').update(document).digest();
  for (const key of keys) {
    if (verify(null, digest, key, signature)) return true;
  }
  return false;
}

export type DocumentCheck =
  | { readonly ok: true; readonly document: MarketDocument }
  | { readonly ok: false; readonly message: string };

/**
 * Nesting bound for a feed document (a market record is 3 levels deep). Unknown fields are kept
 * and stored, and storing serialises the document again, which recursion-bound serialisers
 * cannot do past a few thousand levels: the bound keeps that a 400 and not a store failure.
 */
export const MAX_DOCUMENT_DEPTH = 64;

/** Whether arrays/objects nest deeper than `limit` (iterative: no recursion on client input). */
export function nestedDeeperThan(value: unknown, limit: number): boolean {
  const stack: [unknown, number][] = [[value, 1]];
  while (stack.length > 0) {
    const [v, depth] = stack.pop()!;
    if (typeof v !== 'object' || v === null) continue;
    if (depth > limit) return true;
    for (const child of Array.isArray(v) ? v : Object.values(v)) {
      if (typeof child === 'object' && child !== null) stack.push([child, depth + 1]);
    }
  }
  return false;
}

/** The decoded document must be a JSON object matching the market schema and the body's conditionId. */
export function checkDocument(bytes: Buffer, conditionId: string): DocumentCheck {
  let doc: unknown;
  try {
    doc = JSON.parse(new TextDecoder('utf-8', { fatal: true }).decode(bytes));
  } catch {
    return { ok: false, message: 'document is not UTF-8 JSON' };
  }
  if (nestedDeeperThan(doc, MAX_DOCUMENT_DEPTH)) {
    return { ok: false, message: `document is nested deeper than ${MAX_DOCUMENT_DEPTH} levels` };
  }
  const result = validateDocument(doc);
  if (!result.ok) return result;
  if (result.document.conditionId !== conditionId) {
    return { ok: false, message: 'document conditionId differs from the body conditionId' };
  }
  return result;
}

export type IngestVerification =
  | { readonly ok: true; readonly conditionId: string; readonly envelope: Envelope; readonly document: MarketDocument }
  | { readonly ok: false; readonly code: 'invalid_json' | 'invalid_envelope' | 'invalid_content_signature'; readonly message: string | undefined };

/**
 * The content checks of an ingest body, in their one order: parse the body and the envelope →
 * Ed25519 over SHA-256 of the document → the document (UTF-8 JSON, depth, market schema, same
 * conditionId). The authz ingest stage runs it before allowing; the market service runs it again
 * before storing (defence in depth: the store never holds content the feed key did not sign).
 */
export function verifyIngestBody(raw: Buffer, feedKeys: readonly KeyObject[]): IngestVerification {
  const parsed = parseIngestBody(raw);
  if (!parsed.ok) return { ok: false, code: parsed.code, message: parsed.message };
  const { document, signature, conditionId, envelope } = parsed.value;
  if (!verifyEnvelopeSignature(document, signature, feedKeys)) return { ok: false, code: 'invalid_content_signature', message: undefined };
  const doc = checkDocument(document, conditionId);
  if (!doc.ok) return { ok: false, code: 'invalid_envelope', message: doc.message };
  return { ok: true, conditionId, envelope, document: doc.document };
}
