/**
 * Ingest policy (docs/api.md "POST /internal/ingest/market", docs/api.md "POST /internal/ingest/market"), in the contract's order:
 *   headers well-formed → window → HMAC → record nonce → envelope → Ed25519 → document.
 * A nonce is recorded only after the HMAC verified, and stays recorded whatever follows.
 */
import { timingSafeEqual } from 'node:crypto';
import type { HmacSha256Key } from '../../common/crypto/hmac.ts';
import { ingestMac, SIGNATURE_SCHEME } from '../../common/crypto/ingest-signer.ts';
import { deny, ALLOW, type Decision } from '../decision.ts';
import { verifyIngestBody } from '../../common/feed/envelope.ts';
import type { Clock, NonceStore } from '../../common/ports.ts';
import type { KeyObject } from 'node:crypto';
import { RE } from '../../common/rules.ts';

const INT64_MAX = 9223372036854775807n;
const INT64_MIN = -9223372036854775808n;

export interface IngestDeps {
  readonly hmacKeys: readonly HmacSha256Key[];
  readonly feedKeys: readonly KeyObject[];
  readonly nonces: NonceStore;
  readonly clock: Clock;
  readonly replayWindowSecs: number;
  readonly nonceTtlSecs: number;
  /** Called when the nonce store fails (metrics/logs); the request is denied 503. */
  readonly onStoreError?: (err: unknown) => void;
}

export interface IngestRequest {
  readonly timestamp: string | undefined;
  readonly nonce: string | undefined;
  readonly signature: string | undefined;
  readonly body: Buffer | undefined;
}

const UNAUTHORIZED_MISSING = deny('unauthorized', 'X-Edge-Timestamp, X-Edge-Nonce and X-Edge-Signature are required');
const UNAUTHORIZED_TS = deny('unauthorized', 'X-Edge-Timestamp must be integer unix seconds');
const UNAUTHORIZED_NONCE = deny('unauthorized', 'X-Edge-Nonce must be 16 to 128 hex characters');
const UNAUTHORIZED_SIG_FORMAT = deny('unauthorized', 'X-Edge-Signature must be v1=<64 hex characters>');
const UNAUTHORIZED_HMAC = deny('unauthorized');
const EXPIRED = deny('timestamp expired');
const REPLAY = deny('ingest_replay');
const STORE_DOWN = deny('service_unavailable', 'nonce store unavailable; the request was not accepted');
const BAD_SIGNATURE = deny('invalid_content_signature');

/** Parses the timestamp header into a Number (±int64 checked); undefined when malformed. */
export function parseTimestamp(raw: string): number | undefined {
  if (!RE.timestamp.test(raw)) return undefined;
  if (raw.length >= 19) {
    const big = BigInt(raw);
    if (big > INT64_MAX || big < INT64_MIN) return undefined;
  }
  return Number(raw);
}

/**
 * What the headers alone decide: present and well-formed, timestamp inside the window. Envoy
 * asks this first, without the body (the ingest route's header phase), so a request that fails
 * here is refused before up to INGEST_MAX_BYTES of body is buffered and sent to authz.
 */
export function checkIngestHeaders(req: IngestRequest, replayWindowSecs: number, nowSecs: number): Decision | undefined {
  const { timestamp, nonce, signature } = req;
  if (timestamp === undefined || nonce === undefined || signature === undefined) return UNAUTHORIZED_MISSING;
  const ts = parseTimestamp(timestamp);
  if (ts === undefined) return UNAUTHORIZED_TS;
  if (!RE.nonce.test(nonce)) return UNAUTHORIZED_NONCE;
  if (!RE.signature.test(signature)) return UNAUTHORIZED_SIG_FORMAT;
  if (Math.abs(nowSecs - ts) > replayWindowSecs) return EXPIRED;
  return undefined;
}

/** Checks headers, window and HMAC; returns a denial, or undefined when the request is authentic. */
export function checkIngestSignature(req: IngestRequest, deps: IngestDeps, nowSecs: number): Decision | undefined {
  const headers = checkIngestHeaders(req, deps.replayWindowSecs, nowSecs);
  if (headers !== undefined) return headers;
  // Present and well-formed: checkIngestHeaders said so.
  const { timestamp, nonce, signature } = req as { readonly timestamp: string; readonly nonce: string; readonly signature: string };
  const given = Buffer.from(signature.slice(SIGNATURE_SCHEME.length), 'hex');
  const body = req.body ?? EMPTY;
  let ok = false;
  // Every key is tried (no early exit), each compared in constant time.
  for (const key of deps.hmacKeys) {
    if (timingSafeEqual(ingestMac(key, timestamp, nonce, body), given)) ok = true;
  }
  return ok ? undefined : UNAUTHORIZED_HMAC;
}

const EMPTY = Buffer.alloc(0);

/** The content checks after the nonce is recorded: envelope → Ed25519 → document. */
export function checkIngestContent(body: Buffer, feedKeys: readonly KeyObject[]): Decision {
  const v = verifyIngestBody(body, feedKeys);
  if (v.ok) return ALLOW;
  return v.code === 'invalid_content_signature' ? BAD_SIGNATURE : deny(v.code, v.message);
}

/** The whole ingest policy. */
export async function ingestStage(req: IngestRequest, deps: IngestDeps): Promise<Decision> {
  const denial = checkIngestSignature(req, deps, deps.clock.nowSecs());
  if (denial !== undefined) return denial;
  // Keep the nonce at least until its timestamp has left the window (a request stamped
  // now + window stays acceptable for 2 × window), whatever NONCE_TTL_SECS says.
  const now = deps.clock.nowSecs();
  const ttl = Math.max(deps.nonceTtlSecs, (parseTimestamp(req.timestamp as string) ?? now) + deps.replayWindowSecs + 1 - now);
  let recorded;
  try {
    // Case-folded: one nonce, however it is spelled.
    recorded = await deps.nonces.recordIfAbsent((req.nonce as string).toLowerCase(), ttl);
  } catch (err) {
    deps.onStoreError?.(err);
    return STORE_DOWN;
  }
  if (recorded === 'replay') return REPLAY;
  return checkIngestContent(req.body ?? EMPTY, deps.feedKeys);
}
