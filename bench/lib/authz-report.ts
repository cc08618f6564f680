/**
 * The authz benchmark's results → Markdown: targets, the loaded and unloaded tables, the
 * in-process decision logic and its parts, per-round figures and the method.
 */
import { CLIENT_IP } from './authz-scenarios.ts';
import type { InProcessResult } from './authz-inprocess.ts';
import { fmt, markdownTable, median, met } from './stats.ts';

/** floor and (a), (c) via h2load; floorNode and (b) via the node:http2 client. */
export type Key = 'floor' | 'a' | 'floorNode' | 'b' | 'c';

/** One measured run of one scenario. */
export interface Run {
  readonly key: Key;
  readonly checksPerSec: number;
  /** Allowed decisions per second (what the targets count). */
  readonly allowedPerSec: number;
  readonly allowRate: number;
  readonly cpuUs: number;
  readonly extraCpuUs: number | undefined;
  readonly p50Us: number;
  readonly p99Us: number;
  readonly failed: number;
  readonly denials: Readonly<Record<string, number>>;
  readonly machineBusy: number;
  readonly machineSteal: number;
}

/** A scenario over all rounds: medians, the worst allow rate, total failures. */
export interface Summary {
  readonly key: Key;
  readonly runs: readonly Run[];
  readonly checksPerSec: number;
  readonly allowedPerSec: number;
  readonly cpuUs: number;
  readonly extraCpuUs: number | undefined;
  readonly p50Us: number;
  readonly p99Us: number;
  readonly minAllowRate: number;
  readonly failed: number;
}

/** Reduces a scenario's runs to medians. */
export function summarize(key: Key, runs: readonly Run[]): Summary {
  const extras = runs.map((r) => r.extraCpuUs).filter((x): x is number => x !== undefined);
  return {
    key, runs,
    checksPerSec: median(runs.map((r) => r.checksPerSec)),
    allowedPerSec: median(runs.map((r) => r.allowedPerSec)),
    cpuUs: median(runs.map((r) => r.cpuUs)),
    extraCpuUs: extras.length > 0 ? median(extras) : undefined,
    p50Us: median(runs.map((r) => r.p50Us)),
    p99Us: median(runs.map((r) => r.p99Us)),
    minAllowRate: Math.min(...runs.map((r) => r.allowRate)),
    failed: runs.reduce((n, r) => n + r.failed, 0),
  };
}

/** Median over rounds of x's rate / the floor's rate in the same round. */
function ratioToFloor(x: Summary, floor: Summary): number {
  return median(x.runs.map((r, i) => r.checksPerSec / (floor.runs[i]?.checksPerSec ?? NaN)));
}

/** The same on CPU: floor CPU µs per Check / x's, i.e. x's capacity per core relative to the floor. */
function cpuRatioToFloor(x: Summary, floor: Summary): number {
  return median(x.runs.map((r, i) => (floor.runs[i]?.cpuUs ?? NaN) / r.cpuUs));
}

/** How the runs were made (for the text around the tables). */
export interface Settings {
  readonly rounds: number;
  readonly seconds: number;
  readonly warmupSeconds: number;
  readonly unloadedSeconds: number;
  readonly load: { readonly connections: number; readonly streams: number };
}

/** What a scenario is called in the tables and which load generator drove it. */
export interface ScenarioInfo {
  readonly key: Key;
  readonly label: string;
  readonly generator: 'h2load' | 'node';
}

/** Everything the section is rendered from. */
export interface Report {
  readonly settings: Settings;
  readonly env: Readonly<Record<string, string>>;
  readonly scenarios: readonly ScenarioInfo[];
  readonly loaded: Readonly<Record<Key, Summary>>;
  readonly unloaded: Readonly<Record<Key, Run>>;
  readonly inproc: InProcessResult;
  readonly sizes: { a: number; b: number; c: number };
  readonly generatorNote: string;
}

/** 0.934 → "93 %". */
export const pct = (x: number): string => `${fmt(x * 100, 0)} %`;
/** µs → ms with two decimals. */
export const ms = (us: number): string => fmt(us / 1000, 2);

