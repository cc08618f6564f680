/**
 * Two complete edges (two Envoys, two TS services, each with its own order backend) on one
 * redis-server: the global rate limit across replicas (docs/envoy.md §3). Used by
 * e2e/global-rate-limit.test.ts and, as scenario 12, by `npm run reliability`.
 *
 * Local processes only (e2e/lib/stack.ts with `redisUrl`): the containers driver gives every stack
 * its own Redis container on its own network.
 */
import assert from 'node:assert/strict';
import { setTimeout as sleep } from 'node:timers/promises';
import { geoFixtures } from '../../testkit/geo-fixtures.ts';
import { PrivateRedis } from '../../testkit/redis-server.ts';
import { startStack, type Stack } from '../lib/stack.ts';
import type { Row } from './scenarios.ts';

/** The defaults (SPEC: 20 per second per address, bucket 40), stated so the bounds below read them. */
export const RPS = 20;
export const BURST = 40;

export interface TwoEdges {
  readonly redis: PrivateRedis;
  readonly edges: readonly [Stack, Stack];
  /** Stops both stacks, then the Redis; every process gone. */
  stop(): Promise<void>;
}

/** Two stacks on one private redis-server; clients chosen by X-Forwarded-For (one trusted hop). */
export async function startTwoEdges(env: Record<string, string> = {}): Promise<TwoEdges> {
  const redis = await PrivateRedis.start();
  const opts = {
    redisUrl: redis.url, geoipDb: geoFixtures().geoip2,
    env: { XFF_NUM_TRUSTED_HOPS: '1', RPS_PER_IP: String(RPS), RATE_BURST: String(BURST), LOG_LEVEL: 'warn', ...env },
  };
  const started = await Promise.allSettled([startStack(opts), startStack(opts)]);
  const ok = started.flatMap((s) => (s.status === 'fulfilled' ? [s.value] : []));
  if (ok.length !== 2) {
    await Promise.all(ok.map((s) => s.stop()));
    await redis.stop();
    throw (started.find((s) => s.status === 'rejected') as PromiseRejectedResult).reason;
  }
  const edges = ok as [Stack, Stack];
  // Each Envoy worker opens its HTTP/2 connection to authz on first use, and a cold TS process
  // answers its first calls slowly: warm both edges before anything is measured.
  for (let round = 0; round < 3; round++) {
    await Promise.all(edges.flatMap((s) => Array.from({ length: 8 }, (_, i) => fetch(`${s.edgeUrl}/`, { headers: { 'x-forwarded-for': `192.0.2.${120 + i}` } }).then((r) => r.arrayBuffer()))));
  }
  return {
    redis, edges,
    async stop() {
      await Promise.all(edges.map((s) => s.stop()));
      await redis.stop();
    },
  };
}

export interface Hit { readonly edge: 0 | 1; readonly status: number; readonly at: number; readonly headers: Headers }

/** One GET / through `edge` as client `ip`; never throws (a transport error is status 0). */
export async function hit(two: TwoEdges, edge: 0 | 1, ip: string): Promise<Hit> {
  try {
    const res = await fetch(`${two.edges[edge].edgeUrl}/`, { headers: { 'x-forwarded-for': ip } });
    await res.arrayBuffer();
    return { edge, status: res.status, at: Date.now(), headers: res.headers };
  } catch {
    return { edge, status: 0, at: Date.now(), headers: new Headers() };
  }
}

/** What one traffic phase gave: allowed per edge, in all, statuses, its length in seconds. */
export interface Phase { readonly allowed: [number, number]; readonly total: number; readonly sent: number; readonly statuses: Set<number>; readonly seconds: number }

function tally(hits: readonly Hit[], startedAt: number): Phase {
  const allowed: [number, number] = [0, 0];
  for (const h of hits) if (h.status === 200) allowed[h.edge]++;
  const end = Math.max(startedAt, ...hits.map((h) => h.at));
  return { allowed, total: allowed[0] + allowed[1], sent: hits.length, statuses: new Set(hits.map((h) => h.status)), seconds: (end - startedAt) / 1000 };
}

/** `count` requests from `ip`, all at once, alternating between the edges. */
export async function burst(two: TwoEdges, ip: string, count: number): Promise<Phase> {
  const t0 = Date.now();
  return tally(await Promise.all(Array.from({ length: count }, (_, i) => hit(two, (i % 2) as 0 | 1, ip))), t0);
}

