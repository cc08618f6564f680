/**
 * Gives memory back after a burst (issue 27: "memory as shipped"). V8 keeps the old-space pages a
 * burst made it commit (after 100,000 ingests the heap's total stayed ~85 MB for ~40 MB live) and
 * never shrank them while the service stayed lightly loaded. Once the process is quiet, this
 * runs one memory-reducing full collection (V8's "last resort" flavour: compacts and unmaps
 * free pages), so RSS follows the live data again.
 *
 * The check is a timer (unref'd) every `intervalMs`: it acts only when the JS heap has committed
 * more than `slackBytes` beyond what it held after the last release (or at start: garbage counts
 * as "used" until a collection runs, and a quiet process allocates too little to start one, so
 * the used size cannot tell) AND the event loop was busy less than
 * `maxUtilization` of the last interval (no burst in progress: the pause, tens of ms on a
 * ~40 MB heap, then falls where no request waits), and at most once per `minGapMs`. Under
 * sustained load it never runs; the young generation and V8's own heuristics work as before.
 *
 * The interval looks back: load that resumes just before the check (a quiet replica put back
 * behind the balancer, a feed that starts again) would meet the 70–90-ms pause (measured on a
 * 50–80 MB heap in bench:edge, 2026-11-27: the releases fell at the start of fixed-rate runs and
 * every request then in flight waited for it). So a check that passes is confirmed over a short
 * window first: the collection runs only if the loop was busy at most `quietNowUtilization` of
 * the next `confirmMs` (at 1,000 requests/s it is busy ~20–30 % of any window; an idle process
 * under 1 %), else it waits for the next check.
 */
import { performance } from 'node:perf_hooks';
import { getHeapStatistics, setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';

export interface MemoryReleaseOptions {
  readonly intervalMs: number;
  readonly slackBytes: number;
  readonly maxUtilization: number;
  readonly minGapMs: number;
  /** The window that confirms the process is quiet now, right before the collection. */
  readonly confirmMs: number;
  /** The most the loop may be busy in that window (0..1). */
  readonly quietNowUtilization: number;
  readonly onRelease?: (before: { heapTotal: number; heapUsed: number }, after: { heapTotal: number; heapUsed: number }, pauseMs: number) => void;
}

export const MEMORY_RELEASE_DEFAULTS: MemoryReleaseOptions = {
  intervalMs: 5_000, slackBytes: 16 * 1_048_576, maxUtilization: 0.2, minGapMs: 30_000,
  confirmMs: 250, quietNowUtilization: 0.02,
};

type GcFn = (options: { type: 'major'; execution: 'sync'; flavor: 'last-resort' }) => void;

let gcFn: GcFn | undefined;
/** V8's gc(), made available without --expose-gc on the command line (and without exposing it globally). */
function gc(): GcFn {
  if (gcFn === undefined) {
    setFlagsFromString('--expose-gc');
    gcFn = runInNewContext('gc') as GcFn;
  }
  return gcFn;
}

/** Starts the check; returns a function that stops it. */
export function startMemoryRelease(opts: MemoryReleaseOptions = MEMORY_RELEASE_DEFAULTS): () => void {
  const collect = gc();
  let last = performance.eventLoopUtilization();
  let lastRelease = -Infinity;
  let baseline = getHeapStatistics().total_heap_size;
  let confirming: NodeJS.Timeout | undefined;
  const release = (): void => {
    const h = getHeapStatistics();
    const t = performance.now();
    collect({ type: 'major', execution: 'sync', flavor: 'last-resort' });
    lastRelease = performance.now();
    const a = getHeapStatistics();
    baseline = a.total_heap_size;
    opts.onRelease?.({ heapTotal: h.total_heap_size, heapUsed: h.used_heap_size }, { heapTotal: a.total_heap_size, heapUsed: a.used_heap_size }, lastRelease - t);
  };
  const timer = setInterval(() => {
    const now = performance.eventLoopUtilization();
    const busy = performance.eventLoopUtilization(now, last).utilization;
    last = now;
    if (confirming !== undefined) return;
    const h = getHeapStatistics();
    if (busy > opts.maxUtilization || h.total_heap_size - baseline < opts.slackBytes || performance.now() - lastRelease < opts.minGapMs) return;
    const from = performance.eventLoopUtilization();
    confirming = setTimeout(() => {
      confirming = undefined;
      if (performance.eventLoopUtilization(performance.eventLoopUtilization(), from).utilization > opts.quietNowUtilization) return;
      release();
      // The collection's own time is not load: measure the next interval from here.
      last = performance.eventLoopUtilization();
    }, opts.confirmMs);
    confirming.unref();
  }, opts.intervalMs);
  timer.unref();
  return () => {
    clearInterval(timer);
    if (confirming !== undefined) clearTimeout(confirming);
  };
}
