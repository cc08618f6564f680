/**
 * The TLS stacks of `npm run bench:edge` ((1t) bare Envoy, (2t) the floor, (3t) the full edge, each
 * with TLS on the client listener; started by edge-stacks.ts): requests to a stack over http or
 * https, the new-connection (handshake) rate, and their section of docs/benchmarks.md.
 *
 * Handshakes per second: a Node TLS client loop (node:tls, `BENCH_TLS_CONNS` loops at once, 8 by
 * default), each opening a new connection with no session offered (tls.connect resumes only when
 * given a `session`, which is never passed: every handshake is a full one, TLS 1.3 + X25519 + the
 * P-256 certificate), sending one `GET /v1/markets` with `connection: close` and waiting for the
 * close. h2load cannot open a connection per request in a timed run, and `openssl s_time` runs one
 * connection at a time. Envoy's own counters (`listener.*.ssl.handshake`, `.ssl.session_reused`)
 * confirm the count and that nothing was resumed. The client is Node, so on a small machine it
 * may be the bottleneck: Envoy's CPU per new connection (from /proc) is the figure that carries.
 */
import { request as httpsRequest } from 'node:https';
import { readFileSync } from 'node:fs';
import { connect as tlsConnect } from 'node:tls';
import type { Ep, Stack } from './edge-stacks.ts';
import { envInt, today } from './env.ts';
import { cpuUsPerRequest, startCpuWindow } from './proc.ts';
import { fmt, markdownTable, median, met, pairedMedian, percentile, sortedCopy } from './stats.ts';

/** The TLS forms of (1), (2) and (3), in that order. */
export const TLS_STACKS = ['1t', '2t', '3t'] as const satisfies readonly Stack['name'][];
/** The non-TLS stack each TLS stack is the TLS form of. */
const PLAIN: Readonly<Record<(typeof TLS_STACKS)[number], Stack['name']>> = { '1t': '1', '2t': '2', '3t': '3' };
/** Concurrent connection loops of the handshake measurement. */
export const HS_LOOPS = envInt('BENCH_TLS_CONNS', 8, 1);

/** One request to a stack: fetch for http (as before TLS stacks existed), node:https with `ca` for https. */
export async function edgeRequest(url: string, o: { ca?: string | undefined; method?: string; headers?: Readonly<Record<string, string>>; body?: string }): Promise<{ status: number; text: string }> {
  if (url.startsWith('http:')) {
    const r = await fetch(url, { method: o.method ?? 'GET', ...(o.headers === undefined ? {} : { headers: o.headers }), ...(o.body === undefined ? {} : { body: o.body }) });
    return { status: r.status, text: await r.text() };
  }
  if (o.ca === undefined) throw new Error(`no CA for ${url}`);
  const ca = readFileSync(o.ca);
  return new Promise((resolve, reject) => {
    const req = httpsRequest(url, { method: o.method ?? 'GET', ca, servername: 'localhost', agent: false, headers: { ...o.headers } }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, text: Buffer.concat(chunks).toString() }));
      res.on('error', reject);
    });
    req.on('error', reject);
    req.end(o.body);
  });
}

/** One handshake-rate run of one TLS stack. */
export interface HandshakeSample {
  readonly round: number;
  /** New connections per second that completed with a 200. */
  readonly cps: number;
  readonly ok: number;
  readonly done: number;
  /** Connect to close, µs. */
  readonly p50: number;
  readonly p99: number;
  /** CPU µs per new connection (handshake + one read + close): Envoy, every server, the client loop. */
  readonly envoyUs: number;
  readonly totalUs: number;
  readonly clientUs: number;
  /** Envoy's listener counters over the run: full handshakes and resumed sessions. */
  readonly handshakes: number;
  readonly resumed: number;
}

/** Sum of Envoy's client-listener TLS counter `name` (listener.*.ssl.<name>). */
async function listenerSsl(s: Stack, name: string): Promise<number> {
  const text = await (await fetch(`http://127.0.0.1:${s.adminPort}/stats?filter=ssl`)).text();
  return text.split('\n').filter((l) => l.startsWith('listener.') && l.includes(`.ssl.${name}: `)).reduce((a, l) => a + Number(l.slice(l.lastIndexOf(' ') + 1)), 0);
}

