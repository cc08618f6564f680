/**
 * `npm run bench:costly`: the TS process's CPU per request for each class of request, through the
 * whole edge (issue 26 "Costly requests bounded"): an ordinary read and order, and the costliest
 * requests the limits allow (docs/api.md "Limits": 64 KiB orders, flat and nested 32 levels; queries
 * naming 100 of the longest ids, each a page-cache miss) or refuse. Target: none costs more than 5×
 * the ordinary read.
 *
 * The stack is the e2e suite's (e2e/lib/stack.ts): real Envoy 1.40, the TS process
 * (authz/src/main.ts: ext_authz and the market service), a private redis-server, the demo mTLS
 * order backend. Every request comes through one trusted hop from 81.2.69.160 (GB, a record in the
 * default GeoIP database, not blocked), so every Check does a real GeoIP lookup; the rate limit is
 * local with a bucket no run empties. h2load drives each class over one HTTP/2 connection, one
 * request at a time (as issue 26's finding measured) and with 8 in flight (under load), the query
 * classes through a list of distinct URLs (h2load -i); interleaved rounds (the order reversed every
 * other round), medians. CPU from /proc/<pid>/stat (all threads), divided by the requests h2load
 * completed.
 *
 * Env: BENCH_ROUNDS (5), BENCH_SECONDS (3), BENCH_NO_DOCS=1 to leave docs/benchmarks.md alone,
 * BENCH_ONLY=<key>,… (or `--only <key>,…`) to run only those classes (and the ordinary read),
 * BENCH_AUTHZ_NODE_OPTIONS=… for the TS process's Node options (e.g. `--cpu-prof --cpu-prof-dir=<dir>`:
 * a profile written when the stack stops; `--trace-gc`).
 * Quickest check (~1 min): BENCH_NO_DOCS=1 BENCH_ROUNDS=1 BENCH_SECONDS=1 npm run bench:costly.
 */
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { loadConfig } from '../authz/src/common/config.ts';
import { LIMIT } from '../authz/src/common/rules.ts';
import { MARKETS_QUERY_SCHEMA } from '../authz/src/market/schemas.ts';
import { startStack, type Stack } from '../e2e/lib/stack.ts';
import { demoDocument, signedIngest } from '../scripts/edge-client.ts';
import { longestId, requestClasses, type RequestClass } from './lib/costly-requests.ts';
import { benchLog, envInt, machineLine, redisPid, today, workDir } from './lib/env.ts';
import { ensureH2load, runH2load } from './lib/h2load.ts';
import { writeBenchmarksSection } from './lib/markdown-section.ts';
import { cpuUsPerRequest, startCpuWindow } from './lib/proc.ts';
import { fmt, markdownTable, median, met, pairedMedian, percentile, sortedCopy } from './lib/stats.ts';

const ROUNDS = envInt('BENCH_ROUNDS', 5, 1);
const SECONDS = envInt('BENCH_SECONDS', 3, 1);
const WARMUP_SECONDS = 1.5;
/** Requests in flight: one at a time, and under load. */
const MODES = [1, 8] as const;
type Mode = (typeof MODES)[number];
/** The bound every class is held to, as a multiple of the ordinary read's TS CPU per request. */
const MAX_RATIO = 5;
const CLIENT_IP = '81.2.69.160';
const HEADING = '## Costly requests (TS CPU per request class)';
const log = benchLog('costly');

interface Sample {
  readonly round: number;
  readonly rps: number;
  readonly done: number;
  /** Answers with the expected status class. */
  readonly expected: number;
  readonly tsUs: number;
  readonly redisUs: number;
  readonly envoyUs: number;
  readonly p50: number;
  readonly p99: number;
  readonly busy: number;
  readonly steal: number;
}

const HEADERS = { 'x-forwarded-for': CLIENT_IP, 'user-agent': 'bench-costly/1', accept: 'application/json' };

async function ingestMarkets(stack: Stack, ids: readonly string[]): Promise<void> {
  // 8 at a time; an ingest refused 503 (Redis or the TS process too slow on a loaded machine) is
  // sent again, freshly signed, as the feed would, up to 5 times.
  let next = 0;
  await Promise.all(Array.from({ length: 8 }, async () => {
    for (let i = next++; i < ids.length; i = next++) {
      const id = ids[i]!;
      for (let attempt = 1; ; attempt++) {
        const s = signedIngest(demoDocument(id, 1), id, stack.hmacKey, stack.feedPrivateKey);
        const r = await fetch(`${stack.edgeUrl}/internal/ingest/market`, { method: 'POST', body: new Uint8Array(s.body), headers: { ...s.headers, 'x-forwarded-for': CLIENT_IP } });
        if (r.status === 200) break;
        if (r.status !== 503 || attempt === 5) throw new Error(`ingest ${id}: ${r.status} ${await r.text()}`);
        await r.text();
      }
    }
  }));
}

