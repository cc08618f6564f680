/**
 * The memory part of `npm run bench:market`: the real TS process (authz/src/main.ts or the image's
 * compiled JavaScript, default
 * GeoIP database, Redis store) behind real Envoy, as e2e/lib/stack.ts starts it, measured
 *   idle → after 100,000 markets ingested through Envoy → after 30 s idle →
 *   after 100,000 and then 1,000,000 distinct market queries (the page-cache attack) → after 30 s idle again.
 * RSS from /proc/<pid>/status; heap used/total and external memory from the process's own
 * /metrics (prom-client's nodejs_* gauges). The queries go straight to the market port: they
 * exercise the page cache, which lives there; a Check per query would add nothing it keeps.
 */
import { readFileSync } from 'node:fs';
import { Agent, request } from 'node:http';
import { setTimeout as sleep } from 'node:timers/promises';
import { signedIngest } from '../../scripts/edge-client.ts';
import { startStack, type Stack } from '../../e2e/lib/stack.ts';

export interface MemorySample {
  readonly phase: string;
  readonly rssMb: number;
  readonly heapUsedMb: number;
  readonly heapTotalMb: number;
  readonly externalMb: number;
  /** The glibc heap's resident part (mallocMb). */
  readonly mallocMb: number;
  readonly pageCacheEntries: number;
  readonly seconds: number;
}

export interface MemoryOptions {
  readonly markets: number;
  readonly queries: readonly number[];
  readonly idleSecs: number;
  readonly log: (m: string) => void;
  /** Extra environment for the stack (e.g. NODE_OPTIONS for a side-by-side comparison). */
  readonly env?: Readonly<Record<string, string>>;
  /** The service's entry script (default authz/src/main.ts; bench/lib/compile-js.ts for the image's form). */
  readonly serviceEntry?: string;
}

/**
 * RSS of the process's glibc heap: the main arena (`[heap]`, what the JS thread's malloc uses) and
 * the other arenas (anonymous mappings of 64 MiB reserved, `MALLOC_ARENA_MAX`), told from V8's own
 * pages (256 KiB chunks) by their reservation. Approximate: a mapping is counted by its address range.
 */
function mallocMb(pid: number): number {
  let kb = 0;
  let take = false;
  for (const line of readFileSync(`/proc/${pid}/smaps`, 'utf8').split('\n')) {
    const m = /^([0-9a-f]+)-([0-9a-f]+) \S+ \S+ \S+ (\d+)\s*(.*)$/.exec(line);
    if (m !== null) {
      const size = Number.parseInt(m[2]!, 16) - Number.parseInt(m[1]!, 16);
      const anon = m[3] === '0' && m[4] === '';
      take = m[4] === '[heap]' || (anon && size >= 60 * 1_048_576 && size <= 64 * 1_048_576);
      continue;
    }
    if (take && line.startsWith('Rss:')) kb += Number(/(\d+)/.exec(line)?.[1] ?? 0);
  }
  return kb / 1024;
}