/** New TLS connections to `s` for `seconds`, each one read with `connection: close`; CPU of `pids` from /proc. */
export async function measureHandshakes(s: Stack, o: { ca: string; seconds: number; pids: readonly number[]; path: string; headers: Readonly<Record<string, string>>; round: number }): Promise<HandshakeSample> {
  const ca = readFileSync(o.ca);
  const head = `GET ${o.path} HTTP/1.1\r\nhost: localhost\r\n${Object.entries(o.headers).map(([k, v]) => `${k}: ${v}\r\n`).join('')}connection: close\r\n\r\n`;
  const once = (): Promise<{ ok: boolean; us: number }> => new Promise((resolve) => {
    const t0 = performance.now();
    let first = '';
    const sock = tlsConnect({ host: '127.0.0.1', port: s.port, servername: 'localhost', ca, ALPNProtocols: ['http/1.1'] }, () => sock.write(head));
    sock.setTimeout(10_000, () => sock.destroy());
    sock.on('data', (c: Buffer) => { if (first.length < 12) first += c.toString('latin1'); });
    sock.on('error', () => { /* counted as not ok on close */ });
    sock.on('close', () => resolve({ ok: first.startsWith('HTTP/1.1 200'), us: (performance.now() - t0) * 1000 }));
  });
  const [hs0, re0] = [await listenerSsl(s, 'handshake'), await listenerSsl(s, 'session_reused')];
  const lat: number[] = [];
  let ok = 0;
  const cpuClient0 = process.cpuUsage();
  const close = startCpuWindow(o.pids);
  const t0 = performance.now();
  const end = t0 + o.seconds * 1000;
  await Promise.all(Array.from({ length: HS_LOOPS }, async () => {
    while (performance.now() < end) {
      const r = await once();
      lat.push(r.us);
      if (r.ok) ok++;
    }
  }));
  const wall = (performance.now() - t0) / 1000;
  const cpu = close();
  const client = process.cpuUsage(cpuClient0);
  const [hs1, re1] = [await listenerSsl(s, 'handshake'), await listenerSsl(s, 'session_reused')];
  const sorted = sortedCopy(lat);
  const per = (pid: number): number => cpuUsPerRequest(cpu, pid, lat.length);
  return {
    round: o.round, cps: ok / wall, ok, done: lat.length, p50: percentile(sorted, 50), p99: percentile(sorted, 99),
    envoyUs: per(s.envoy.pid), totalUs: o.pids.reduce((a, p) => a + per(p), 0), clientUs: (client.user + client.system) / Math.max(1, lat.length),
    handshakes: hs1 - hs0, resumed: re1 - re0,
  };
}

/** What the TLS report reads of a keep-alive sample (bench/edge.ts's Sample). */
interface KeepAlive { readonly round: number; readonly rps: number; readonly ok: number; readonly done: number; readonly p50: number; readonly p99: number; readonly envoyUs: number; readonly authzUs: number; readonly totalUs: number; readonly busy: number }

