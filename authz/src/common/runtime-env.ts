/**
 * The runtime settings the TS service runs with, wherever it is started: the service image
 * (deploy/Dockerfile `ENV`), `npm start`, `npm run authz`, the e2e stacks and the benchmarks.
 * They bound the process's memory, not its behaviour (docs/benchmarks.md, "Market service memory"):
 *
 * - `--max-semi-space-size=4`: V8 sizes the young generation from the heap limit, which it
 *   derives from the machine's (or the container's) memory; on a 24 GiB host each semi-space grew
 *   to 64 MiB under an ingest burst and stayed there (128 MiB of new space in a process whose live
 *   heap is ~40 MB). 8 MiB kept RSS ~100 MB lower after a burst; 4 MiB another ~10 MB (the
 *   compiled service with 100,000 markets stored: 193 MB against 202 MB), which puts the 200-MB
 *   bound under it with a margin. Neither costs measurable CPU per Check (bench:authz, 4 MiB
 *   against 8 MiB in alternating runs, 2026-11-25), and each scavenge has less to copy.
 * - `--max-old-space-size=256`: the old generation's limit, and with it how far V8 lets the heap
 *   grow between full collections. V8 derives both from the machine's memory: on a 24 GiB host a
 *   4 GiB limit and a growing factor of up to ×4 (chosen when the collector keeps up, as under a
 *   query burst), so a burst that promotes ~3 KB of per-request garbage per query let the heap
 *   reach ~90 MB committed for ~25 MB live before the next full collection (RSS +57–110 MB over
 *   10^5 distinct queries). With 256 MiB V8 caps the factor at ×1.3–1.4 (`--trace-gc-verbose`
 *   prints it): +17–20 MB over the same burst. 256 MiB is also the limit V8's own formula gives
 *   for the pod's 512 Mi (a quarter, ×2 on 64-bit), so every host sizes it alike. The caches'
 *   byte bounds (~120 MiB together, redis-store.ts) and the ~25 MB base stay far below it; the
 *   container's limit, not this, is what a larger heap would meet first. The cost: more full
 *   collections for the allocation-heaviest requests (bench:costly, 2026-11-27: the largest
 *   orders, 100-id queries and 500-market pages +55–120 % TS CPU per request against V8's own
 *   sizing here).
 *   docs/benchmarks.md, "Findings: the old generation's growth during a query burst".
 * - `MALLOC_ARENA_MAX=2`: glibc's per-thread malloc arenas (8 × cores by default) hold freed
 *   native memory of libuv's and V8's threads; two are plenty for one JS thread.
 *
 * `NODE_OPTIONS` given by the operator is kept: these flags come first, so the operator's win.
 */
export const SERVICE_RUNTIME_ENV = {
  NODE_OPTIONS: '--max-semi-space-size=4 --max-old-space-size=256',
  MALLOC_ARENA_MAX: '2',
} as const;

/** `SERVICE_RUNTIME_ENV` merged into an environment (an operator's NODE_OPTIONS appended). */
export function withServiceRuntime(env: NodeJS.ProcessEnv): NodeJS.ProcessEnv {
  const given = env['NODE_OPTIONS']?.trim();
  return {
    ...env,
    MALLOC_ARENA_MAX: env['MALLOC_ARENA_MAX'] ?? SERVICE_RUNTIME_ENV.MALLOC_ARENA_MAX,
    NODE_OPTIONS: given ? `${SERVICE_RUNTIME_ENV.NODE_OPTIONS} ${given}` : SERVICE_RUNTIME_ENV.NODE_OPTIONS,
  };
}
