/**
 * The trace audit's checker (`npm run audit:traces`, scripts/audit-traces.ts; issue 31: "no
 * secret in any span, checked over a full e2e run"): reads every span the run's receiver got
 * (<dir>/exports.jsonl) and every secret the tests recorded (<dir>/ledger.jsonl,
 * testkit/trace-ledger.ts), and fails when
 *   - any text a span carries (name, status, every attribute of the span, its resource, scope,
 *     events and links: e2e/lib/otlp.ts fieldsOf) contains a secret, as recorded or in its other
 *     encoding (hex ↔ base64/base64url), case-insensitively, also once %-decoded (a URL);
 *   - an attribute key is outside the allow-list: a Check span only CHECK_SPAN_ATTRIBUTE_NAMES
 *     (authz/src/authz/tracing.ts), Envoy's spans only Envoy's standard tags (ENVOY_SPAN_TAGS),
 *     resources only RESOURCE_ATTRIBUTES, and no attribute at all on scopes, events or links;
 *   - nothing was exported or nothing recorded (an audit that saw nothing proves nothing).
 * Usage: scripts/node scripts/trace-check.ts <dir>; prints the counts; exit 1 on a finding.
 */
import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { CHECK_SPAN_ATTRIBUTE_NAMES, CHECK_SPAN_NAME } from '../authz/src/authz/tracing.ts';
import { exportedSpans, fieldsOf, type FieldPlace, type Span } from '../e2e/lib/otlp.ts';
import { EXPORTS_FILE, LEDGER_FILE, type LedgerEntry } from '../testkit/trace-ledger.ts';

/**
 * The tags Envoy's tracer may set on its spans (server, upstream and ext_authz egress spans):
 * Envoy's standard tag names (source/common/tracing/common_values.h, TracingTagValues) and the
 * ext_authz filter's (source/extensions/filters/common/ext_authz/ext_authz.h, TracingConstants).
 * No custom tag is configured (envoy/render/tracing.ts), so nothing else may appear.
 */
export const ENVOY_SPAN_TAGS: readonly string[] = [
  // OpenTracing's standard names
  'component', 'error', 'http.method', 'http.status_code', 'http.url', 'peer.address', 'span.kind',
  // Envoy's own
  'canceled', 'downstream_cluster', 'error.reason', 'grpc.authority', 'grpc.content_type', 'grpc.message', 'grpc.path',
  'grpc.status_code', 'grpc.timeout', 'guid:x-client-trace-id', 'guid:x-request-id', 'http.protocol', 'node_id',
  'request_size', 'response_flags', 'response_size', 'retry.count', 'status', 'upstream_address', 'upstream_cluster',
  'upstream_cluster.name', 'user_agent', 'zone',
  // ext_authz's
  'ext_authz_status', 'ext_authz_http_status', 'ext_authz_ok', 'ext_authz_unauthorized', 'ext_authz_error',
  // the ratelimit filter's gRPC call (RATELIMIT_SERVICE_ADDRESS): `ok` or `over_limit` (seen in the audit of 2026-11-27)
  'ratelimit_status',
];

/** The resource attributes: the service name (both) and the OpenTelemetry SDK's own telemetry.sdk.* (the TS service). */
export const RESOURCE_ATTRIBUTES: readonly string[] = ['service.name', 'telemetry.sdk.language', 'telemetry.sdk.name', 'telemetry.sdk.version'];

/** Shorter secrets are not searched (a 16-char window is also the index's key): a nonce is 32 hex, a key 64. */
export const MIN_SECRET_CHARS = 16;

export interface Finding {
  readonly traceId: string;
  readonly spanId: string;
  readonly service: string;
  readonly span: string;
  /** `secret`: a ledger value in a span; `key`: an attribute key outside the allow-list. */
  readonly what: 'secret' | 'key';
  /** The place and key, and for a secret its kind and first 6 characters (never the whole value). */
  readonly detail: string;
}

