/**
 * npm run bench:capacity — the per-unit costs docs/capacity.md sizes the fleet and the pod from,
 * measured on real parts, and the section "## Measured unit costs" of docs/capacity.md written
 * from them (BENCH_NO_DOCS=1: print only).
 *
 * 1. Redis (a private redis-server on a free port, never the shared one): bytes per rate-limit
 *    bucket (an IPv4 client; an IPv6 client in a /48 of its own, i.e. its /64's bucket and its
 *    prefix's; IPv6 /64s sharing one /48) taken through the service's own RedisBuckets script, and
 *    per nonce through RedisNonceStore, from INFO memory's used_memory over N keys, at two N
 *    (the slope must not move), and MEMORY USAGE of one key.
 * 2. Envoy (the whole edge as the e2e suite starts it, e2e/lib/stack.ts: real Envoy 1.40, the TS
 *    service, the private Redis, the global limit in the Check; XFF_NUM_TRUSTED_HOPS=1): distinct
 *    clients, one request each (GET /v1/geoblock: the local stage, the Check with its global
 *    bucket, the market upstream), each from its own X-Forwarded-For address; Envoy's heap
 *    (admin /memory `allocated`) and RSS (/proc) at checkpoints up to BENCH_CAPACITY_V4 (default
 *    200,000) IPv4 clients, then BENCH_CAPACITY_V6 (default 100,000) IPv6 clients each in its own
 *    /48 (two descriptors each: the /64's and the prefix's). Over the same load: CPU µs per request
 *    per process (/proc) and Redis calls per request (INFO commandstats deltas / requests).
 */
import { Redis } from 'ioredis';
import { randomBytes } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { availableParallelism, cpus, loadavg } from 'node:os';
import { fileURLToPath } from 'node:url';
import { setTimeout as sleep } from 'node:timers/promises';
import { RedisNonceStore } from '../authz/src/common/adapters/nonce-store.ts';
import { clientKeys, RedisBuckets } from '../authz/src/ratelimit/bucket.ts';
import { PrivateRedis } from '../testkit/redis-server.ts';
import { startStack, type Stack } from '../e2e/lib/stack.ts';
import { LOCAL_RATE_LIMIT_DESCRIPTOR_CAP, type RenderOptions } from '../envoy/render.ts';
import { writeSection } from './lib/markdown-section.ts';
import { pipelinedLoad, type StatusCounts } from './lib/pipelined-load.ts';
import { processCpuSeconds, startCpuWindow } from './lib/proc.ts';

/** Distinct clients whose requests are Checked for the CPU and Redis figures (part 1). */
const COST_CLIENTS = 10_000;
/** Commands Redis counts in INFO commandstats that the bucket script runs inside EVALSHA (not round trips). */
const SCRIPT_INTERNAL = new Set(['get', 'set', 'time']);
const LABEL = {
  v4Checked: 'IPv4 clients, Checked',
  v4: 'IPv4 clients, TS stopped',
  v6: 'IPv6 clients each in its own /48, TS stopped',
} as const;

export const CAPACITY_DOC = fileURLToPath(new URL('../docs/capacity.md', import.meta.url));
const HEADING = '## Measured unit costs';

const log = (s: string): void => { process.stderr.write(`bench:capacity: ${s}\n`); };
const int = (name: string, def: number): number => {
  const v = process.env[name];
  return v === undefined || v === '' ? def : Number(v);
};
const fmt = (n: number, digits = 0): string => n.toLocaleString('en-US', { maximumFractionDigits: digits, minimumFractionDigits: digits });

async function usedMemory(r: Redis): Promise<number> {
  const info = await r.info('memory');
  return Number(/used_memory:(\d+)/.exec(info)?.[1]);
}

async function commandCalls(r: Redis): Promise<Record<string, number>> {
  const info = await r.info('commandstats');
  const out: Record<string, number> = {};
  for (const m of info.matchAll(/cmdstat_([^:]+):calls=(\d+)/g)) out[m[1]!] = Number(m[2]);
  return out;
}

