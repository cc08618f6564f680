/**
 * `scripts/node bench/replica-wait.ts`: what REDIS_MIN_REPLICAS=1 costs an ingest's Redis writes
 * (docs/operations.md "Redis"). A master and one replica on loopback, both as production runs
 * them (append-only file, fsync on every write); one ingest's writes as the service makes them
 * (the nonce's SET NX, then the market store's compare-and-set script) through RedisNonceStore
 * and RedisMarketStore, with REDIS_MIN_REPLICAS=0 (the master's answer) and =1 (plus the shared
 * PUBLISH + WAIT barrier after each, on the write connection), in interleaved rounds:
 *   - one at a time: µs per ingest (p50, p99);
 *   - 64 at a time for BENCH_SECONDS: ingests/s, p50/p99, and WAIT barriers per write (group commit).
 * Writes its section of docs/benchmarks.md (BENCH_NO_DOCS=1: print only). Env: BENCH_ROUNDS (4),
 * BENCH_SEQUENTIAL (1000 ingests per round and setting), BENCH_SECONDS (3).
 */
import { spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import type { Redis } from 'ioredis';
import { createRedis, REDIS_COMMAND_TIMEOUT_MS } from '../authz/src/common/adapters/redis.ts';
import { RedisNonceStore } from '../authz/src/common/adapters/nonce-store.ts';
import { ReplicaWait } from '../authz/src/common/adapters/replica-wait.ts';
import { RedisMarketStore } from '../authz/src/market/redis-store.ts';
import { validateDocument, type MarketDocument } from '../authz/src/common/feed/schema.ts';
import type { Envelope } from '../authz/src/common/feed/envelope.ts';
import { envelopeFor, marketDoc, newFeedKey } from '../testkit/feed.ts';
import { freePort, PrivateRedis } from '../testkit/redis-server.ts';
import { replicationInfo } from '../testkit/sentinel.ts';
import { benchLog, envInt, machineLine, today } from './lib/env.ts';
import { writeBenchmarksSection } from './lib/markdown-section.ts';
import { fmt, markdownTable, median, percentile, sortedCopy } from './lib/stats.ts';

const ROUNDS = envInt('BENCH_ROUNDS', 4, 1);
const SEQUENTIAL = envInt('BENCH_SEQUENTIAL', 1000, 10);
const SECONDS = envInt('BENCH_SECONDS', 3, 1);
const WAIT_MS = 200;
const CONCURRENT_DOCS = 25_000 * SECONDS;
const log = benchLog('replicas');
const feed = newFeedKey();

interface Side { readonly name: string; readonly nonces: RedisNonceStore; readonly store: RedisMarketStore; readonly replicas: ReplicaWait | undefined; readonly conns: Redis[] }

function side(url: string, minReplicas: number): Side {
  const main = createRedis(url);
  if (minReplicas === 0) return { name: 'REDIS_MIN_REPLICAS=0', nonces: new RedisNonceStore(main), store: new RedisMarketStore(main, { cacheTtlMs: 0 }), replicas: undefined, conns: [main] };
  const writes = createRedis(url, { commandTimeout: REDIS_COMMAND_TIMEOUT_MS + WAIT_MS });
  const replicas = new ReplicaWait(writes, { minReplicas, waitMs: WAIT_MS });
  return {
    name: `REDIS_MIN_REPLICAS=${minReplicas}`, nonces: new RedisNonceStore(main, replicas), replicas, conns: [main, writes],
    store: new RedisMarketStore(main, { cacheTtlMs: 0, replicas, writeTimeoutMs: REDIS_COMMAND_TIMEOUT_MS + WAIT_MS }),
  };
}

/** Signed documents prepared ahead (Ed25519 signing is not what is measured). */
function documents(n: number): { document: MarketDocument; envelope: Envelope }[] {
  return Array.from({ length: n }, () => {
    const raw = marketDoc(`0xbench-${randomBytes(8).toString('hex')}`, 1);
    const r = validateDocument(raw);
    if (!r.ok) throw new Error('bad document');
    return { document: r.document, envelope: envelopeFor(raw, feed) as Envelope };
  });
}

/** One ingest's Redis writes; its duration in µs. */
async function ingest(s: Side, d: { document: MarketDocument; envelope: Envelope }): Promise<number> {
  const t0 = performance.now();
  if (await s.nonces.recordIfAbsent(randomBytes(16).toString('hex'), 600) !== 'recorded') throw new Error('replay?');
  if (await s.store.put(d.document, d.envelope) !== 'stored') throw new Error('not stored');
  return (performance.now() - t0) * 1000;
}

interface Sample { p50: number; p99: number; perSec?: number; barriersPerWrite?: number }

async function sequential(s: Side): Promise<Sample> {
  const docs = documents(SEQUENTIAL);
  const us: number[] = [];
  for (const d of docs) us.push(await ingest(s, d));
  const sorted = sortedCopy(us);
  return { p50: percentile(sorted, 50), p99: percentile(sorted, 99) };
}

async function concurrent(s: Side): Promise<Sample> {
  // Enough for the fastest setting (each document is stored once: a new market).
  const docs = documents(CONCURRENT_DOCS);
  const us: number[] = [];
  const barriers0 = s.replicas?.barriers ?? 0;
  const end = performance.now() + SECONDS * 1000;
  await Promise.all(Array.from({ length: 64 }, async () => {
    for (let d = docs.pop(); d !== undefined && performance.now() < end; d = docs.pop()) us.push(await ingest(s, d));
  }));
  if (docs.length === 0) throw new Error('BENCH: out of prepared documents; raise CONCURRENT_DOCS');
  const sorted = sortedCopy(us);
  const writes = 2 * us.length;
  return { p50: percentile(sorted, 50), p99: percentile(sorted, 99), perSec: us.length / SECONDS, ...(s.replicas === undefined ? {} : { barriersPerWrite: (s.replicas.barriers - barriers0) / writes }) };
}

const master = await PrivateRedis.start();
const replicaDir = mkdtempSync(join(tmpdir(), 'bench-replica-'));
const replicaPort = await freePort();
const replica = spawn('redis-server', ['--port', String(replicaPort), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'yes', '--appendfsync', 'always', '--dir', replicaDir, '--replicaof', '127.0.0.1', String(master.port)], { stdio: 'ignore' });
try {
  for (let t = 0; !/state=online/.test([...(await replicationInfo(master.port))?.values() ?? []].join(',')); t++) {
    if (t > 200) throw new Error('the replica did not come online');
    await sleep(50);
  }
  const sides = [side(master.url, 0), side(master.url, 1)];
  await sleep(300);
  const seq = new Map<string, Sample[]>(sides.map((s) => [s.name, []]));
  const con = new Map<string, Sample[]>(sides.map((s) => [s.name, []]));
  for (let r = 0; r < ROUNDS; r++) {
    for (const s of r % 2 === 0 ? sides : [...sides].reverse()) {
      seq.get(s.name)?.push(await sequential(s));
      con.get(s.name)?.push(await concurrent(s));
      log(`round ${r + 1}/${ROUNDS} ${s.name}: one at a time p50 ${fmt(seq.get(s.name)?.at(-1)?.p50 ?? NaN)} µs; 64 at a time ${fmt(con.get(s.name)?.at(-1)?.perSec ?? NaN)}/s`);
    }
  }
  const m = (xs: Sample[] | undefined, f: (x: Sample) => number | undefined): number => median((xs ?? []).map((x) => f(x) ?? NaN));
  const rows = sides.map((s) => [
    s.name,
    fmt(m(seq.get(s.name), (x) => x.p50)), fmt(m(seq.get(s.name), (x) => x.p99)),
    fmt(m(con.get(s.name), (x) => x.perSec)), fmt(m(con.get(s.name), (x) => x.p50)), fmt(m(con.get(s.name), (x) => x.p99)),
    s.replicas === undefined ? '–' : fmt(m(con.get(s.name), (x) => x.barriersPerWrite), 3),
  ]);
  const body = `Written by \`scripts/node bench/replica-wait.ts\` on ${today()}: ${ROUNDS} interleaved rounds, medians.
Machine: ${machineLine(undefined).replace(', h2load none', '')}.
Method: a master and one replica on loopback, both with \`appendonly yes\`, \`appendfsync always\`; one ingest's Redis writes
as the service makes them (RedisNonceStore: the nonce's \`SET NX\`; RedisMarketStore.put: the compare-and-set script), with
REDIS_MIN_REPLICAS=0 and =1 (each write then confirmed by the shared \`PUBLISH\` + \`WAIT 1 ${WAIT_MS}\` barrier on the write
connection; docs/operations.md "Redis"). One at a time: ${SEQUENTIAL} ingests per round; 64 at a time: ${SECONDS} s per round.
Through Envoy the same difference sits under the whole request's time (docs/reliability.md rows 9–11).

${markdownTable(
    ['setting', 'one at a time p50 µs', 'p99 µs', '64 at a time ingests/s', 'p50 µs', 'p99 µs', 'WAIT barriers per write'],
    rows, ['l', 'r', 'r', 'r', 'r', 'r', 'r'],
  )}
`;
  process.stdout.write(`${body}\n`);
  if (process.env['BENCH_NO_DOCS'] === undefined) writeBenchmarksSection('## Replica confirmations (REDIS_MIN_REPLICAS)', body);
  for (const s of sides) {
    await s.store.close();
    s.replicas?.close();
    for (const c of s.conns) c.disconnect();
  }
} finally {
  replica.kill('SIGKILL');
  await master.stop();
  rmSync(replicaDir, { recursive: true, force: true });
}