/** One request of each class through the edge: the expected status and code, and an order delivered whole. */
async function preflight(stack: Stack, classes: readonly RequestClass[]): Promise<void> {
  for (const c of classes) {
    const before = stack.backend.deliveries.length;
    const r = await fetch(`${stack.edgeUrl}${c.paths[0]}`, {
      method: c.body === undefined ? 'GET' : 'POST', headers: { ...HEADERS, ...(c.body === undefined ? {} : { 'content-type': 'application/json' }) },
      ...(c.body === undefined ? {} : { body: new Uint8Array(c.body) }),
    });
    const text = await r.text();
    const code = r.status >= 400 ? (JSON.parse(text) as { error: string }).error : undefined;
    if (r.status !== c.expect.status || code !== c.expect.code) throw new Error(`preflight ${c.key}: ${r.status} ${text.slice(0, 200)}`);
    if (c.body !== undefined && c.expect.status === 200) {
      const sent = Buffer.from((JSON.parse(c.body.toString()) as { payload: string }).payload, 'base64');
      if (stack.backend.deliveries.length !== before + 1 || !stack.backend.deliveries.at(-1)!.body.equals(sent)) throw new Error(`preflight ${c.key}: the backend did not get the payload`);
    }
  }
}

/** The class keys `--only a,b` (or `--only=a,b`) names, else BENCH_ONLY's; undefined: every class. */
function onlyClasses(argv: readonly string[], fromEnv: string | undefined): string[] | undefined {
  let value = fromEnv;
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i]!;
    if (a === '--only') value = argv[++i];
    else if (a.startsWith('--only=')) value = a.slice('--only='.length);
    else throw new Error(`bench:costly: unknown argument ${JSON.stringify(a)} (known: --only <class>,…)`);
  }
  if (value === undefined || value === '') return undefined;
  return value.split(',').map((k) => k.trim()).filter((k) => k !== '');
}