const v4 = (i: number): string => `11.${(i >> 16) & 255}.${(i >> 8) & 255}.${i & 255}`;
/** IPv6 client i in a /48 of its own (2a00:<hi>:<lo>::/48). */
const v6Own48 = (i: number): string => `2a00:${((i >>> 16) & 0xffff).toString(16)}:${(i & 0xffff).toString(16)}::1`;
/** IPv6 client i, a /64 of its own, 65,536 of them per /48. */
const v6Shared48 = (i: number): string => `2a01:${((i >>> 16) & 0xffff).toString(16)}:0:${(i & 0xffff).toString(16)}::1`;

interface RedisRow { readonly what: string; readonly keysPerUnit: number; readonly perUnit: readonly { n: number; bytes: number }[]; readonly memoryUsage: number }

/** Bytes per unit in Redis: used_memory before and after `n` units (after a FLUSHALL of the private server). */
async function redisUnits(r: Redis, what: string, ns: readonly number[], fill: (from: number, to: number) => Promise<void>, sampleKey: () => Promise<string>): Promise<RedisRow> {
  const perUnit: { n: number; bytes: number }[] = [];
  let memoryUsage = 0;
  for (const n of ns) {
    await r.flushall();
    const before = await usedMemory(r);
    const chunk = 2_000;
    for (let from = 0; from < n; from += chunk) await fill(from, Math.min(n, from + chunk));
    const after = await usedMemory(r);
    const keys = await r.dbsize();
    perUnit.push({ n, bytes: (after - before) / n });
    memoryUsage = Number(await r.call('MEMORY', 'USAGE', await sampleKey()));
    log(`redis ${what}: n=${n} keys=${keys} ${((after - before) / n).toFixed(1)} B per unit`);
  }
  await r.flushall();
  return { what, keysPerUnit: 0, perUnit, memoryUsage };
}

async function measureRedis(ns: readonly number[]): Promise<{ rows: RedisRow[]; version: string }> {
  const server = await PrivateRedis.start();
  const r = new Redis(server.url, { enableAutoPipelining: false, maxRetriesPerRequest: 1 });
  const conns: Redis[] = [r];
  try {
    const version = /redis_version:(\S+)/.exec(await r.info('server'))?.[1] ?? '?';
    // A rate so slow that no key expires during the measurement; the value (a TAT in µs) has the
    // same width as a real one, so the encoding is the same.
    const limits = { rpsPerIp: 0.0001, rateBurst: 40, ratePrefixV6: 48, rpsPerPrefix: 0.0005, prefixBurst: 200 };
    const bucketConn = new Redis(server.url, { enableAutoPipelining: false, maxRetriesPerRequest: 1 });
    const buckets = new RedisBuckets(bucketConn, limits);
    // /64s sharing a /48: a prefix bucket that never runs dry (a refused take writes no key).
    const sharedConn = new Redis(server.url, { enableAutoPipelining: false, maxRetriesPerRequest: 1 });
    const sharedBuckets = new RedisBuckets(sharedConn, { ...limits, prefixBurst: 10_000_000 });
    conns.push(bucketConn, sharedConn);
    const keysOf = clientKeys(48);
    const takeAll = async (addr: (i: number) => string, from: number, to: number, b = buckets): Promise<void> => {
      const takes: Promise<unknown>[] = [];
      for (let i = from; i < to; i++) {
        const k = keysOf(addr(i))!;
        takes.push(b.take(k.client, 1, k.prefix));
      }
      await Promise.all(takes);
    };
    const nonces = new RedisNonceStore(r);
    const rows = [
      await redisUnits(r, 'rate-limit bucket, IPv4 client (`edge:rl:<IPv4>`)', ns, (a, b) => takeAll(v4, a, b), async () => `edge:rl:${v4(0)}`),
      await redisUnits(r, 'rate-limit buckets, IPv6 client in a /48 of its own (its /64 and its /48: two keys)', ns, (a, b) => takeAll(v6Own48, a, b),
        async () => `edge:rl:${keysOf(v6Own48(0))!.client}`),
      await redisUnits(r, 'rate-limit bucket, IPv6 /64 sharing its /48 (one key; the prefix key is shared)', ns, (a, b) => takeAll(v6Shared48, a, b, sharedBuckets),
        async () => `edge:rl:${keysOf(v6Shared48(0))!.client}`),
      await redisUnits(r, 'nonce, 32 hex digits (`SET edge:nonce:<nonce> 1 EX 600 NX`)', ns, async (a, b) => {
        await Promise.all(Array.from({ length: b - a }, () => nonces.recordIfAbsent(randomBytes(16).toString('hex'), 600)));
      }, async () => (await r.keys('edge:nonce:*'))[0] ?? ''),
    ];
    return { rows, version };
  } finally {
    for (const c of conns) c.disconnect();
    await server.stop();
  }
}

