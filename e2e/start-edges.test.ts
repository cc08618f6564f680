/**
 * The local stack's edges, through the real `npm start` (npm, its `sh -c`, scripts/start.ts) on
 * fresh ports and a fresh run directory (DEV_RUN_DIR) each:
 *   - a bad setting: one line naming it, exit code 2, nothing started (every case at once);
 *   - SIGTERM/SIGINT to the npm pid, to its process group, and `timeout`: the whole stack stops,
 *     in order (no Redis errors from the TS service), every port free, no process left;
 *   - supervision: the TS service, Redis and the demo backend killed are restarted (503 JSON
 *     meanwhile, 200 again within 10 s); Envoy killed ends the stack; a second `npm start` names
 *     the running one; a misspelled setting is a warning naming the nearest one;
 *   - the `npm start` procedures of docs/operations.md, run as written (HMAC rotation with
 *     .run/dev.env kept current, client-certificate rotation, GeoIP replacement);
 *   - the first start says what it installs.
 */
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile, execFileSync, spawn } from 'node:child_process';
import { createHash, randomBytes, X509Certificate } from 'node:crypto';
import { cpSync, existsSync, mkdirSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { once } from 'node:events';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { setTimeout as sleep } from 'node:timers/promises';
import { fileURLToPath } from 'node:url';
import { freePort, PrivateRedis } from '../testkit/redis-server.ts';
import { tempDir } from '../testkit/temp-dir.ts';
import { docBlock as docBlockOf } from './lib/doc-blocks.ts';
import { Collected, freshStart, keysOf, portOpen, type FreshStart } from './lib/npm-start.ts';

const ROOT = fileURLToPath(new URL('../', import.meta.url));
const NODE = join(ROOT, 'scripts', 'node');

/** Processes of a stack: their command line or environment names its run directory. */
function stackProcesses(runDir: string): { pid: number; cmd: string }[] {
  const out: { pid: number; cmd: string }[] = [];
  for (const d of readdirSync('/proc')) {
    if (!/^\d+$/.test(d) || Number(d) === process.pid) continue;
    try {
      const cmd = readFileSync(`/proc/${d}/cmdline`, 'utf8').replaceAll('\0', ' ');
      const env = readFileSync(`/proc/${d}/environ`, 'utf8');
      if (cmd.includes(runDir) || env.includes(`DEV_RUN_DIR=${runDir}\0`)) out.push({ pid: Number(d), cmd });
    } catch { /* gone, or not ours */ }
  }
  return out;
}

type Fresh = FreshStart;

function fresh(extra: Record<string, string> = {}): Promise<Fresh> {
  return freshStart({ extra: { SHUTDOWN_GRACE_MS: '1000', ...extra } });
}

/** A process of these tests: its own process group (so the group can be signalled). */
class Proc extends Collected {
  static npm(env: Record<string, string>, args: string[] = ['npm', 'start']): Proc {
    return new Proc(spawn(args[0]!, args.slice(1), { cwd: ROOT, env, stdio: ['ignore', 'pipe', 'pipe'], detached: true }));
  }
  static bash(script: string, env: Record<string, string>): Proc {
    return new Proc(spawn('bash', ['-c', script], { cwd: ROOT, env, stdio: ['ignore', 'pipe', 'pipe'], detached: true }));
  }
}

/** Nothing of the stack is left: no process names its run directory, every port is closed. */
async function nothingLeft(f: Fresh): Promise<void> {
  let procs = stackProcesses(f.runDir);
  for (let i = 0; i < 30 && procs.length > 0; i++) {
    await sleep(100);
    procs = stackProcesses(f.runDir);
  }
  assert.deepEqual(procs.map((p) => p.cmd), [], 'no process of the stack is left');
  for (const [k, port] of Object.entries(f.ports)) assert.equal(await portOpen(port), false, `${k} ${port} is closed`);
}

/** Kills whatever a failed test left behind (the processes of its own run directory only). */
function cleanUp(f: Fresh): void {
  for (const p of stackProcesses(f.runDir)) {
    try {
      process.kill(p.pid, 'SIGKILL');
    } catch { /* gone */ }
  }
  rmSync(f.runDir, { recursive: true, force: true });
}

/** scripts/edge-client.ts with these keys: its output (`<status> <body>`), whatever the status. */
async function client(f: Fresh, keys: Record<string, string>, ...args: string[]): Promise<{ stdout: string }> {
  try {
    return await promisify(execFile)(NODE, [join(ROOT, 'scripts/edge-client.ts'), ...args], { cwd: ROOT, env: { ...f.env, ...keys, EDGE_PORT: String(f.ports.EDGE_PORT) } });
  } catch (err) {
    return { stdout: String((err as { stdout?: string }).stdout ?? err) };
  }
}

/** The lines a clean stop must not print: the TS service's Redis errors, errors, a child killed. */
function assertCleanStop(out: string, graceMs: number): void {
  const stop = out.slice(out.indexOf('npm start: stopping'));
  assert.ok(stop.length > 0, out);
  assert.doesNotMatch(stop, /ECONNREFUSED|redis error|"level":(50|60)|did not stop within|\[error\]/, stop);
  const secs = Number(/npm start: stopped in ([0-9.]+) s/.exec(stop)?.[1]);
  // Margin: 1.5 s beyond the TS service's grace for Envoy's drain and the backend and Redis to stop.
  assert.ok(secs < graceMs / 1000 + 1.5, `stopped in ${secs} s (grace ${graceMs} ms):\n${stop}`);
}

test('npm start: each bad setting ends it before anything starts, with one line naming the variable, exit code 2, nothing left', { timeout: 60_000 }, async () => {
  const cases: [Record<string, string>, string | RegExp][] = [
    [{ EDGE_PORT: 'abc' }, 'EDGE_PORT: expected an integer in [0, 65535], got "abc"'],
    [{ RPS_PER_IP: '-1' }, 'RPS_PER_IP: expected an integer in [1, 1000000], got "-1"'],
    [{ RATE_BURST: '0' }, 'RATE_BURST: expected an integer in [1, 10000000], got "0"'],
    [{ RATE_LIMIT_SCOPE: 'cluster' }, 'RATE_LIMIT_SCOPE: expected "global" or "local", got "cluster"'],
    [{ RATE_LIMIT_SCOPE: 'local', RATELIMIT_SERVICE_ADDRESS: '127.0.0.1:8091' }, 'RATELIMIT_SERVICE_ADDRESS: expected unset with RATE_LIMIT_SCOPE=local (only the global limit calls a rate limit service), got "127.0.0.1:8091"'],
    [{ GEO_UNKNOWN: 'maybe' }, 'GEO_UNKNOWN: expected "block", "close-only" or "allow", got "maybe"'],
    [{ BLOCKED_COUNTRIES: 'KP,PL', CLOSE_ONLY_COUNTRIES: 'PL' }, 'CLOSE_ONLY_COUNTRIES: expected codes not also in BLOCKED_COUNTRIES (each jurisdiction has one tier; PL is in both), got "PL"'],
    [{ BLOCKED_COUNTRIES: 'XX1' }, 'BLOCKED_COUNTRIES: expected ISO 3166-1 alpha-2 codes, comma-separated, got "XX1"'],
    [{ LOG_LEVEL: 'loud' }, 'LOG_LEVEL: expected trace|debug|info|warn|error|fatal|silent, got "loud"'],
    [{ AUTHZ_WORKERS: '0' }, 'AUTHZ_WORKERS: expected an integer in [1, 64], got "0"'],
    [{ NONCE_TTL_SECS: '10' }, 'NONCE_TTL_SECS: expected at least 2 × REPLAY_WINDOW_SECS (600), got "10"'],
    [{ ORDER_BACKEND_URL: 'http://backend' }, 'ORDER_BACKEND_URL: expected https://host:port (no path), got "http://backend"'],
    [{ EDGE_INGEST_HMAC: 'short' }, /^EDGE_INGEST_HMAC: expected .*32 bytes/],
    [{ DEV_REDIS_PORT: '0' }, 'DEV_REDIS_PORT: expected an integer in [1, 65535], got "0"'],
    [{ DEV_BACKEND_PORT: 'x' }, 'DEV_BACKEND_PORT: expected an integer in [0, 65535], got "x"'],
    [{ EDGE_PORT: '0' }, 'EDGE_PORT: expected a port in [1, 65535] for npm start, got "0"'],
    [{ STRICT_SETTINGS: '1', RATE_LIMIT_RPS: '-1' }, 'RATE_LIMIT_RPS: expected a known setting (STRICT_SETTINGS=1 refuses unknown ones); did you mean RATE_LIMIT_SCOPE?'],
    [{ STRICT_SETTINGS: 'yes' }, 'STRICT_SETTINGS: expected 1 or 0, got "yes"'],
    [{ DEV_EDGE_TLS: 'yes' }, 'DEV_EDGE_TLS: expected 1 or 0, got "yes"'],
    // The geo policy file and the settings it replaces are one or the other; a file that cannot be read ends it too.
    [{ GEO_POLICY_FILE: new URL('../deploy/policy/venue-example.yaml', import.meta.url).pathname, BLOCKED_COUNTRIES: 'KP' }, /^GEO_POLICY_FILE: expected no BLOCKED_COUNTRIES beside it \(the file holds the whole geo policy/],
    [{ GEO_POLICY_FILE: '/nonexistent/policy.yaml' }, /^GEO_POLICY_FILE: \/nonexistent\/policy\.yaml: \(file\): expected a readable file, got "ENOENT/],
  ];
  const runs = await Promise.all(cases.map(async ([setting, line]) => ({ setting, line, f: await fresh(setting) })));
  // Ports given twice: the second setting is named.
  const dup = await fresh();
  dup.env['MARKET_PORT'] = String(dup.ports.EDGE_PORT);
  runs.push({ setting: { MARKET_PORT: 'EDGE_PORT' }, line: `MARKET_PORT: expected a port other than EDGE_PORT's, got "${dup.ports.EDGE_PORT}"`, f: dup });
  try {
    const t0 = Date.now();
    const procs = runs.map((r) => Proc.npm(r.f.env));
    const codes = await Promise.all(procs.map((p) => p.exit(30_000)));
    const elapsed = Date.now() - t0;
    for (const [i, r] of runs.entries()) {
      const what = JSON.stringify(r.setting);
      assert.equal(codes[i], 2, `${what}: exit code\n${procs[i]!.out}`);
      const lines = procs[i]!.lines();
      assert.equal(lines.length, 1, `${what}: one line, no stack trace:\n${procs[i]!.out}`);
      if (typeof r.line === 'string') assert.equal(lines[0], `npm start: ${r.line}`, what);
      else assert.match(lines[0]!.replace(/^npm start: /, ''), r.line, what);
      assert.deepEqual(readdirSync(r.f.runDir), [], `${what}: nothing was started or written (no redis/, start.pid, dev.env)`);
    }
    for (const r of runs) await nothingLeft(r.f);
    process.stdout.write(`# ${runs.length} bad settings refused in ${elapsed} ms (in parallel)\n`);
  } finally {
    for (const r of runs) cleanUp(r.f);
  }
});

test('npm start: SIGTERM or SIGINT to the npm pid or to its process group, and `timeout`, stop the whole stack in order; every port free, no process left', { timeout: 120_000 }, async () => {
  const ways: [string, (p: Proc) => void, string[] | undefined, number | null][] = [
    ['SIGTERM to the npm pid', (p) => p.child.kill('SIGTERM'), undefined, 0],
    ['SIGINT to the npm pid', (p) => p.child.kill('SIGINT'), undefined, 0],
    ['SIGTERM to its process group', (p) => process.kill(-p.child.pid!, 'SIGTERM'), undefined, 0],
    ['SIGINT to its process group (Ctrl-C)', (p) => process.kill(-p.child.pid!, 'SIGINT'), undefined, 0],
    ['timeout 15 npm start', () => undefined, ['timeout', '15', 'npm', 'start'], 124],
  ];
  const runs = await Promise.all(ways.map(async ([name, send, cmd, code]) => ({ name, send, code, f: await fresh(), cmd })));
  try {
    const procs = runs.map((r) => Proc.npm(r.f.env, r.cmd));
    await Promise.all(procs.map((p) => p.waitFor(/start: READY/, 14_000)));
    for (const [i, r] of runs.entries()) {
      assert.equal((await fetch(`http://127.0.0.1:${r.f.ports.EDGE_PORT}/healthz`)).status, 200, r.name);
      r.send(procs[i]!);
    }
    const codes = await Promise.all(procs.map((p) => p.exit(30_000)));
    for (const [i, r] of runs.entries()) {
      assert.equal(codes[i], r.code, `${r.name}: exit code\n${procs[i]!.out}`);
      assertCleanStop(procs[i]!.out, 1000);
      await nothingLeft(r.f);
    }
  } finally {
    for (const r of runs) cleanUp(r.f);
  }
});

test('npm start supervises: the TS service, Redis and the demo backend are restarted (503 JSON meanwhile, 200 again within 10 s); a second npm start names the running one; Envoy\'s exit ends the stack', { timeout: 120_000 }, async () => {
  const f = await fresh({ RATE_LIMIT_RPS: '-1' });
  const stack = Proc.npm(f.env);
  try {
    await stack.waitFor(/start: READY/, 60_000);
    const edge = `http://127.0.0.1:${f.ports.EDGE_PORT}`;
    // A misspelled setting: a warning naming the nearest one; the TS service never sees it.
    assert.match(stack.out, /npm start: warning: RATE_LIMIT_RPS is not a setting \(did you mean RATE_LIMIT_SCOPE\?\); it is ignored/);
    const procs = () => stackProcesses(f.runDir);
    const pidOf = (re: RegExp): number => {
      const p = procs().filter((x) => re.test(x.cmd));
      assert.equal(p.length, 1, `${re}: ${procs().map((x) => x.cmd).join('\n')}`);
      return p[0]!.pid;
    };
    assert.doesNotMatch(readFileSync(`/proc/${pidOf(/authz\/src\/main\.ts/)}/environ`, 'utf8'), /RATE_LIMIT_RPS/);
    const startPid = pidOf(/scripts\/start\.ts/);

    // A second npm start: on the same run directory, then on the same ports from another one.
    const again = Proc.npm(f.env);
    assert.equal(await again.exit(20_000), 2, again.out);
    assert.match(again.lines().at(-1) ?? '', new RegExp(`^npm start: a stack is already running from ${f.runDir} \\(pid ${startPid}, ${edge}\\); stop it first`));
    const otherDir = tempDir('edge-start-');
    const elsewhere = Proc.npm({ ...f.env, DEV_RUN_DIR: otherDir });
    assert.equal(await elsewhere.exit(20_000), 2, elsewhere.out);
    assert.match(elsewhere.lines().at(-1) ?? '', new RegExp(`^npm start: a stack is already running on these ports \\(pid ${startPid}\\): EDGE_PORT ${f.ports.EDGE_PORT}, AUTHZ_GRPC_PORT`));
    rmSync(otherDir, { recursive: true, force: true });
    assert.equal((await fetch(`${edge}/healthz`)).status, 200, 'the running stack is untouched');

    const keys = keysOf(join(f.runDir, 'dev.env'));
    assert.match((await client(f, keys, 'demo-ingest', '0xsup')).stdout, /^200 /);
    const order = async (): Promise<string> => {
      writeFileSync(join(f.runDir, 'o.bin'), randomBytes(32));
      return (await client(f, keys, 'order', '0xsup', '1', join(f.runDir, 'o.bin'))).stdout;
    };
    assert.match(await order(), /^200 /);

    // The TS service killed: Envoy answers 503 JSON until it is back, then 200 within 10 s.
    process.kill(pidOf(/authz\/src\/main\.ts/), 'SIGKILL');
    const killedAt = Date.now();
    const seen: number[] = [];
    let unavailable: unknown;
    while (Date.now() - killedAt < 10_000) {
      const r = await fetch(`${edge}/v1/markets`);
      seen.push(r.status);
      if (r.status === 503) unavailable = await r.json();
      else await r.arrayBuffer();
      if (r.status === 200 && unavailable !== undefined) break;
      await sleep(20);
    }
    const u = unavailable as { message?: string; requestId?: string } | undefined;
    assert.deepEqual(unavailable, { error: 'service_unavailable', message: u?.message, requestId: u?.requestId }, `503 JSON while down: ${seen.join(',')}`);
    assert.match(String(u?.requestId), /^[0-9a-f-]{36}$/, 'Envoy\'s 503 names its request id');
    assert.equal(seen.at(-1), 200, `200 again within 10 s: ${seen.join(',')}`);
    process.stdout.write(`# TS service killed: 200 again after ${Date.now() - killedAt} ms\n`);
    await stack.waitFor(/npm start: the TS service exited \(signal SIGKILL\); restarting it in 0\.5 s \(restart 1\)\n(.|\n)*npm start: the TS service is back/, 10_000);

    // Redis killed: restarted with its data; ingests work again.
    process.kill(pidOf(/redis-server/), 'SIGKILL');
    await stack.waitFor(/npm start: redis-server exited \(signal SIGKILL\); restarting it in 0\.5 s \(restart 1\)\n(.|\n)*npm start: redis-server is back/, 10_000);
    let ingest = '';
    for (let i = 0; i < 50 && !ingest.startsWith('200'); i++) {
      ingest = (await client(f, keys, 'demo-ingest', '0xsup2')).stdout;
      if (!ingest.startsWith('200')) await sleep(200);
    }
    assert.match(ingest, /^200 /);
    const markets = await (await fetch(`${edge}/v1/markets?conditionId=0xsup`)).json() as { markets: unknown[] };
    assert.equal(markets.markets.length, 1, 'the market stored before the crash is still there (append-only file)');

    // The demo backend killed: restarted; orders reach it again.
    process.kill(pidOf(/order-backend-main\.ts/), 'SIGKILL');
    await stack.waitFor(/npm start: the demo backend exited \(signal SIGKILL\); restarting it in 0\.5 s \(restart 1\)\n(.|\n)*npm start: the demo backend is back/, 10_000);
    let ordered = '';
    for (let i = 0; i < 50 && !ordered.startsWith('200'); i++) {
      ordered = await order();
      if (!ordered.startsWith('200')) await sleep(200);
    }
    assert.match(ordered, /^200 /);

    // Envoy's exit ends the stack.
    process.kill(pidOf(/envoy -c/), 'SIGKILL');
    assert.equal(await stack.exit(20_000), 1, stack.out);
    assert.match(stack.out, /npm start: Envoy exited \(signal SIGKILL\); stopping the stack/);
    await nothingLeft(f);
  } finally {
    cleanUp(f);
  }
});

/** The ```sh block of docs/operations.md marked `<!-- doc-test: <id> -->` (the doc's text, run as written; e2e/lib/doc-blocks.ts). */
function docBlock(id: string): string {
  return docBlockOf('docs/operations.md', id);
}

test('docs/operations.md, npm start forms, run as written: HMAC rotation keeps .run/dev.env current, client-certificate rotation, GeoIP replacement (good and corrupt)', { timeout: 180_000 }, async () => {
  const f = await fresh({ GEOIP_RELOAD_INTERVAL_MS: '100', ORDER_BACKEND_MAX_CONN_SECS: '1' });
  /** The doc's paths and ports are the defaults: this run's instead. */
  const ours = (block: string): string => block.replaceAll('.run/', `${f.runDir}/`)
    .replaceAll('127.0.0.1:9901', `127.0.0.1:${f.ports.ENVOY_ADMIN_PORT}`).replaceAll('127.0.0.1:9464', `127.0.0.1:${f.ports.AUTHZ_ADMIN_PORT}`);
  const stopStack = async (p: Proc): Promise<void> => {
    process.kill(-p.child.pid!, 'SIGINT');
    assert.equal(await p.exit(20_000), 0, p.out);
  };
  try {
    // A first start writes dev.env with the first key.
    let stack = Proc.npm(f.env);
    await stack.waitFor(/start: READY/, 60_000);
    await stopStack(stack);
    const first = keysOf(join(f.runDir, 'dev.env'));
    const oldKey = first['EDGE_INGEST_HMAC']!;

    // Rotation, step 1: new key current, old key previous.
    stack = Proc.bash(ours(docBlock('hmac-rotation-start')), f.env);
    await stack.waitFor(/start: READY/, 60_000);
    assert.match(stack.out, /now holds the ingest HMAC key\(s\) this stack runs with/);
    const rotated = keysOf(join(f.runDir, 'dev.env'));
    assert.match(rotated['EDGE_INGEST_HMAC']!, /^hex:[0-9a-f]{64}$/);
    assert.notEqual(rotated['EDGE_INGEST_HMAC'], oldKey, 'dev.env holds the new key');
    assert.equal(rotated['EDGE_INGEST_HMAC_PREVIOUS'], oldKey, 'and the old one as previous');
    assert.equal(rotated['EDGE_FEED_ED25519_KEY'], first['EDGE_FEED_ED25519_KEY'], 'the rest of dev.env is kept');
    assert.match((await client(f, rotated, 'demo-ingest', '0xrot1')).stdout, /^200 /, 'the banner\'s dev.env signs with the current key');
    assert.match((await client(f, { ...rotated, EDGE_INGEST_HMAC: oldKey }, 'demo-ingest', '0xrot2')).stdout, /^200 /, 'the old key is still accepted');
    await stopStack(stack);

    // A plain restart keeps the rotation as it is.
    stack = Proc.npm(f.env);
    await stack.waitFor(/start: READY/, 60_000);
    assert.match((await client(f, { ...rotated, EDGE_INGEST_HMAC: oldKey }, 'demo-ingest', '0xrot3')).stdout, /^200 /);
    await stopStack(stack);

    // Step 3: the previous key emptied, in the service and in dev.env.
    stack = Proc.bash(ours(docBlock('hmac-rotation-end')), f.env);
    await stack.waitFor(/start: READY/, 60_000);
    const ended = keysOf(join(f.runDir, 'dev.env'));
    assert.equal(ended['EDGE_INGEST_HMAC'], rotated['EDGE_INGEST_HMAC']);
    assert.equal(ended['EDGE_INGEST_HMAC_PREVIOUS'], undefined);
    assert.match((await client(f, ended, 'demo-ingest', '0xrot4')).stdout, /^200 /);
    assert.match((await client(f, { ...ended, EDGE_INGEST_HMAC: oldKey }, 'demo-ingest', '0xrot5')).stdout, /^401 .*unauthorized/, 'the retired key is refused');

    // Client certificate: issued and published while the stack runs; Envoy loads it; new
    // connections to the backend present it.
    writeFileSync(join(f.runDir, 'o.bin'), randomBytes(32));
    assert.match((await client(f, ended, 'order', '0xrot1', '1', join(f.runDir, 'o.bin'))).stdout, /^200 /);
    await stack.waitFor(/"clientCert":"edge-client-1"/, 5000);
    const sdsUpdates = async (): Promise<number> => Number(/ssl_context_update_by_sds: (\d+)/.exec(
      await (await fetch(`http://127.0.0.1:${f.ports.ENVOY_ADMIN_PORT}/stats?filter=client_ssl_socket_factory.ssl_context_update_by_sds`)).text())?.[1]);
    const before = await sdsUpdates();
    const rotate = Proc.bash(ours(docBlock('client-cert-rotate')), f.env);
    assert.equal(await rotate.exit(30_000), 0, rotate.out);
    assert.match(rotate.out, /npm start: published client-\d+ \(CN=edge-client-\d+\)/);
    assert.match(rotate.out, /client_ssl_socket_factory\.ssl_context_update_by_sds: \d+/, 'the doc\'s grep finds the counter');
    for (let i = 0; i < 20 && (await sdsUpdates()) === before; i++) await sleep(100);
    assert.equal(await sdsUpdates(), before + 1, 'Envoy loaded the new certificate');
    await sleep(1100); // ORDER_BACKEND_MAX_CONN_SECS=1: the next order opens a new connection
    assert.match((await client(f, ended, 'order', '0xrot1', '1', join(f.runDir, 'o.bin'))).stdout, /^200 /);
    await stack.waitFor(/"clientCert":"edge-client-\d{6,}"/, 5000);

    // GeoIP: a good replacement is loaded, a corrupt one refused (the old one keeps serving).
    assert.ok(existsSync(join(f.runDir, 'geoip/country.mmdb')), 'npm start serves a copy under the run directory');
    const reloads = async (): Promise<string> => (await (await fetch(`http://127.0.0.1:${f.ports.AUTHZ_ADMIN_PORT}/metrics`)).text())
      .split('\n').filter((l) => l.startsWith('edge_geoip_reloads_total')).join(' ');
    assert.equal(await reloads(), 'edge_geoip_reloads_total{result="ok"} 0 edge_geoip_reloads_total{result="failed"} 0');
    const good = Proc.bash(ours(docBlock('geoip-replace')), f.env);
    assert.equal(await good.exit(10_000), 0, good.out);
    for (let i = 0; i < 30 && !(await reloads()).includes('{result="ok"} 1'); i++) await sleep(100);
    assert.equal(await reloads(), 'edge_geoip_reloads_total{result="ok"} 1 edge_geoip_reloads_total{result="failed"} 0');
    const bad = Proc.bash(ours(docBlock('geoip-corrupt')), f.env);
    assert.equal(await bad.exit(10_000), 0, bad.out);
    for (let i = 0; i < 30 && !(await reloads()).includes('{result="failed"} 1'); i++) await sleep(100);
    assert.equal(await reloads(), 'edge_geoip_reloads_total{result="ok"} 1 edge_geoip_reloads_total{result="failed"} 1');
    assert.equal((await fetch(`http://127.0.0.1:${f.ports.EDGE_PORT}/healthz`)).status, 200, 'the previous database keeps serving');
    await stopStack(stack);
    assertCleanStop(stack.out, 1000);
    await nothingLeft(f);
  } finally {
    cleanUp(f);
  }
});

test('npm start on a fresh clone says what it installs before the ~20 s of pip', { timeout: 30_000 }, async () => {
  const pkg = JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8')) as { scripts: Record<string, string> };
  const clone = tempDir('edge-clone-');
  try {
    mkdirSync(join(clone, 'scripts'));
    cpSync(join(ROOT, 'scripts/setup.sh'), join(clone, 'scripts/setup.sh'));
    // No .venv yet; a Python that fails at once stands for the install (nothing is downloaded).
    const p = new Proc(spawn('sh', ['-c', pkg.scripts['start']!], { cwd: clone, env: { ...process.env, PYTHON: 'false' }, stdio: ['ignore', 'pipe', 'pipe'] }));
    assert.notEqual(await p.exit(20_000), 0);
    assert.match(p.lines()[0] ?? '', /^npm start: first run: installing Envoy, grpcurl and Node 24 into \.venv\//, p.out);
  } finally {
    rmSync(clone, { recursive: true, force: true });
  }
});

test('npm start with nothing trusted (GEO_TRUSTED_CIDRS empty, GEO_UNKNOWN=block) becomes ready: readiness is the TS service\'s /healthz and Envoy\'s admin /ready, never a route geo may refuse', { timeout: 90_000 }, async () => {
  const f = await fresh({ GEO_TRUSTED_CIDRS: '', GEO_UNKNOWN: 'block' });
  const stack = Proc.npm(f.env);
  try {
    await stack.waitFor(/start: READY/, 60_000);
    const edge = `http://127.0.0.1:${f.ports.EDGE_PORT}`;
    assert.match(stack.out, new RegExp(`start: READY {2}the TS service GET 127\\.0\\.0\\.1:${f.ports.MARKET_PORT}/healthz → 200, Envoy admin GET /ready → 200\n`));
    // The banner says what this machine gets through the edge, and why.
    assert.match(stack.out, new RegExp(`this machine {2}GET ${edge}/healthz → 451 restricted_jurisdiction \\(geo judges 127\\.0\\.0\\.1 like any client: it is not in GEO_TRUSTED_CIDRS\\)`));
    const viaEdge = await fetch(`${edge}/healthz`);
    assert.equal(viaEdge.status, 451, 'loopback has no GeoIP record: blocked by design');
    assert.equal((await viaEdge.json() as { error: string }).error, 'restricted_jurisdiction');
    assert.equal((await fetch(`http://127.0.0.1:${f.ports.MARKET_PORT}/healthz`)).status, 200);
    assert.equal(await (await fetch(`http://127.0.0.1:${f.ports.ENVOY_ADMIN_PORT}/ready`)).text(), 'LIVE\n');
    process.kill(-stack.child.pid!, 'SIGINT');
    assert.equal(await stack.exit(20_000), 0, stack.out);
    await nothingLeft(f);
  } finally {
    cleanUp(f);
  }
});

test('npm start names the component that does not become ready and its last answer: Envoy that never listens (an unreachable REDIS_URL is named by its own test)', { timeout: 120_000 }, async () => {
  // An "Envoy" that runs and never opens its admin port.
  const fakeDir = tempDir('edge-fake-envoy-');
  const fake = join(fakeDir, 'envoy');
  writeFileSync(fake, '#!/bin/sh\nexec sleep 600\n', { mode: 0o755 });
  const silentEnvoy = await fresh({ ENVOY_BIN: fake });
  const runs = [silentEnvoy].map((f) => ({ f, p: Proc.npm(f.env) }));
  try {
    const codes = await Promise.all(runs.map((r) => r.p.exit(75_000)));
    assert.deepEqual(codes, [1], runs.map((r) => r.p.out).join('\n----\n'));
    assert.match(runs[0]!.p.out, new RegExp(`npm start: Envoy did not become ready within 30 s: GET http://127\\.0\\.0\\.1:${silentEnvoy.ports.ENVOY_ADMIN_PORT}/ready: connection refused \\(nothing listening\\)\n`));
    for (const r of runs) await nothingLeft(r.f);
  } finally {
    for (const r of runs) cleanUp(r.f);
    rmSync(fakeDir, { recursive: true, force: true });
  }
});

/**
 * Runs `npm start` on a pseudo-terminal (Python's pty module: Node has none) and prints what it
 * read until READY; then exits, which closes the terminal: the kernel sends SIGHUP, and every later
 * write to it fails with EIO (issue 32: the crash handler used to loop on that at full CPU).
 */
const PTY_RUNNER = `
import os, pty, select, sys, time
pid, fd = pty.fork()
if pid == 0:
    os.execvp('npm', ['npm', 'start'])
buf, end = b'', time.time() + 60
while b'READY' not in buf and time.time() < end:
    if select.select([fd], [], [], 0.2)[0]:
        try:
            buf += os.read(fd, 65536)
        except OSError:
            break
sys.stdout.write(buf.decode(errors='replace'))
sys.stdout.flush()
# Hold the terminal until told, then let it go with this process.
sys.stdin.read(1)
`;

/** Requests for a while (the stack logs each one), whatever they answer; stops at the first refused connection. */
async function load(port: number, ms: number): Promise<number> {
  let sent = 0;
  const end = Date.now() + ms;
  while (Date.now() < end) {
    try {
      await Promise.all([0, 1, 2, 3].map(() => fetch(`http://127.0.0.1:${port}/v1/markets?limit=1`, { signal: AbortSignal.timeout(2000) }).then((r) => r.arrayBuffer())));
      sent += 4;
    } catch {
      break;
    }
  }
  return sent;
}

test('npm start survives its terminal: the terminal closed or the output pipe broken under load stops the whole stack in order; every port free, nothing spinning', { timeout: 120_000 }, async () => {
  const GRACE_MS = 1000;
  const [tty, pipe] = [await fresh(), await fresh()];
  try {
    // The terminal: a pty that goes away while requests are coming in.
    const term = new Proc(spawn('python3', ['-c', PTY_RUNNER], { cwd: ROOT, env: tty.env, stdio: ['pipe', 'pipe', 'pipe'], detached: true }));
    // The pipe: `npm start | tee log`, then tee is gone (Ctrl-C'd on its own, the terminal kept).
    const piped = Proc.npm(pipe.env);
    await Promise.all([term.waitFor(/start: READY/, 60_000), piped.waitFor(/start: READY/, 60_000)]);
    const t0 = Date.now();
    const loads = [load(tty.ports.EDGE_PORT, 5000), load(pipe.ports.EDGE_PORT, 5000)];
    await sleep(500);
    term.child.stdin?.end('x');
    piped.child.stdout?.destroy();
    piped.child.stderr?.destroy();
    const sent = await Promise.all(loads);
    assert.ok(sent.every((n) => n > 0), `requests were sent while the output went away: ${sent.join(', ')}`);
    // Stopped in order: the TS service's grace, Envoy's and Redis's own stop, and a margin of 5 s
    // for a busy 2-core machine; before the fix the stack never stopped (start.ts spun on EIO).
    for (const f of [tty, pipe]) {
      let procs = stackProcesses(f.runDir);
      while (procs.length > 0 && Date.now() - t0 < GRACE_MS + 15_000) {
        await sleep(200);
        procs = stackProcesses(f.runDir);
      }
      assert.deepEqual(procs.map((p) => p.cmd), [], `no process of the stack is left ${Date.now() - t0} ms after the output went away`);
      await nothingLeft(f);
    }
    assert.equal(await piped.exit(5000), 0, piped.out);
  } finally {
    cleanUp(tty);
    cleanUp(pipe);
  }
});

test('docs/operations.md, npm start: an HMAC rotation step from a shell that sourced dev.env before the rotation is refused (exit 2, both keys by fingerprint, dev.env untouched); the refreshed shell ends the rotation', { timeout: 180_000 }, async () => {
  const f = await fresh();
  const ours = (block: string): string => block.replaceAll('./.run/', `${f.runDir}/`).replaceAll('.run/', `${f.runDir}/`);
  const stopStack = async (p: Proc): Promise<void> => {
    process.kill(-p.child.pid!, 'SIGINT');
    assert.equal(await p.exit(20_000), 0, p.out);
  };
  const fp = (key: string): string => `sha256:${createHash('sha256').update(Buffer.from(key.replace(/^hex:/, ''), 'hex')).digest('hex').slice(0, 8)}`;
  const devEnv = join(f.runDir, 'dev.env');
  /** A start refused before anything ran: exit 2, one line, no key in it, dev.env as it was, nothing started. */
  const refused = async (p: Proc, re: RegExp): Promise<string> => {
    const before = readFileSync(devEnv, 'utf8');
    assert.equal(await p.exit(30_000), 2, p.out);
    const lines = p.lines();
    assert.equal(lines.length, 1, `one line:\n${p.out}`);
    assert.match(lines[0]!, re);
    for (const v of Object.values(keysOf(devEnv))) assert.ok(!p.out.includes(v.replace(/^hex:/, '')), 'no key in the output');
    assert.equal(readFileSync(devEnv, 'utf8'), before, 'dev.env is untouched');
    assert.ok(!existsSync(join(f.runDir, 'start.pid')), 'nothing was started');
    return lines[0]!;
  };
  try {
    let stack = Proc.npm(f.env);
    await stack.waitFor(/start: READY/, 60_000);
    await stopStack(stack);
    // The banner's `set -a; . dev.env; set +a` in a shell, before the rotation.
    const stale = keysOf(devEnv);
    const oldKey = stale['EDGE_INGEST_HMAC']!;

    // Step 1 in another shell; the feed switches to the new key (step 2).
    stack = Proc.bash(ours(docBlock('hmac-rotation-start')), f.env);
    await stack.waitFor(/start: READY/, 60_000);
    const rotated = keysOf(devEnv);
    const newKey = rotated['EDGE_INGEST_HMAC']!;
    assert.match(stack.out, new RegExp(`now holds the ingest HMAC key\\(s\\) this stack runs with \\(from your environment\\): EDGE_INGEST_HMAC ${fp(newKey)}, EDGE_INGEST_HMAC_PREVIOUS ${fp(oldKey)}\n`));
    assert.match((await client(f, rotated, 'demo-ingest', '0xstale1')).stdout, /^200 /);
    await stopStack(stack);

    // Step 3 from the stale shell: refused, naming the environment's (old) key and dev.env's (new) one.
    const line = await refused(Proc.bash(ours(docBlock('hmac-rotation-end')), { ...f.env, ...stale }),
      /^npm start: EDGE_INGEST_HMAC in your environment \(sha256:[0-9a-f]{8}\) is not the key this stack last ran with \(sha256:[0-9a-f]{8}, in '[^']+dev\.env'\).*refresh it \(set -a; \. '[^']+dev\.env'; set \+a\)/);
    assert.ok(line.includes(`(${fp(oldKey)})`) && line.includes(`(${fp(newKey)}, in`), line);
    // A plain start from that shell likewise.
    await refused(Proc.npm({ ...f.env, ...stale }), /^npm start: EDGE_INGEST_HMAC in your environment/);

    // The doc's refresh, then step 3: the rotation ends on the new key.
    stack = Proc.bash(ours(docBlock('hmac-refresh-shell')), { ...f.env, ...stale });
    await stack.waitFor(/start: READY/, 60_000);
    const ended = keysOf(devEnv);
    assert.equal(ended['EDGE_INGEST_HMAC'], newKey);
    assert.equal(ended['EDGE_INGEST_HMAC_PREVIOUS'], undefined);
    assert.match((await client(f, ended, 'demo-ingest', '0xstale2')).stdout, /^200 /, 'the feed on the new key is accepted');
    assert.match((await client(f, stale, 'demo-ingest', '0xstale3')).stdout, /^401 .*unauthorized/, 'the retired key is refused');
    await stopStack(stack);

    // A shell that sourced dev.env during the rotation would accept the retired key again: refused.
    await refused(Proc.npm({ ...f.env, ...rotated }),
      new RegExp(`^npm start: EDGE_INGEST_HMAC_PREVIOUS in your environment \\(${fp(oldKey)}\\) is not the previous key this stack last ran with \\(none, in`));
    await nothingLeft(f);
  } finally {
    cleanUp(f);
  }
});

test('npm start with a REDIS_URL that does not answer: one "waiting for Redis" line, the TS service starts once it answers; its Redis errors one line per 10 s; a Redis that never answers ends the start after 30 s naming the cause', { timeout: 120_000 }, async () => {
  const redis = await PrivateRedis.start();
  await redis.stop();
  const late = await fresh({ REDIS_URL: redis.url });
  const closedPort = await freePort();
  const never = await fresh({ REDIS_URL: `redis://:pw@127.0.0.1:${closedPort}/0` });
  try {
    const t0 = Date.now();
    const neverProc = Proc.npm(never.env);
    const stack = Proc.npm(late.env);
    await stack.waitFor(/npm start: waiting for Redis at /, 30_000);
    await sleep(2000);
    await redis.resume();
    await stack.waitFor(/start: READY/, 60_000);
    assert.equal(stack.out.match(/waiting for Redis/g)?.length, 1, stack.out);
    // Two whole lines in this order; the demo backend (its own process) may log between them.
    assert.match(stack.out, new RegExp(`^npm start: waiting for Redis at redis://127\\.0\\.0\\.1:${redis.port}/0 \\(REDIS_URL\\): the TS service starts once it answers \\(at most 30 s\\)\n(?:.*\n)*?npm start: Redis at redis://127\\.0\\.0\\.1:${redis.port}/0 answers\n`, 'm'));
    assert.doesNotMatch(stack.out, /redis error|subscriber error/, 'the TS service started once Redis answered');

    // Redis goes away under the running stack: each connection's error once, not one per reconnect.
    const from = stack.out.length;
    await redis.stop();
    await sleep(5000);
    const errors = stack.out.slice(from).split('\n').filter((l) => /"msg":"(redis error|market store subscriber error)/.test(l));
    const byMsg = Object.groupBy(errors, (l) => /"msg":"([^"]+)"/.exec(l)![1]!);
    assert.ok(errors.length > 0, 'the outage is logged');
    for (const [msg, lines] of Object.entries(byMsg)) assert.equal(lines!.length, 1, `${msg}: one line in 5 s of reconnects:\n${errors.join('\n')}`);
    await redis.resume();
    let status = 0;
    for (let i = 0; i < 50 && status !== 200; i++) {
      status = (await fetch(`http://127.0.0.1:${late.ports.EDGE_PORT}/healthz`)).status;
      if (status !== 200) await sleep(200);
    }
    assert.equal(status, 200, 'ready again once Redis is back');
    process.kill(-stack.child.pid!, 'SIGINT');
    assert.equal(await stack.exit(20_000), 0, stack.out);

    // Nothing ever listens: after 30 s the start ends, naming Redis and the last error; the TS service never started.
    assert.equal(await neverProc.exit(60_000), 1, neverProc.out);
    process.stdout.write(`# unanswered REDIS_URL: the start ended after ${Date.now() - t0} ms\n`);
    assert.match(neverProc.out, new RegExp(`npm start: Redis at redis://…@127\\.0\\.0\\.1:${closedPort}/0 \\(REDIS_URL\\) did not answer within 30 s \\(connect ECONNREFUSED 127\\.0\\.0\\.1:${closedPort}\\): start it, or fix or unset REDIS_URL`));
    assert.equal(neverProc.out.match(/waiting for Redis/g)?.length, 1, neverProc.out);
    assert.doesNotMatch(neverProc.out, /edge-authz|:pw@/, 'no TS service, no password');
    await nothingLeft(late);
    await nothingLeft(never);
  } finally {
    await redis.stop();
    cleanUp(late);
    cleanUp(never);
  }
});

test('npm start refused for ports in use writes nothing: no run directory, no dev.env', { timeout: 60_000 }, async () => {
  const f = await fresh();
  const holder = createServer().listen(f.ports.EDGE_PORT, '127.0.0.1');
  await once(holder, 'listening');
  const newDir = join(f.runDir, 'not-yet');
  try {
    for (const env of [f.env, { ...f.env, DEV_RUN_DIR: newDir }]) {
      const p = Proc.npm(env);
      assert.equal(await p.exit(30_000), 2, p.out);
      assert.match(p.lines().join('\n'), new RegExp(`^npm start: ports already in use: EDGE_PORT ${f.ports.EDGE_PORT} by pid ${process.pid} `));
    }
    assert.deepEqual(readdirSync(f.runDir), [], 'an existing run directory stays empty (no dev.env)');
  } finally {
    holder.close();
    cleanUp(f);
  }
});

test('Ctrl-C while npm start generates its certificates: a clean stop, no openssl stack trace, nothing left', { timeout: 60_000 }, async () => {
  const f = await fresh();
  // An openssl that takes 2 s for the first CA, so the Ctrl-C lands while it runs.
  const bin = join(f.runDir, 'slow-bin');
  mkdirSync(bin);
  const real = execFileSync('sh', ['-c', 'command -v openssl']).toString().trim();
  writeFileSync(join(bin, 'openssl'), `#!/bin/sh\ncase "$*" in *backend-ca.key*) : > ${bin}/running; sleep 2;; esac\nexec ${real} "$@"\n`, { mode: 0o755 });
  const runDir = join(f.runDir, 'run');
  const env = { ...f.env, DEV_RUN_DIR: runDir, PATH: `${bin}:${f.env['PATH'] ?? ''}` };
  try {
    const p = Proc.npm(env);
    for (let i = 0; i < 300 && !existsSync(join(bin, 'running')); i++) await sleep(50);
    assert.ok(existsSync(join(bin, 'running')), `openssl ran:\n${p.out}`);
    process.kill(-p.child.pid!, 'SIGINT'); // Ctrl-C: the terminal's process group
    assert.equal(await p.exit(30_000), 0, p.out);
    assert.doesNotMatch(p.out, /internal error|Error:|\n\s+at /, p.out);
    assert.match(p.out, /npm start: stopped in/);
    await nothingLeft({ ...f, runDir });
  } finally {
    cleanUp({ ...f, runDir });
    cleanUp(f);
  }
});

test('npm start keeps its development PKI: a rotated client certificate and the CAs survive a restart; an expiring certificate is issued again', { timeout: 180_000 }, async () => {
  const f = await fresh({ ORDER_BACKEND_MAX_CONN_SECS: '1' });
  const pki = join(f.runDir, 'pki');
  const stopStack = async (p: Proc): Promise<void> => {
    process.kill(-p.child.pid!, 'SIGINT');
    assert.equal(await p.exit(20_000), 0, p.out);
  };
  const cas = (): string[] => ['backend-ca', 'client-ca'].map((n) => readFileSync(join(pki, `${n}.crt`), 'utf8'));
  const cnOf = (file: string): string => new X509Certificate(readFileSync(file)).subject;
  try {
    let stack = Proc.npm(f.env);
    await stack.waitFor(/start: READY/, 60_000);
    await stopStack(stack);
    const firstCas = cas();
    const backendCert = readFileSync(join(pki, 'backend.crt'), 'utf8');

    // A client certificate rotated with the stack stopped, then a restart: both kept.
    const rotate = Proc.npm(f.env, ['npm', 'start', '--', '--rotate-client-cert']);
    assert.equal(await rotate.exit(30_000), 0, rotate.out);
    const rotatedCn = cnOf(join(pki, 'client/tls.crt'));
    assert.match(rotatedCn, /^CN=edge-client-\d{6,}$/);
    stack = Proc.npm(f.env);
    await stack.waitFor(/start: READY/, 60_000);
    assert.doesNotMatch(stack.out, /issued again/, stack.out);
    assert.deepEqual(cas(), firstCas, 'the CAs are kept');
    assert.equal(readFileSync(join(pki, 'backend.crt'), 'utf8'), backendCert, 'the backend certificate is kept');
    assert.equal(cnOf(join(pki, 'client/tls.crt')), rotatedCn, 'the rotated client certificate is kept');
    const keys = keysOf(join(f.runDir, 'dev.env'));
    assert.match((await client(f, keys, 'demo-ingest', '0xpki')).stdout, /^200 /);
    writeFileSync(join(f.runDir, 'o.bin'), randomBytes(32));
    assert.match((await client(f, keys, 'order', '0xpki', '1', join(f.runDir, 'o.bin'))).stdout, /^200 /);
    await stack.waitFor(new RegExp(`"clientCert":"${rotatedCn.slice(3)}"`), 5000);
    await stopStack(stack);

    // The backend certificate re-signed for 1 day only (under RENEW_DAYS): issued again, the CAs kept.
    execFileSync('openssl', ['x509', '-req', '-in', 'backend.csr', '-CA', 'backend-ca.crt', '-CAkey', 'backend-ca.key', '-days', '1',
      '-out', 'backend.crt', '-extfile', 'backend.ext'], { cwd: pki, stdio: 'ignore' });
    stack = Proc.npm(f.env);
    await stack.waitFor(/start: READY/, 60_000);
    assert.match(stack.out, /\(certificates in '[^']+\/pki'; issued again, as missing or expiring within 7 days: backend\)/);
    const renewed = new X509Certificate(readFileSync(join(pki, 'backend.crt')));
    assert.ok(Date.parse(renewed.validTo) - Date.now() > 25 * 86_400_000, renewed.validTo);
    assert.deepEqual(cas(), firstCas);
    assert.equal(cnOf(join(pki, 'client/tls.crt')), rotatedCn);
    await sleep(1100); // ORDER_BACKEND_MAX_CONN_SECS=1: a new connection meets the new server certificate
    assert.match((await client(f, keys, 'order', '0xpki', '1', join(f.runDir, 'o.bin'))).stdout, /^200 /);
    await stopStack(stack);
    await nothingLeft(f);
  } finally {
    cleanUp(f);
  }
});

test('docs as written against npm start: the openssl signed ingest of docs/api.md; the GeoIP replacement snippets of docs/operations.md show the count moved (default reload interval)', { timeout: 120_000 }, async () => {
  const f = await fresh();
  const ours = (block: string): string => block.replaceAll('.run/', `${f.runDir}/`)
    .replaceAll('127.0.0.1:8080', `127.0.0.1:${f.ports.EDGE_PORT}`).replaceAll('127.0.0.1:9464', `127.0.0.1:${f.ports.AUTHZ_ADMIN_PORT}`);
  const stack = Proc.npm(f.env);
  try {
    await stack.waitFor(/start: READY/, 60_000);
    const block = docBlockOf('docs/api.md', 'api-openssl-ingest');
    assert.ok(block.includes('openssl pkeyutl -sign -inkey feed-private.pem'), 'docs/api.md has the signed ingest');
    const signed = Proc.bash(`set -eo pipefail\n${ours(block)}`, f.env);
    assert.equal(await signed.exit(30_000), 0, signed.out);
    assert.match(signed.out, /^\{"status":"stored","conditionId":"0x7c01","seq":\d+\}\n$/, signed.out);
    const markets = await (await fetch(`http://127.0.0.1:${f.ports.EDGE_PORT}/v1/markets?conditionId=0x7c01`)).json() as { markets: unknown[] };
    assert.equal(markets.markets.length, 1);

    // The snippets print the counter after the reload (GEOIP_RELOAD_INTERVAL_MS 2 s, unset here).
    const good = Proc.bash(ours(docBlock('geoip-replace')), f.env);
    assert.equal(await good.exit(40_000), 0, good.out);
    assert.equal(good.out, 'edge_geoip_reloads_total{result="ok"} 1\nedge_geoip_reloads_total{result="failed"} 0\n');
    const bad = Proc.bash(ours(docBlock('geoip-corrupt')), f.env);
    assert.equal(await bad.exit(40_000), 0, bad.out);
    assert.equal(bad.out, 'edge_geoip_reloads_total{result="ok"} 1\nedge_geoip_reloads_total{result="failed"} 1\n');
  } finally {
    process.kill(-stack.child.pid!, 'SIGINT');
    await stack.exit(20_000);
    cleanUp(f);
  }
});

describe('npm start: a seal through the admin port outlives restarts (issue 26)', () => {
  test('the banner names the token (0600); without it 401; with it the TS service exits sealed, is restarted sealed (no crash loop), a new npm start comes up SEALED, and only removing the marker unseals; Ctrl-C leaves no marker', { timeout: 180_000 }, async () => {
    const f = await fresh();
    const edge = `http://127.0.0.1:${f.ports.EDGE_PORT}`;
    const admin = `http://127.0.0.1:${f.ports.AUTHZ_ADMIN_PORT}/admin/seal`;
    const marker = join(f.runDir, 'sealed');
    const healthz = async (): Promise<[number, unknown]> => {
      const r = await fetch(`${edge}/healthz`);
      const body = (await r.json()) as { error?: unknown };
      return [r.status, body.error];
    };
    const stopStack = async (p: Proc): Promise<void> => {
      process.kill(-p.child.pid!, 'SIGINT');
      assert.equal(await p.exit(30_000), 0, p.out);
    };
    try {
      let stack = Proc.npm(f.env);
      await stack.waitFor(/start: READY/, 60_000);
      const tokenFile = join(f.runDir, 'admin-token');
      assert.equal(statSync(tokenFile).mode & 0o777, 0o600);
      const token = readFileSync(tokenFile, 'utf8').trim();
      assert.match(token, /^[0-9a-f]{64}$/);
      assert.ok(stack.out.includes(`seal          curl -X POST -H "authorization: Bearer $(cat '${tokenFile}')" http://127.0.0.1:${f.ports.AUTHZ_ADMIN_PORT}/admin/seal`), stack.out);
      assert.ok(!stack.out.includes(token), 'the banner names the file, never the token');
      // A stop by signal is a normal stop: no marker.
      await stopStack(stack);
      assert.equal(existsSync(marker), false, 'Ctrl-C seals but leaves nothing behind');

      stack = Proc.npm(f.env);
      await stack.waitFor(/start: READY/, 60_000);
      // A local caller without the token.
      for (const headers of [{}, { authorization: `Bearer ${'f'.repeat(64)}` }] as Record<string, string>[]) {
        const r = await fetch(admin, { method: 'POST', headers });
        assert.equal(r.status, 401);
        await r.text();
      }
      assert.deepEqual(await healthz(), [200, undefined]);
      const authzPid = (): number[] => stackProcesses(f.runDir).filter((p) => /authz\/src\/main\.ts/.test(p.cmd)).map((p) => p.pid);
      const before = authzPid();
      assert.equal(before.length, 1);

      // The operator seals: the TS service exits and is restarted sealed.
      const r = await fetch(admin, { method: 'POST', headers: { authorization: `Bearer ${token}` } });
      assert.equal(r.status, 202);
      assert.ok(existsSync(marker));
      await stack.waitFor(/npm start: the TS service exited \(code 0\); restarting it in 0\.5 s \(restart 1\)\nnpm start: the stack is SEALED[^\n]*to unseal: remove [^\n]*\n(.|\n)*npm start: the TS service is back \(pid \d+\), SEALED/, 20_000);
      const after = authzPid();
      assert.equal(after.length, 1);
      assert.notEqual(after[0], before[0], 'a new process');
      assert.deepEqual(await healthz(), [503, 'sealed']);
      // It stays up, sealed: no restart loop.
      await sleep(3000);
      assert.deepEqual(authzPid(), after, 'still the same process');
      assert.doesNotMatch(stack.out, /restart 2\)/);
      assert.deepEqual(await healthz(), [503, 'sealed']);
      await stopStack(stack);
      assert.ok(existsSync(marker), 'the seal outlives the stack');

      // A new npm start comes up sealed.
      stack = Proc.npm(f.env);
      await stack.waitFor(/npm start: SEALED {2}/, 60_000);
      assert.match(stack.out, new RegExp(`npm start: SEALED  ${edge}/healthz → 503 sealed \\(sealed \\S+ by POST /admin/seal\\)\\n  '${marker}' is present: the TS service started without loading any key`));
      assert.doesNotMatch(stack.out, /start: READY/);
      assert.deepEqual(await healthz(), [503, 'sealed']);
      await stopStack(stack);

      // Unsealed as docs/operations.md says, run as written: the marker removed, then npm start.
      stack = Proc.bash(docBlock('unseal').replaceAll('.run/', `${f.runDir}/`), f.env);
      await stack.waitFor(/start: READY/, 60_000);
      assert.equal(existsSync(marker), false);
      assert.deepEqual(await healthz(), [200, undefined]);
      await stopStack(stack);
      await nothingLeft(f);
    } finally {
      cleanUp(f);
    }
  });
});
