/**
 * What every benchmark script needs around its measurements: integer knobs from the
 * environment, a timestamped log, a work directory, the machine line of a report and the
 * pid of a redis-server.
 */
import { execFileSync } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import { cpus, tmpdir } from 'node:os';
import { join } from 'node:path';

/** An integer environment knob ≥ `min`, or `def` when unset. */
export function envInt(name: string, def: number, min: number): number {
  const raw = process.env[name];
  if (raw === undefined || raw === '') return def;
  const n = Number(raw);
  if (!Number.isInteger(n) || n < min) throw new Error(`${name}: expected an integer ≥ ${min}, got ${JSON.stringify(raw)}`);
  return n;
}

/** A log on stderr with the seconds since the script started: `[bench:edge   12.3s] …`. */
export function benchLog(name: string): (message: string) => void {
  const t0 = performance.now();
  return (m) => void process.stderr.write(`[bench:${name} ${((performance.now() - t0) / 1000).toFixed(1).padStart(5)}s] ${m}\n`);
}

/** A fresh temporary directory for logs and request bodies, removed when the process exits. */
export function workDir(name: string): string {
  const dir = mkdtempSync(join(tmpdir(), `bench-${name}-`));
  process.once('exit', () => rmSync(dir, { recursive: true, force: true }));
  return dir;
}

/** Today's date as the reports give it (YYYY-MM-DD, UTC). */
export const today = (): string => new Date().toISOString().slice(0, 10);

function firstLine(cmd: string, args: readonly string[]): string {
  try {
    return execFileSync(cmd, [...args], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'] }).split('\n', 1)[0]?.trim() ?? '?';
  } catch {
    return '?';
  }
}

/** "AMD EPYC, 2 vCPUs (shared, noisy), Node 24.x, h2load nghttp2/1.52.0, Redis 7.0.15". */
export function machineLine(h2load: string | undefined): string {
  const model = (cpus()[0]?.model ?? '?').replace(/\s+\d+-Core Processor$/, '').trim();
  const h2 = h2load === undefined ? 'none' : /nghttp2\/[\d.]+/.exec(firstLine(h2load, ['--version']))?.[0] ?? 'nghttp2/?';
  const redis = /v=([\d.]+)/.exec(firstLine('redis-server', ['--version']))?.[1] ?? '?';
  return `${model}, ${cpus().length} vCPUs (shared, noisy), Node ${process.versions.node}, h2load ${h2}, Redis ${redis}`;
}

/**
 * The pid of the redis-server at `url` (INFO server), or undefined when it does not run on this
 * machine (no /proc entry): then its CPU cannot be counted. Throws when it does not answer.
 */
export function redisPid(url: string): number | undefined {
  let out: string;
  try {
    out = execFileSync('redis-cli', ['-u', url, 'info', 'server'], { encoding: 'utf8', timeout: 5000, stdio: ['ignore', 'pipe', 'pipe'] });
  } catch (err) {
    throw new Error(`Redis at ${url} does not answer (${String(err)})`, { cause: err });
  }
  const pid = Number(/process_id:(\d+)/.exec(out)?.[1]);
  if (!Number.isInteger(pid) || pid <= 0) throw new Error(`Redis at ${url}: no process_id in INFO`);
  return existsSync(`/proc/${pid}/stat`) ? pid : undefined;
}