/** `ip` at `rps` requests per second for `ms`, alternating between the edges. */
export async function steady(two: TwoEdges, ip: string, rps: number, ms: number): Promise<Phase> {
  const t0 = Date.now();
  const hits: Promise<Hit>[] = [];
  for (let i = 0; Date.now() - t0 < ms; i++) {
    hits.push(hit(two, (i % 2) as 0 | 1, ip));
    const next = t0 + ((i + 1) * 1000) / rps;
    await sleep(Math.max(0, next - Date.now()));
  }
  return tally(await Promise.all(hits), t0);
}

/** The most a client may get in `seconds` under one bucket: the burst, the refill, and 1 of slack (as the other tests). */
export const bound = (seconds: number): number => BURST + Math.ceil(RPS * seconds) + 1;

/** Token leases at their defaults (RATE_LEASE_TOKENS, RATE_LEASE_MS), one per TS process (AUTHZ_WORKERS 1). */
export const LEASE_TOKENS = 64;
export const LEASE_MS = 100;
/** Edges, i.e. TS processes holding leases. */
export const N_EDGES = 2;
/**
 * What leases may add across the edges (docs/envoy.md §3 "Token leases"): the tokens the edges
 * held unspent when the window began, at most LEASE_TOKENS each and never more than the refill of
 * one LEASE_MS: min(N × LEASE_TOKENS, ⌈RPS × LEASE_MS / 1000⌉) = 2 at the defaults.
 */
export const LEASE_SLACK = Math.min(N_EDGES * LEASE_TOKENS, Math.ceil((RPS * LEASE_MS) / 1000));
/** The most a client may get in `seconds` across both edges under the global limit: burst + rate × t + the lease term (+1 as `bound`). */
export const globalBound = (seconds: number): number => bound(seconds) + LEASE_SLACK;

/** Waits (bounded) until both TS services answer for the global limit again (its x-ratelimit headers are back). */
export async function globalAgain(two: TwoEdges, timeoutMs: number): Promise<number> {
  const t0 = Date.now();
  for (let i = 0; Date.now() - t0 < timeoutMs; i++) {
    const probes = await Promise.all([hit(two, 0, `192.0.2.${100 + (i % 20)}`), hit(two, 1, `192.0.2.${100 + (i % 20)}`)]);
    if (probes.every((p) => p.status === 200 && p.headers.get('x-ratelimit-remaining') !== null)) return Date.now() - t0;
    await sleep(100);
  }
  throw new Error(`the global limit did not come back within ${timeoutMs} ms`);
}

/** A TS service's counter (sum of its series) from its /metrics. */
export async function counter(stack: Stack, name: string): Promise<number> {
  const text = await (await fetch(`${stack.authzAdmin}/metrics`)).text();
  return text.split('\n').filter((l) => l.startsWith(name)).reduce((n, l) => n + Number(l.split(' ').at(-1)), 0);
}

/**
 * Requests both edges let through without a global answer so far: the TS services' Checks that
 * went on without the bucket (Redis failed: edge_ratelimit_redis_errors_total; Redis slower than
 * the 100-ms bound: edge_ratelimit_late_total), plus Envoy's own count of rate limit calls that
 * failed or timed out (failure_mode_allowed; only with a ratelimit filter, i.e.
 * RATELIMIT_SERVICE_ADDRESS). On a loaded machine a bucket answer can miss the bound; each such
 * request met only its edge's own bucket, so the global bound holds up to this many.
 */
export async function failedOpen(two: TwoEdges): Promise<number> {
  let n = 0;
  for (const s of two.edges) {
    const stats = await (await fetch(`${s.envoyAdmin}/stats?filter=ratelimit\\.failure_mode_allowed$`)).text();
    for (const line of stats.split('\n')) if (line.includes(': ')) n += Number(line.split(': ')[1]);
    n += await counter(s, 'edge_ratelimit_redis_errors_total');
    n += await counter(s, 'edge_ratelimit_late_total');
  }
  return n;
}

