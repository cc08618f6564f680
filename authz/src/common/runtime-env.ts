/**
 * The runtime settings the TS service runs with, wherever it is started: the service image
 * (deploy/Dockerfile `ENV`), `npm start`, `npm run authz`, the e2e stacks and the benchmarks.
 * They bound the process's memory, not its behaviour (docs/benchmarks.md, "Market service memory"):
 *
 * - `--max-old-space-size=256` and V8's heap growing factor ×2 (HEAP_GROWING_PERCENT, set by the
 *   service itself at start: Node refuses that flag in NODE_OPTIONS): one heap sizing everywhere.
 *   Without a limit Node sizes V8 from the memory it sees: 259 MiB in the pod (the service
 *   container's 512Mi) but 4,288 MiB on a 24-GiB host, where V8 then lets the old generation grow
 *   to ~4× the live heap between full collections (RSS +60–67 MB over 10^5 distinct queries,
 *   issue 27). At 256 MiB V8's own factor is ~1.1–1.3, so every ~2 MB of promoted garbage
 *   started a full collection (50 in 3 s of the costliest queries against 10 with the host's
 *   sizing) and those requests cost 6.4–6.8× an ordinary read (issue 26). ×2 sits between: the
 *   numbers that chose it are in docs/benchmarks.md ("Market service memory", and the costly
 *   requests' findings on the pod's heap sizing).
 *
 * - `--max-semi-space-size=4`: V8 sizes the young generation from the heap limit, which it
 *   derives from the machine's (or the container's) memory; on a 24 GiB host each semi-space grew
 *   to 64 MiB under an ingest burst and stayed there (128 MiB of new space in a process whose live
 *   heap is ~40 MB). 8 MiB kept RSS ~100 MB lower after a burst; 4 MiB another ~10 MB (the
 *   compiled service with 100,000 markets stored: 193 MB against 202 MB), which puts the 200-MB
 *   bound under it with a margin. Neither costs measurable CPU per Check (bench:authz, 4 MiB
 *   against 8 MiB in alternating runs, 2026-11-25), and each scavenge has less to copy.
 * - `MALLOC_ARENA_MAX=2`: glibc's per-thread malloc arenas (8 × cores by default) hold freed
 *   native memory of libuv's and V8's threads; two are plenty for one JS thread.
 *
 * `NODE_OPTIONS` given by the operator is kept: these flags come first, so the operator's win.
 */
import { setFlagsFromString } from 'node:v8';

export const SERVICE_RUNTIME_ENV = {
  NODE_OPTIONS: '--max-semi-space-size=4 --max-old-space-size=256',
  MALLOC_ARENA_MAX: '2',
} as const;

/** V8's old-generation growing factor over the live heap after a full collection, in percent (100: ×2). */
export const HEAP_GROWING_PERCENT = 100;

/**
 * Sets HEAP_GROWING_PERCENT in this process's V8 (the service's entry point calls it first).
 * V8 reads it each time it sets the next full collection's limit, so setting it at start is
 * as good as the command line, which every launcher would otherwise have to carry.
 */
export function applyHeapGrowth(): void {
  setFlagsFromString(`--heap-growing-percent=${HEAP_GROWING_PERCENT}`);
}

/** `SERVICE_RUNTIME_ENV` merged into an environment (an operator's NODE_OPTIONS appended). */
export function withServiceRuntime(env: NodeJS.ProcessEnv): NodeJS.ProcessEnv {
  const given = env['NODE_OPTIONS']?.trim();
  return {
    ...env,
    MALLOC_ARENA_MAX: env['MALLOC_ARENA_MAX'] ?? SERVICE_RUNTIME_ENV.MALLOC_ARENA_MAX,
    NODE_OPTIONS: given ? `${SERVICE_RUNTIME_ENV.NODE_OPTIONS} ${given}` : SERVICE_RUNTIME_ENV.NODE_OPTIONS,
  };
}
