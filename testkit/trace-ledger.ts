/**
 * The trace audit's secret ledger (`npm run audit:traces`, scripts/audit-traces.ts): with
 * EDGE_E2E_TRACE_AUDIT=<dir> set, every secret a test generates or sends (HMAC keys, feed keys,
 * signatures, nonces, order payloads, tokens, private keys of the run's PKI) is appended to
 * <dir>/ledger.jsonl where it is made or sent, and scripts/trace-check.ts searches every span
 * exported during the run for each of them. Without the setting `recordSecret` returns at its
 * first comparison: nothing is encoded, nothing is written.
 */
import { appendFileSync } from 'node:fs';
import { join } from 'node:path';

/** The setting that turns the audit mode on: the directory of the run's exports, ledger and endpoint. */
export const TRACE_AUDIT_ENV = 'EDGE_E2E_TRACE_AUDIT';
export const LEDGER_FILE = 'ledger.jsonl';
export const EXPORTS_FILE = 'exports.jsonl';

const dir = process.env[TRACE_AUDIT_ENV] ?? '';

/** Whether this process runs in the trace audit (EDGE_E2E_TRACE_AUDIT set). */
export const traceAudit = dir !== '';

/**
 * How often an audited Envoy exports (ms; Envoy's default is 5 s, and it drops what it holds when
 * stopped, so the spans of an edge's last seconds would escape the audit). Set through the Envoy's
 * admin runtime layer once it runs (`shortenEnvoyFlush`); it takes effect at the flush already
 * scheduled, up to ENVOY_FLUSH_MS later, so a stop waits for that and two short intervals.
 */
export const AUDIT_FLUSH_MS = 250;
/** Envoy's own trace flush interval (`tracing.opentelemetry.flush_interval_ms`'s default). */
const ENVOY_FLUSH_MS = 5000;

/**
 * Sets an audited Envoy's flush interval to AUDIT_FLUSH_MS through its admin on
 * 127.0.0.1:`adminPort`; returns how long a stop must wait from now on for everything exported
 * until then to have gone out (`untilFlushed`).
 */
export async function shortenEnvoyFlush(adminPort: number | string): Promise<() => number> {
  const r = await fetch(`http://127.0.0.1:${adminPort}/runtime_modify?tracing.opentelemetry.flush_interval_ms=${AUDIT_FLUSH_MS}`, { method: 'POST' });
  if (!r.ok) throw new Error(`Envoy's runtime_modify: ${r.status}`);
  const flushedBy = Date.now() + ENVOY_FLUSH_MS;
  return () => Math.max(2 * AUDIT_FLUSH_MS, flushedBy + 2 * AUDIT_FLUSH_MS - Date.now());
}

/** One ledger line: what kind of secret, and the forms a span could carry it in. */
export interface LedgerEntry {
  readonly kind: string;
  readonly values: readonly string[];
}

/** The forms of a secret: a string as is; bytes as hex, base64 and base64url. */
function forms(v: string | Buffer): string[] {
  return typeof v === 'string' ? [v] : [v.toString('hex'), v.toString('base64'), v.toString('base64url')];
}

/** Records `values` (empty ones skipped) as secrets of `kind`; a no-op outside the audit. */
export function recordSecret(kind: string, ...values: (string | Buffer | undefined)[]): void {
  if (!traceAudit) return;
  const all = values.filter((v): v is string | Buffer => v !== undefined && v.length > 0).flatMap(forms);
  if (all.length > 0) appendFileSync(join(dir, LEDGER_FILE), `${JSON.stringify({ kind, values: all } satisfies LedgerEntry)}\n`);
}

/** A PEM file's secrets: its base64 body, whole and line by line (a span would carry a piece). */
export function recordPem(kind: string, pem: string): void {
  if (!traceAudit) return;
  const body = pem.split('\n').filter((l) => l !== '' && !l.startsWith('-----'));
  recordSecret(kind, body.join(''), ...body);
}
