/**
 * h2load (nghttp2-client): a C HTTP/2 load generator, cheap enough on CPU that it does not
 * starve the server it measures on a small machine. Used for gRPC with a pre-framed body:
 *   h2load -c C -m M -D secs -d body.bin -H 'content-type: application/grpc' -H 'te: trailers' URL
 * It multiplexes M streams on each of C connections, like Envoy's gRPC client does.
 *
 * Caveats: h2load sees HTTP status only (gRPC answers 200 even for a gRPC error, the
 * grpc-status trailer is not checked) and every request carries the same body. Callers
 * verify the decisions by other means (a preflight and the server's own counters).
 */
import { execFile, execFileSync } from 'node:child_process';
import { accessSync, constants, readFileSync, rmSync } from 'node:fs';
import { delimiter, join } from 'node:path';

/** Absolute path of `cmd` on PATH, or undefined. */
export function which(cmd: string): string | undefined {
  for (const dir of (process.env['PATH'] ?? '').split(delimiter)) {
    if (dir === '') continue;
    const p = join(dir, cmd);
    try {
      accessSync(p, constants.X_OK);
      return p;
    } catch { /* next */ }
  }
  return undefined;
}

/**
 * Finds h2load, installing Debian's nghttp2-client with apt-get when missing (as root, or
 * through passwordless sudo). Returns undefined when it cannot be had; `log` says why.
 */
export function ensureH2load(log: (msg: string) => void): string | undefined {
  const found = which('h2load');
  if (found !== undefined) return found;
  if (which('apt-get') === undefined) {
    log('h2load not found and apt-get is not available');
    return undefined;
  }
  const asRoot = process.getuid?.() === 0;
  const run = (args: string[]): boolean => {
    const [cmd, argv] = asRoot ? ['apt-get', args] : ['sudo', ['-n', 'apt-get', ...args]];
    try {
      execFileSync(cmd, argv, { stdio: 'ignore', timeout: 120_000, env: { ...process.env, DEBIAN_FRONTEND: 'noninteractive' } });
      return true;
    } catch {
      return false;
    }
  };
  log('h2load not found: apt-get install -y nghttp2-client');
  // A stale package index is the usual failure; refresh it once and retry.
  if (!run(['install', '-y', 'nghttp2-client']) && !(run(['update']) && run(['install', '-y', 'nghttp2-client']))) {
    log('installing nghttp2-client failed');
    return undefined;
  }
  return which('h2load');
}

/** One h2load run: target, body, concurrency, duration. */
export interface H2loadSpec {
  readonly url: string;
  /**
   * Optional: a file of URLs, one a line (h2load -i), used instead of `url`: each connection
   * requests them in turn, from the first. Only the first line's scheme, host and port count.
   */
  readonly inputFile?: string;
  /** File holding the request body (a gRPC-framed message); none = GET. */
  readonly dataFile?: string;
  /** HTTP/1.1 instead of HTTP/2 (`--h1`), e.g. for a plain HTTP service. */
  readonly h1?: boolean;
  /** Fixed request rate per client (h2load --rps), for latency at a constant load. */
  readonly rpsPerClient?: number;
  readonly headers: Readonly<Record<string, string>>;
  readonly connections: number;
  readonly streamsPerConnection: number;
  readonly durationSeconds: number;
  /**
   * Optional: a request count (-n) instead of the duration (-D), e.g. with `connectionRate`
   * (h2load refuses -r with -D). `durationSeconds` then only sizes the timeout.
   */
  readonly requests?: number;
  /**
   * Optional: open `perPeriod` connections every `period` (h2load -r / --rate-period, e.g.
   * '1ms'). With `rpsPerClient` this staggers the clients' request timers, which otherwise
   * fire together and turn a constant rate into synchronized bursts.
   */
  readonly connectionRate?: { readonly perPeriod: number; readonly period: string };
  /** Where the per-request log goes (deleted after parsing). */
  readonly logFile: string;
  readonly threads?: number;
}

