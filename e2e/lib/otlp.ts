/**
 * A real OTLP/gRPC trace receiver (e2e/lib/otlp-receiver.py: grpcio serving the published OTLP
 * protos of PyPI's opentelemetry-proto, both installed into .venv by scripts/setup.sh), started as
 * a child process on a free port, and the spans it received, flattened for assertions.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { createReadStream, createWriteStream } from 'node:fs';
import { createInterface } from 'node:readline';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { fileURLToPath } from 'node:url';

const ROOT = fileURLToPath(new URL('../../', import.meta.url));
const PYTHON = join(ROOT, '.venv', 'bin', 'python');
const SCRIPT = join(ROOT, 'e2e', 'lib', 'otlp-receiver.py');

/** An attribute value as OTLP's AnyValue (json_format): the one field set. */
interface AnyValue {
  string_value?: string; int_value?: string; bool_value?: boolean; double_value?: number; bytes_value?: string;
  array_value?: { values?: AnyValue[] }; kvlist_value?: { values?: KeyValue[] };
}
interface KeyValue { key: string; value?: AnyValue }
interface OtlpSpan {
  trace_id?: string; span_id?: string; parent_span_id?: string; name?: string; kind?: string; trace_state?: string;
  attributes?: KeyValue[]; status?: { code?: string; message?: string };
  events?: { name?: string; attributes?: KeyValue[] }[];
  links?: { trace_id?: string; span_id?: string; trace_state?: string; attributes?: KeyValue[] }[];
}
/** One ExportTraceServiceRequest as json_format writes it (field names as in the .proto). */
export interface ExportRequest {
  resource_spans?: { resource?: { attributes?: KeyValue[] }; scope_spans?: { scope?: { name?: string; version?: string; attributes?: KeyValue[] }; spans?: OtlpSpan[] }[] }[];
}

type Plain = string | number | boolean;
type Attributes = Readonly<Record<string, Plain>>;

/** One exported span: ids in hex, attributes as plain values. */
export interface Span {
  readonly service: string;
  readonly traceId: string;
  readonly spanId: string;
  /** '' for a root span. */
  readonly parentSpanId: string;
  readonly name: string;
  /** SPAN_KIND_SERVER, SPAN_KIND_CLIENT, … */
  readonly kind: string;
  readonly attributes: Attributes;
  readonly statusCode: string;
  readonly statusMessage: string;
  readonly traceState: string;
  /** The resource's attributes (service.name among them) and the instrumentation scope's name, version and attributes. */
  readonly resource: Attributes;
  readonly scope: { readonly name: string; readonly version: string; readonly attributes: Attributes };
  readonly events: readonly { readonly name: string; readonly attributes: Attributes }[];
  readonly links: readonly { readonly traceId: string; readonly spanId: string; readonly traceState: string; readonly attributes: Attributes }[];
}

const hex = (b64: string | undefined): string => Buffer.from(b64 ?? '', 'base64').toString('hex');
/** A value as a plain one: arrays and key-value lists as JSON, bytes in base64 (as exported). */
function plain(v: AnyValue | undefined): Plain {
  if (v?.string_value !== undefined) return v.string_value;
  if (v?.int_value !== undefined) return Number(v.int_value);
  if (v?.bool_value !== undefined) return v.bool_value;
  if (v?.bytes_value !== undefined) return v.bytes_value;
  if (v?.array_value !== undefined) return JSON.stringify((v.array_value.values ?? []).map(plain));
  if (v?.kvlist_value !== undefined) return JSON.stringify(attrs(v.kvlist_value.values));
  return v?.double_value ?? '';
}
const attrs = (kvs: KeyValue[] | undefined): Record<string, Plain> => Object.fromEntries((kvs ?? []).map((kv) => [kv.key, plain(kv.value)]));

/** The spans of one ExportTraceServiceRequest (json_format's output). */
export function spansOf(req: ExportRequest): Span[] {
  const out: Span[] = [];
  for (const rs of req.resource_spans ?? []) {
    const resource = attrs(rs.resource?.attributes);
    const service = String(resource['service.name'] ?? '');
    for (const ss of rs.scope_spans ?? []) {
      const scope = { name: ss.scope?.name ?? '', version: ss.scope?.version ?? '', attributes: attrs(ss.scope?.attributes) };
      for (const s of ss.spans ?? []) {
        out.push({
          service, traceId: hex(s.trace_id), spanId: hex(s.span_id), parentSpanId: hex(s.parent_span_id), name: s.name ?? '',
          kind: s.kind ?? 'SPAN_KIND_UNSPECIFIED', attributes: attrs(s.attributes), statusCode: s.status?.code ?? 'STATUS_CODE_UNSET',
          statusMessage: s.status?.message ?? '', traceState: s.trace_state ?? '', resource, scope,
          events: (s.events ?? []).map((e) => ({ name: e.name ?? '', attributes: attrs(e.attributes) })),
          links: (s.links ?? []).map((l) => ({ traceId: hex(l.trace_id), spanId: hex(l.span_id), traceState: l.trace_state ?? '', attributes: attrs(l.attributes) })),
        });
      }
    }
  }
  return out;
}

