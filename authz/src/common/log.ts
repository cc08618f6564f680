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

/**
 * The service's log output: standard output, as pino writes it by default, except that a write
 * that fails for good (EIO: the terminal is gone; EPIPE: the reader of the pipe is gone) is a
 * hang-up. Logging stops (every later line would fail the same way), and the process gets SIGHUP,
 * which seals it and stops it like SIGTERM (process.ts): a service whose decision log can no
 * longer be written does not keep deciding. A cluster worker leaves that to the primary, which
 * shares its output.
 */
export function logOutput(): pino.DestinationStream {
  const out = pino.destination({ dest: 1 });
  let gone = false;
  out.on('error', () => {
    if (gone) return;
    gone = true;
    // Nothing is written any more, not even the flush at exit: pino's exit hook calls flushSync,
    // which in sonic-boom retries every error but EAGAIN/EBUSY forever, 100 ms apart. pino itself
    // turns these off for EPIPE only; on EIO (a terminal closed) the service never exited, writing
    // its last lines to the closed terminal ten times a second (issue 32, authz/test/hangup.test.ts).
    out.write = () => true;
    out.flushSync = () => undefined;
    out.end = () => undefined;
    process.kill(process.pid, 'SIGHUP');
  });
  return out;
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

/** A warning that can recur many times a second, logged at most once per interval (see throttledWarn). */
export interface ThrottledWarn {
  warn(fields: Record<string, unknown>): void;
  /** The condition is over (e.g. the connection is back): the next warning is logged at once. */
  reset(): void;
}

/**
 * Logs `msg` at most once per `everyMs`, the first at once; a line after some were left out
 * counts them (`repeated`). A Redis that is down fails a reconnect every ≤ 1 s on each of the
 * process's connections: one line per attempt (~7 a second here) buries every other line.
 */
export function throttledWarn(logger: Logger, msg: string, everyMs = 10_000, now: () => number = Date.now): ThrottledWarn {
  let last = -Infinity;
  let repeated = 0;
  return {
    warn(fields) {
      const t = now();
      if (t - last < everyMs) {
        repeated++;
        return;
      }
      logger.warn(repeated > 0 ? { ...fields, repeated } : fields, msg);
      last = t;
      repeated = 0;
    },
    reset() {
      last = -Infinity;
      repeated = 0;
    },
  };
}
