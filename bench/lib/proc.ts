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
import { closeSync, openSync, readdirSync, readFileSync, writeSync } from 'node:fs';

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

/**
 * Per thread of `pid` (by tid): [ns on a CPU, ns runnable but waiting for one], from
 * /proc/<pid>/task/<tid>/schedstat. Empty when the kernel keeps no schedstats (all zeros).
 */
export function threadSchedStats(pid: number): Map<string, readonly [number, number]> {
  const out = new Map<string, readonly [number, number]>();
  let ran = 0;
  for (const tid of readdirSync(`/proc/${pid}/task`)) {
    try {
      const [run = 0, wait = 0] = readFileSync(`/proc/${pid}/task/${tid}/schedstat`, 'utf8').split(' ').map(Number);
      out.set(tid, [run, wait]);
      ran += run;
    } catch {
      // The thread exited in between.
    }
  }
  return ran === 0 ? new Map() : out;
}

/**
 * Seconds the threads of `pid` waited for a CPU between two threadSchedStats() readings, per
 * thread (a thread that exited in between counts for nothing, one born in between from zero);
 * NaN without schedstats.
 */
export function runQueueWaitSeconds(before: ReadonlyMap<string, readonly [number, number]>, after: ReadonlyMap<string, readonly [number, number]>): number {
  if (after.size === 0) return Number.NaN;
  let ns = 0;
  for (const [tid, [, wait]] of after) ns += Math.max(0, wait - (before.get(tid)?.[1] ?? 0));
  return ns / 1e9;
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
  /** Seconds per pid its threads waited for a CPU over the window (NaN without schedstats). */
  readonly waitSeconds: ReadonlyMap<number, number>;
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
  const sched0 = new Map(pids.map((p) => [p, threadSchedStats(p)]));
  return () => {
    const cpu = new Map(pids.map((p) => [p, processCpuSeconds(p) - (cpu0.get(p) ?? 0)]));
    const wait = new Map(pids.map((p) => [p, runQueueWaitSeconds(sched0.get(p) ?? new Map(), threadSchedStats(p))]));
    const sys1 = systemCpu();
    const total = sys1.total - sys0.total;
    return {
      wallSeconds: (performance.now() - t0) / 1000,
      cpuSeconds: cpu,
      waitSeconds: wait,
      machineBusy: total > 0 ? 1 - (sys1.idle - sys0.idle) / total : 0,
      machineSteal: total > 0 ? (sys1.steal - sys0.steal) / total : 0,
    };
  };
}

/** The kernel's cpuidle driver (e.g. `haltpoll` in a KVM guest, `intel_idle` on metal), or 'none'. */
export function cpuidleDriver(): string {
  try {
    return readFileSync('/sys/devices/system/cpu/cpuidle/current_driver', 'utf8').trim();
  } catch {
    return 'none';
  }
}

/**
 * Asks the kernel to keep every CPU out of idle states slower to leave than `us` µs, through
 * the PM QoS device /dev/cpu_dma_latency, as tuned's latency-performance profile does; 0 means
 * idle CPUs poll instead of halting. The request holds while the file stays open: call the
 * returned function to drop it (closing on exit drops it too). Needs root; returns the error
 * otherwise.
 */
export function holdCpuIdleLatency(us: number): (() => void) | Error {
  let fd: number | undefined;
  try {
    fd = openSync('/dev/cpu_dma_latency', 'w');
    const value = Buffer.alloc(4);
    value.writeInt32LE(us);
    writeSync(fd, value);
    const held = fd;
    return () => closeSync(held);
  } catch (err) {
    if (fd !== undefined) closeSync(fd);
    return err instanceof Error ? err : new Error(String(err));
  }
}
