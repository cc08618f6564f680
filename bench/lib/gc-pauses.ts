/**
 * GC pauses recorded by bench/lib/gc-pauses-preload.ts, and which requests they explain.
 */
import { existsSync, readFileSync } from 'node:fs';
import { fileURLToPath, pathToFileURL } from 'node:url';

export interface GcPause {
  /** µs since the epoch (the clock of h2load's per-request log). */
  readonly startUs: number;
  readonly durationUs: number;
}

/** The Node flag that loads the recorder; the process writes where BENCH_GC_PAUSES_FILE says. */
export const GC_PAUSES_IMPORT = `--import=${pathToFileURL(fileURLToPath(new URL('./gc-pauses-preload.ts', import.meta.url))).href}`;

/** Every pause in `files` (missing files count as none), sorted by start. */
export function readGcPauses(...files: readonly string[]): GcPause[] {
  const out: GcPause[] = [];
  for (const file of files) {
    if (!existsSync(file)) continue;
    for (const line of readFileSync(file, 'utf8').split('\n')) {
      const [start, duration] = line.split('\t');
      if (start === undefined || duration === undefined) continue;
      out.push({ startUs: Number(start), durationUs: Number(duration) });
    }
  }
  return out.sort((a, b) => a.startUs - b.startUs);
}

/**
 * Whether a request that started at `startUs` and took `latencyUs` overlapped a pause, or began
 * within `drainUs` after one ended (still queued behind it). `pauses` sorted by start.
 */
export function duringPause(pauses: readonly GcPause[], startUs: number, latencyUs: number, drainUs: number): boolean {
  const end = startUs + latencyUs;
  // The last pause that started before the request ended, then earlier ones while they could reach it.
  let lo = 0;
  let hi = pauses.length;
  while (lo < hi) {
    const mid = (lo + hi) >>> 1;
    if ((pauses[mid] as GcPause).startUs <= end) lo = mid + 1;
    else hi = mid;
  }
  for (let i = lo - 1; i >= 0; i--) {
    const p = pauses[i] as GcPause;
    if (p.startUs + p.durationUs + drainUs >= startUs) return true;
    if (p.startUs + 1_000_000 < startUs) return false; // no GC pause lasts a second
  }
  return false;
}