interface EnvoySample { readonly label: string; readonly clients: number; readonly allocated: number; readonly heap: number; readonly rss: number }
interface LoadCost { readonly requests: number; readonly seconds: number; readonly cpuUs: Record<string, number>; readonly redisCallsPerRequest: number; readonly redisCommands: Record<string, number>; readonly statuses: StatusCounts; readonly machineBusy: number; readonly envoyUsNewClient: number; readonly loadAverage: number }

function rssBytes(pid: number): number {
  const m = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
  return Number(m?.[1]) * 1024;
}

async function envoyMemory(admin: string): Promise<{ allocated: number; heap: number }> {
  const j = await (await fetch(`${admin}/memory`)).json() as Record<string, string>;
  return { allocated: Number(j['allocated']), heap: Number(j['heap_size']) };
}

async function measureEnvoy(v4Max: number, v6Max: number): Promise<{ samples: EnvoySample[]; cost: LoadCost; concurrency: number }> {
  // The LRUs above every checkpoint, so each client keeps its descriptors (the shipped cap is measured by measureCap).
  const stack = await startStackRetrying({ maxDynamicDescriptors: 1_000_000 });
  try {
    const pid = stack.envoyPid()!;
    const authzPid = stack.pids().find((p) => p !== pid)!;
    const redis = new Redis(stack.redis.url, { enableAutoPipelining: false });
    const redisPid = Number(/process_id:(\d+)/.exec(await redis.info('server'))?.[1]);
    const port = Number(new URL(stack.edgeUrl).port);
    const load = (client: (i: number) => string, from: number, to: number): Promise<StatusCounts> =>
      pipelinedLoad({ host: '127.0.0.1', port, path: '/v1/geoblock', client, from, to, connections: 8, window: 32 });
    // Warm-up: 2,000 clients from a range the checkpoints never use (every code path, tcmalloc's caches).
    await load((i) => `12.0.${i >> 8}.${i & 255}`, 0, 2_000);
    await sleep(1000);
    const samples: EnvoySample[] = [];
    const sample = async (label: string, clients: number): Promise<void> => {
      await sleep(500);
      const m = await envoyMemory(stack.envoyAdmin);
      samples.push({ label, clients, ...m, rss: rssBytes(pid) });
      log(`envoy ${label} ${clients}: allocated ${(m.allocated / 1e6).toFixed(1)} MB, RSS ${(rssBytes(pid) / 1e6).toFixed(1)} MB`);
    };
    const statuses: StatusCounts = {};
    const add = (c: StatusCounts): void => { for (const [k, v] of Object.entries(c)) statuses[Number(k)] = (statuses[Number(k)] ?? 0) + v; };
    // Part 1, the TS service up: every request is Checked (the global bucket in Redis); the CPU
    // per request and Redis's commands are taken over this part only.
    const pids = { envoy: pid, 'TS (authz + market)': authzPid, redis: redisPid };
    const costClients = Math.min(v4Max, COST_CLIENTS);
    await sample(LABEL.v4Checked, 0);
    const cmd0 = await commandCalls(redis);
    const window = startCpuWindow([pid, authzPid, redisPid]);
    add(await load(v4, 0, costClients));
    const cpu = window();
    const loadAverage = loadavg()[0] ?? 0;
    const cmd1 = await commandCalls(redis);
    await sample(LABEL.v4Checked, costClients);
    // Part 2, the TS service stopped: the Check fails at once (503, ext_authz_error) after the
    // local stage has taken the client's descriptor, so Envoy's descriptors fill at Envoy's pace
    // on a shared machine. The slopes are taken within a part, never across the stop.
    await stack.killAuthz();
    await sleep(1000);
    let done = costClients;
    await sample(LABEL.v4, done);
    const envoyCpu0 = processCpuSeconds(pid);
    for (const n of [100_000, 200_000, 500_000, 1_000_000].filter((x) => x > done && x <= v4Max)) {
      add(await load(v4, done, n)); done = n; await sample(LABEL.v4, n);
    }
    // Envoy's CPU for a request that takes a new descriptor and is answered at once (the Check
    // fails: no TS service): the cheapest way to add clients to the LRU.
    const envoyUsNewClient = done > costClients ? ((processCpuSeconds(pid) - envoyCpu0) / (done - costClients)) * 1e6 : NaN;
    let v6Done = 0;
    await sample(LABEL.v6, 0);
    for (const n of [10_000, 100_000, 200_000].filter((x) => x <= v6Max)) {
      add(await load(v6Own48, v6Done, n)); v6Done = n; await sample(LABEL.v6, n);
    }
    const requests = costClients;
    const redisCommands: Record<string, number> = {};
    for (const [k, v] of Object.entries(cmd1)) if (v - (cmd0[k] ?? 0) > 0 && k !== 'info') redisCommands[k] = v - (cmd0[k] ?? 0);
    const calls = Object.entries(redisCommands).filter(([k]) => !SCRIPT_INTERNAL.has(k)).reduce((a, [, v]) => a + v, 0);
    const cpuUs: Record<string, number> = {};
    for (const [name, p] of Object.entries(pids)) cpuUs[name] = ((cpu.cpuSeconds.get(p) ?? 0) / requests) * 1e6;
    redis.disconnect();
    return { samples, cost: { requests, seconds: cpu.wallSeconds, cpuUs, redisCallsPerRequest: calls / requests, redisCommands, statuses, machineBusy: cpu.machineBusy, envoyUsNewClient, loadAverage }, concurrency: 2 };
  } finally {
    await stack.stop();
  }
}