export interface AuditResult {
  readonly traces: number;
  readonly spans: number;
  /** Texts searched: every field fieldsOf yields. */
  readonly values: number;
  /** Distinct forms searched for, and how many recorded values were too short to search. */
  readonly secrets: number;
  readonly tooShort: number;
  /** Spans whose parent was not exported (a process stopped before its last batch went out): what the audit could not see. */
  readonly unparented: number;
  readonly findings: Finding[];
}

const isHex = (v: string): boolean => /^(?:[0-9a-fA-F]{2})+$/.test(v);
const isBase64 = (v: string): boolean => /^[A-Za-z0-9+/_-]+={0,2}$/.test(v) && v.length % 4 !== 1;

/** A recorded value and its other encodings: hex → base64, base64url; base64(url) → hex, the other alphabet; text → base64 of its bytes. */
export function secretForms(v: string): string[] {
  const out = new Set([v, Buffer.from(v, 'utf8').toString('base64')]);
  if (isHex(v)) {
    const b = Buffer.from(v, 'hex');
    out.add(b.toString('base64')).add(b.toString('base64url'));
  } else if (isBase64(v)) {
    const b = Buffer.from(v, v.includes('-') || v.includes('_') ? 'base64url' : 'base64');
    out.add(b.toString('hex')).add(b.toString('base64')).add(b.toString('base64url'));
  }
  return [...out];
}

/** Finds secrets in texts: every 16-char window of a text looked up in an index of the secrets' first 16 chars. */
class SecretIndex {
  private readonly byPrefix = new Map<string, { form: string; kind: string }[]>();
  readonly size: number;
  readonly tooShort: number;
  constructor(entries: readonly LedgerEntry[]) {
    const seen = new Set<string>();
    let short = 0;
    for (const e of entries) {
      for (const v of e.values) {
        if (v.length < MIN_SECRET_CHARS) { short += 1; continue; }
        for (const f of secretForms(v).map((x) => x.toLowerCase())) {
          if (f.length < MIN_SECRET_CHARS || seen.has(f)) continue;
          seen.add(f);
          const key = f.slice(0, MIN_SECRET_CHARS);
          const same = this.byPrefix.get(key);
          if (same === undefined) this.byPrefix.set(key, [{ form: f, kind: e.kind }]);
          else same.push({ form: f, kind: e.kind });
        }
      }
    }
    this.size = seen.size;
    this.tooShort = short;
  }
  /** The kind and first characters of the first secret `text` contains, else undefined. */
  find(text: string): string | undefined {
    if (text.length < MIN_SECRET_CHARS) return undefined;
    const t = text.toLowerCase();
    for (let i = 0; i + MIN_SECRET_CHARS <= t.length; i++) {
      for (const c of this.byPrefix.get(t.slice(i, i + MIN_SECRET_CHARS)) ?? []) {
        if (t.startsWith(c.form, i)) return `${c.kind} (${c.form.slice(0, 6)}…)`;
      }
    }
    return undefined;
  }
}

/** A URL's text with its %-escapes decoded (a secret in a query string is escaped); as is when malformed. */
function percentDecoded(v: string): string {
  try {
    return decodeURIComponent(v);
  } catch { return v; }
}

/** The attribute keys allowed at `place` of span `s`; undefined: none at all. */
function allowed(s: Span, place: FieldPlace): ReadonlySet<string> | undefined {
  if (place === 'resource') return RESOURCE_SET;
  if (place === 'attribute') return s.name === CHECK_SPAN_NAME ? CHECK_SET : ENVOY_SET;
  return undefined;
}
const RESOURCE_SET = new Set(RESOURCE_ATTRIBUTES);
const CHECK_SET = new Set(CHECK_SPAN_ATTRIBUTE_NAMES);
const ENVOY_SET = new Set(ENVOY_SPAN_TAGS);

