/**
 * The global rate limit's cost per Check in the TS process and in Redis, with token leases
 * (RATE_LEASE_TOKENS 64, RATE_LEASE_MS 100: the defaults) and without (RATE_LEASE_TOKENS=0), side
 * by side: the Check limiter as the ext_authz Check runs it (createCheckLimiter + withGlobalLimit
 * around an allow), on a private redis-server, one client (bench:edge's single load address) from
 * 16 concurrent streams (bench:edge's 16 connections), interleaved rounds.
 *
 * What it measures is CPU, not throughput: this process's own CPU (process.cpuUsage) and
 * redis-server's (/proc) per Check, which barely move with other load on the machine, where
 * bench:edge's req/s ratios do. And Checks per Redis call, and the share answered at once.
 *
 *   scripts/node bench/ratelimit-leases.ts   (BENCH_ROUNDS 6, BENCH_CHECKS 20000 per cell, BENCH_LEASE_TOKENS 64: the default)
 */
import { Writable } from 'node:stream';
import { createRedis } from '../authz/src/common/adapters/redis.ts';
import { loadConfig } from '../authz/src/common/config.ts';
import { createLogger } from '../authz/src/common/log.ts';
import { createMetrics } from '../authz/src/common/metrics.ts';
import { ALLOW } from '../authz/src/authz/decision.ts';
import type { AuthzInput } from '../authz/src/authz/codec/request.ts';
import { BATCH, RedisBuckets, type LeasePolicy } from '../authz/src/ratelimit/bucket.ts';
import { createCheckLimiter, withGlobalLimit } from '../authz/src/ratelimit/check-limit.ts';
import { PrivateRedis } from '../testkit/redis-server.ts';
import { envInt, redisPid } from './lib/env.ts';
import { processCpuSeconds } from './lib/proc.ts';
import { fmt, median } from './lib/stats.ts';

const ROUNDS = envInt('BENCH_ROUNDS', 6, 1);
const CHECKS = envInt('BENCH_CHECKS', 20_000, 100);
const STREAMS = 16;

const logger = createLogger('silent', new Writable({ write: (_c, _e, cb) => cb() }));
const limits = loadConfig({ RPS_PER_IP: '1000000', RATE_BURST: '1000000' });
const redis = await PrivateRedis.start();
const conn = createRedis(redis.url, { enableAutoPipelining: false });
await new Promise((r) => conn.once('ready', r));
const rpid = redisPid(redis.url)!;

interface Cell { tsUs: number; redisUs: number; perCall: number; atOnce: number; wallUs: number }
const cells = new Map<string, Cell[]>();

async function cell(name: string, lease: LeasePolicy, client: string): Promise<void> {
  let calls = 0;
  let viaRedis = 0;
  const buckets = new RedisBuckets(conn, limits, (n) => { calls++; viaRedis += n; }, BATCH, lease);
  const metrics = createMetrics({ geoipBuildEpochSecs: () => 0, defaultMetrics: false });
  const evaluate = withGlobalLimit(createCheckLimiter({ buckets, limits, metrics, logger }), () => ALLOW);
  const input = { globalLimit: true, clientIp: client } as AuthzInput;
  const cpu0 = process.cpuUsage();
  const r0 = processCpuSeconds(rpid);
  const t0 = performance.now();
  await Promise.all(Array.from({ length: STREAMS }, async () => {
    for (let i = 0; i < CHECKS / STREAMS; i++) {
      const d = await evaluate(input);
      if (!d.allow) throw new Error('refused');
    }
  }));
  const wall = performance.now() - t0;
  const cpu = process.cpuUsage(cpu0);
  const r = processCpuSeconds(rpid) - r0;
  const list = cells.get(name) ?? [];
  list.push({ tsUs: (cpu.user + cpu.system) / CHECKS, redisUs: (r * 1e6) / CHECKS, perCall: CHECKS / Math.max(1, calls), atOnce: 1 - viaRedis / CHECKS, wallUs: (wall * 1000) / CHECKS });
  cells.set(name, list);
}

const LEASE_TOKENS = envInt('BENCH_LEASE_TOKENS', 64, 1);
const variants: [string, LeasePolicy][] = [[`leases (${LEASE_TOKENS} tokens, 100 ms)`, { tokens: LEASE_TOKENS, ms: 100 }], ['no leases', { tokens: 0, ms: 0 }]];
await cell('warm-up', variants[0]![1], '192.0.2.200');
await cell('warm-up', variants[1]![1], '192.0.2.201');
for (let round = 0; round < ROUNDS; round++) {
  const order = round % 2 === 0 ? variants : [...variants].reverse();
  for (const [name, lease] of order) await cell(name, lease, `192.0.2.${round * 2 + (name === 'no leases' ? 1 : 0) + 1}`);
}
const rows = variants.map(([name]) => {
  const c = cells.get(name)!;
  const m = (f: (x: Cell) => number, d = 1): string => fmt(median(c.map(f)), d);
  return `| ${name} | ${m((x) => x.tsUs)} | ${m((x) => x.redisUs)} | ${m((x) => x.tsUs + x.redisUs)} | ${m((x) => x.perCall)} | ${m((x) => x.atOnce * 100, 0)} % | ${m((x) => x.wallUs)} |`;
});
process.stdout.write(`${ROUNDS} interleaved rounds of ${CHECKS} Checks (one client, ${STREAMS} streams), medians:

| Global limit in the Check | TS µs/Check | Redis µs/Check | both | Checks per Redis call | answered at once | wall µs/Check |
| --- | ---: | ---: | ---: | ---: | ---: | ---: |
${rows.join('\n')}
`);
conn.disconnect();
await redis.stop();