/** The docs section of the TLS stacks: target, keep-alive tables, handshakes, the method. */
export function tlsReport(o: {
  all: (mode: 'sat' | 'fixed', name: Stack['name'], ep: Ep) => readonly KeepAlive[];
  handshakes: (name: Stack['name']) => readonly HandshakeSample[];
  stacks: readonly Stack[]; eps: readonly Ep[]; epName: (ep: Ep) => string; fixed: boolean;
  satConnections: number; load: string; busyMachine: boolean; machine: string; rounds: number; seconds: number; errors: readonly string[];
}): string {
  const tls = o.stacks.filter((s) => s.tls);
  const names = new Set(o.stacks.map((s) => s.name));
  const count = (l: readonly { ok: number; done: number }[]): string => `${l.reduce((a, x) => a + x.ok, 0)}/${l.reduce((a, x) => a + x.done, 0)}`;
  const targets: string[][] = [];
  const satRows: string[][] = [];
  const fixedRows: string[][] = [];
  for (const ep of o.eps) {
    const paired = (mode: 'sat' | 'fixed', a: Stack['name'], b: Stack['name'], f: (x: KeepAlive, y: KeepAlive) => number): number => pairedMedian(o.all(mode, a, ep), o.all(mode, b, ep), f);
    const ratio = paired('sat', '3t', '2t', (x, y) => x.rps / y.rps);
    const capacity = paired('sat', '3t', '2t', (x, y) => y.totalUs / x.totalUs);
    targets.push([o.epName(ep), '(3t) ≥ 90 % of (2t) req/s at saturation', `${fmt(ratio * 100)} % (by all servers' CPU per request: ${fmt(capacity * 100)} %)`,
      `${met(ratio >= 0.9)}${o.busyMachine ? ' (measured on a busy machine)' : ''}`]);
    const plain = TLS_STACKS.filter((t) => names.has(PLAIN[t]) && o.all('sat', PLAIN[t], ep).length > 0);
    targets.push([o.epName(ep), 'TLS over plaintext, same stack, req/s at saturation (keep-alive)', plain.length === 0 ? 'plaintext stacks not measured in this run'
      : plain.map((t) => {
        const d = paired('sat', t, PLAIN[t], (x, y) => x.envoyUs - y.envoyUs);
        return `(${t}) / (${PLAIN[t]}) ${fmt(100 * paired('sat', t, PLAIN[t], (x, y) => x.rps / y.rps))} %, Envoy ${d >= 0 ? '+' : ''}${fmt(d, 1)} µs/req`;
      }).join('; '), '–']);
    for (const s of tls) {
      const med = (mode: 'sat' | 'fixed', f: (x: KeepAlive) => number, d = 0): string => fmt(median(o.all(mode, s.name, ep).map(f)), d);
      satRows.push([o.epName(ep), s.label, med('sat', (x) => x.rps), med('sat', (x) => x.envoyUs), s.authzPid === undefined ? '–' : med('sat', (x) => x.authzUs), med('sat', (x) => x.totalUs), count(o.all('sat', s.name, ep))]);
      if (o.fixed) {
        fixedRows.push([o.epName(ep), s.label, med('fixed', (x) => x.rps), med('fixed', (x) => x.p50 / 1000, 2), med('fixed', (x) => x.p99 / 1000, 2),
          med('fixed', (x) => x.envoyUs), med('fixed', (x) => x.totalUs), count(o.all('fixed', s.name, ep))]);
      }
    }
  }
  const hsRows = tls.map((s) => {
    const l = o.handshakes(s.name);
    const m = (f: (x: HandshakeSample) => number, d = 0): string => fmt(median(l.map(f)), d);
    // Envoy's share of a full handshake: a new connection's Envoy CPU minus a keep-alive read's, same round.
    const keep = o.all('sat', s.name, 'markets');
    const hsUs = median(l.flatMap((x) => keep.filter((y) => y.round === x.round).map((y) => x.envoyUs - y.envoyUs)));
    return [s.label, m((x) => x.cps), m((x) => x.envoyUs), fmt(hsUs), fmt(1e6 / hsUs), m((x) => x.totalUs), m((x) => x.clientUs),
      m((x) => x.p50 / 1000, 2), m((x) => x.p99 / 1000, 2), `${l.reduce((a, x) => a + x.handshakes, 0)} / ${l.reduce((a, x) => a + x.resumed, 0)}`, count(l)];
  });
  // Per round: the target's input, so the spread on a busy machine shows.
  const perRound = [...new Set(o.all('sat', '3t', o.eps[0] ?? 'markets').map((x) => x.round))].map((round) => [String(round + 1), ...o.eps.map((ep) => {
    const at = (name: Stack['name']): number => o.all('sat', name, ep).find((x) => x.round === round)?.rps ?? NaN;
    return `${fmt(100 * at('3t') / at('2t'))} %`;
  }), ...tls.map((s) => fmt(o.handshakes(s.name).find((x) => x.round === round)?.cps ?? NaN))]);
  const busy = median(tls.flatMap((s) => o.eps.flatMap((ep) => o.all('sat', s.name, ep).map((x) => x.busy))));
  const r = (n: number): ('l' | 'r')[] => ['l', 'l', ...Array<'r'>(n).fill('r')];
  const note = o.busyMachine
    ? `**Machine busy (load ${o.load}; ${fmt(busy * 100)} % of all CPUs busy during the saturation runs): ratios only,
not the verdict.** Other work shared the CPUs; absolute req/s move with it, the ratios of stacks measured side by
side in the same rounds less so.`
    : `Load ${o.load}; ${fmt(busy * 100)} % of all CPUs busy during the saturation runs.`;
  return `Run by \`npm run bench:edge\` (bench/edge.ts) on ${today()}: ${o.machine}; ${o.rounds} interleaved round(s) of ${o.seconds} s
per cell after a warm-up; medians (ratios taken within a round, then the median over rounds).

${note}

Stacks (1t), (2t), (3t) are (1) bare Envoy, (2) the floor (allow-all ext_authz) and (3) the full edge of "Edge data
plane (Envoy)" with TLS on the client listener: \`EDGE_TLS_CERT_FILE\`/\`EDGE_TLS_KEY_FILE\` set to a P-256 development
certificate, the production DownstreamTlsContext (TLS 1.2–1.3, the intermediate profile, ALPN h2 and http/1.1;
envoy/render/tls.ts). Same upstreams, same rounds (the stack order reversed every other round), same load as the
plaintext stacks: h2load --h1 over TLS 1.3 with keep-alive, 7 browser-like headers.

${markdownTable(['Endpoint', 'Target', 'Measured', 'Met'], targets)}

### At saturation (${o.satConnections} keep-alive TLS connections), CPU µs per request

${markdownTable(['Request', 'Stack', 'req/s', 'Envoy', 'authz', 'all servers', '2xx'], satRows, r(5))}
${o.fixed ? `
### Latency at a fixed 1,000 req/s over TLS, CPU µs per request

${markdownTable(['Request', 'Stack', 'req/s', 'p50 ms', 'p99 ms', 'Envoy', 'all servers', '2xx'], fixedRows, r(6))}
` : `
(Fixed-rate latency not measured in this run: \`BENCH_MODES=sat\`.)
`}
### New connections: a full TLS handshake and one read each

${markdownTable(['Stack', 'new conn/s', 'Envoy µs/conn', 'Envoy µs/handshake', 'handshakes/s per Envoy core', 'all servers µs/conn', 'client µs/conn', 'p50 ms', 'p99 ms', 'handshakes / resumed (Envoy)', '200'], hsRows,
    ['l', 'r', 'r', 'r', 'r', 'r', 'r', 'r', 'r', 'r', 'r'])}

<details><summary>Per round: (3t) / (2t) req/s and new connections per second</summary>

${markdownTable(['Round', ...o.eps.map((ep) => `${ep}: (3t) / (2t)`), ...tls.map((s) => `${s.name} new conn/s`)], perRound, ['l', ...Array<'r'>(o.eps.length + tls.length).fill('r')])}

</details>

- Client: ${HS_LOOPS} Node TLS client loops (bench/lib/edge-tls.ts; \`BENCH_TLS_CONNS\`), each a new connection with no
  session offered (no resumption: Envoy's \`ssl.session_reused\` is the second number), \`GET /v1/markets\` with
  \`connection: close\`, then the next. "new conn/s" is what this client reached on the busy machine; the client's own
  CPU per connection is beside it, so it is likely the bottleneck.
- "Envoy µs/handshake": Envoy's CPU per new connection minus its CPU per keep-alive read of the same stack in the same
  round, i.e. the TLS handshake, the TCP accept and close. "handshakes/s per Envoy core": 10^6 over it, what one Envoy
  worker (\`--concurrency 1\`) could accept with a core to itself; Envoy scales it with workers.
- Error counters after the run: ${o.errors.length === 0 ? 'none' : o.errors.join('; ')}.`;
}
