/**
 * `npm run bench:market`: GET /v1/markets?limit=100 and GET /v1/quotes?conditionId=<one>
 * against the market service directly (no Envoy), with 100 and with 100,000 markets stored,
 * side by side in one run: two service processes (bench/market-server.ts: createMarketService
 * over RedisMarketStore), each on its own private redis-server, filled through
 * RedisMarketStore.put (the production layout and Lua script). Interleaved rounds, medians.
 * Reports req/s, p50/p99 (h2load --h1, keep-alive) and CPU µs per request of the service and
 * of its redis-server (from /proc). Target: 100k / 100 ≥ 0.8 for both endpoints.
 *
 * Then memory (bench/lib/market-memory.ts): the real TS process behind real Envoy with the default
 * GeoIP database, idle, after 100,000 markets ingested through Envoy, after 30 s idle, and after
 * 10^5 and 10^6 distinct market queries (the page-cache attack). Target: ≤ 200 MB RSS with 10^5
 * markets stored; the queries grow RSS by tens of MB at most.
 *
 * Env: BENCH_ROUNDS (6), BENCH_SECONDS (3), BENCH_NO_DOCS=1 to leave docs/benchmarks.md alone,
 * BENCH_MEMORY=only|skip (default: both parts), BENCH_MEMORY_MARKETS (100000),
 * BENCH_MEMORY_QUERIES (100000,1000000: cumulative counts), BENCH_MEMORY_IDLE_SECS (30).
 * Quickest checks (~20 s each): BENCH_NO_DOCS=1 BENCH_ROUNDS=1 BENCH_SECONDS=1 BENCH_MEMORY=skip npm run bench:market;
 * BENCH_NO_DOCS=1 BENCH_MEMORY=only BENCH_MEMORY_MARKETS=500 BENCH_MEMORY_QUERIES=1000 BENCH_MEMORY_IDLE_SECS=0 npm run bench:market.
 */
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { withServiceRuntime } from '../authz/src/common/runtime-env.ts';
import { PrivateRedis } from '../testkit/redis-server.ts';
import { forkNode, type NodeChild } from './lib/child.ts';
import { benchLog, envInt, machineLine, redisPid, today, workDir } from './lib/env.ts';
import { ensureH2load, runH2load } from './lib/h2load.ts';
import { writeBenchmarksSection } from './lib/markdown-section.ts';
import { measureMemory, memoryTable, type MemorySample } from './lib/market-memory.ts';
import { compileService } from './lib/compile-js.ts';
import { cpuUsPerRequest, startCpuWindow } from './lib/proc.ts';
import { fmt, markdownTable, median, met, pairedMedian, percentile, sortedCopy } from './lib/stats.ts';

// An even number of rounds: the two sizes alternate which goes first, and each order counts equally.
const ROUNDS = envInt('BENCH_ROUNDS', 6, 1);
const SECONDS = envInt('BENCH_SECONDS', 3, 1);
const CONNECTIONS = 8;
const SIZES = [100, 100_000] as const;
const ENDPOINTS = ['markets', 'quotes'] as const;
type Endpoint = (typeof ENDPOINTS)[number];
const log = benchLog('market');

const MEMORY = process.env['BENCH_MEMORY'] ?? 'both';
if (!['both', 'only', 'skip'].includes(MEMORY)) throw new Error(`BENCH_MEMORY: expected only or skip, got ${JSON.stringify(MEMORY)}`);

/**
 * As shipped (the image: compiled JavaScript, the service's runtime settings), against the same
 * run from its .ts sources (npm start and the e2e suite: Node strips the types at load) and
 * against V8's own sizing on this host (64 MiB semi-spaces, as it grew them here; glibc's default
 * 8 arenas per core), side by side in one run.
 */
