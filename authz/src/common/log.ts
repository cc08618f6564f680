/**
 * JSON logs (pino). Logs never carry keys, signatures, full nonces or order payloads:
 * call sites pass only the fields below, and pino's redact strips the known secret-bearing
 * paths should one ever be passed by mistake.
 */
import { createHash } from 'node:crypto';
import { pino, type Logger } from 'pino';

export type { Logger };

export const REDACT_PATHS = [
  'signature', 'hmac', 'key', 'keys', 'payload', 'body', 'd', 's', 'nonce',
  'headers["x-edge-signature"]', 'headers["x-edge-nonce"]', 'headers.authorization', 'headers.cookie',
  '*.signature', '*.payload', '*.body', '*.key', '*.nonce',
];

export function createLogger(level: string, destination?: pino.DestinationStream): Logger {
  return pino(
    {
      level,
      base: { service: 'edge-authz' },
      redact: { paths: REDACT_PATHS, censor: '[redacted]' },
      timestamp: pino.stdTimeFunctions.isoTime,
    },
    destination,
  );
}

/** Hex characters of the nonce tag (48 bits: collisions are rare within a day of ingests). */
export const NONCE_TAG_HEX = 12;

/**
 * The `nonceTag` of a decision log line: the first NONCE_TAG_HEX hex characters of the
 * nonce's SHA-256. Support matches a complaint by hashing the nonce the publisher reports
 * (`printf %s <nonce> | sha256sum | cut -c1-12`); the log holds no part of the nonce itself.
 * Computed only for lines that are written (denials), never on the allow path.
 */
export function nonceTag(nonce: string | undefined): string | undefined {
  return nonce === undefined ? undefined : createHash('sha256').update(nonce).digest('hex').slice(0, NONCE_TAG_HEX);
}