export interface GlobalScale { readonly phaseMs: number; readonly redisDownMs: number }
export const GLOBAL_SHORT: GlobalScale = { phaseMs: 4000, redisDownMs: 4000 };
export const GLOBAL_FULL: GlobalScale = { phaseMs: 10_000, redisDownMs: 10_000 };

/**
 * Scenario 12: a heavy client alternating between the edges at 100 req/s (5 × its limit) and a
 * light one at 10 req/s, while Redis is up, then stopped, then back. Asserts the bounds; returns the row.
 */
export async function globalRateLimit(two: TwoEdges, scale: GlobalScale): Promise<Row> {
  const heavy = (n: number): string => `192.0.2.${30 + n}`;
  const light = (n: number): string => `2001:db8:3:${(0x70 + n).toString(16)}::1`;
  const phase = async (n: number, ms: number): Promise<[Phase, Phase]> => Promise.all([steady(two, heavy(n), 100, ms), steady(two, light(n), 10, ms)]);
  const noErrors = (p: Phase, what: string): void => assert.deepEqual([...p.statuses].filter((s) => s !== 200 && s !== 429), [], `${what}: only 200 and 429`);

  const open0 = await failedOpen(two);
  const [up, upLight] = await phase(0, scale.phaseMs);
  const upOpen = (await failedOpen(two)) - open0;
  noErrors(up, 'Redis up');
  assert.ok(up.total <= globalBound(up.seconds) + upOpen && up.total >= BURST, `Redis up: ${up.total} allowed in ${up.seconds} s (bound ${globalBound(up.seconds)}, failed open ${upOpen})`);
  assert.equal(upLight.total, upLight.sent, 'the light client is never limited');

  const failOpenBefore = (await Promise.all(two.edges.map((s) => counter(s, 'edge_ratelimit_redis_errors_total')))).reduce((a, b) => a + b, 0);
  await two.redis.stop();
  const [down, downLight] = await phase(1, scale.redisDownMs);
  noErrors(down, 'Redis down');
  noErrors(downLight, 'Redis down, light client');
  for (const e of [0, 1] as const) assert.ok(down.allowed[e] <= bound(down.seconds), `Redis down: edge ${e} let ${down.allowed[e]} through in ${down.seconds} s (its local bound ${bound(down.seconds)})`);
  assert.ok(down.total > bound(down.seconds), `Redis down: ${down.total} in all, above one bucket (${bound(down.seconds)}): each edge's own limit applied`);
  assert.equal(downLight.total, downLight.sent, 'the light client is never limited');
  const failOpen = (await Promise.all(two.edges.map((s) => counter(s, 'edge_ratelimit_redis_errors_total')))).reduce((a, b) => a + b, 0) - failOpenBefore;
  assert.ok(failOpen > 0, 'the fail-open answers are counted');

  await two.redis.resume();
  const recoveryMs = await globalAgain(two, 10_000);
  const open2 = await failedOpen(two);
  const [back, backLight] = await phase(2, scale.phaseMs);
  const backOpen = (await failedOpen(two)) - open2;
  noErrors(back, 'Redis back');
  assert.ok(back.total <= globalBound(back.seconds) + backOpen, `Redis back: ${back.total} allowed in ${back.seconds} s (bound ${globalBound(back.seconds)}, failed open ${backOpen})`);
  assert.equal(backLight.total, backLight.sent, 'the light client is never limited');

  const s = (p: Phase, open?: number, global = true): string => `${p.total} of ${p.sent} in ${p.seconds.toFixed(1)} s (bound ${global ? globalBound(p.seconds) : bound(p.seconds)}; per edge ${p.allowed.join('/')}${open === undefined ? '' : `; failed open ${open}`})`;
  return {
    scenario: '12. global rate limit across two edges',
    load: `1 client at 100 req/s alternating between 2 edges (limit ${RPS}/s, burst ${BURST}) + 1 at 10 req/s`,
    fault: `Redis down ${scale.redisDownMs / 1000} s`,
    outcome: `Redis up: allowed ${s(up, upOpen)}; down: ${s(down, undefined, false)}, each edge its own bucket, 0 errors, ${failOpen} fail-open answers counted; back: ${s(back, backOpen)}; light client: ${upLight.total + downLight.total + backLight.total} of ${upLight.sent + downLight.sent + backLight.sent} allowed`,
    recovery: `global again ${recoveryMs} ms after Redis was back`,
  };
}