const MEMORY_CONFIGS: readonly { readonly name: string; readonly env: Record<string, string>; readonly js: boolean }[] = [
  { name: 'as shipped: compiled JavaScript (deploy/Dockerfile), runtime settings (authz/src/common/runtime-env.ts)', env: {}, js: true },
  { name: 'the .ts sources (npm start, e2e), same runtime settings', env: {}, js: false },
  // Comparisons of the young generation's sizing (BENCH_MEMORY_COMPARE=1; measured 2026-11-25, see the findings).
  ...(process.env['BENCH_MEMORY_COMPARE'] === '1' ? [
    { name: 'compiled JavaScript, --max-semi-space-size=8 (shipped until 2026-11-25)', env: { NODE_OPTIONS: '--max-semi-space-size=8' }, js: true },
    { name: 'compiled JavaScript, V8/glibc sizing (semi-space 64 MiB, 16 arenas)', env: { NODE_OPTIONS: '--max-semi-space-size=64', MALLOC_ARENA_MAX: '16' }, js: true },
  ] : []),
];

/** Issue 27's bounds: RSS as shipped and under npm start with the markets stored, and RSS growth over 10^5 distinct queries. */
const RSS_SHIPPED_MAX_MB = 150;
const RSS_SOURCES_MAX_MB = 200;
const QUERY_GROWTH_MAX_MB = 48;
const GROWTH_QUERIES = 100_000;

/** The memory part, in its own docs section. */
async function memoryPart(): Promise<void> {
  const markets = envInt('BENCH_MEMORY_MARKETS', 100_000, 1);
  const queries = (process.env['BENCH_MEMORY_QUERIES'] ?? '100000,1000000').split(',').map(Number);
  if (queries.some((q, i) => !Number.isInteger(q) || q < 1 || (i > 0 && q <= queries[i - 1]!))) throw new Error('BENCH_MEMORY_QUERIES: increasing positive integers');
  const idleSecs = envInt('BENCH_MEMORY_IDLE_SECS', 30, 0);
  const runs: { name: string; samples: MemorySample[] }[] = [];
  const compiled = compileService();
  for (const c of MEMORY_CONFIGS) {
    log(`memory: ${c.name}`);
    runs.push({ name: c.name, samples: await measureMemory({ markets, queries, idleSecs, log, env: c.env, ...(c.js ? { serviceEntry: compiled } : {}) }) });
  }
  const storedOf = (samples: readonly MemorySample[]): MemorySample => samples.find((x) => x.phase.startsWith(`${idleSecs} s idle`)) ?? samples[2]!;
  const growthOf = (samples: readonly MemorySample[]): { queries: string; mb: number } => {
    const after = samples.find((x) => x.phase === `after ${GROWTH_QUERIES.toLocaleString('en')} distinct market queries`) ?? samples[3]!;
    return { queries: after.phase.replace(/^after /, ''), mb: after.rssMb - storedOf(samples).rssMb };
  };
  const shipped = runs[0]!.samples;
  const sources = runs[1]!.samples;
  const stored = storedOf(shipped);
  const storedTs = storedOf(sources);
  const growth = growthOf(shipped);
  const growthTs = growthOf(sources);
  const last = [...shipped].reverse().find((x) => x.phase.includes('distinct market queries'))!;
  const quiet = shipped.find((x) => x.phase === `${idleSecs} s idle after the queries`);
  const text = `Run by \`npm run bench:market\` (bench/market.ts, bench/lib/market-memory.ts) on ${today()}: ${machineLine(h2load)}.
The real TS process (the default GeoIP database, \`REDIS_URL\` on a private redis-server) behind real Envoy, as the e2e suite starts it
(e2e/lib/stack.ts). ${markets.toLocaleString('en')} signed markets ingested through Envoy (48 at a time: header phase, body Check, market service),
then ${idleSecs} s idle, then distinct \`GET /v1/markets?conditionId=<known>,<unknown-i>\` straight to the market port (32 at a time), the page-cache attack of issue 20.
RSS from \`/proc/<pid>/status\`; heap and external memory from the process's own \`/metrics\` (heap used includes garbage not yet collected).
Configurations one after the other in the same run: the service as shipped (the JavaScript the image's build stage compiles,
tsconfig.build.json, with its runtime settings) and the same service run from its \`.ts\` sources (as \`npm start\` and the e2e suite run it)${MEMORY_CONFIGS.length > 2 ? ', then the compiled service with the young generation it had until 2026-11-25, and with V8\'s and glibc\'s own sizing' : ''}.
Other agents were loading the machine during the run (see "Machine busy" elsewhere in this file); RSS does not depend on CPU time, but a slower ingest phase is a longer burst.

| Target | measured | met |
| --- | ---: | --- |
| as shipped: RSS with ${markets.toLocaleString('en')} markets stored and the GeoIP database loaded ≤ ${RSS_SHIPPED_MAX_MB} MB | ${stored.rssMb.toFixed(0)} MB | ${met(stored.rssMb <= RSS_SHIPPED_MAX_MB)} |
| \`npm start\` (.ts sources): the same ≤ ${RSS_SOURCES_MAX_MB} MB | ${storedTs.rssMb.toFixed(0)} MB | ${met(storedTs.rssMb <= RSS_SOURCES_MAX_MB)} |
| as shipped: RSS growth over ${growth.queries} ≤ ${QUERY_GROWTH_MAX_MB} MB | ${growth.mb.toFixed(0)} MB | ${met(growth.mb <= QUERY_GROWTH_MAX_MB)} |
| .ts sources: RSS growth over ${growthTs.queries} ≤ ${QUERY_GROWTH_MAX_MB} MB | ${growthTs.mb.toFixed(0)} MB | ${met(growthTs.mb <= QUERY_GROWTH_MAX_MB)} |
| as shipped: RSS growth over ${last.phase.replace(/^after /, '')} (informational) | ${(last.rssMb - stored.rssMb).toFixed(0)} MB | – |
${quiet === undefined ? '' : `| as shipped: the same, ${idleSecs} s after the queries ended (informational: what the process keeps) | ${(quiet.rssMb - stored.rssMb).toFixed(0)} MB | – |\n`}
${memoryTable(runs)}

${MEMORY_FINDINGS}`;
  writeBenchmarksSection('## Market service memory', text);
  process.stdout.write(`${text}\n`);
}

