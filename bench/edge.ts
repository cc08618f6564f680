/**
 * `npm run bench:edge`: the data plane, five stacks side by side in one run against the same
 * upstreams (bench/lib/edge-stacks.ts): (1) bare Envoy, (2) the production filters with an
 * allow-all ext_authz (the floor), (3) the full edge with the real TS process, (3*) the same with
 * every request header sent to authz, (4) the full edge with the global rate limit (its bucket taken
 * in the ext_authz Check), (3u) the full edge over Unix domain sockets to the TS process, (3o) the
 * full edge with traces on (only when BENCH_STACKS names it), and the TLS
 * forms (1t), (2t), (3t) of (1), (2), (3) (bench/lib/edge-tls.ts: their report and the rate of new
 * TLS connections, measured each round). For reads
 * (`GET /v1/markets`, one market) and orders (`POST /v1/orders`, 256-byte payload to the mTLS
 * backend), in interleaved rounds: at saturation (req/s) and at a fixed 1,000 req/s (p50/p99); CPU
 * µs per request of every server process from /proc. Targets: (3) ≥ 90 % of (2)'s req/s; p99 added
 * by (3) over (1) ≤ 2 ms; (4) ≥ 80 % of (3)'s req/s; (3u) against (3): UDS is the default where it is faster.
 *
 * Load: h2load --h1 from 127.0.0.1, which GEO_TRUSTED_CIDRS (default 127.0.0.0/8) trusts, so geo
 * allows it without a GeoIP lookup; every request carries 7 browser-like headers.
 *
 * Env: BENCH_ROUNDS (4), BENCH_SECONDS (3), BENCH_NO_DOCS=1 to leave docs/benchmarks.md alone,
 * BENCH_MODES (`sat,fixed`; `sat`: saturation only, with BENCH_NO_DOCS=1), BENCH_STACKS (all; e.g.
 * `2,4,4-` or `3,3u`: only those are measured, (3) always started; the docs are then left alone, but
 * for `1t,2t,3t`, which rewrites the TLS section only), BENCH_TLS_CONNS (8 concurrent new-connection loops).
 * Quickest check (~35 s): BENCH_NO_DOCS=1 BENCH_ROUNDS=1 BENCH_SECONDS=1 npm run bench:edge.
 */
import { availableParallelism, loadavg } from 'node:os';
import { join } from 'node:path';
import { benchLog, envInt, machineLine, today, workDir } from './lib/env.ts';
import { bucketCalls, CLIENT_HEADERS, envoyErrors, failedOpenChecks, MARKETS_PATH, ORDERS_PATH, startEdge, type Edge, type Ep, type Stack } from './lib/edge-stacks.ts';
import { measureHandshakes, TLS_STACKS, tlsReport, type HandshakeSample } from './lib/edge-tls.ts';
import { ensureH2load, runH2load } from './lib/h2load.ts';
import { writeBenchmarksSection } from './lib/markdown-section.ts';
import { cpuUsPerRequest, startCpuWindow } from './lib/proc.ts';
import { fmt, markdownTable, median, met, pairedMedian, percentile, sortedCopy } from './lib/stats.ts';

// Even: the stack order is reversed every other round, so each order counts equally.
const ROUNDS = envInt('BENCH_ROUNDS', 4, 1);
const SECONDS = envInt('BENCH_SECONDS', 3, 1);
const SAT_CONNECTIONS = 16;
const FIXED = { connections: 10, rpsPerClient: 100 } as const;
/** Seconds of unmeasured fixed-rate load before each measured fixed-rate run (see measure()). */
const FIXED_PRELOAD_S = 0.5;
const EPS: readonly Ep[] = ['markets', 'orders'];
/** sat: saturation; fixed: 1,000 req/s. */
type Mode = 'sat' | 'fixed';
/** BENCH_MODES=sat runs saturation only (the fixed-rate runs cannot reach 1,000 req/s on a machine others load). */
const MODES: readonly Mode[] = (process.env['BENCH_MODES'] ?? 'sat,fixed').split(',').filter((m): m is Mode => m === 'sat' || m === 'fixed');