function rssMb(pid: number): number {
  return Number(/VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'))?.[1] ?? NaN) / 1024;
}

async function metrics(stack: Stack): Promise<Map<string, number>> {
  const text = await (await fetch(`${stack.authzAdmin}/metrics`)).text();
  return new Map([...text.matchAll(/^([a-z_]+) (\S+)$/gm)].map((m) => [m[1]!, Number(m[2])]));
}

/** Runs `n` tasks, `concurrency` at a time. */
async function pool(n: number, concurrency: number, task: (i: number) => Promise<void>): Promise<void> {
  let next = 0;
  await Promise.all(Array.from({ length: concurrency }, async () => {
    for (let i = next++; i < n; i = next++) await task(i);
  }));
}

/** One HTTP/1.1 keep-alive request; resolves with the status, body read and dropped. */
function httpCall(agent: Agent, port: number, method: string, path: string, headers: Record<string, string>, body?: Buffer): Promise<number> {
  return new Promise((resolve, reject) => {
    const req = request({ host: '127.0.0.1', port, method, path, headers, agent }, (res) => {
      res.resume();
      res.on('end', () => resolve(res.statusCode ?? 0));
    });
    req.on('error', reject);
    req.end(body);
  });
}

export async function measureMemory(opts: MemoryOptions): Promise<MemorySample[]> {
  // The default GeoIP database; no rate limit in the way of one load generator on loopback.
  const stack = await startStack({
    // 48 ingests in flight from one address: more than INGEST_MAX_PENDING_PER_CLIENT's default (8) lets Envoy hold.
    env: { RPS_PER_IP: '1000000', RATE_BURST: '1000000', INGEST_MAX_PENDING_PER_CLIENT: '64', LOG_LEVEL: 'warn', ...opts.env },
    ...(opts.serviceEntry === undefined ? {} : { serviceEntry: opts.serviceEntry }),
  });
  const samples: MemorySample[] = [];
  const t0 = performance.now();
  const authzPid = stack.pids()[1]!;
  const sample = async (phase: string): Promise<void> => {
    const m = await metrics(stack);
    const mb = (k: string): number => (m.get(k) ?? NaN) / 1_048_576;
    const s = {
      phase, rssMb: rssMb(authzPid), heapUsedMb: mb('edge_authz_nodejs_heap_size_used_bytes'), heapTotalMb: mb('edge_authz_nodejs_heap_size_total_bytes'),
      externalMb: mb('edge_authz_nodejs_external_memory_bytes'), mallocMb: mallocMb(authzPid), pageCacheEntries: m.get('edge_market_page_cache_entries') ?? NaN,
      seconds: (performance.now() - t0) / 1000,
    };
    samples.push(s);
    opts.log(`memory: ${phase}: RSS ${s.rssMb.toFixed(0)} MB, heap ${s.heapUsedMb.toFixed(0)}/${s.heapTotalMb.toFixed(0)} MB, external ${s.externalMb.toFixed(0)} MB, malloc ${s.mallocMb.toFixed(0)} MB, page cache ${s.pageCacheEntries}`);
  };
  const edgePort = Number(new URL(stack.edgeUrl).port);
  const marketPort = Number(stack.env['MARKET_PORT']);
  const agent = new Agent({ keepAlive: true, maxSockets: 64 });
  try {
    await sleep(3000);
    await sample('idle, GeoIP database loaded');
    const ids = (i: number): string => `0x${i.toString(16).padStart(64, '0')}`;
    let failed = 0;
    let resent = 0;
    await pool(opts.markets, 48, async (i) => {
      const doc = Buffer.from(JSON.stringify({
        conditionId: ids(i), seq: 1, question: `Will market ${i} resolve yes?`, active: true, closed: false,
        minSize: '5', maxSize: '100000', tickSize: '0.01',
        outcomes: [{ tokenId: `${i}1`, name: 'Yes', bid: '0.51', ask: '0.53', last: '0.52' }, { tokenId: `${i}2`, name: 'No', bid: '0.47', ask: '0.49', last: '0.48' }],
        updatedAt: 1763700000,
      }));
      // An ingest refused with 503 (authz or Redis too slow on a busy host) or 429 (more of the
      // feed's ingests pending than Envoy holds while the host is that slow), or answered 504 (the
      // store did not confirm the write in time) is sent again, freshly signed, as the feed would
      // (docs/api.md): then 409 `stale_document` means the earlier attempt was stored. Anything
      // else is a failure of the run.
      for (let attempt = 1; ; attempt++) {
        const s = signedIngest(doc, ids(i), stack.hmacKey, stack.feedPrivateKey);
        const status = await httpCall(agent, edgePort, 'POST', '/internal/ingest/market', { ...s.headers, 'content-length': String(s.body.length) }, s.body);
        if (status === 200 || (status === 409 && attempt > 1)) break;
        if ((status !== 503 && status !== 504 && status !== 429) || attempt === 5) { failed++; opts.log(`memory: ingest ${i} answered ${status}`); break; }
        resent++;
        if (status === 429) await sleep(100 * attempt);
      }
      if ((i + 1) % 20_000 === 0) opts.log(`memory: ${(i + 1).toLocaleString('en')} markets ingested`);
    });
    if (failed > 0) throw new Error(`${failed} ingests failed`);
    if (resent > 0) opts.log(`memory: ${resent} ingests answered 429, 503 or 504 under load and were sent again`);
    await sample(`after ${opts.markets.toLocaleString('en')} markets ingested through Envoy`);
    await sleep(opts.idleSecs * 1000);
    await sample(`${opts.idleSecs} s idle after that`);
    const known = ids(0);
    let sent = 0;
    for (const n of opts.queries) {
      const from = sent;
      await pool(n - from, 32, async (i) => {
        // A query answered 503 (Redis slower than its command timeout on a busy host) is sent again.
        for (let attempt = 1; ; attempt++) {
          const status = await httpCall(agent, marketPort, 'GET', `/v1/markets?conditionId=${known},0xnone-${from + i}`, {});
          if (status === 200) break;
          if (status !== 503 || attempt === 3) { failed++; break; }
          resent++;
        }
      });
      sent = n;
      if (failed > 0) throw new Error(`${failed} queries failed`);
      if (resent > 0) opts.log(`memory: ${resent} ingests and queries answered 503 or 504 under load and were sent again`);
      await sample(`after ${n.toLocaleString('en')} distinct market queries`);
    }
    // What the process keeps once the query burst is over (memory-release.ts acts when it is quiet).
    if (opts.idleSecs > 0) {
      await sleep(opts.idleSecs * 1000);
      await sample(`${opts.idleSecs} s idle after the queries`);
    }
  } finally {
    agent.destroy();
    await stack.stop();
  }
  return samples;
}

export function memoryTable(runs: readonly { readonly name: string; readonly samples: readonly MemorySample[] }[]): string {
  const rows = runs.flatMap((r) => r.samples.map((s) => `| ${r.name} | ${s.phase} | ${s.rssMb.toFixed(0)} | ${s.heapUsedMb.toFixed(0)} | ${s.heapTotalMb.toFixed(0)} | ${s.externalMb.toFixed(0)} | ${s.mallocMb.toFixed(0)} | ${s.pageCacheEntries} | ${s.seconds.toFixed(0)} |`));
  return ['| configuration | phase | RSS MB | heap used MB | heap total MB | external MB | malloc heap MB | cached pages | at s |', '| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |', ...rows].join('\n');
}
