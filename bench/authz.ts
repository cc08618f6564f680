/**
 * `npm run bench:authz`: the ext_authz Check service against a do-nothing grpc-js floor,
 * over real gRPC on loopback, side by side in one run.
 *
 *   1. In-process: the decision logic alone (decode → evaluate → encode) and its parts.
 *   2. Two child servers: bench/floor-server.ts (allow-all) and bench/authz-server.ts (the
 *      real core: GeoDatabase, Redis nonces, metrics, the real market store with the market
 *      ingested through the market service). Their CPU is read from /proc.
 *   3. Preflight: every scenario is decided as expected; a replayed nonce is denied.
 *   4. Warm-up, then latency at concurrency 1, then R interleaved rounds under load:
 *      floor, (a), floor via node client, (b), (c), floor, (a), …
 *   5. Medians → stdout and the "Authorization service" section of docs/benchmarks.md.
 *
 * Env: BENCH_ROUNDS (5), BENCH_SECONDS (3), REDIS_URL (redis://127.0.0.1:6379/0),
 * BENCH_NO_DOCS=1 to leave docs/benchmarks.md alone, BENCH_GENERATOR=node to drive every
 * scenario with the node:http2 client instead of h2load (what happens when h2load is missing).
 * Quickest check (~35 s): BENCH_NO_DOCS=1 BENCH_ROUNDS=1 BENCH_SECONDS=1 npm run bench:authz.
 */
import { randomBytes } from 'node:crypto';
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { withServiceRuntime } from '../authz/src/common/runtime-env.ts';
import { newFeedKey } from '../testkit/feed.ts';
import {
  anonymizerDbForBench, BENCH_POLICY_ENV, CHECK_PATH, geoGetRequest, ingestRequestFactory, marketIngestBody, orderRequest, type DecisionCount,
} from './lib/authz-scenarios.ts';
import { measureInProcess } from './lib/authz-inprocess.ts';
import { ms, pct, renderSection, summarize, type Key, type Report, type Run, type Summary } from './lib/authz-report.ts';
import { forkNode, type NodeChild } from './lib/child.ts';
import { benchLog, envInt, machineLine, redisPid, today, workDir } from './lib/env.ts';
import { checkResponseCode, frameGrpc } from './lib/grpc-wire.ts';
import { runHttp2Client } from './lib/h2-client.ts';
import { ensureH2load, runH2load } from './lib/h2load.ts';
import { writeBenchmarksSection } from './lib/markdown-section.ts';
import { startCpuWindow } from './lib/proc.ts';
import { fmt, percentile, sortedCopy } from './lib/stats.ts';

const ROOT = new URL('..', import.meta.url).pathname;
const HEADING = '## Authorization service (ext_authz Check)';

// Many short rounds rather than a few long ones: the median then shrugs off a run that caught
// a noisy neighbour or a server in its other batching/GC mode (see docs/benchmarks.md).
const ROUNDS = envInt('BENCH_ROUNDS', 5, 1);
const SECONDS = envInt('BENCH_SECONDS', 3, 1);
const WARMUP_SECONDS = 1.5;
const UNLOADED_SECONDS = 1.5;
/** Like Envoy's gRPC client: a few HTTP/2 connections, many streams multiplexed on each. */
const LOAD = { connections: 4, streams: 16 } as const;
const UNLOADED = { connections: 1, streams: 1 } as const;
const REDIS_URL = process.env['REDIS_URL'] ?? 'redis://127.0.0.1:6379/0';
/** Upper bound on ingests/s used to size each run's pool of one-time signed requests. */
const MAX_INGEST_RATE = 10_000;

const log = benchLog('authz');

type Concurrency = { readonly connections: number; readonly streams: number };

interface Scenario {
  readonly key: Key;
  readonly label: string;
  readonly server: NodeChild;
  readonly kind: 'floor' | 'authz';
  /** h2load with one body file, or the node:http2 client with a body per request. */
  readonly generator: 'h2load' | 'node';
  readonly dataFile?: string;
  /** For the node client: bodies for a run of `seconds` (fresh one-time nonces for (b)). */
  readonly bodies?: (seconds: number) => (i: number) => Buffer | undefined;
  /** Also charge this process's CPU (the Redis server) to the scenario. */
  readonly extraPid?: number;
}

interface Counts {
  total: number;
  allowed: number;
  denied: Record<string, number>;
}

