/**
 * A real OTLP/gRPC trace receiver (e2e/lib/otlp-receiver.py: grpcio serving the published OTLP
 * protos of PyPI's opentelemetry-proto, both installed into .venv by scripts/setup.sh), started as
 * a child process on a free port, and the spans it received, flattened for assertions.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { fileURLToPath } from 'node:url';

const ROOT = fileURLToPath(new URL('../../', import.meta.url));
const PYTHON = join(ROOT, '.venv', 'bin', 'python');
const SCRIPT = join(ROOT, 'e2e', 'lib', 'otlp-receiver.py');

/** An attribute value as OTLP's AnyValue (json_format): the one field set. */
type AnyValue = { string_value?: string; int_value?: string; bool_value?: boolean; double_value?: number };
interface KeyValue { key: string; value?: AnyValue }
interface OtlpSpan {
  trace_id?: string; span_id?: string; parent_span_id?: string; name?: string; kind?: string;
  attributes?: KeyValue[]; status?: { code?: string; message?: string };
}
interface ExportRequest {
  resource_spans?: { resource?: { attributes?: KeyValue[] }; scope_spans?: { spans?: OtlpSpan[] }[] }[];
}

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
  readonly attributes: Readonly<Record<string, string | number | boolean>>;
  readonly statusCode: string;
}

const hex = (b64: string | undefined): string => Buffer.from(b64 ?? '', 'base64').toString('hex');
function plain(v: AnyValue | undefined): string | number | boolean {
  if (v?.string_value !== undefined) return v.string_value;
  if (v?.int_value !== undefined) return Number(v.int_value);
  if (v?.bool_value !== undefined) return v.bool_value;
  return v?.double_value ?? '';
}
const attrs = (kvs: KeyValue[] | undefined): Record<string, string | number | boolean> => Object.fromEntries((kvs ?? []).map((kv) => [kv.key, plain(kv.value)]));

/** The spans of one ExportTraceServiceRequest (json_format's output). */
export function spansOf(req: ExportRequest): Span[] {
  const out: Span[] = [];
  for (const rs of req.resource_spans ?? []) {
    const service = String(attrs(rs.resource?.attributes)['service.name'] ?? '');
    for (const ss of rs.scope_spans ?? []) {
      for (const s of ss.spans ?? []) {
        out.push({
          service, traceId: hex(s.trace_id), spanId: hex(s.span_id), parentSpanId: hex(s.parent_span_id), name: s.name ?? '',
          kind: s.kind ?? 'SPAN_KIND_UNSPECIFIED', attributes: attrs(s.attributes), statusCode: s.status?.code ?? 'STATUS_CODE_UNSET',
        });
      }
    }
  }
  return out;
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

/** Starts the receiver; `discard`: accept and drop every export (bench:edge), no spans kept. */
export async function startOtlpReceiver(opts: { discard?: boolean } = {}): Promise<OtlpReceiver> {
  const child: ChildProcess = spawn(PYTHON, [SCRIPT, ...(opts.discard === true ? ['--discard'] : [])], { stdio: ['ignore', 'pipe', 'pipe'] });
  const lines: string[] = [];
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
        else if (l !== '') lines.push(l);
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
      if (child.exitCode !== null || child.signalCode !== null) return;
      const exited = new Promise((r) => child.once('exit', r));
      child.kill('SIGTERM');
      await Promise.race([exited, sleep(3000)]);
      if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
    },
  };
}
