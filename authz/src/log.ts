/**
 * JSON logs (pino). Logs never carry keys, signatures, full nonces or order payloads:
 * call sites pass only the fields below, and pino's redact strips the known secret-bearing
 * paths should one ever be passed by mistake.
 */
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

/** A nonce shortened for logs: enough to correlate, too little to replay. */
export function nonceTag(nonce: string | undefined): string | undefined {
  return nonce === undefined ? undefined : `${nonce.slice(0, 6)}…(${nonce.length})`;
}