async function serverCounts(s: Scenario): Promise<Counts> {
  if (s.kind === 'floor') {
    const { checks } = await s.server.call<{ checks: number }>('stats');
    return { total: checks, allowed: checks, denied: {} };
  }
  const rows = await s.server.call<DecisionCount[]>('stats');
  const c: Counts = { total: 0, allowed: 0, denied: {} };
  for (const r of rows) {
    c.total += r.value;
    if (r.outcome === 'allow') c.allowed += r.value;
    else c.denied[`${r.route}:${r.code}`] = r.value;
  }
  return c;
}

const classifyCheck = (m: Buffer): string => {
  const code = checkResponseCode(m);
  return code === 0 ? 'allow' : `deny(${code})`;
};

interface Driven {
  readonly ok: number;
  readonly failed: number;
  readonly elapsedSeconds: number;
  readonly latenciesUs: Float64Array;
  /** Allowed as seen by the client (node client only). */
  readonly clientAllowed: number | undefined;
}

async function drive(h2loadBin: string | undefined, s: Scenario, conc: Concurrency, seconds: number, scratch: string): Promise<Driven> {
  if (s.generator === 'h2load' && h2loadBin !== undefined && s.dataFile !== undefined) {
    const r = await runH2load(h2loadBin, {
      url: `http://127.0.0.1:${s.server.port}${CHECK_PATH}`,
      dataFile: s.dataFile,
      headers: { 'content-type': 'application/grpc', te: 'trailers' },
      connections: conc.connections,
      streamsPerConnection: conc.streams,
      durationSeconds: seconds,
      logFile: join(scratch, 'h2load.log'),
    });
    return { ok: r.succeeded, failed: r.failed + r.errored, elapsedSeconds: r.elapsedSeconds, latenciesUs: r.latenciesUs, clientAllowed: undefined };
  }
  if (s.bodies === undefined) throw new Error(`${s.key}: no bodies for the node client`);
  const r = await runHttp2Client({
    url: `http://127.0.0.1:${s.server.port}`,
    path: CHECK_PATH,
    connections: conc.connections,
    streamsPerConnection: conc.streams,
    durationMs: seconds * 1000,
    body: s.bodies(seconds),
    classify: classifyCheck,
  });
  if (r.exhausted) log(`${s.key}: ran out of pre-generated requests before ${seconds} s (rate above ${MAX_INGEST_RATE}/s?)`);
  return { ok: r.ok, failed: r.failed, elapsedSeconds: r.elapsedSeconds, latenciesUs: r.latenciesUs, clientAllowed: r.outcomes['allow'] ?? 0 };
}

async function measure(h2loadBin: string | undefined, s: Scenario, conc: Concurrency, seconds: number, scratch: string): Promise<Run> {
  const before = await serverCounts(s);
  const pids = s.extraPid === undefined ? [s.server.pid] : [s.server.pid, s.extraPid];
  const window = startCpuWindow(pids);
  const d = await drive(h2loadBin, s, conc, seconds, scratch);
  const cpu = window();
  const after = await serverCounts(s);
  // The server's own count is the denominator for CPU: every Check it decided in the window.
  const decided = after.total - before.total;
  const allowed = after.allowed - before.allowed;
  const denials: Record<string, number> = {};
  for (const [k, v] of Object.entries(after.denied)) {
    const n = v - (before.denied[k] ?? 0);
    if (n > 0) denials[k] = n;
  }
  const allowRate = decided > 0 ? allowed / decided : 0;
  const lat = sortedCopy(d.latenciesUs);
  const checksPerSec = d.ok / d.elapsedSeconds;
  const extra = s.extraPid === undefined ? undefined : cpu.cpuSeconds.get(s.extraPid);
  return {
    key: s.key,
    checksPerSec,
    // The node client classifies every response itself; for h2load, the server's counters decide.
    allowedPerSec: d.clientAllowed !== undefined ? d.clientAllowed / d.elapsedSeconds : checksPerSec * allowRate,
    allowRate,
    cpuUs: ((cpu.cpuSeconds.get(s.server.pid) ?? NaN) * 1e6) / decided,
    extraCpuUs: extra === undefined ? undefined : (extra * 1e6) / decided,
    p50Us: percentile(lat, 50),
    p99Us: percentile(lat, 99),
    failed: d.failed,
    denials,
    machineBusy: cpu.machineBusy,
    machineSteal: cpu.machineSteal,
  };
}

/** Sends `bodies` one at a time and returns the client-side outcomes. */
async function send(s: Scenario, bodies: readonly Buffer[]): Promise<Record<string, number>> {
  const r = await runHttp2Client({
    url: `http://127.0.0.1:${s.server.port}`, path: CHECK_PATH, connections: 1, streamsPerConnection: 1,
    durationMs: 10_000, body: (i) => bodies[i], classify: classifyCheck,
  });
  return r.failed > 0 ? { ...r.outcomes, failed: r.failed } : r.outcomes;
}

