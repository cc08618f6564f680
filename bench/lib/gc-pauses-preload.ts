/**
 * Preload (`node --import`) for a Node server under a benchmark: appends every GC pause of the
 * process to the file named by BENCH_GC_PAUSES_FILE, one line per pause (start in µs since the
 * epoch, main-thread pause in µs, V8's kind), flushed every 250 ms. bench/lib/gc-pauses.ts reads
 * it back to tell which slow requests coincided with a pause. The cost is one observer callback
 * per GC, none per request.
 */
import { appendFileSync } from 'node:fs';
import { PerformanceObserver, performance, type PerformanceEntry } from 'node:perf_hooks';

const file = process.env['BENCH_GC_PAUSES_FILE'];
if (file !== undefined && file !== '') {
  let lines: string[] = [];
  new PerformanceObserver((list) => {
    for (const e of list.getEntries() as (PerformanceEntry & { detail?: { kind?: number } })[]) {
      lines.push(`${Math.round((performance.timeOrigin + e.startTime) * 1000)}\t${Math.round(e.duration * 1000)}\t${e.detail?.kind ?? 0}\n`);
    }
  }).observe({ entryTypes: ['gc'] });
  setInterval(() => {
    if (lines.length === 0) return;
    appendFileSync(file, lines.join(''));
    lines = [];
  }, 250).unref();
}