/** startStack, tried up to four times: on a loaded machine the TS service may miss the stack's start-up deadline. */
async function startStackRetrying(render: Omit<RenderOptions, 'sdsPath'>): Promise<Stack> {
  const opts = { env: { XFF_NUM_TRUSTED_HOPS: '1', LOG_LEVEL: 'warn', LOG_DECISIONS: 'off' }, render, startTimeoutMs: 60_000 };
  for (let attempt = 1; ; attempt++) {
    try {
      return await startStack(opts);
    } catch (err) {
      if (attempt === 4) throw err;
      log(`the stack did not start (${String(err).slice(0, 80)}); again`);
    }
  }
}

/**
 * The shipped cap (LOCAL_RATE_LIMIT_DESCRIPTOR_CAP) holds: Envoy's heap after `cap` IPv4 clients
 * and after twice as many (the TS service stopped, as in part 2).
 */
async function measureCap(): Promise<EnvoySample[]> {
  const cap = LOCAL_RATE_LIMIT_DESCRIPTOR_CAP;
  const stack = await startStackRetrying({});
  try {
    const pid = stack.envoyPid()!;
    const port = Number(new URL(stack.edgeUrl).port);
    await stack.killAuthz();
    const samples: EnvoySample[] = [];
    const label = `IPv4 clients, shipped cap ${fmt(cap)}, TS stopped`;
    let done = 0;
    for (const n of [cap / 2, cap, 2 * cap]) {
      await pipelinedLoad({ host: '127.0.0.1', port, path: '/v1/geoblock', client: v4, from: done, to: n, connections: 8, window: 32 });
      done = n;
      await sleep(500);
      const m = await envoyMemory(stack.envoyAdmin);
      samples.push({ label, clients: n, ...m, rss: rssBytes(pid) });
      log(`envoy ${label} ${n}: allocated ${(m.allocated / 1e6).toFixed(1)} MB, RSS ${(rssBytes(pid) / 1e6).toFixed(1)} MB`);
    }
    return samples;
  } finally {
    await stack.stop();
  }
}