async function main(): Promise<void> {
  const only = onlyClasses(process.argv.slice(2), process.env['BENCH_ONLY']);
  const h2load = ensureH2load(log);
  if (h2load === undefined) throw new Error('h2load (Debian nghttp2-client) is required');
  const dir = workDir('costly');
  const nodeOptions = process.env['BENCH_AUTHZ_NODE_OPTIONS'];
  const env = {
    XFF_NUM_TRUSTED_HOPS: '1', GEO_TRUSTED_CIDRS: '', RATE_LIMIT_SCOPE: 'local', RPS_PER_IP: '1000000', RATE_BURST: '1000000',
    ...(nodeOptions === undefined || nodeOptions === '' ? {} : { NODE_OPTIONS: nodeOptions }),
  };
  log('starting the stack (Envoy, the TS process, Redis, the order backend)');
  const stack = await startStack({ env });
  /** By mode, then class key. */
  const samples = new Map<Mode, Map<string, Sample[]>>(MODES.map((m) => [m, new Map()]));
  let classes: RequestClass[] | undefined;
  try {
    const [envoyPid, tsPid] = stack.pids();
    const redis = redisPid(stack.redis.url);
    if (envoyPid === undefined || tsPid === undefined || redis === undefined) throw new Error('a process of the stack has no pid');
    // More than a page of the largest `limit`, so every such page is full.
    const maxLimit = MARKETS_QUERY_SCHEMA.properties.limit.maximum;
    const known = Array.from({ length: maxLimit + LIMIT.queryIds }, (_, i) => longestId(`m${i}`));
    log(`ingesting ${known.length} markets through the edge`);
    await ingestMarkets(stack, known);
    const config = loadConfig({ ...stack.env });
    classes = requestClasses({
      market: known[0]!, known, maxLimit, orderMaxBytes: config.orderMaxBytes, payloadMaxBytes: config.orderPayloadMaxBytes, distinctQueries: 3_000,
    });
    const all = classes;
    const unknown = only?.filter((k) => !all.some((c) => c.key === k)) ?? [];
    if (unknown.length > 0) throw new Error(`--only/BENCH_ONLY: no class ${unknown.join(', ')} (classes: ${classes.map((c) => c.key).join(', ')})`);
    classes = classes.filter((c, i) => i === 0 || only === undefined || only.includes(c.key));
    const files = new Map<string, { dataFile?: string; inputFile?: string }>();
    for (const c of classes) {
      const f: { dataFile?: string; inputFile?: string } = {};
      if (c.body !== undefined) writeFileSync(f.dataFile = join(dir, `${c.key}.json`), c.body);
      if (c.paths.length > 1) writeFileSync(f.inputFile = join(dir, `${c.key}.urls`), c.paths.map((p) => `${stack.edgeUrl}${p}`).join('\n'));
      files.set(c.key, f);
    }
    log('preflight');
    await preflight(stack, classes);

    const measure = async (c: RequestClass, mode: Mode, round: number, seconds: number): Promise<void> => {
      const window = startCpuWindow([tsPid, redis, envoyPid]);
      const r = await runH2load(h2load, {
        url: `${stack.edgeUrl}${c.paths[0]}`, ...files.get(c.key),
        headers: { ...HEADERS, ...(c.body === undefined ? {} : { 'content-type': 'application/json' }) },
        connections: 1, streamsPerConnection: mode, durationSeconds: seconds, logFile: join(dir, 'h2load.log'),
      });
      const cpu = window();
      // The demo backend keeps what it received; nothing here reads it after the preflight.
      stack.backend.deliveries.length = 0;
      const lat = sortedCopy(r.latenciesUs);
      const s: Sample = {
        round, rps: r.reqPerSec, done: r.done, expected: r.statusClasses[c.expect.status === 200 ? '2xx' : '4xx'],
        tsUs: cpuUsPerRequest(cpu, tsPid, r.done), redisUs: cpuUsPerRequest(cpu, redis, r.done), envoyUs: cpuUsPerRequest(cpu, envoyPid, r.done),
        p50: percentile(lat, 50), p99: percentile(lat, 99), busy: cpu.machineBusy, steal: cpu.machineSteal,
      };
      const byClass = samples.get(mode)!;
      if (round >= 0) byClass.set(c.key, [...(byClass.get(c.key) ?? []), s]);
      log(`${round < 0 ? 'warm-up' : `round ${round + 1}`} ×${mode} ${c.key.padEnd(12)} ${fmt(s.rps).padStart(6)} req/s  TS ${fmt(s.tsUs).padStart(5)} µs/req  `
        + `Redis ${fmt(s.redisUs).padStart(4)}  Envoy ${fmt(s.envoyUs).padStart(4)}  ${s.expected}/${s.done} ${c.expect.status}`);
    };
    for (const c of classes) await measure(c, 8, -1, WARMUP_SECONDS);
    for (let round = 0; round < ROUNDS; round++) {
      for (const mode of MODES) {
        for (const c of round % 2 === 0 ? classes : [...classes].reverse()) await measure(c, mode, round, SECONDS);
      }
    }
  } catch (err) {
    process.stderr.write(`--- last lines of the stack's log\n${stack.logs().trim().split('\n').slice(-20).join('\n')}\n`);
    throw err;
  } finally {
    await stack.stop();
  }
  if (classes === undefined) throw new Error('no request classes');
  const body = report(classes, samples, machineLine(h2load));
  process.stdout.write(`${HEADING}\n\n${body}\n`);
  if (writeBenchmarksSection(HEADING, body)) log(`wrote "${HEADING.slice(3)}" in docs/benchmarks.md`);
}