/** h2load's summary counts plus the per-request latencies from its log. */
export interface H2loadResult {
  readonly done: number;
  /** HTTP 2xx responses. */
  readonly succeeded: number;
  readonly failed: number;
  readonly errored: number;
  readonly elapsedSeconds: number;
  readonly reqPerSec: number;
  /** Responses by status class, as h2load counts them (`status codes: … 2xx, … 3xx, … 4xx, … 5xx`). */
  readonly statusClasses: { readonly '2xx': number; readonly '3xx': number; readonly '4xx': number; readonly '5xx': number };
  /** Per-request latency in µs (from --log-file). */
  readonly latenciesUs: Float64Array;
}

function num(re: RegExp, text: string): number {
  const m = re.exec(text);
  if (m === null) throw new Error(`h2load output did not match ${re}:\n${text}`);
  return Number(m[1]);
}

/** Runs h2load for `durationSeconds` and parses its summary and per-request log. */
export function runH2load(bin: string, spec: H2loadSpec): Promise<H2loadResult> {
  const args = [
    '-c', String(spec.connections),
    '-m', String(spec.streamsPerConnection),
    '-t', String(spec.threads ?? 1),
    ...(spec.requests === undefined ? ['-D', `${Math.round(spec.durationSeconds * 1000)}ms`] : ['-n', String(spec.requests)]),
    ...(spec.connectionRate === undefined ? [] : ['-r', String(spec.connectionRate.perPeriod), '--rate-period', spec.connectionRate.period]),
    ...(spec.dataFile === undefined ? [] : ['-d', spec.dataFile]),
    ...(spec.h1 === true ? ['--h1'] : []),
    ...(spec.rpsPerClient === undefined ? [] : ['--rps', String(spec.rpsPerClient)]),
    '--log-file', spec.logFile,
    ...Object.entries(spec.headers).flatMap(([k, v]) => ['-H', `${k}: ${v}`]),
    ...(spec.inputFile === undefined ? [spec.url] : ['-i', spec.inputFile]),
  ];
  return new Promise((resolve, reject) => {
    execFile(bin, args, { maxBuffer: 16 << 20, timeout: (spec.durationSeconds + 30) * 1000 }, (err, stdout, stderr) => {
      if (err) {
        reject(new Error(`h2load failed: ${String(err)}\n${stderr}`));
        return;
      }
      try {
        // Each line: start (µs since the epoch), status, latency (µs).
        const latencies: number[] = [];
        for (const line of readFileSync(spec.logFile, 'utf8').split('\n')) {
          const tab = line.lastIndexOf('\t');
          if (tab > 0) latencies.push(Number(line.slice(tab + 1)));
        }
        rmSync(spec.logFile, { force: true });
        resolve({
          done: num(/requests: \d+ total, \d+ started, (\d+) done/, stdout),
          succeeded: num(/(\d+) succeeded/, stdout),
          failed: num(/(\d+) failed/, stdout),
          errored: num(/(\d+) errored/, stdout),
          // h2load prints "finished in 3.00s" or, under a second, "finished in 501.04ms".
          elapsedSeconds: num(/finished in ([\d.]+)s/, stdout.replace(/finished in ([\d.]+)ms/, (_m, v: string) => `finished in ${Number(v) / 1000}s`)),
          reqPerSec: num(/finished in [\d.]+m?s, ([\d.]+) req\/s/, stdout),
          statusClasses: {
            '2xx': num(/status codes: (\d+) 2xx/, stdout), '3xx': num(/(\d+) 3xx/, stdout),
            '4xx': num(/(\d+) 4xx/, stdout), '5xx': num(/(\d+) 5xx/, stdout),
          },
          latenciesUs: Float64Array.from(latencies),
        });
      } catch (e) {
        reject(e instanceof Error ? e : new Error(String(e)));
      }
    });
  });
}
