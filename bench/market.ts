/**
 * `npm run bench:market`: GET /v1/markets?limit=100 and GET /v1/quotes?conditionId=<one>
 * against the market service directly (no Envoy), with 100 and with 100,000 markets stored,
 * side by side in one run: two service processes (bench/market-server.ts: createMarketService
 * over RedisMarketStore), each on its own private redis-server, filled through
 * RedisMarketStore.put (the production layout and Lua script). Interleaved rounds, medians.
 * Reports req/s, p50/p99 (h2load --h1, keep-alive) and CPU µs per request of the service and
 * of its redis-server (from /proc). Target: 100k / 100 ≥ 0.8 for both endpoints.
 *
 * Env: BENCH_ROUNDS (6), BENCH_SECONDS (3), BENCH_NO_DOCS=1 to leave docs/benchmarks.md alone.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { PrivateRedis } from '../authz/test/redis-server.ts';
import { forkNode, type NodeChild } from './lib/child.ts';
import { ensureH2load, runH2load } from './lib/h2load.ts';
import { envInt, machineLine, redisPid } from './lib/market-env.ts';
import { writeSection } from './lib/markdown-section.ts';
import { startCpuWindow } from './lib/proc.ts';
import { fmt, markdownTable, median, percentile, sortedCopy } from './lib/stats.ts';

// An even number of rounds: the two sizes alternate which goes first, and each order counts equally.
const ROUNDS = envInt('BENCH_ROUNDS', 6, 1);
const SECONDS = envInt('BENCH_SECONDS', 3, 1);
const CONNECTIONS = 8;
const SIZES = [100, 100_000] as const;
const ENDPOINTS = ['markets', 'quotes'] as const;
type Endpoint = (typeof ENDPOINTS)[number];
const t0 = performance.now();
const log = (m: string): void => void process.stderr.write(`[bench:market ${((performance.now() - t0) / 1000).toFixed(1).padStart(5)}s] ${m}\n`);
const dir = mkdtempSync(join(tmpdir(), 'bench-market-'));
process.once('exit', () => rmSync(dir, { recursive: true, force: true }));

const h2load = ensureH2load(log);
if (h2load === undefined) throw new Error('h2load (Debian nghttp2-client) is required');

interface Target { size: number; redis: PrivateRedis; redisPid: number; svc: NodeChild; oneId: string; bytes: Record<Endpoint, number> }
interface Sample { round: number; rps: number; p50: number; p99: number; svcUs: number; redisUs: number; ok: number; done: number; busy: number; steal: number }
const samples = new Map<string, Sample[]>();
const targets: Target[] = [];
const redises: PrivateRedis[] = [];
const pathOf = (ep: Endpoint, t: Target): string => (ep === 'markets' ? '/v1/markets?limit=100' : `/v1/quotes?conditionId=${t.oneId}`);
const key = (ep: Endpoint, size: number): string => `${ep}|${size}`;

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
    svcUs: ((cpu.cpuSeconds.get(t.svc.pid) ?? 0) * 1e6) / Math.max(1, r.done),
    redisUs: ((cpu.cpuSeconds.get(t.redisPid) ?? 0) * 1e6) / Math.max(1, r.done),
    busy: cpu.machineBusy, steal: cpu.machineSteal,
  }]);
  log(`${round < 0 ? 'warm-up ' : `round ${round + 1} `}${k}: ${fmt(r.reqPerSec)} req/s, ${r.succeeded}/${r.done} 2xx, p99 ${fmt(percentile(lat, 99) / 1000, 2)} ms`);
}

try {
  for (const size of SIZES) {
    const redis = await PrivateRedis.start();
    redises.push(redis);
    const start = (): Promise<NodeChild> => forkNode(fileURLToPath(new URL('./market-server.ts', import.meta.url)), {
      env: { ...process.env, REDIS_URL: redis.url }, logFile: join(dir, `svc-${size}.log`),
    });
    // Filled by a process of its own, so the measured service starts fresh (no heap left over from 100k writes).
    const filler = await start();
    const t1 = performance.now();
    const oneId = await filler.call<string>('fill', size);
    await filler.stop();
    log(`stored ${size.toLocaleString('en')} markets in ${fmt(performance.now() - t1)} ms`);
    const svc = await start();
    const t: Target = { size, redis, redisPid: redisPid(redis.port), svc, oneId, bytes: { markets: 0, quotes: 0 } };
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

const epLabel = (ep: Endpoint): string => (ep === 'markets' ? '`GET /v1/markets?limit=100`' : '`GET /v1/quotes?conditionId=<one>`');
const med = (k: string, f: (s: Sample) => number): number => median((samples.get(k) ?? []).map(f));
/** Median over rounds of (100k value / 100 value) in the same round. */
const pairedRatio = (ep: Endpoint, f: (s: Sample) => number): number => {
  const small = samples.get(key(ep, 100)) ?? [];
  return median((samples.get(key(ep, 100_000)) ?? []).flatMap((s) => {
    const o = small.find((x) => x.round === s.round);
    return o === undefined ? [] : [f(s) / f(o)];
  }));
};
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
  ratios.push([epLabel(ep), fmt(rps, 2), fmt(cpu, 2), rps >= 0.8 ? '**yes**' : '**no**']);
}
const perRound: string[][] = [];
for (let round = 0; round < ROUNDS; round++) {
  const cells = ENDPOINTS.flatMap((ep) => SIZES.map((size) => samples.get(key(ep, size))?.find((s) => s.round === round)));
  perRound.push([String(round + 1), ...cells.map((s) => (s === undefined ? '–' : `${fmt(s.rps)} / ${fmt(s.svcUs)} / ${fmt(s.redisUs)}`)),
    `${fmt(100 * median(cells.map((s) => s?.busy ?? NaN)))} %`, `${fmt(100 * Math.max(...cells.map((s) => s?.steal ?? 0)))} %`]);
}