/** Where in a span a field is: what decides which attribute keys are allowed there. */
export type FieldPlace = 'span' | 'attribute' | 'resource' | 'scope' | 'event' | 'link';

/** One text a span carries: its place, its key (an attribute's name; '' for the name, status message, trace state), its value. */
export interface SpanField {
  readonly place: FieldPlace;
  readonly key: string;
  readonly value: string;
}

/**
 * Everything a span carries as text, walked once: its name, status message and trace state; every
 * attribute; the resource's and the scope's attributes (and the scope's name and version); each
 * event's name and attributes; each link's trace state and attributes. What the no-secrets checks
 * search (e2e/traces.test.ts, scripts/trace-check.ts).
 */
export function* fieldsOf(s: Span): Generator<SpanField> {
  yield { place: 'span', key: '', value: s.name };
  yield { place: 'span', key: '', value: s.statusMessage };
  yield { place: 'span', key: '', value: s.traceState };
  const each = function* (place: FieldPlace, a: Attributes): Generator<SpanField> {
    for (const [key, v] of Object.entries(a)) yield { place, key, value: String(v) };
  };
  yield* each('attribute', s.attributes);
  yield* each('resource', s.resource);
  yield { place: 'scope', key: '', value: s.scope.name };
  yield { place: 'scope', key: '', value: s.scope.version };
  yield* each('scope', s.scope.attributes);
  for (const e of s.events) {
    yield { place: 'event', key: '', value: e.name };
    yield* each('event', e.attributes);
  }
  for (const l of s.links) {
    yield { place: 'link', key: '', value: l.traceState };
    yield* each('link', l.attributes);
  }
}

/** The spans of a receiver's output file (startOtlpReceiver's `file`: one export request per line), read as a stream. */
export async function* exportedSpans(file: string): AsyncGenerator<Span> {
  for await (const l of createInterface({ input: createReadStream(file), crlfDelay: Infinity })) {
    if (l !== '') yield* spansOf(JSON.parse(l) as ExportRequest);
  }
}

export interface OtlpReceiver {
  /** `http://127.0.0.1:<port>`: OTEL_EXPORTER_OTLP_ENDPOINT. */
  readonly endpoint: string;
  /** Every span received so far. */
  spans(): Span[];
  /** Every export request as received (JSON lines): what the no-secrets check searches. */
  raw(): string;
  /** Waits until `done(spans)` holds, at most `ms` (Envoy and the SDK each export every 5 s by default). */
  waitFor(done: (spans: Span[]) => boolean, ms: number, what: string): Promise<Span[]>;
  stop(): Promise<void>;
}

/**
 * Starts the receiver; `discard`: accept and drop every export (bench:edge), no spans kept;
 * `file`: append every export request there as a JSON line instead of keeping it (the trace
 * audit's one receiver of a whole e2e run, scripts/audit-traces.ts; read back by exportedSpans).
 */
export async function startOtlpReceiver(opts: { discard?: boolean; file?: string } = {}): Promise<OtlpReceiver> {
  const child: ChildProcess = spawn(PYTHON, [SCRIPT, ...(opts.discard === true ? ['--discard'] : [])], { stdio: ['ignore', 'pipe', 'pipe'] });
  const lines: string[] = [];
  const out = opts.file === undefined ? undefined : createWriteStream(opts.file, { flags: 'a' });
  let errors = '';
  let rest = '';
  child.stderr?.setEncoding('utf8').on('data', (d: string) => { errors += d; });
  const port = await new Promise<number>((resolve, reject) => {
    child.once('exit', (code) => reject(new Error(`otlp-receiver.py exited (${code}) before listening: ${errors.slice(-2000)}`)));
    child.stdout?.setEncoding('utf8').on('data', (d: string) => {
      const parts = (rest + d).split('\n');
      rest = parts.pop() ?? '';
      for (const l of parts) {
        const m = /^\{"listening": ([0-9]+)\}$/.exec(l);
        if (m !== null) resolve(Number(m[1]));
        else if (l === '') continue;
        else if (out === undefined) lines.push(l);
        else if (!out.writableEnded) out.write(`${l}\n`);
      }
    });
  });
  const spans = (): Span[] => lines.flatMap((l) => spansOf(JSON.parse(l) as ExportRequest));
  return {
    endpoint: `http://127.0.0.1:${port}`,
    spans,
    raw: () => lines.join('\n'),
    async waitFor(done, ms, what) {
      for (const end = Date.now() + ms; ;) {
        const s = spans();
        if (done(s)) return s;
        if (Date.now() > end) throw new Error(`timed out after ${ms} ms waiting for ${what}; ${s.length} spans received`);
        await sleep(100);
      }
    },
    async stop() {
      if (child.exitCode !== null || child.signalCode !== null) {
        if (out !== undefined && !out.writableEnded) await new Promise((r) => out.end(r));
        return;
      }
      const exited = new Promise((r) => child.once('exit', r));
      child.kill('SIGTERM');
      await Promise.race([exited, sleep(3000)]);
      if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
      if (out !== undefined) await new Promise((r) => out.end(r));
    },
  };
}