/** Bytes per client between two samples of one kind. */
function slopes(samples: readonly EnvoySample[]): { label: string; from: number; to: number; allocated: number; rss: number }[] {
  const out: { label: string; from: number; to: number; allocated: number; rss: number }[] = [];
  for (let i = 1; i < samples.length; i++) {
    const a = samples[i - 1]!;
    const b = samples[i]!;
    if (a.label !== b.label || b.clients === a.clients) continue;
    const n = b.clients - a.clients;
    out.push({ label: b.label, from: a.clients, to: b.clients, allocated: (b.allocated - a.allocated) / n, rss: (b.rss - a.rss) / n });
  }
  return out;
}

function report(redis: { rows: RedisRow[]; version: string }, envoy: { samples: EnvoySample[]; cost: LoadCost }, capped: readonly EnvoySample[], ns: readonly number[]): string {
  const date = new Date().toISOString().slice(0, 10);
  const cpu = cpus()[0]?.model.trim() ?? 'unknown CPU';
  const lines: string[] = [];
  lines.push(`Written by \`npm run bench:capacity\` (bench/capacity.ts) on ${date}: ${cpu}, ${availableParallelism()} vCPUs (shared with other agents' work while it ran), Node ${process.versions.node}, Redis ${redis.version}, Envoy 1.40.0.`);
  lines.push('');
  lines.push('### Redis: bytes per key');
  lines.push('');
  lines.push(`A private redis-server on a free port; the keys written by the service's own code (RedisBuckets' script, RedisNonceStore), \`INFO memory\` \`used_memory\` before and after N units (the slope across the two N must not move), and \`MEMORY USAGE\` of one key (the key's own allocation, without the keyspace's dictionary and expiry entries).`);
  lines.push('');
  lines.push(`| unit | ${ns.map((n) => `bytes per unit, N = ${fmt(n)}`).join(' | ')} | MEMORY USAGE of one key |`);
  lines.push(`| --- | ${ns.map(() => '---:').join(' | ')} | ---: |`);
  for (const r of redis.rows) lines.push(`| ${r.what} | ${r.perUnit.map((p) => fmt(p.bytes, 1)).join(' | ')} | ${fmt(r.memoryUsage)} |`);
  lines.push('');
  lines.push('### Envoy: bytes per local-limit descriptor');
  lines.push('');
  lines.push(`The whole edge as the e2e suite starts it (e2e/lib/stack.ts: Envoy \`--concurrency 2\`, the TS service, a private Redis, the global limit in the Check), \`XFF_NUM_TRUSTED_HOPS=1\`; each client sends one \`GET /v1/geoblock\` with its address as the only X-Forwarded-For entry (8 keep-alive connections, 32 pipelined requests each), so each adds one entry to the IPv4 LRU, or for IPv6 in a /48 of its own, one to the /64 LRU and one to the prefix LRU. Heap is admin \`/memory\` \`allocated\` (what tcmalloc handed out), RSS from \`/proc/<pid>/status\`, 0.5 s after each step; the first row is after a warm-up of 2,000 other clients.`);
  lines.push('');
  lines.push('| clients | heap allocated MB | heap size MB | RSS MB |');
  lines.push('| --- | ---: | ---: | ---: |');
  for (const s of envoy.samples) lines.push(`| ${fmt(s.clients)} ${s.label} | ${fmt(s.allocated / 1e6, 1)} | ${fmt(s.heap / 1e6, 1)} | ${fmt(s.rss / 1e6, 1)} |`);
  lines.push('');
  lines.push('| step | heap bytes per client | RSS bytes per client |');
  lines.push('| --- | ---: | ---: |');
  for (const s of slopes(envoy.samples)) lines.push(`| ${s.label}: ${fmt(s.from)} → ${fmt(s.to)} | ${fmt(s.allocated)} | ${fmt(s.rss)} |`);
  lines.push('');
  lines.push(`With the shipped cap (\`max_dynamic_descriptors: ${fmt(LOCAL_RATE_LIMIT_DESCRIPTOR_CAP)}\`, envoy/render/budget.ts), a stack of its own: the LRU evicts past the cap, so the heap stops growing there.`);
  lines.push('');
  lines.push('| clients | heap allocated MB | RSS MB |');
  lines.push('| --- | ---: | ---: |');
  for (const s of capped) lines.push(`| ${fmt(s.clients)} ${s.label} | ${fmt(s.allocated / 1e6, 1)} | ${fmt(s.rss / 1e6, 1)} |`);
  lines.push('');
  lines.push('### The same load: CPU per request and Redis calls per request');
  lines.push('');
  const c = envoy.cost;
  const statuses = Object.entries(c.statuses).map(([k, v]) => `${k}: ${fmt(v)}`).join(', ');
  lines.push(`Part 1 above (the TS service up): ${fmt(c.requests)} requests of distinct clients in ${fmt(c.seconds, 1)} s (${fmt(c.requests / c.seconds)} req/s; machine busy ${fmt(c.machineBusy * 100)} %, load average ${fmt(c.loadAverage, 1)} on ${availableParallelism()} vCPUs, other agents' work included). **On a machine that loaded the CPU per request is inflated several times over** (docs/benchmarks.md measured the same processes at 84–137 µs of Envoy per request on a quiet machine): these rows show the proportions between the processes, not their cost; docs/capacity.md sizes the fleet from docs/benchmarks.md's figures. Answers over the whole run: ${statuses} (503: part 2, the TS service stopped). CPU from \`/proc/<pid>/stat\` over part 1, divided by its requests; Redis commands from \`INFO commandstats\` deltas over part 1.`);
  lines.push('');
  lines.push('| process | CPU µs per request |');
  lines.push('| --- | ---: |');
  for (const [k, v] of Object.entries(c.cpuUs)) lines.push(`| ${k} | ${fmt(v, 1)} |`);
  lines.push('');
  lines.push(`Envoy's CPU per request in part 2 (a new client each, the local stage takes its descriptor, the Check fails at once: 503): **${fmt(c.envoyUsNewClient, 1)} µs**, i.e. one Envoy core adds at most ~${fmt(1e6 / c.envoyUsNewClient)} clients a second to its LRUs this way.`);
  lines.push('');
  lines.push(`Redis calls (round trips) per request: **${fmt(c.redisCallsPerRequest, 3)}**, i.e. ${fmt(1 / c.redisCallsPerRequest, 1)} requests per bucket call. Commands per request: ${Object.entries(c.redisCommands).map(([k, v]) => `\`${k}\` ${fmt(v / c.requests, 3)}`).join(', ')} (\`${[...SCRIPT_INTERNAL].join('`, `')}\` run inside the bucket script, one \`evalsha\` per call: not round trips).`);
  return lines.join('\n');
}

const INTRO = `# Capacity

What one request, one client, one nonce and one market cost, measured here, and from them the fleet
and the pod's memory budget. The section "Measured unit costs" is rewritten by \`npm run bench:capacity\`.
`;

if (import.meta.main) {
  const ns = [int('BENCH_CAPACITY_REDIS_SMALL', 10_000), int('BENCH_CAPACITY_REDIS_LARGE', 100_000)];
  const redis = await measureRedis(ns);
  const envoy = await measureEnvoy(int('BENCH_CAPACITY_V4', 200_000), int('BENCH_CAPACITY_V6', 100_000));
  const capped = await measureCap();
  const body = report(redis, envoy, capped, ns);
  if (process.env['BENCH_NO_DOCS'] === '1') process.stdout.write(`${body}\n`);
  else { writeSection(CAPACITY_DOC, HEADING, body, INTRO); log(`wrote ${CAPACITY_DOC}`); }
  process.exit(0);
}