const body = `Run by \`npm run bench:market\` (bench/market.ts) on ${new Date().toISOString().slice(0, 10)}: ${machineLine(h2load)}.
The market service alone (no Envoy): one service process per size (bench/market-server.ts:
\`createMarketService\` over \`RedisMarketStore\`, pino silent), each on its own private redis-server
filled through \`RedisMarketStore.put\` (the production key layout and write script) by a separate process.
h2load --h1, ${CONNECTIONS} keep-alive connections, ${ROUNDS} interleaved rounds of ${SECONDS} s per cell after a warm-up; medians.
CPU from \`/proc/<pid>/stat\` (all threads), divided by the requests of the run.

| Target: 100,000-market rate ≥ 0.8 × 100-market rate | req/s ratio | CPU ratio (capacity) | Met |
| --- | ---: | ---: | --- |
${ratios.map((r) => `| ${r.join(' | ')} |`).join('\n')}

${markdownTable(['Request', 'Markets stored', 'Response bytes', 'req/s', 'p50 ms', 'p99 ms', 'Service CPU µs/req', 'Redis CPU µs/req', '2xx'], rows, ['l', 'r', 'r', 'r', 'r', 'r', 'r', 'r', 'r'])}

- Ratios are the median over rounds of the 100,000-market cell divided by the 100-market cell of the
  same round; "CPU ratio" is the same for (service + Redis) CPU per request, inverted (capacity per core).
- A page is one Lua script on Redis (\`ZRANGE … BYLEX LIMIT\` + one \`HMGET\` per market), O(log N + limit),
  and the service concatenates records serialized at write time, so the cost does not grow with N.
- Records are ~1.4 KB each (two outcomes, a 600-byte envelope), so a 100-market page is ~137 KB and
  \`/v1/markets?limit=100\` is bound by moving those bytes: see "Where the time goes".
- p50/p99 are under saturation (${CONNECTIONS} requests in flight), so they include queueing.

<details><summary>Per round: req/s / service CPU µs per request / Redis CPU µs per request</summary>

${markdownTable(['Round', ...ENDPOINTS.flatMap((ep) => SIZES.map((s) => `${ep} @ ${s.toLocaleString('en')}`)), 'Machine busy', 'Steal (max)'], perRound, ['l', 'r', 'r', 'r', 'r', 'r', 'r'])}

</details>

### Where the time goes (\`/v1/markets?limit=100\`, measured separately on 2026-11-22)

Not re-measured by the script: a \`--cpu-prof\` profile of the 100-market service under the same load;
prototypes of the page handler in a separate process against the same Redis, side by side with the real
service (4 rounds of 2 s, medians); the Redis side of each read strategy with ioredis against a private
redis-server (100 markets, 8 calls in flight, Redis CPU from /proc).

| Where | Share / cost | Note |
| --- | ---: | --- |
| Service: \`Buffer.byteLength(body)\` on the page string (authz/src/marketdata/http.ts:50) | ~10 % of service CPU | walks the whole 137 KB string only to count bytes |
| Service: \`res.end(body)\` with a string: UTF-8 encoding + socket write, incl. the syscall (http.ts:51) | ~30 % | the string is encoded again on write |
| Service: building the page string (\`join\` + template, http.ts:178) | ~8 % | ioredis first decodes every record to a string |
| Service: garbage collection | ~15 % | the transient strings of every page (ioredis replies, the joined body) |
| Prototype: records as Buffers from Redis, \`Buffer.concat\`, \`res.end(buffer)\` | 558 vs 850, 533 vs 982 µs/page (two runs) | −35 to −45 % service CPU, the same bytes |
| Prototype: the page cached in process for 1 s (as \`cache-control: max-age=1\` allows) | 36 µs/page, Redis 0 | |
| Redis: the page Lua script (\`ZRANGE\` + 100 \`HMGET\` in Lua) | ~320 µs / page | 137 KB copied through Lua strings |
| Redis: \`ZRANGE BYLEX\` + one \`MGET\` of 100 string keys (two round trips) | ~55 µs / page | the same bytes without Lua |
| Redis: \`ZRANGE BYLEX\` alone | ~5 µs | the O(log N) part |`;

if (process.env['BENCH_NO_DOCS'] !== '1') {
  writeSection(fileURLToPath(new URL('../docs/benchmarks.md', import.meta.url)), '## Market data service', body, '# Benchmarks');
}
process.stdout.write(`${body}\n`);