/** Every scenario is allowed; a replayed ingest is denied (so replays cannot pass as ingests). */
async function preflight(sc: Record<Key, Scenario>, a: Buffer, c: Buffer, framedIngests: (n: number) => Buffer[]): Promise<void> {
  const expect = (what: string, got: Record<string, number>, want: Record<string, number>): void => {
    if (JSON.stringify(got) !== JSON.stringify(want)) throw new Error(`preflight ${what}: expected ${JSON.stringify(want)}, got ${JSON.stringify(got)}`);
  };
  const b = framedIngests(5);
  expect('floor', await send(sc.floor, [a, a, a]), { allow: 3 });
  expect('(a)', await send(sc.a, [a, a, a]), { allow: 3 });
  expect('(c)', await send(sc.c, [c, c, c]), { allow: 3 });
  const before = await serverCounts(sc.b);
  expect('(b) fresh nonces', await send(sc.b, b), { allow: 5 });
  const replayed = await send(sc.b, b);
  if ((replayed['allow'] ?? 0) !== 0) throw new Error(`preflight (b): replayed nonces were allowed: ${JSON.stringify(replayed)}`);
  const after = await serverCounts(sc.b);
  const replays = (after.denied['ingest:ingest_replay'] ?? 0) - (before.denied['ingest:ingest_replay'] ?? 0);
  if (replays !== 5) throw new Error(`preflight (b): server counted ${replays} ingest_replay denials, expected 5`);
}

function versionOf(pkg: string): string {
  return (JSON.parse(readFileSync(join(ROOT, 'node_modules', pkg, 'package.json'), 'utf8')) as { version: string }).version;
}

/**
 * The five scenarios. (a), (c) and the floor send one fixed body (h2load); (b) needs a fresh
 * one-time nonce per request, so the node:http2 client sends a pool generated just before each
 * run; "floorNode" is the floor driven by that same client with ingest-sized bodies.
 */
function buildScenarios(o: {
  floor: NodeChild; authz: NodeChild; useH2load: boolean; scratch: string; a: Buffer; c: Buffer;
  framedIngests: (n: number) => Buffer[]; redisPid: number | undefined;
}): Record<Key, Scenario> {
  const viaH2load = o.useH2load ? 'h2load' : 'node';
  const floorIngestBodies = o.framedIngests(256);
  const constant = (buf: Buffer) => () => () => buf;
  const aFile = join(o.scratch, 'a.bin');
  const cFile = join(o.scratch, 'c.bin');
  writeFileSync(aFile, o.a);
  writeFileSync(cFile, o.c);
  return {
    floor: { key: 'floor', label: 'floor (allow-all grpc-js)', server: o.floor, kind: 'floor', generator: viaH2load, dataFile: aFile, bodies: constant(o.a) },
    a: { key: 'a', label: '(a) geo-only GET', server: o.authz, kind: 'authz', generator: viaH2load, dataFile: aFile, bodies: constant(o.a) },
    floorNode: {
      key: 'floorNode', label: 'floor, ingest-sized body', server: o.floor, kind: 'floor', generator: 'node',
      bodies: () => (i) => floorIngestBodies[i % floorIngestBodies.length],
    },
    b: {
      key: 'b', label: '(b) signed ingest', server: o.authz, kind: 'authz', generator: 'node', extraPid: o.redisPid,
      bodies: (seconds) => {
        const pool = o.framedIngests(Math.ceil(seconds * MAX_INGEST_RATE));
        return (i) => pool[i];
      },
    },
    c: { key: 'c', label: '(c) order', server: o.authz, kind: 'authz', generator: viaH2load, dataFile: cFile, bodies: constant(o.c) },
  };
}