function report(classes: readonly RequestClass[], samples: ReadonlyMap<Mode, ReadonlyMap<string, readonly Sample[]>>, machine: string): string {
  const of = (c: RequestClass, m: Mode): readonly Sample[] => samples.get(m)?.get(c.key) ?? [];
  const ratio = (c: RequestClass, m: Mode): number => pairedMedian(of(c, m), of(classes[0]!, m), (x, y) => x.tsUs / y.tsUs);
  const med = (c: RequestClass, m: Mode, f: (s: Sample) => number): number => median(of(c, m).map(f));
  const rows = classes.map((c) => {
    const all = MODES.flatMap((m) => of(c, m));
    const answered = all.reduce((n, x) => n + x.expected, 0);
    const done = all.reduce((n, x) => n + x.done, 0);
    return [
      c.label, c.size, `${c.expect.status}${c.expect.code === undefined ? '' : ` \`${c.expect.code}\``} (${answered >= done ? 'all' : `${answered} of ${done}`})`,
      ...MODES.flatMap((m) => [fmt(med(c, m, (x) => x.tsUs)), `${fmt(ratio(c, m), 1)}×`]),
      fmt(med(c, 1, (x) => x.redisUs)), fmt(med(c, 1, (x) => x.envoyUs)), fmt(med(c, 8, (x) => x.rps)),
    ];
  });
  const bounded = classes.slice(1);
  const worst = (m: Mode, cs: readonly RequestClass[]): RequestClass => cs.reduce((w, c) => (ratio(c, m) > ratio(w, m) ? c : w), cs[0]!);
  const targetRow = (m: Mode): string[] => {
    const w = worst(m, bounded);
    const over = bounded.filter((c) => ratio(c, m) > MAX_RATIO).map((c) => `${c.key} ${fmt(ratio(c, m), 1)}×`);
    return [`${m === 1 ? 'one request at a time' : `${m} in flight`}`, `${fmt(ratio(w, m), 1)}× (${w.key})`, over.length === 0 ? 'none' : over.join(', '), met(over.length === 0)];
  };
  const rounds = MODES.flatMap((m) => of(classes[0]!, m).map((_, i) => [
    `${i + 1}, ×${m}`, ...classes.map((c) => fmt(of(c, m)[i]?.tsUs ?? NaN)),
    `${fmt(median(classes.map((c) => (of(c, m)[i]?.busy ?? NaN) * 100)))} %`, `${fmt(Math.max(...classes.map((c) => (of(c, m)[i]?.steal ?? 0) * 100)))} %`,
  ]));
  return `Run by \`npm run bench:costly\` (bench/costly.ts, bench/lib/costly-requests.ts) on ${today()}: ${machine}.
The whole edge as the e2e suite starts it (e2e/lib/stack.ts): real Envoy, the TS process (ext_authz and the market service; its
runtime settings, so the heap sizing it has in the pod: authz/src/common/runtime-env.ts),
a private redis-server, the demo mTLS order backend; every request from one trusted hop for 81.2.69.160 (a real GeoIP
lookup per Check), the local rate limit with a bucket no run empties. h2load over one HTTP/2 connection, one request at a time
(as issue 26's finding measured) and ${MODES[1]} in flight; ${ROUNDS} interleaved rounds of ${SECONDS} s per class and mode (the order reversed
every other round) after a ${WARMUP_SECONDS} s warm-up; medians. CPU from \`/proc/<pid>/stat\` (all threads) over each run, divided by
the requests h2load completed.

| Target: no class costs the TS process more than ${MAX_RATIO}× the ordinary read | Worst | Over ${MAX_RATIO}× | Met |
| --- | ---: | --- | --- |
${MODES.map((m) => `| ${targetRow(m).join(' | ')} |`).join('\n')}

${markdownTable(
    ['Class', 'Request', 'Answer', 'TS µs/req, 1 at a time', '× read', `TS µs/req, ${MODES[1]} in flight`, '× read', 'Redis µs/req (1)', 'Envoy µs/req (1)', `req/s (${MODES[1]})`],
    rows, ['l', 'r', 'l', 'r', 'r', 'r', 'r', 'r', 'r', 'r'],
  )}

- "× read" is the median over rounds of the class's TS CPU per request divided by the ordinary read's in the same round
  and mode. The TS process answers the Check of every request, and the market service for reads.
- Orders: the body is read by the order scanner (authz/src/common/json-scan.ts): checked as JSON in one pass (one table look-up
  a byte), nesting past ${LIMIT.orderJsonDepth} levels refused as soon as the scan reaches it, only the envelope's four members decoded. An allowed
  order's answer says where the payload lies in the body (the order-body filter decodes it from there), so the payload crosses once.
- Queries: ${LIMIT.queryIds} ids of 128 characters (a ~13 KB URL); each run's requests cycle through 3,000 distinct URLs, more than the page
  cache keeps, so every one reads Redis. A page of stored markets costs by its size (~1.6 KB a market here): \`idsKnown\` answers
  as much as \`limit=${LIMIT.queryIds}\` does, and \`pageMax\` is the largest page any client may ask for.

<details><summary>Per round and mode: TS CPU µs per request</summary>

${markdownTable(['Round', ...classes.map((c) => c.key), 'Machine busy', 'Steal (max)'], rounds, ['l', ...classes.map(() => 'r' as const), 'r', 'r'])}

Classes: ${classes.map((c) => `\`${c.key}\` ${c.label}`).join('; ')}.

</details>`;
}

await main();