/** What the heap snapshots showed (a one-off investigation; its method is described, its scratch script is not kept). */
const MEMORY_FINDINGS = `Where the memory goes (investigated 2026-11-24 with \`--heapsnapshot-signal\` snapshots of the same process idle, after
100,000 ingests and after 100,000 distinct queries; a snapshot collects garbage first, so it shows what is live):
- **Nothing is kept per market or per query beyond the caches' bounds.** The live JS heap was 39 MB idle, 40 MB after
  the 100,000 ingests and 46 MB after the queries (2,000 cached pages: ~3 KB each, under the 32 MiB estimate's bound).
- **Idle.** Of the 39 MB live: 12 MB of strings, of which 4.6 MB are the source of Node's own TypeScript stripper
  (amaro, loaded because the service runs \`.ts\` directly); 11 MB of ArrayBuffers, of which 7.8 MB are the GeoIP database
  (read whole into memory by maxmind) and 3 MB the stripper's WebAssembly. Type stripping alone costs ~17 MB of RSS
  (an empty \`.cjs\` script: 40 MB RSS; the same as \`.cts\`: 57 MB). The rest of the idle RSS is Node itself (its
  binary's mapped pages, ~58 MB shared and clean) and V8's reserved but unused heap.
- **After a burst, V8's young generation is what stays.** With its own sizing on this 24 GiB host V8 grew each
  semi-space to 64 MiB (128 MiB of new space for a ~40 MB live heap) and never shrank it: the "heap at ~190 MB" of the
  attack report. \`--max-semi-space-size=8\` capped that at 16 MiB (bench:authz showed the same CPU per Check with it
  and without, 2026-11-24: geo GET 43–45 µs, order 53–55 µs, signed ingest 168–185 µs).
- **4 MiB since 2026-11-25: the bound with a margin.** With 8 the compiled service sat at the bound: 197, 201 and
  202 MB with 100,000 markets stored in three runs. The table above measures 4 (as shipped) and 8 side by side in
  every run; before it, 193 MB with 4 against 202 MB with 8 (one run each), and the day before 191 against 202. CPU per Check, bench:authz in four
  alternating runs (8, 4, 4, 8; 2 rounds each; medians of the 4 samples): geo GET 38.1 µs with 4 against 38.2 with 8,
  order 42.2 against 42.7, signed ingest 138 against 128 µs with spreads that overlap (117–145 against 119–139). The
  ingest allocates the most per Check, so a smaller young generation would cost there first; the feed's rate is far
  below saturation. Rejected then: a hard \`--max-old-space-size\` near the live heap (an out-of-memory crash when the
  caches fill to their bounds).
- **Since 2026-11-27: one heap sizing everywhere, \`--max-old-space-size=256\` and V8's growing factor ×2**
  (authz/src/common/runtime-env.ts). 256 MiB is far above the live heap (22–45 MB here; the caches' bounds come to
  ~120 MB) and is what Node gave the service in the pod anyway (it sizes V8 from the cgroup: 259 MiB under 512Mi). On
  this host V8 sized itself at 4 GiB and let the old generation grow ~4× the live heap between full collections: +60–67
  MB over 10^5 distinct queries. The limit alone keeps V8's own factor (~1.1–1.3 at 256 MiB): +11 MB, but a full
  collection every ~2 MB of promoted garbage, and the costliest queries at 6.4–6.8× an ordinary read (issue 26). ×2
  (\`--heap-growing-percent=100\`, set by the service at start) measured +36 MB over the same queries and 121 MB with
  100,000 markets stored (one run each, 2026-11-27, beside the lead's other work), and the costly classes back near the
  host's ratios ("Costly requests").
- In a container with a memory limit Node derives V8's limits from the cgroup, so the default sizing there is smaller
  than on this host; the explicit flag makes the bound the same everywhere.
- **What stays after the burst is V8's old space, not the allocator.** After the 100,000 ingests the heap's total is
  84–90 MB for a heap used of 30–50 MB (garbage V8 has not given back). Allocator variants, side by side on the
  compiled service (2026-11-25, quiet machine, 100,000 markets): glibc with fixed thresholds
  (\`MALLOC_MMAP_THRESHOLD_=65536 MALLOC_TRIM_THRESHOLD_=131072\`, so freed memory goes back to the kernel) 208 MB, and
  then +46 MB over 10^6 queries; jemalloc (\`LD_PRELOAD\`) 204 MB; glibc as shipped 202 MB and +49 MB. None is
  adopted. Over 10^6 distinct queries the service grew 48–49 MB with 4 and with 8, the caches at their bounds.
  One earlier run (2026-11-25, while a CI run shared the machine) reached 495 MB after 10^6 queries with a 105-MB heap;
  it did not recur on a quiet machine and is not explained.`;

