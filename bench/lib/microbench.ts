/**
 * In-process micro-benchmarks: µs per call of a function in a tight loop, timed with
 * performance.now around whole batches (never per call, so the timer costs nothing).
 * Each measurement: warm-up (lets V8 optimise), then `reps` batches sized to ~`batchMs`;
 * the median batch is reported, which shrugs off a batch hit by a GC or a noisy neighbour.
 */
import { median } from './stats.ts';

/** Outcome of timeLoop. */
export interface LoopResult {
  /** Median µs per call over the batches. */
  readonly usPerCall: number;
  /** Fastest batch, µs per call. */
  readonly minUs: number;
  readonly calls: number;
}

/** Warm-up and batch sizing for timeLoop. */
export interface LoopOptions {
  readonly warmupMs?: number;
  readonly batchMs?: number;
  readonly reps?: number;
  /** Never call fn with i ≥ maxCalls (inputs that may be used once, e.g. one-time nonces). */
  readonly maxCalls?: number;
}

/**
 * Times `fn(i)` with i = 0, 1, 2… (callers index pre-built inputs with it). Synchronous
 * results are not awaited, so a sync path is measured without any Promise machinery.
 */
export async function timeLoop(fn: (i: number) => unknown, opts: LoopOptions = {}): Promise<LoopResult> {
  const { warmupMs = 200, batchMs = 100, reps = 7, maxCalls = Infinity } = opts;
  let i = 0;
  const run = async (n: number): Promise<number> => {
    const t0 = performance.now();
    for (const end = i + n; i < end; ) {
      const r = fn(i++);
      if (r instanceof Promise) await r;
    }
    return performance.now() - t0;
  };
  // Warm up while calibrating the batch size.
  let n = 64;
  const warmEnd = performance.now() + warmupMs;
  let per = 0;
  while (performance.now() < warmEnd && i + n <= maxCalls / 3) {
    per = (await run(n)) / n;
    if (per * n < 20) n *= 2;
  }
  const batch = Math.max(16, Math.min(Math.round(batchMs / Math.max(per, 1e-6)), Math.floor((maxCalls - i) / reps)));
  if (i + batch * reps > maxCalls) throw new Error(`timeLoop: maxCalls ${maxCalls} too small`);
  const samples: number[] = [];
  for (let r = 0; r < reps; r++) samples.push(((await run(batch)) / batch) * 1000);
  return { usPerCall: median(samples), minUs: Math.min(...samples), calls: i };
}

/**
 * CPU µs per call of an async operation run `concurrency`-wide for `ms` (process.cpuUsage,
 * i.e. this process only): for calls that wait on I/O, where wall time per call says
 * nothing about cost.
 */
export async function cpuPerCall(fn: (i: number) => Promise<unknown>, opts: { ms: number; concurrency: number; startAt?: number }): Promise<{ cpuUs: number; calls: number }> {
  let i = opts.startAt ?? 0;
  let calls = 0;
  const end = performance.now() + opts.ms;
  const cpu0 = process.cpuUsage();
  await Promise.all(Array.from({ length: opts.concurrency }, async () => {
    while (performance.now() < end) {
      await fn(i++);
      calls++;
    }
  }));
  const cpu = process.cpuUsage(cpu0);
  return { cpuUs: (cpu.user + cpu.system) / calls, calls };
}
