/**
 * Bearer tokens of the internal callers (AUTHZ_ADMIN_TOKEN_FILE for POST /admin/seal,
 * RATELIMIT_SERVICE_TOKEN_FILE for RateLimitService): read once from a restricted-permission file
 * at start, kept only as their SHA-256 digest (the file's bytes are zeroed at once), and checked
 * in constant time: a presented token is hashed and its digest compared with timingSafeEqual, so
 * neither the content nor the length of the token shows in the time an answer takes.
 */
import { createHash, timingSafeEqual } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { ConfigError } from './config.ts';

/** The fewest bytes a token file may hold (after its trailing newline): 32, like the ingest key. */
export const MIN_TOKEN_BYTES = 32;

/** Checks a presented `authorization` header value against one configured token. */
export interface TokenCheck {
  /** True when `header` is `Bearer <the token>` (the scheme in any case). */
  accepts(header: string | undefined): boolean;
}

const digest = (b: Buffer): Buffer => createHash('sha256').update(b).digest();

/** The token bytes of a file: one trailing newline (\n or \r\n) removed; nothing else changed. */
function tokenBytes(raw: Buffer): Buffer {
  let end = raw.length;
  if (end > 0 && raw[end - 1] === 0x0a) end--;
  if (end > 0 && raw[end - 1] === 0x0d) end--;
  return raw.subarray(0, end);
}

/**
 * The token in `file`, named by `setting` in the error when the file cannot be read or holds
 * fewer than MIN_TOKEN_BYTES bytes, or whitespace or control characters (which no header can carry).
 */
export function readTokenFile(setting: string, file: string): TokenCheck {
  let raw: Buffer;
  try {
    raw = readFileSync(file);
  } catch (err) {
    throw new ConfigError(setting, 'a readable file holding the token', `${file}: ${(err as NodeJS.ErrnoException).code ?? String(err)}`);
  }
  try {
    const token = tokenBytes(raw);
    if (token.length < MIN_TOKEN_BYTES || token.some((c) => c <= 0x20 || c === 0x7f)) {
      throw new ConfigError(setting, `a file holding a token of at least ${MIN_TOKEN_BYTES} visible ASCII characters (e.g. openssl rand -hex 32)`, file);
    }
    return tokenCheck(digest(token));
  } finally {
    raw.fill(0);
  }
}

/** A TokenCheck for the token whose SHA-256 digest is `expected`. */
export function tokenCheck(expected: Buffer): TokenCheck {
  return {
    accepts(header) {
      const m = header === undefined ? null : /^bearer[ ]+(\S+)[ ]*$/i.exec(header);
      // No token: still one hash and one compare, so a missing header answers like a wrong one.
      const presented = digest(Buffer.from(m?.[1] ?? '', 'utf8'));
      return timingSafeEqual(presented, expected) && m !== null;
    },
  };
}