const h2load = ensureH2load(log);
if (h2load === undefined) throw new Error('h2load (Debian nghttp2-client) is required');

interface Target { size: number; redis: PrivateRedis; redisPid: number; svc: NodeChild; oneId: string; bytes: Record<Endpoint, number> }
interface Sample { round: number; rps: number; p50: number; p99: number; svcUs: number; redisUs: number; ok: number; done: number; busy: number; steal: number }
const pathOf = (ep: Endpoint, t: Target): string => (ep === 'markets' ? '/v1/markets?limit=100' : `/v1/quotes?conditionId=${t.oneId}`);
const key = (ep: Endpoint, size: number): string => `${ep}|${size}`;
const epLabel = (ep: Endpoint): string => (ep === 'markets' ? '`GET /v1/markets?limit=100`' : '`GET /v1/quotes?conditionId=<one>`');

/** The speed part: both sizes side by side, interleaved rounds; its own docs section. */
async function speedPart(): Promise<void> {
  const dir = workDir('market');
  const samples = new Map<string, Sample[]>();
  const targets: Target[] = [];
  const redises: PrivateRedis[] = [];

  async function measure(t: Target, ep: Endpoint, round: number): Promise<void> {
    const close = startCpuWindow([t.svc.pid, t.redisPid]);
    const r = await runH2load(h2load as string, {
      url: `http://127.0.0.1:${t.svc.port}${pathOf(ep, t)}`, h1: true, headers: {}, connections: CONNECTIONS, streamsPerConnection: 1,
      durationSeconds: SECONDS, logFile: join(dir, 'h2load.log'),
    });
    const cpu = close();
    const lat = sortedCopy(r.latenciesUs);
    const k = key(ep, t.size);
    samples.set(k, [...(samples.get(k) ?? []), {
      round, rps: r.reqPerSec, p50: percentile(lat, 50), p99: percentile(lat, 99), ok: r.succeeded, done: r.done,
      svcUs: cpuUsPerRequest(cpu, t.svc.pid, r.done), redisUs: cpuUsPerRequest(cpu, t.redisPid, r.done),
      busy: cpu.machineBusy, steal: cpu.machineSteal,
    }]);
    log(`${round < 0 ? 'warm-up ' : `round ${round + 1} `}${k}: ${fmt(r.reqPerSec)} req/s, ${r.succeeded}/${r.done} 2xx, p99 ${fmt(percentile(lat, 99) / 1000, 2)} ms`);
  }

  try {
    for (const size of SIZES) {
      const redis = await PrivateRedis.start();
      redises.push(redis);
      // The service's runtime settings (authz/src/common/runtime-env.ts), as wherever it runs.
      const start = (): Promise<NodeChild> => forkNode(fileURLToPath(new URL('./market-server.ts', import.meta.url)), {
        env: withServiceRuntime({ ...process.env, REDIS_URL: redis.url }), logFile: join(dir, `svc-${size}.log`),
      });
      // Filled by a process of its own, so the measured service starts fresh (no heap left over from 100k writes).
      const filler = await start();
      const t1 = performance.now();
      const oneId = await filler.call<string>('fill', size);
      await filler.stop();
      log(`stored ${size.toLocaleString('en')} markets in ${fmt(performance.now() - t1)} ms`);
      const svc = await start();
      const pid = redisPid(redis.url);
      if (pid === undefined) throw new Error('the private redis-server has no /proc entry');
      const t: Target = { size, redis, redisPid: pid, svc, oneId, bytes: { markets: 0, quotes: 0 } };
      targets.push(t);
      // Preflight: the page really holds 100 markets (and a cursor when more exist), the quote its market.
      for (const ep of ENDPOINTS) {
        const res = await fetch(`http://127.0.0.1:${svc.port}${pathOf(ep, t)}`);
        const text = await res.text();
        const body = JSON.parse(text) as { markets?: unknown[]; quotes?: { conditionId: string }[]; nextCursor: string | null };
        const ok = res.status === 200 && (ep === 'markets'
          ? body.markets?.length === Math.min(100, size) && (body.nextCursor !== null) === size > 100
          : (body.quotes?.length ?? 0) > 0 && body.quotes?.every((q) => q.conditionId === oneId));
        if (!ok) throw new Error(`preflight ${ep}@${size}: ${res.status} ${text.slice(0, 200)}`);
        t.bytes[ep] = Buffer.byteLength(text);
      }
    }

    // Warm-up, then interleaved rounds: markets@100, markets@100k, quotes@100, quotes@100k; the
    // order of the two sizes alternates between rounds so drift hits both alike.
    for (const t of targets) for (const ep of ENDPOINTS) await measure(t, ep, -1);
    samples.clear();
    for (let round = 0; round < ROUNDS; round++) {
      for (const ep of ENDPOINTS) for (const t of round % 2 === 0 ? targets : [...targets].reverse()) await measure(t, ep, round);
    }
  } finally {
    for (const t of targets) await t.svc.stop();
    for (const r of redises) await r.stop();
  }

  const med = (k: string, f: (s: Sample) => number): number => median((samples.get(k) ?? []).map(f));
  /** Median over rounds of (100k value / 100 value) in the same round. */
  const pairedRatio = (ep: Endpoint, f: (s: Sample) => number): number =>
    pairedMedian(samples.get(key(ep, 100_000)) ?? [], samples.get(key(ep, 100)) ?? [], (big, small) => f(big) / f(small));
  const rows: string[][] = [];
  const ratios: string[][] = [];
  for (const ep of ENDPOINTS) {
    for (const t of targets) {
      const k = key(ep, t.size);
      const all = samples.get(k) ?? [];
      rows.push([
        epLabel(ep), t.size.toLocaleString('en'), fmt(t.bytes[ep]),
        fmt(med(k, (s) => s.rps)), fmt(med(k, (s) => s.p50) / 1000, 2), fmt(med(k, (s) => s.p99) / 1000, 2),
        fmt(med(k, (s) => s.svcUs)), fmt(med(k, (s) => s.redisUs)),
        `${all.reduce((a, s) => a + s.ok, 0)}/${all.reduce((a, s) => a + s.done, 0)}`,
      ]);
    }
    const rps = pairedRatio(ep, (s) => s.rps);
    const cpu = 1 / pairedRatio(ep, (s) => s.svcUs + s.redisUs);
    ratios.push([epLabel(ep), fmt(rps, 2), fmt(cpu, 2), met(rps >= 0.8)]);
  }
  const perRound: string[][] = [];
  for (let round = 0; round < ROUNDS; round++) {
    const cells = ENDPOINTS.flatMap((ep) => SIZES.map((size) => samples.get(key(ep, size))?.find((s) => s.round === round)));
    perRound.push([String(round + 1), ...cells.map((s) => (s === undefined ? '–' : `${fmt(s.rps)} / ${fmt(s.svcUs)} / ${fmt(s.redisUs)}`)),
      `${fmt(100 * median(cells.map((s) => s?.busy ?? NaN)))} %`, `${fmt(100 * Math.max(...cells.map((s) => s?.steal ?? 0)))} %`]);
  }

  const body = `Run by \`npm run bench:market\` (bench/market.ts) on ${today()}: ${machineLine(h2load)}.
The market service alone (no Envoy): one service process per size (bench/market-server.ts:
\`createMarketService\` over \`RedisMarketStore\`, pino silent, the service's runtime settings), each on its own private
redis-server filled through \`RedisMarketStore.put\` (the production key layout and write script) by a separate process.
h2load --h1, ${CONNECTIONS} keep-alive connections, ${ROUNDS} interleaved rounds of ${SECONDS} s per cell after a warm-up; medians.
CPU from \`/proc/<pid>/stat\` (all threads), divided by the requests of the run.

${markdownTable(['Target: 100,000-market rate ≥ 0.8 × 100-market rate', 'req/s ratio', 'CPU ratio (capacity)', 'Met'], ratios, ['l', 'r', 'r', 'l'])}

${markdownTable(['Request', 'Markets stored', 'Response bytes', 'req/s', 'p50 ms', 'p99 ms', 'Service CPU µs/req', 'Redis CPU µs/req', '2xx'], rows, ['l', 'r', 'r', 'r', 'r', 'r', 'r', 'r', 'r'])}

- Ratios are the median over rounds of the 100,000-market cell divided by the 100-market cell of the
  same round; "CPU ratio" is the same for (service + Redis) CPU per request, inverted (capacity per core).
- A page is one Lua script on Redis (\`ZRANGE … BYLEX LIMIT\` + one \`HMGET\` per market), O(log N + limit),
  and the service concatenates records serialized at write time, so the cost does not grow with N.
- Records are ~1.4 KB each (two outcomes, a 600-byte envelope), so a 100-market page is ~137 KB and
  \`/v1/markets?limit=100\` is bound by moving those bytes: see the findings below.
- p50/p99 are under saturation (${CONNECTIONS} requests in flight), so they include queueing.

<details><summary>Per round: req/s / service CPU µs per request / Redis CPU µs per request</summary>

${markdownTable(['Round', ...ENDPOINTS.flatMap((ep) => SIZES.map((s) => `${ep} @ ${s.toLocaleString('en')}`)), 'Machine busy', 'Steal (max)'], perRound, ['l', 'r', 'r', 'r', 'r', 'r', 'r'])}

</details>`;
  writeBenchmarksSection('## Market data service', body);
  process.stdout.write(`${body}\n`);
}

if (MEMORY !== 'only') await speedPart();
if (MEMORY !== 'skip') await memoryPart();