/** Audits `spans` against the secrets of `ledger`. */
export async function auditSpans(spans: AsyncIterable<Span> | Iterable<Span>, ledger: readonly LedgerEntry[]): Promise<AuditResult> {
  const index = new SecretIndex(ledger);
  const traces = new Set<string>();
  const spanIds = new Set<string>();
  const parents: string[] = [];
  const findings: Finding[] = [];
  let count = 0;
  let values = 0;
  for await (const s of spans) {
    count += 1;
    traces.add(s.traceId);
    spanIds.add(s.spanId);
    if (s.parentSpanId !== '') parents.push(s.parentSpanId);
    const found = (what: Finding['what'], detail: string): void => {
      findings.push({ traceId: s.traceId, spanId: s.spanId, service: s.service, span: s.name, what, detail });
    };
    for (const f of fieldsOf(s)) {
      values += 1;
      const where = `${f.place === 'attribute' ? 'span' : f.place}${f.key === '' ? '' : ` attribute ${JSON.stringify(f.key)}`}`;
      if (f.key !== '' && allowed(s, f.place)?.has(f.key) !== true) found('key', where);
      const secret = index.find(f.value) ?? (f.value.includes('%') ? index.find(percentDecoded(f.value)) : undefined);
      if (secret !== undefined) found('secret', `${where} carries ${secret}`);
    }
  }
  const unparented = parents.filter((p) => !spanIds.has(p)).length;
  return { traces: traces.size, spans: count, values, secrets: index.size, tooShort: index.tooShort, unparented, findings };
}

/** The ledger's entries (testkit/trace-ledger.ts). */
export function readLedger(file: string): LedgerEntry[] {
  return readFileSync(file, 'utf8').split('\n').filter((l) => l !== '').map((l) => JSON.parse(l) as LedgerEntry);
}

/** Audits an audit directory (exports.jsonl, ledger.jsonl); an empty export or ledger is a finding too. */
export async function checkDir(dir: string): Promise<AuditResult> {
  const exports = join(dir, EXPORTS_FILE);
  const ledgerFile = join(dir, LEDGER_FILE);
  const ledger = existsSync(ledgerFile) ? readLedger(ledgerFile) : [];
  const r = await auditSpans(existsSync(exports) ? exportedSpans(exports) : [], ledger);
  const empty = (detail: string): Finding => ({ traceId: '', spanId: '', service: '', span: '', what: 'secret', detail });
  if (r.spans === 0) r.findings.push(empty(`no span exported (${exports}): the audit saw nothing`));
  if (r.secrets === 0) r.findings.push(empty(`no secret recorded (${ledgerFile}): the audit searched for nothing`));
  return r;
}

/** The result as printed: the counts, then one line per finding (at most 50, then how many more). */
export function report(r: AuditResult): string {
  const lines = [
    `trace audit: ${r.traces} traces, ${r.spans} spans (${r.unparented} whose parent was not exported), ${r.values} values checked, `
      + `${r.secrets} secret forms searched (${r.tooShort} recorded values under ${MIN_SECRET_CHARS} chars not searched): `
      + `${r.findings.length === 0 ? 'no finding' : `${r.findings.length} finding(s)`}`,
  ];
  for (const f of r.findings.slice(0, 50)) lines.push(`  ${f.what}: ${f.detail}${f.spanId === '' ? '' : ` — span ${JSON.stringify(f.span)} of ${f.service} (trace ${f.traceId}, span ${f.spanId})`}`);
  if (r.findings.length > 50) lines.push(`  … and ${r.findings.length - 50} more`);
  return lines.join('\n');
}

if (import.meta.main) {
  const dir = process.argv[2];
  if (dir === undefined) {
    process.stderr.write('usage: scripts/node scripts/trace-check.ts <audit dir>\n');
    process.exit(2);
  }
  const r = await checkDir(dir);
  process.stdout.write(`${report(r)}\n`);
  process.exitCode = r.findings.length === 0 ? 0 : 1;
}
