/**
 * Every validation rule of the interface, declared once. Each pattern is a string (for the JSON
 * schemas and the OpenAPI document, which take patterns as strings) and a compiled RegExp (for
 * the code); scripts/openapi.ts, the feed and market schemas, the stages and the settings parser
 * all import them from here, so a rule changed here changes everywhere.
 */

export const PATTERN = {
  /** A market id (`conditionId`, an order's `marketId`). */
  conditionId: '^[A-Za-z0-9_.:-]{1,128}$',
  /** A decimal amount: sizes, prices, ORDER_MAX_SIZE (at most 18 fractional digits). */
  decimal: '^[0-9]+(\\.[0-9]{1,18})?$',
  /** X-Edge-Timestamp: decimal integer seconds (the int64 range is checked in code). */
  timestamp: '^-?[0-9]{1,19}$',
  /** X-Edge-Nonce: 16 to 128 hex characters. */
  nonce: '^[0-9a-fA-F]{16,128}$',
  /** X-Edge-Signature: `v1=` and the hex HMAC-SHA256, either case. */
  signature: '^v1=[0-9a-fA-F]{64}$',
  /** The feed envelope's `s`: a 64-byte Ed25519 signature in hex. */
  signatureHex: '^[0-9a-fA-F]{128}$',
  /**
   * Strict, canonical, padded standard base64 of at least one byte: unused bits zero, `=` only
   * as padding. The code checks it with strictBase64Length (same language, no backtracking over
   * a 43 KB payload); a property test proves the two agree.
   */
  strictBase64: '^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{4}|[A-Za-z0-9+/][AQgw]==|[A-Za-z0-9+/]{2}[AEIMQUYcgkosw048]=)$',
  /** A page cursor (base64url of a conditionId). */
  cursor: '^[A-Za-z0-9_-]+$',
  /** ISO 3166-1 alpha-2 country code. */
  country: '^[A-Z]{2}$',
  /** ISO 3166-2 subdivision code (`CA-ON`). */
  region: '^[A-Z]{2}-[A-Z0-9]{1,3}$',
} as const;

export type Rule = keyof typeof PATTERN;

/** PATTERN compiled. */
export const RE: { readonly [K in Rule]: RegExp } = Object.freeze(
  Object.fromEntries(Object.entries(PATTERN).map(([k, p]) => [k, new RegExp(p)])) as { [K in Rule]: RegExp },
);

/**
 * Bounds on what one request may make the service parse (docs/api.md "Limits"): past them the
 * answer is a 400 before the costly part runs.
 */
export const LIMIT = {
  /** Levels of arrays and objects an order body may nest (the envelope object is level 1). */
  orderJsonDepth: 32,
  /** `conditionId` values one `GET /v1/markets` or `/v1/quotes` query may name. */
  queryIds: 100,
} as const;

const B64_BODY = /^[A-Za-z0-9+/]*$/;
/** The last data character before `==` / `=` must leave the unused bits zero (canonical). */
const PAD2_LAST = /[AQgw]/;
const PAD1_LAST = /[AEIMQUYcgkosw048]/;

/** Decoded length of strict, canonical, padded standard base64 (PATTERN.strictBase64); -1 when `s` is not that. */
export function strictBase64Length(s: string): number {
  const n = s.length;
  if (n === 0 || n % 4 !== 0) return -1;
  const pad = s.charCodeAt(n - 1) === 61 /* = */ ? (s.charCodeAt(n - 2) === 61 ? 2 : 1) : 0;
  const data = pad === 0 ? s : s.slice(0, n - pad);
  if (!B64_BODY.test(data)) return -1;
  if (pad === 2 && !PAD2_LAST.test(s.charAt(n - 3))) return -1;
  if (pad === 1 && !PAD1_LAST.test(s.charAt(n - 2))) return -1;
  return (n / 4) * 3 - pad;
}

/** The bytes of strict, canonical, padded standard base64 (PATTERN.strictBase64); undefined when `s` is not that. */
export function decodeStrictBase64(s: string): Buffer | undefined {
  return strictBase64Length(s) < 0 ? undefined : Buffer.from(s, 'base64');
}