async function main(): Promise<void> {
  log(`${ROUNDS} rounds × ${SECONDS} s, ${LOAD.connections}×${LOAD.streams} in flight`);
  const forceNode = process.env['BENCH_GENERATOR'] === 'node';
  const h2loadBin = forceNode ? undefined : ensureH2load(log);
  const generatorNote = h2loadBin !== undefined ? '' : forceNode
    ? 'BENCH_GENERATOR=node: the node:http2 client drove every scenario (no h2load).'
    : 'h2load was not available (apt-get failed), so the node:http2 client drove every scenario instead.';
  if (h2loadBin === undefined) log(generatorNote);
  // The shared Redis (ingest nonces); its CPU is charged to (b) when it runs on this machine.
  const redis = redisPid(REDIS_URL);
  const scratch = workDir('authz');
  const hmacKey = randomBytes(32);
  const feed = newFeedKey();
  const env = {
    ...BENCH_POLICY_ENV,
    ANONYMIZER_DB: anonymizerDbForBench().anonymizer,
    EDGE_INGEST_HMAC: `hex:${hmacKey.toString('hex')}`,
    EDGE_FEED_ED25519_PUBLIC_KEY: feed.publicHex,
    REDIS_URL,
  };
  const now = (): number => Math.floor(Date.now() / 1000);
  const aMsg = geoGetRequest();
  const cMsg = orderRequest(now());
  const ingests = (count: number): Buffer[] => ingestRequestFactory(hmacKey, feed, now())(count);
  const framedIngests = (count: number): Buffer[] => ingestRequestFactory(hmacKey, feed, now(), { framed: true })(count);
  const bSize = ingests(1)[0]?.length ?? 0;
  const a = frameGrpc(aMsg);
  const c = frameGrpc(cMsg);

  // The market (c) orders, as the feed signs it; stored in each core's market store before any Check.
  const market = marketIngestBody(feed, 1);
  const inproc = await measureInProcess({ env, redisUrl: REDIS_URL, geoGet: aMsg, order: cMsg, ingests, market }, log);

  log('starting floor and authz servers');
  const childEnv = { ...process.env, ...env };
  const floor = await forkNode(join(ROOT, 'bench/floor-server.ts'), { env: childEnv, logFile: join(scratch, 'floor.log') });
  const authz = await forkNode(join(ROOT, 'bench/authz-server.ts'), { env: withServiceRuntime(childEnv), logFile: join(scratch, 'authz.log') });
  try {
    await authz.call('ingest', market.toString('base64'));
    const sc = buildScenarios({ floor, authz, useH2load: h2loadBin !== undefined, scratch, a, c, framedIngests, redisPid: redis });
    const sequence: Key[] = ['floor', 'a', 'floorNode', 'b', 'c'];
    const scenarios = sequence.map((k) => sc[k]);

    log('preflight');
    await preflight(sc, a, c, framedIngests);

    log(`warm-up ${WARMUP_SECONDS} s each`);
    for (const s of scenarios) await measure(h2loadBin, s, LOAD, WARMUP_SECONDS, scratch);

    log(`latency at concurrency 1, ${UNLOADED_SECONDS} s each`);
    const unloaded = {} as Record<Key, Run>;
    for (const s of scenarios) unloaded[s.key] = await measure(h2loadBin, s, UNLOADED, UNLOADED_SECONDS, scratch);

    const runs: Record<Key, Run[]> = { floor: [], a: [], floorNode: [], b: [], c: [] };
    for (let round = 1; round <= ROUNDS; round++) {
      for (const s of scenarios) {
        const r = await measure(h2loadBin, s, LOAD, SECONDS, scratch);
        runs[s.key].push(r);
        const denied = Object.keys(r.denials).length > 0 ? ` denied ${JSON.stringify(r.denials)}` : '';
        log(`round ${round} ${s.key.padEnd(9)} ${fmt(r.checksPerSec).padStart(7)} Checks/s  ${fmt(r.cpuUs, 1).padStart(6)} µs CPU/Check  p99 ${ms(r.p99Us)} ms  allowed ${pct(r.allowRate)}${denied}${r.failed > 0 ? ` failed ${r.failed}` : ''}`);
      }
    }
    const loaded = Object.fromEntries(sequence.map((k) => [k, summarize(k, runs[k])])) as Record<Key, Summary>;

    const report: Report = {
      settings: { rounds: ROUNDS, seconds: SECONDS, warmupSeconds: WARMUP_SECONDS, unloadedSeconds: UNLOADED_SECONDS, load: LOAD },
      env: { date: today(), machine: machineLine(h2loadBin), grpcjs: versionOf('@grpc/grpc-js') },
      scenarios, loaded, unloaded, inproc,
      sizes: { a: aMsg.length, b: bSize, c: cMsg.length },
      generatorNote,
    };
    const section = renderSection(report);
    process.stdout.write(`${HEADING}\n${section}`);
    if (writeBenchmarksSection(HEADING, section)) log(`wrote "${HEADING.slice(3)}" in docs/benchmarks.md`);
  } catch (err) {
    for (const name of ['authz.log', 'floor.log']) {
      const text = readFileSync(join(scratch, name), 'utf8').trim().split('\n').slice(-20).join('\n');
      if (text !== '') process.stderr.write(`--- last lines of ${name}\n${text}\n`);
    }
    throw err;
  } finally {
    await Promise.all([floor.stop(), authz.stop()]);
  }
  log('done');
}

await main();
