/**
 * Small shared bits of bench/market.ts and bench/edge.ts: environment knobs, the machine
 * line of a report, and the pid of a redis-server found by its port.
 */
import { execFileSync } from 'node:child_process';
import { cpus } from 'node:os';

/** An integer environment knob ≥ `min`, or `def` when unset. */
export function envInt(name: string, def: number, min: number): number {
  const raw = process.env[name];
  if (raw === undefined || raw === '') return def;
  const n = Number(raw);
  if (!Number.isInteger(n) || n < min) throw new Error(`${name}: expected an integer ≥ ${min}, got ${JSON.stringify(raw)}`);
  return n;
}

function firstLine(cmd: string, args: readonly string[]): string {
  try {
    return execFileSync(cmd, [...args], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'] }).split('\n', 1)[0]?.trim() ?? '?';
  } catch {
    return '?';
  }
}

/** "AMD EPYC, 2 vCPUs (shared, noisy), Node 24.x, h2load nghttp2/1.52.0, Redis 7.0.15". */
export function machineLine(h2load: string): string {
  const model = (cpus()[0]?.model ?? '?').replace(/\s+\d+-Core Processor$/, '').trim();
  const h2 = /nghttp2\/[\d.]+/.exec(firstLine(h2load, ['--version']))?.[0] ?? 'nghttp2/?';
  const redis = /v=([\d.]+)/.exec(firstLine('redis-server', ['--version']))?.[1] ?? '?';
  return `${model}, ${cpus().length} vCPUs (shared, noisy), Node ${process.versions.node}, h2load ${h2}, Redis ${redis}`;
}

/** The pid of the redis-server listening on `port` (INFO server). */
export function redisPid(port: number): number {
  const out = execFileSync('redis-cli', ['-p', String(port), 'info', 'server'], { encoding: 'utf8' });
  const pid = Number(/process_id:(\d+)/.exec(out)?.[1]);
  if (!Number.isInteger(pid) || pid <= 0) throw new Error(`redis on ${port}: no process_id in INFO`);
  return pid;
}