/** The section body (everything under the heading), Markdown. */
export function renderSection(r: Report): string {
  const { loaded: L, unloaded: U, inproc: P } = r;
  const { rounds: ROUNDS, seconds: SECONDS, warmupSeconds: WARMUP_SECONDS, unloadedSeconds: UNLOADED_SECONDS, load: LOAD } = r.settings;
  const aRatio = ratioToFloor(L.a, L.floor);
  const cRatio = ratioToFloor(L.c, L.floor);
  const aCpu = cpuRatioToFloor(L.a, L.floor);
  const cCpu = cpuRatioToFloor(L.c, L.floor);
  const order: Key[] = ['floor', 'a', 'c', 'floorNode', 'b'];
  const label = Object.fromEntries(r.scenarios.map((s) => [s.key, s])) as Record<Key, ScenarioInfo>;
  const gen = (k: Key): string => (label[k].generator === 'h2load' ? 'h2load' : 'node:http2');
  const loadedRows = order.map((k) => {
    const s = L[k];
    const vsFloor = k === 'a' ? pct(aRatio) : k === 'c' ? pct(cRatio) : '–';
    return [
      label[k].label, gen(k), fmt(s.checksPerSec), vsFloor, pct(s.minAllowRate), fmt(s.cpuUs, 1),
      s.extraCpuUs === undefined ? '–' : fmt(s.extraCpuUs, 1), ms(s.p50Us), ms(s.p99Us),
    ];
  });
  const unloadedRows = order.map((k) => [label[k].label, gen(k), fmt(U[k].p50Us), fmt(U[k].p99Us), fmt(U[k].checksPerSec), fmt(U[k].cpuUs, 1)]);
  const targets = [
    ['(a) Checks/s ≥ 85 % of the floor', `${pct(aRatio)} (by server CPU per Check: ${pct(aCpu)})`, met(aRatio >= 0.85)],
    ['(a) decision logic ≤ 10 µs', `${fmt(P.decision.a.us, 2)} µs`, met(P.decision.a.us <= 10)],
    ['(b) ≥ 3,000 verified ingests/s per process', `${fmt(L.b.allowedPerSec)} /s (allowed ${pct(L.b.minAllowRate)})`, met(L.b.allowedPerSec >= 3000 && L.b.minAllowRate === 1)],
    ['(c) Checks/s ≥ 80 % of the floor', `${pct(cRatio)} (by server CPU per Check: ${pct(cCpu)})`, met(cRatio >= 0.8)],
  ];
  const rounds = L.floor.runs.map((_, i) => [
    String(i + 1),
    ...order.map((k) => {
      const run = L[k].runs[i];
      return run === undefined ? '–' : `${fmt(run.checksPerSec)} / ${fmt(run.cpuUs, 1)}`;
    }),
    pct(median(order.map((k) => L[k].runs[i]?.machineBusy ?? NaN))),
    pct(Math.max(...order.map((k) => L[k].runs[i]?.machineSteal ?? 0))),
  ]);
  const decisionRows = [P.decision.a, P.decision.b, P.decision.c].map((d) => [d.name, fmt(d.us, 2), d.note ?? '']);
  const partRows = P.parts.map((p) => [p.name, fmt(p.us, 2), p.note ?? '']);
  const e = r.env;
  return `
Run by \`npm run bench:authz\` (bench/authz.ts) on ${e['date']}: ${e['machine']},
@grpc/grpc-js ${e['grpcjs']}.
${ROUNDS} interleaved rounds of ${SECONDS} s per scenario; medians. Regenerate with \`npm run bench:authz\`
(it rewrites only this section).

### Targets

${markdownTable(['Target', 'Measured', 'Met'], targets, ['l', 'r', 'l'])}

### Under load: ${LOAD.connections} connections × ${LOAD.streams} streams (${LOAD.connections * LOAD.streams} Checks in flight)

${markdownTable(
    ['Scenario', 'Load generator', 'Checks/s', 'vs floor', 'Allowed', 'Server CPU µs/Check', 'Redis CPU µs/Check', 'p50 ms', 'p99 ms'],
    loadedRows, ['l', 'l', 'r', 'r', 'r', 'r', 'r', 'r', 'r'],
  )}

- Scenarios: (a) geo-only \`GET /v1/markets?…\` as Envoy sends it (${r.sizes.a}-byte CheckRequest, 14 headers,
  \`x-edge-client-ip: ${CLIENT_IP}\`, which has a record in the default GeoIP database and is not blocked);
  (b) signed ingest (${r.sizes.b} bytes: valid HMAC, valid Ed25519 envelope, a fresh nonce per request,
  written to Redis); (c) order for the market the service's market store holds (${r.sizes.c} bytes).
- "Allowed" is the lowest allow rate of any round, from the server's own decision counters
  (and, for the node:http2 client, from every CheckResponse it received). For (b) that is the
  verified ingest rate: a replay would be denied \`ingest_replay\` and is not counted; the preflight
  checks that replays are denied.
- "vs floor" is the median over rounds of the scenario's Checks/s divided by the floor's in the
  same round; "by server CPU per Check" is the floor's CPU per Check divided by the scenario's
  in the same round, i.e. capacity per core. Both move from run to run: Checks/s with the
  neighbours, and CPU per Check too (the floor in particular lands anywhere between ~28 and
  ~45 µs per Check on a quiet machine); the per-round table shows the spread.${r.generatorNote === '' ? '' : `\n- ${r.generatorNote}`}
- p50/p99 under load include queueing behind ${LOAD.connections * LOAD.streams} in-flight Checks; see the
  next table for the service time.

### Latency at concurrency 1 (one connection, one stream, ${UNLOADED_SECONDS} s each)

${markdownTable(['Scenario', 'Load generator', 'p50 µs', 'p99 µs', 'Checks/s', 'Server CPU µs/Check'], unloadedRows, ['l', 'l', 'r', 'r', 'r', 'r'])}

One Check at a time: the service time without queueing, and no batching of reads and writes
across calls, hence the higher CPU per Check than under load.

### Decision logic alone (in-process, µs per call)

\`decodeCheckRequest\` → \`evaluate\` → \`encodeDecision\` on pre-encoded CheckRequests in a tight loop
(median of 7 batches), with the production adapters except an in-memory nonce store.

${markdownTable(['Scenario', 'µs/call', 'Note'], decisionRows, ['l', 'r', 'l'])}

Where the time goes (same method, one part at a time):

${markdownTable(['Part', 'µs/call', 'Note'], partRows, ['l', 'r', 'l'])}

<details><summary>Per round: Checks/s / server CPU µs per Check</summary>

${markdownTable(['Round', ...order.map((k) => label[k].label), 'Machine busy', 'Steal (max)'], rounds, ['l', 'r', 'r', 'r', 'r', 'r', 'r', 'r'])}

</details>

Method:
- Each server is its own child process; its CPU is the change in utime+stime of
  \`/proc/<pid>/stat\` over the run (all its threads: GC, libuv), divided by the Checks it
  decided. It is steadier than Checks/s when neighbours take CPU, but not constant (see
  the per-round table).
- The authz server is \`createAuthzCore\` with the real GeoDatabase over the default database,
  \`RedisNonceStore\` on the shared Redis (keys \`edge:nonce:*\`, random nonces, expire after
  NONCE_TTL_SECS), the real in-memory market store (\`MemoryMarketStore\`) holding the market,
  ingested before the run through the market service's write path (with Redis an order's market is
  an in-process cache hit too), prom-client metrics and pino at \`info\`. GEO_TRUSTED_CIDRS empty, so
  every Check really does a GeoIP lookup, and jurisdiction tiers configured (BENCH_POLICY_ENV in
  bench/lib/authz-scenarios.ts): the client's country (GB) is close-only, so (a) is a close-only read
  and (c) an order carrying \`x-edge-access: close-only\` and \`x-edge-jurisdiction: GB\`. A shadow policy
  (\`SHADOW_CLOSE_ONLY_COUNTRIES\`, agreeing for GB) and the anonymizer rule (\`ANONYMIZER_DB\`, the test
  fixture's Anonymous IP layout, where the client has no record; orders and ingests look it up) are on too.
- The floor is a grpc-js server with proto-loader's standard service definition (full decode
  of every CheckRequest) returning an OK CheckResponse: the transport and framework alone.
- h2load sends one pre-framed body (5-byte gRPC prefix + CheckRequest bytes) with
  \`content-type: application/grpc\` and \`te: trailers\` to
  \`/envoy.service.auth.v3.Authorization/Check\`. It cannot vary the body, so (b) uses a
  node:http2 client (bench/lib/h2-client.ts) that sends a distinct pre-generated signed
  CheckRequest per call; the same client driving the floor shows it is not (b)'s bottleneck.
- Rounds are interleaved (floor, a, floor via node, b, c, floor, …) after a ${WARMUP_SECONDS} s warm-up
  of each, so drift on the machine hits every scenario alike.
`;
}