interface Sample {
  round: number; rps: number; ok: number; done: number; p50: number; p99: number;
  /** CPU µs per request of each server process, and of all of them. */
  envoyUs: number; authzUs: number; marketUs: number; backendUs: number; redisUs: number; totalUs: number;
  busy: number;
  /** Global-limit takes per Redis script call over the run (stack (4); NaN elsewhere). */
  perCall: number;
}
type Samples = Map<string, Sample[]>;
const key = (mode: Mode, s: Stack | Stack['name'], ep: Ep): string => `${mode}|${typeof s === 'string' ? s : s.name}|${ep}`;
const epNameOf = (ep: Ep, readBytes: number): string => (ep === 'markets' ? `\`GET ${MARKETS_PATH}\` (one market, ${readBytes} bytes)` : `\`POST ${ORDERS_PATH}\` (256-byte payload, mTLS backend)`);

async function main(): Promise<void> {
  const log = benchLog('edge');
  const h2load = ensureH2load(log);
  if (h2load === undefined) throw new Error('h2load (Debian nghttp2-client) is required');
  const dir = workDir('edge');
  const load0 = loadavg()[0] ?? 0;
  const edge = await startEdge(dir, log);
  try {
    const samples: Samples = new Map();
    const handshakes = new Map<Stack['name'], HandshakeSample[]>();
    const { floor, backend, redis } = edge.pids;
    const newConnections = async (s: Stack, round: number): Promise<void> => {
      const h = await measureHandshakes(s, { ca: edge.tlsCaFile ?? '', seconds: SECONDS, pids: [s.envoy.pid, s.tsPid, backend, floor, redis], path: MARKETS_PATH, headers: CLIENT_HEADERS, round });
      handshakes.set(s.name, [...(handshakes.get(s.name) ?? []), h]);
      log(`round ${round + 1} new TLS connections ${s.label}: ${fmt(h.cps)}/s, ${h.ok}/${h.done} 200, Envoy ${fmt(h.envoyUs)} µs/conn, client ${fmt(h.clientUs)} µs/conn, `
        + `Envoy handshakes ${h.handshakes}, resumed ${h.resumed}`);
    };
    const run = async (s: Stack, ep: Ep, mode: Mode, round: number): Promise<void> => {
      const sample = await measure(h2load, edge, dir, s, ep, mode, round);
      samples.set(key(mode, s, ep), [...(samples.get(key(mode, s, ep)) ?? []), sample]);
      log(`${round < 0 ? 'warm-up' : `round ${round + 1}`} ${mode} ${s.label} ${ep}: ${fmt(sample.rps)} req/s, ${sample.ok}/${sample.done} 2xx, `
        + `p50 ${fmt(sample.p50 / 1000, 2)} p99 ${fmt(sample.p99 / 1000, 2)} ms, total ${fmt(sample.totalUs)} µs/req`);
    };
    // Warm-up, then rounds: per request type and mode, every stack in turn, the order reversed every other round.
    const wanted = process.env['BENCH_STACKS']?.split(',');
    const measured = wanted === undefined ? edge.stacks : edge.stacks.filter((s) => wanted.includes(s.name));
    for (const s of measured) for (const ep of EPS) await run(s, ep, 'sat', -1);
    samples.clear();
    for (let round = 0; round < ROUNDS; round++) {
      const order = round % 2 === 0 ? measured : [...measured].reverse();
      for (const ep of EPS) for (const mode of MODES) for (const s of order) await run(s, ep, mode, round);
      for (const s of order) if (s.tls) await newConnections(s, round);
    }
    const errors: string[] = [];
    for (const s of edge.stacks) {
      const bad = await envoyErrors(s);
      log(`${s.label} Envoy error counters: ${bad.length === 0 ? 'none' : bad.join(', ')}`);
      if (bad.length > 0) errors.push(`${s.label}: ${bad.map((b) => `\`${b}\``).join(', ')}`);
    }
    const open = await failedOpenChecks(edge);
    log(`TS process: global limit answers without the bucket: ${open.length === 0 ? 'none' : open.join(', ')}`);
    if (open.length > 0) errors.push(`the TS process (global limit failed open): ${open.map((b) => `\`${b}\``).join(', ')}`);
    const wantedAll = wanted === undefined;
    if (measured.some((s) => !s.tls)) {
      const body = report(samples, edge, machineLine(h2load), errors);
      if (wantedAll) writeBenchmarksSection('## Edge data plane (Envoy)', body);
      process.stdout.write(`${body}\n`);
    }
    if (TLS_STACKS.every((n) => measured.some((s) => s.name === n))) {
      const tlsBody = tlsReport({
        all: (mode, name, ep) => samples.get(key(mode, name, ep)) ?? [], handshakes: (name) => handshakes.get(name) ?? [],
        stacks: measured, eps: EPS, epName: (ep) => epNameOf(ep, edge.readBytes), fixed: MODES.includes('fixed'), satConnections: SAT_CONNECTIONS,
        load: `${fmt(load0, 1)} at the start, ${fmt(loadavg()[0] ?? 0, 1)} at the end (1-minute average, ${availableParallelism()} vCPUs)`,
        busyMachine: Math.max(load0, loadavg()[0] ?? 0) >= availableParallelism(), machine: machineLine(h2load), rounds: ROUNDS, seconds: SECONDS, errors,
      });
      if (wantedAll || measured.every((s) => s.tls)) writeBenchmarksSection('## Edge data plane over TLS (Envoy)', tlsBody);
      process.stdout.write(`${tlsBody}\n`);
    }
  } finally {
    await edge.stop();
  }
}

/** One run of one stack, one request type, one mode; CPU of every server process over it. */
async function measure(h2load: string, edge: Edge, dir: string, s: Stack, ep: Ep, mode: Mode, round: number): Promise<Sample> {
  const { floor, backend, redis } = edge.pids;
  const ts = s.tsPid;
  const pids = [s.envoy.pid, ts, backend, floor, redis];
  const load = (seconds: number): ReturnType<typeof runH2load> => runH2load(h2load, {
    url: `${s.origin}${ep === 'markets' ? MARKETS_PATH : ORDERS_PATH}`,
    h1: true,
    ...(ep === 'orders' ? { dataFile: edge.orderFile } : {}),
    headers: ep === 'orders' ? { ...CLIENT_HEADERS, 'content-type': 'application/json' } : CLIENT_HEADERS,
    connections: mode === 'sat' ? SAT_CONNECTIONS : FIXED.connections, streamsPerConnection: 1, durationSeconds: Math.max(1, seconds),
    logFile: join(dir, 'h2load.log'),
    // Fixed rate: each connection paced at rpsPerClient, the connections opened 1 ms apart so their
    // timers interleave (a request every 1 ms, not bursts of `connections` every 10 ms).
    ...(mode === 'fixed' ? {
      rpsPerClient: FIXED.rpsPerClient, requests: Math.round(FIXED.connections * FIXED.rpsPerClient * seconds),
      connectionRate: { perPeriod: 1, period: `${1000 / (FIXED.connections * FIXED.rpsPerClient)}ms` },
    } : {}),
  });
  // Fixed rate measures the steady state: the stack sat idle while the others ran, long enough for
  // Envoy to close its market and backend connections (upstream idle_timeout 4 s), so the same
  // load runs FIXED_PRELOAD_S first, unmeasured, and the measured run starts on open connections.
  if (mode === 'fixed') await load(FIXED_PRELOAD_S);
  const global = s.name === '4' || s.name === '4-';
  const calls0 = global ? await bucketCalls(s) : undefined;
  const close = startCpuWindow(pids);
  const r = await load(SECONDS);
  const cpu = close();
  const calls1 = global ? await bucketCalls(s) : undefined;
  const perCall = calls0 && calls1 ? (calls1.takes - calls0.takes) / Math.max(1, calls1.calls - calls0.calls) : NaN;
  const per = (pid: number): number => cpuUsPerRequest(cpu, pid, r.done);
  const lat = sortedCopy(r.latenciesUs);
  return {
    round, rps: r.reqPerSec, ok: r.succeeded, done: r.done, p50: percentile(lat, 50), p99: percentile(lat, 99),
    envoyUs: per(s.envoy.pid),
    authzUs: s.authzPid === undefined ? 0 : per(s.authzPid),
    // (3), (3*), (4), (4−): one TS process does ext_authz *and* serves the market upstream: one figure.
    marketUs: s.authzPid === ts ? 0 : per(ts),
    backendUs: per(backend), redisUs: per(redis), totalUs: pids.reduce((a, p) => a + per(p), 0),
    busy: cpu.machineBusy, perCall,
  };
}

/** The docs section: targets, the two load tables, per-round inputs, what `minimal` buys, the method. */
function report(samples: Samples, edge: Edge, machine: string, errors: readonly string[]): string {
  // The TLS stacks have their own section (bench/lib/edge-tls.ts).
  const stacks = edge.stacks.filter((s) => !s.tls);
  const { readBytes } = edge;
  const all = (mode: Mode, s: Stack | Stack['name'], ep: Ep): Sample[] => samples.get(key(mode, s, ep)) ?? [];
  const med = (mode: Mode, s: Stack, ep: Ep, f: (x: Sample) => number): number => median(all(mode, s, ep).map(f));
  const paired = (mode: Mode, a: Stack['name'], b: Stack['name'], ep: Ep, f: (x: Sample, y: Sample) => number): number =>
    pairedMedian(all(mode, a, ep), all(mode, b, ep), f);
  const count = (list: readonly Sample[]): string => `${list.reduce((a, x) => a + x.ok, 0)}/${list.reduce((a, x) => a + x.done, 0)}`;
  const epName = (ep: Ep): string => epNameOf(ep, readBytes);
  const servesMarket = (s: Stack): boolean => s.authzPid === s.tsPid;
  const targets: string[][] = [];
  const satRows: string[][] = [];
  const fixedRows: string[][] = [];
  const headerRows: string[][] = [];
  for (const ep of EPS) {
    for (const s of stacks) {
      const us = (mode: Mode, f: (x: Sample) => number): string => fmt(med(mode, s, ep, f));
      satRows.push([epName(ep), s.label, us('sat', (x) => x.rps), us('sat', (x) => x.envoyUs), s.authzPid === undefined ? '–' : us('sat', (x) => x.authzUs),
        servesMarket(s) ? 'in authz' : us('sat', (x) => x.marketUs), us('sat', (x) => x.backendUs), us('sat', (x) => x.redisUs),
        us('sat', (x) => x.totalUs), count(all('sat', s, ep))]);
      fixedRows.push([epName(ep), s.label, us('fixed', (x) => x.rps), fmt(med('fixed', s, ep, (x) => x.p50) / 1000, 2), fmt(med('fixed', s, ep, (x) => x.p99) / 1000, 2),
        us('fixed', (x) => x.envoyUs), s.authzPid === undefined ? '–' : us('fixed', (x) => x.authzUs), us('fixed', (x) => x.totalUs), count(all('fixed', s, ep))]);
    }
    const ratio = paired('sat', '3', '2', ep, (x, y) => x.rps / y.rps);
    const capacity = paired('sat', '3', '2', ep, (x, y) => y.totalUs / x.totalUs);
    const addedP99 = paired('fixed', '3', '1', ep, (x, y) => x.p99 - y.p99) / 1000;
    const addedP99Floor = paired('fixed', '2', '1', ep, (x, y) => x.p99 - y.p99) / 1000;
    targets.push([epName(ep), '(3) ≥ 90 % of (2) req/s at saturation', `${fmt(ratio * 100)} % (by all servers' CPU per request: ${fmt(capacity * 100)} %)`, met(ratio >= 0.9)]);
    targets.push([epName(ep), 'p99 added by (3) over (1) at 1,000 req/s ≤ 2 ms', `${fmt(addedP99, 2)} ms (the floor (2) adds ${fmt(addedP99Floor, 2)} ms)`, met(addedP99 <= 2)]);
    // The global rate limit's price: (4) against (3) in the same round.
    const globalRatio = paired('sat', '4', '3', ep, (x, y) => x.rps / y.rps);
    const globalCpu = paired('sat', '4', '3', ep, (x, y) => x.totalUs - y.totalUs);
    const globalP99 = paired('fixed', '4', '3', ep, (x, y) => x.p99 - y.p99) / 1000;
    const perCall = (mode: Mode): string => fmt(median(all(mode, '4', ep).map((x) => x.perCall)), 1);
    targets.push([epName(ep), '(4) global rate limit ≥ 80 % of (3) req/s at saturation',
      `${fmt(globalRatio * 100)} % (+${fmt(globalCpu)} µs of all servers' CPU per request; p99 at 1,000 req/s ${globalP99 >= 0 ? '+' : ''}${fmt(globalP99, 2)} ms; `
      + `requests per Redis call ${perCall('sat')} at saturation, ${perCall('fixed')} at 1,000 req/s)`, met(globalRatio >= 0.8)]);
    // Issue 27: the global limit with token leases at ≥ 90 % of the floor; (4−), the same without leases, beside it.
    const floorRatio = (name: Stack['name']): number => paired('sat', name, '2', ep, (x, y) => x.rps / y.rps);
    const perCallOf = (name: Stack['name'], mode: Mode): string => fmt(median(all(mode, name, ep).map((x) => x.perCall)), 1);
    targets.push([epName(ep), '(4) global rate limit with leases ≥ 90 % of the floor (2) req/s at saturation',
      `${fmt(floorRatio('4') * 100)} % (without leases, (4−): ${fmt(floorRatio('4-') * 100)} %; requests per Redis call ${perCallOf('4', 'sat')} with leases, `
      + `${perCallOf('4-', 'sat')} without; all servers' CPU per request ${fmt(paired('sat', '4', '4-', ep, (x, y) => x.totalUs - y.totalUs), 1)} µs with leases vs without)`, met(floorRatio('4') >= 0.9)]);
    // Unix sockets against loopback TCP: (3u) against (3) in the same round (docs/envoy.md "Unix domain sockets").
    const udsRatio = paired('sat', '3u', '3', ep, (x, y) => x.rps / y.rps);
    const udsDiff = (mode: Mode, f: (x: Sample) => number): string => {
      const d = paired(mode, '3u', '3', ep, (x, y) => f(x) - f(y));
      return `${d >= 0 ? '+' : ''}${fmt(d, 1)}`;
    };
    const udsP99 = paired(MODES.includes('fixed') ? 'fixed' : 'sat', '3u', '3', ep, (x, y) => x.p99 - y.p99) / 1000;
    targets.push([epName(ep), '(3u) Unix sockets ≥ (3) loopback TCP req/s at saturation (UDS the default)',
      `${fmt(udsRatio * 100, 1)} %; CPU µs/req at saturation Envoy ${udsDiff('sat', (x) => x.envoyUs)}, TS process ${udsDiff('sat', (x) => x.authzUs)}, `
      + `all servers ${udsDiff('sat', (x) => x.totalUs)}; p99 ${MODES.includes('fixed') ? 'at 1,000 req/s' : 'at saturation'} ${udsP99 >= 0 ? '+' : ''}${fmt(udsP99, 2)} ms`, met(udsRatio >= 1)]);
    // Traces on at the default sampler (every request): (3o) against (3) in the same round (docs/operations.md "Traces").
    if (edge.stacks.some((s) => s.name === '3o')) {
      const tracedRatio = paired('sat', '3o', '3', ep, (x, y) => x.rps / y.rps);
      const tracedDiff = (f: (x: Sample) => number): string => {
        const d = paired('sat', '3o', '3', ep, (x, y) => f(x) - f(y));
        return `${d >= 0 ? '+' : ''}${fmt(d, 1)}`;
      };
      targets.push([epName(ep), '(3o) traces on (every request sampled): req/s against (3) at saturation (a cost to state, no target)',
        `${fmt(tracedRatio * 100, 1)} %; CPU µs/req Envoy ${tracedDiff((x) => x.envoyUs)}, TS process ${tracedDiff((x) => x.authzUs)}, all servers ${tracedDiff((x) => x.totalUs)} `
        + '(the receiver\'s own CPU not counted)', 'n/a']);
    }
    // What `allowedHeaders: minimal` buys over `all`: (3*) − (3) in the same round.
    for (const [mode, label] of [['fixed', 'at 1,000 req/s'], ['sat', 'at saturation']] as const) {
      const diff = (f: (x: Sample) => number): string => fmt(paired(mode, '3*', '3', ep, (x, y) => f(x) - f(y)), 1);
      headerRows.push([epName(ep), label, diff((x) => x.authzUs), diff((x) => x.envoyUs), diff((x) => x.totalUs),
        mode === 'sat'
          ? `req/s ${fmt(100 * paired(mode, '3', '3*', ep, (x, y) => x.rps / y.rps - 1), 1)} %`
          : `p99 ${fmt(paired(mode, '3*', '3', ep, (x, y) => x.p99 - y.p99) / 1000, 2)} ms`]);
    }
  }
  const busy = median(stacks.flatMap((s) => EPS.flatMap((ep) => all('sat', s, ep).map((x) => x.busy))));
  const perRound: string[][] = [];
  for (let round = 0; round < ROUNDS; round++) {
    perRound.push([String(round + 1), ...EPS.flatMap((ep) => {
      const at = (mode: Mode, name: Stack['name']): Sample | undefined => all(mode, name, ep).find((x) => x.round === round);
      const [s2, s3, s4, s4n, f1, f2, f3] = [at('sat', '2'), at('sat', '3'), at('sat', '4'), at('sat', '4-'), at('fixed', '1'), at('fixed', '2'), at('fixed', '3')];
      const ratio = (a: Sample | undefined, b: Sample | undefined): string => (a === undefined || b === undefined ? '–' : `${fmt(a.rps)} / ${fmt(b.rps)} = ${fmt((100 * a.rps) / b.rps)} %`);
      return [
        ratio(s3, s2), ratio(s4, s3), ratio(s4, s2), ratio(s4n, s2),
        f1 === undefined || f2 === undefined || f3 === undefined ? '–' : `${fmt(f1.p99 / 1000, 2)} / ${fmt(f2.p99 / 1000, 2)} / ${fmt(f3.p99 / 1000, 2)}`,
      ];
    })]);
  }
  const r = (n: number): ('l' | 'r')[] => ['l', 'l', ...Array<'r'>(n).fill('r')];

  return `Run by \`npm run bench:edge\` (bench/edge.ts) on ${today()}: ${machine},
Envoy 1.40.0 with \`--concurrency 1\` (one worker per Envoy; the load generator, Envoy, the TS process, Redis and the backend
share the 2 vCPUs). ${ROUNDS} interleaved rounds of ${SECONDS} s per cell after a warm-up; medians (ratios and differences are
taken within a round, then the median over rounds). CPU from \`/proc/<pid>/stat\` (all threads), divided by the requests of the run.

Load: h2load --h1 with keep-alive from 127.0.0.1, which the default \`GEO_TRUSTED_CIDRS\` (127.0.0.0/8) trusts, so geo
allows it without a GeoIP lookup; every request carries 7 browser-like headers (~560 bytes: user agent, cookie,
accept-*). \`RPS_PER_IP = RATE_BURST = 1000000\` for the run so the per-IP limiter runs on every request but never
throttles the load generator's single address (production defaults are far lower).

${markdownTable(['Endpoint', 'Target', 'Measured', 'Met'], targets)}

### At saturation (${SAT_CONNECTIONS} keep-alive connections), CPU µs per request

${markdownTable(['Request', 'Stack', 'req/s', 'Envoy', 'authz', 'market (TS)', 'backend', 'Redis', 'all servers', '2xx'], satRows, r(8))}

"authz" is bench/edge-floor-server.ts for (2) and the TS process for (3)/(3*), which also serves the market
upstream there (one process in production, so its column holds both; "market (TS)" of (1)/(2) is that same
process serving reads only). "all servers" adds every server process (not h2load). Machine busy during the
saturation runs: ${fmt(busy * 100)} % (median).

### Latency at a fixed 1,000 req/s (${FIXED.connections} connections × ${FIXED.rpsPerClient} req/s, staggered), CPU µs per request

${markdownTable(['Request', 'Stack', 'req/s', 'p50 ms', 'p99 ms', 'Envoy', 'authz', 'all servers', '2xx'], fixedRows, r(7))}

At 1,000 req/s every process wakes up for nearly every request, so CPU per request is higher than at
saturation, where each wake-up serves several.

<details><summary>Per round: the targets' inputs</summary>

${markdownTable(['Round', 'reads: req/s (3) / (2)', 'reads: req/s (4) / (3)', 'reads: req/s (4) / (2)', 'reads: req/s (4−) / (2)', 'reads: p99 ms (1) / (2) / (3) at 1,000 req/s',
    'orders: req/s (3) / (2)', 'orders: req/s (4) / (3)', 'orders: req/s (4) / (2)', 'orders: req/s (4−) / (2)', 'orders: p99 ms (1) / (2) / (3) at 1,000 req/s'], perRound, ['l', 'r', 'r', 'r', 'r', 'r', 'r', 'r', 'r', 'r', 'r'])}

</details>

### What \`allowedHeaders: 'minimal'\` (default) buys over \`'all'\` for the full edge

Cost with \`all\` minus cost with \`minimal\`, (3*) − (3) in the same round; positive = \`minimal\` is cheaper.

${markdownTable(['Request', 'Load', 'TS process µs/req', 'Envoy µs/req', 'all servers µs/req', 'throughput / p99 with minimal'], headerRows, r(4))}

With \`minimal\`, authz receives \`x-edge-client-ip\`, \`x-request-id\` (and \`content-type\` on orders) instead of every
header of the request (the browser-like ones, h2load's, Envoy's own \`x-forwarded-*\`).

- Stack (4) is (3) with \`RATE_LIMIT_SCOPE=global\` (the default with Redis; (2)–(3*) are rendered \`local\`): after
  the local bucket, the ext_authz Check to the same TS process takes the client's bucket on the same Redis (no
  ratelimit filter, no second gRPC call; docs/envoy.md §3). The Checks that arrive while a bucket call is at Redis go
  together as the next call (one Lua script for all of them, the same grants as one call each: authz/src/ratelimit/bucket.ts);
  "requests per Redis call" is the TS process's \`edge_ratelimit_decisions_total\` over \`edge_ratelimit_redis_calls_total\`
  during (4)'s runs. Every request here comes from one client address, as in every stack. The error counters below include
  any bucket answer that failed open (the TS process's \`edge_ratelimit_redis_errors_total\`/\`edge_ratelimit_late_total\`:
  it would flatter its throughput).
- Stack (3u) is (3) with \`AUTHZ_GRPC_SOCKET\` and \`MARKET_SOCKET\` set: Envoy's \`authz\` and \`market\` clusters are
  \`pipe\` endpoints on the same TS process, which listens on its TCP ports (for the other stacks) and on the sockets.
  Its row in the targets: req/s of (3u) over (3) and the CPU per request difference of each process, (3u) − (3) in
  the same round (negative: cheaper over the socket).
- Stack (1) is renderEnvoy's production bootstrap parsed back and stripped to the router filter
  (bench/lib/edge-stacks.ts \`bare()\`), so listener, routes, clusters, upstream TLS and the access log are identical;
  it forwards the order JSON as is (no order-body filter), the others send the decoded 256 bytes (the preflight checks
  both by the backend's SHA-256).
- Fixed rate: h2load \`--rps ${FIXED.rpsPerClient}\` on each of ${FIXED.connections} connections, opened 1 ms apart (\`-r 1 --rate-period 1ms\`)
  so a request starts every millisecond. Without the stagger all connections' timers fire together and
  the "constant" 1,000 req/s arrives as bursts of ${FIXED.connections} every 10 ms, which multiplies p50 several times over
  (measured: a 0.2 ms server showed p50 2.1 ms instead of 0.36 ms). Latency is measured from the actual send
  (no coordinated-omission correction); at 1,000 req/s no stack is near saturation.
- Each measured fixed-rate run follows ${FIXED_PRELOAD_S} s of the same load on the same stack, which is not measured.
  - Why: while the other stacks run, a stack sits idle for ~10 s. That is longer than the 4-s upstream
    \`idle_timeout\` of the market and backend clusters (kept below Node's 5-s keep-alive), so Envoy has closed
    those connections.
  - Without the pre-load, the first ~60 ms of each run reopened them, including the mTLS handshakes to the backend.
  - On 2026-11-22, that window held 0–15 order requests over the limit for (2)/(3) and none for (1). The target
    allows ~30 per run.
- The access log is formatted and written for every request, to /dev/null instead of stdout.
- Error counters after the run (Envoy's; the TS process's global-limit fail-opens): ${errors.length === 0 ? 'none' : errors.join('; ')}.`;
}

await main();
