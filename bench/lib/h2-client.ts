/**
 * A closed-loop HTTP/2 load generator on node:http2 that sends a *different* pre-encoded
 * body per request — what h2load cannot do (its -d file is one body for every request).
 * Needed wherever each request must be unique, e.g. signed ingests with one-time nonces.
 *
 * Shape like Envoy's gRPC client: a few connections, many concurrent streams on each.
 * Every response is checked (HTTP 200, grpc-status 0) and may be classified (e.g. allowed
 * vs denied) so a run reports what was actually decided, not just what was answered.
 */
import { connect, constants, type ClientHttp2Session, type ClientHttp2Stream } from 'node:http2';
import { grpcRequestHeaders, unframeGrpc } from './grpc-wire.ts';

/** What to send, where, how wide and for how long. */
export interface Http2ClientSpec {
  /** http://host:port (cleartext HTTP/2, prior knowledge, as for an h2c gRPC server). */
  readonly url: string;
  readonly path: string;
  readonly connections: number;
  readonly streamsPerConnection: number;
  readonly durationMs: number;
  /** The i-th request body (already gRPC-framed); undefined = no more requests to send. */
  readonly body: (i: number) => Buffer | undefined;
  /** Names the outcome of a successful call from its response message (e.g. 'allow'). */
  readonly classify?: (message: Buffer) => string;
  /** Extra request headers. */
  readonly headers?: Readonly<Record<string, string>>;
}

/** Counts and latencies of one run. */
export interface Http2ClientResult {
  /** Calls answered with HTTP 200 and grpc-status 0. */
  readonly ok: number;
  /** Transport or gRPC failures (stream errors, non-200, grpc-status ≠ 0). */
  readonly failed: number;
  /** ok calls by classify(); { ok } when no classifier was given. */
  readonly outcomes: Readonly<Record<string, number>>;
  readonly elapsedSeconds: number;
  /** Per-call latency in µs, completion order (ok calls only). */
  readonly latenciesUs: Float64Array;
  /** True when body() ran out before the duration ended. */
  readonly exhausted: boolean;
}

/** Opens the connections, waits for them to be ready, then keeps every stream slot busy. */
export async function runHttp2Client(spec: Http2ClientSpec): Promise<Http2ClientResult> {
  const authority = new URL(spec.url).host;
  const headers = { ...grpcRequestHeaders(spec.path, authority), ...spec.headers };
  const sessions: ClientHttp2Session[] = [];
  for (let c = 0; c < spec.connections; c++) {
    const s = connect(spec.url, { settings: { enablePush: false } });
    await new Promise<void>((resolve, reject) => {
      s.once('connect', () => resolve());
      s.once('error', reject);
    });
    sessions.push(s);
  }

  let latencies = new Float64Array(1 << 16);
  let ok = 0;
  let failed = 0;
  let next = 0;
  let inFlight = 0;
  let exhausted = false;
  const outcomes: Record<string, number> = {};
  const classify = spec.classify;
  const t0 = performance.now();
  const deadline = t0 + spec.durationMs;
  let finish: () => void = () => {};
  const finished = new Promise<void>((resolve) => { finish = resolve; });

  const record = (started: number, message: Buffer | undefined): void => {
    const us = (performance.now() - started) * 1000;
    if (ok === latencies.length) {
      const grown = new Float64Array(latencies.length * 2);
      grown.set(latencies);
      latencies = grown;
    }
    latencies[ok++] = us;
    const name = classify === undefined ? 'ok' : message === undefined ? 'unparsable' : classify(message);
    outcomes[name] = (outcomes[name] ?? 0) + 1;
  };

  const issue = (session: ClientHttp2Session): void => {
    if (performance.now() >= deadline) return;
    const body = spec.body(next);
    if (body === undefined) {
      exhausted = true;
      return;
    }
    next++;
    inFlight++;
    const started = performance.now();
    const stream: ClientHttp2Stream = session.request(headers, { endStream: false });
    let status = 0;
    let grpcStatus: string | undefined;
    const chunks: Buffer[] = [];
    stream.on('response', (h) => {
      status = Number(h[constants.HTTP2_HEADER_STATUS]);
      // Trailers-only responses (errors) carry grpc-status in the headers.
      const g = h['grpc-status'];
      if (g !== undefined) grpcStatus = String(g);
    });
    stream.on('trailers', (t) => {
      grpcStatus = String(t['grpc-status']);
    });
    stream.on('data', (chunk: Buffer) => chunks.push(chunk));
    stream.once('close', () => {
      inFlight--;
      if (status === 200 && grpcStatus === '0') {
        record(started, unframeGrpc(chunks.length === 1 ? (chunks[0] as Buffer) : Buffer.concat(chunks)));
      } else {
        failed++;
      }
      issue(session);
      if (inFlight === 0) finish();
    });
    stream.on('error', () => { /* counted on close */ });
    stream.end(body);
  };

  for (const s of sessions) for (let i = 0; i < spec.streamsPerConnection; i++) issue(s);
  if (inFlight === 0) finish();
  await finished;
  const elapsedSeconds = (performance.now() - t0) / 1000;
  await Promise.all(sessions.map((s) => new Promise<void>((resolve) => s.close(() => resolve()))));
  return { ok, failed, outcomes, elapsedSeconds, latenciesUs: latencies.subarray(0, ok), exhausted };
}
