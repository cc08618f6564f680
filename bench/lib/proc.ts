/**
 * CPU accounting from /proc (Linux), for any process the benchmark did not write itself
 * (a Node server, Envoy, redis-server…).
 *
 * Why /proc/<pid>/stat and not wall-clock throughput alone: on a shared, noisy 2-vCPU
 * machine the requests per second move with whatever else runs, but the CPU time the
 * server itself spends per request barely does. utime+stime cover every thread of the
 * process (libuv pool, GC helpers), in clock ticks (CLK_TCK, 100 Hz on Linux), so a run
 * should burn at least a few hundred ticks for a per-request figure to be exact to ~1 %.
 */
import { execFileSync } from 'node:child_process';
import { readFileSync } from 'node:fs';

function clockTicksPerSecond(): number {
  try {
    const n = Number(execFileSync('getconf', ['CLK_TCK'], { encoding: 'utf8' }).trim());
    return Number.isInteger(n) && n > 0 ? n : 100;
  } catch {
    return 100; // the Linux USER_HZ on every mainstream architecture
  }
}

/** Clock ticks per second of utime/stime (sysconf(_SC_CLK_TCK)). */
export const CLK_TCK = clockTicksPerSecond();

/**
 * utime+stime of `pid` in seconds. Parsed after the last ')' because the command name
 * (field 2) may itself contain spaces or parentheses.
 */
export function processCpuSeconds(pid: number): number {
  const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
  const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  // fields[0] is field 3 (state), so utime (field 14) is fields[11] and stime (15) fields[12].
  return (Number(fields[11]) + Number(fields[12])) / CLK_TCK;
}

/** Machine-wide CPU counters (first line of /proc/stat), in ticks. */
export interface SystemCpu {
  readonly total: number;
  readonly idle: number;
  /** Time stolen by the hypervisor: a direct measure of a noisy neighbour. */
  readonly steal: number;
}

/** Reads the machine-wide counters now. */
export function systemCpu(): SystemCpu {
  const line = readFileSync('/proc/stat', 'utf8').split('\n', 1)[0] ?? '';
  const v = line.trim().split(/\s+/).slice(1).map(Number);
  // user nice system idle iowait irq softirq steal (guest time is already inside user).
  const [user = 0, nice = 0, system = 0, idle = 0, iowait = 0, irq = 0, softirq = 0, steal = 0] = v;
  return { total: user + nice + system + idle + iowait + irq + softirq + steal, idle: idle + iowait, steal };
}

/** CPU used by a set of processes and by the machine between start() and stop(). */
export interface CpuSample {
  readonly wallSeconds: number;
  /** CPU seconds per pid over the window. */
  readonly cpuSeconds: ReadonlyMap<number, number>;
  /** Fraction of all CPUs busy over the window (every process on the machine). */
  readonly machineBusy: number;
  /** Fraction of all CPUs stolen by the hypervisor over the window. */
  readonly machineSteal: number;
}

/** Starts a measurement window over `pids`; call the returned function to close it. */
export function startCpuWindow(pids: readonly number[]): () => CpuSample {
  const t0 = performance.now();
  const sys0 = systemCpu();
  const cpu0 = new Map(pids.map((p) => [p, processCpuSeconds(p)]));
  return () => {
    const cpu = new Map(pids.map((p) => [p, processCpuSeconds(p) - (cpu0.get(p) ?? 0)]));
    const sys1 = systemCpu();
    const total = sys1.total - sys0.total;
    return {
      wallSeconds: (performance.now() - t0) / 1000,
      cpuSeconds: cpu,
      machineBusy: total > 0 ? 1 - (sys1.idle - sys0.idle) / total : 0,
      machineSteal: total > 0 ? (sys1.steal - sys0.steal) / total : 0,
    };
  };
}

/** CPU µs per request of `pid` over a window that served `requests` (0 for a pid it did not watch). */
export function cpuUsPerRequest(sample: CpuSample, pid: number, requests: number): number {
  return ((sample.cpuSeconds.get(pid) ?? 0) * 1e6) / Math.max(1, requests);
}
