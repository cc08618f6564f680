/**
 * The real entry point as a child process (Node 24): single-process and AUTHZ_WORKERS=2
 * cluster mode — serving, aggregated metrics, seal through the admin port (with the admin token),
 * and exit; then the restart a supervisor or the kubelet would do: it starts sealed (no key read,
 * 503 sealed, health NOT_SERVING, liveness SERVING, the unseal procedure logged) and stays up
 * until stopped; SIGTERM/SIGINT seal too but leave nothing behind; removing the marker unseals.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { existsSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { tempDir } from '../../testkit/temp-dir.ts';
import * as grpc from '@grpc/grpc-js';
import type { MethodDefinition } from '@grpc/proto-loader';
import { loadPackageDefinition } from '../../proto/index.ts';
import { LIVENESS_SERVICE } from '../src/authz/grpc-server.ts';
import { fileURLToPath } from 'node:url';
import { setTimeout as sleep } from 'node:timers/promises';
import { freePort, PrivateRedis } from '../../testkit/redis-server.ts';
import { newFeedKey } from '../../testkit/feed.ts';
import { tokenFile } from './helpers.ts';

const ROOT = fileURLToPath(new URL('../../', import.meta.url));

/** grpc.health.v1 Check of `service` on 127.0.0.1:`port`: SERVING, NOT_SERVING, or the error. */
async function health(port: number, service: string): Promise<string> {
  const check = (loadPackageDefinition()['grpc.health.v1.Health'] as Record<string, MethodDefinition<object, object>>)['Check']!;
  const client = new grpc.Client(`127.0.0.1:${port}`, grpc.credentials.createInsecure());
  try {
    return await new Promise((resolve) => {
      client.makeUnaryRequest(check.path, check.requestSerialize, check.responseDeserialize, { service }, { deadline: Date.now() + 3000 },
        (err, res) => resolve(err ? `error: ${err.message}` : ['UNKNOWN', 'SERVING', 'NOT_SERVING'][(res as { status: number }).status] ?? '?'));
    });
  } finally {
    client.close();
  }
}

/** main.ts as a child process with its output collected. */
class Main {
  out = '';
  readonly child: ChildProcess;
  readonly exited: Promise<number | null>;
  constructor(env: NodeJS.ProcessEnv) {
    this.child = spawn(`${ROOT}scripts/node`, [`${ROOT}authz/src/main.ts`], { env, stdio: ['ignore', 'pipe', 'pipe'] });
    this.child.stdout?.on('data', (d: Buffer) => { this.out += d.toString(); });
    this.child.stderr?.on('data', (d: Buffer) => { this.out += d.toString(); });
    this.exited = new Promise((resolve) => this.child.once('exit', (code) => resolve(code)));
  }
  /** Waits until GET / on the market port answers `status`. */
  async answers(market: number, status: number): Promise<void> {
    for (let i = 0; i < 150; i++) {
      if (this.child.exitCode !== null) break;
      try {
        if ((await fetch(`http://127.0.0.1:${market}/`)).status === status) return;
      } catch { /* not yet */ }
      await sleep(100);
    }
    assert.fail(`GET / never answered ${status}: ${this.out}`);
  }
}

async function runMain(workers: number, redisUrl?: string): Promise<void> {
  const [grpcPort, market, admin] = [await freePort(), await freePort(), await freePort()];
  const dir = tempDir('edge-process-');
  const token = tokenFile();
  const sealFile = join(dir, 'sealed');
  const hmacFile = join(dir, 'ingest-hmac');
  writeFileSync(hmacFile, `hex:${randomBytes(32).toString('hex')}\n`, { mode: 0o600 });
  const env = {
    ...process.env,
    EDGE_INGEST_HMAC: '', EDGE_INGEST_HMAC_FILE: hmacFile,
    EDGE_FEED_ED25519_PUBLIC_KEY: newFeedKey().publicHex,
    AUTHZ_GRPC_PORT: String(grpcPort), MARKET_PORT: String(market), AUTHZ_ADMIN_PORT: String(admin),
    AUTHZ_WORKERS: String(workers), SHUTDOWN_GRACE_MS: '200', LOG_LEVEL: 'warn',
    REDIS_URL: redisUrl ?? '', AUTHZ_ADMIN_TOKEN_FILE: token.file, AUTHZ_SEAL_FILE: sealFile,
  };
  const procs: Main[] = [];
  const start = (): Main => {
    const m = new Main(env);
    procs.push(m);
    return m;
  };
  try {
    const first = start();
    await first.answers(market, 200);
    for (let i = 0; i < 6; i++) await (await fetch(`http://127.0.0.1:${market}/`)).text();
    const metrics = await (await fetch(`http://127.0.0.1:${admin}/metrics`)).text();
    assert.match(metrics, /edge_market_requests_total\{route="\/",status="200"\} 7/, 'metrics of every worker are aggregated');
    if (redisUrl === undefined) assert.match(first.out, /IN-MEMORY/, 'the in-memory store is announced loudly');
    assert.equal((await fetch(`http://127.0.0.1:${admin}/admin/seal`, { method: 'POST' })).status, 401, 'no token: refused');
    assert.equal((await fetch(`http://127.0.0.1:${market}/`)).status, 200, 'and nothing sealed');
    const seal = await fetch(`http://127.0.0.1:${admin}/admin/seal`, { method: 'POST', headers: { authorization: `Bearer ${token.token}` } });
    assert.equal(seal.status, 202);
    assert.deepEqual(await seal.json(), { status: 'sealing', persistent: true });
    const sealed = await fetch(`http://127.0.0.1:${market}/`);
    assert.equal(sealed.status, 503);
    assert.equal(((await sealed.json()) as { error: string }).error, 'sealed');
    assert.equal(await Promise.race([first.exited, sleep(10_000).then(() => 'timeout')]), 0, 'the process exits after draining');
    assert.deepEqual(Object.keys(JSON.parse(readFileSync(sealFile, 'utf8')) as object).sort(), ['pid', 'reason', 'sealedAt'], 'the seal is recorded');

    // Restarted (a supervisor, the kubelet): sealed from the start, without reading any key (the
    // key file is gone), and it stays up: no crash loop.
    rmSync(hmacFile);
    const again = start();
    await again.answers(market, 503);
    const r = await fetch(`http://127.0.0.1:${market}/healthz`);
    assert.deepEqual([r.status, ((await r.json()) as { error: string }).error], [503, 'sealed']);
    assert.equal(await health(grpcPort, ''), 'NOT_SERVING', 'readiness');
    assert.equal(await health(grpcPort, 'envoy.service.auth.v3.Authorization'), 'NOT_SERVING');
    assert.equal(await health(grpcPort, LIVENESS_SERVICE), 'SERVING', 'liveness: alive, so not restarted in a loop');
    // One per worker (the cluster primary sums the gauge), once every worker has started.
    let sealedGauge: string[] = [];
    for (let i = 0; i < 50 && sealedGauge[0] !== `edge_authz_sealed ${workers}`; i++) {
      if (i > 0) await sleep(100);
      sealedGauge = (await (await fetch(`http://127.0.0.1:${admin}/metrics`)).text()).split('\n').filter((l) => l.startsWith('edge_authz_sealed '));
    }
    assert.deepEqual(sealedGauge, [`edge_authz_sealed ${workers}`]);
    assert.match(again.out, /SEALED: .*sealed is present, so this process starts sealed: no key was loaded.*to unseal: remove .*sealed and restart the service/);
    await sleep(1500);
    assert.equal(again.child.exitCode, null, 'still running');
    // A normal stop: exits 0, the marker stays.
    again.child.kill('SIGTERM');
    assert.equal(await Promise.race([again.exited, sleep(10_000).then(() => 'timeout')]), 0);
    assert.ok(existsSync(sealFile));

    // Unsealed by the operator: the marker removed, the key back; SIGTERM then records nothing.
    rmSync(sealFile);
    writeFileSync(hmacFile, `hex:${randomBytes(32).toString('hex')}\n`, { mode: 0o600 });
    const unsealed = start();
    await unsealed.answers(market, 200);
    assert.equal(await health(grpcPort, ''), 'SERVING');
    unsealed.child.kill('SIGTERM');
    assert.equal(await Promise.race([unsealed.exited, sleep(10_000).then(() => 'timeout')]), 0);
    assert.equal(existsSync(sealFile), false, 'a stop by signal is not a persistent seal');
  } finally {
    for (const p of procs) p.child.kill('SIGKILL');
    token.remove();
    rmSync(dir, { recursive: true, force: true });
  }
}

test('process – single process: serves; the admin token seals (none: 401); exits 0; restarted it is still sealed until the marker goes', () => runMain(1));
test('process – AUTHZ_WORKERS=2 (on Redis): metrics aggregated across workers, seal reaches every worker, exits 0; restarted, every worker starts sealed', async () => {
  const redis = await PrivateRedis.start();
  try {
    await runMain(2, redis.url);
  } finally {
    await redis.stop();
  }
});

test('process – AUTHZ_WORKERS=2 without REDIS_URL refuses to start: each worker would keep its own nonces (a replay through another worker would pass)', async () => {
  const child = spawn(`${ROOT}scripts/node`, [`${ROOT}authz/src/main.ts`], {
    env: {
      ...process.env, REDIS_URL: '', AUTHZ_WORKERS: '2', LOG_LEVEL: 'warn',
      EDGE_INGEST_HMAC: `hex:${randomBytes(32).toString('hex')}`, EDGE_FEED_ED25519_PUBLIC_KEY: newFeedKey().publicHex,
      AUTHZ_GRPC_PORT: String(await freePort()), MARKET_PORT: String(await freePort()), AUTHZ_ADMIN_PORT: String(await freePort()),
    },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let out = '';
  child.stdout.on('data', (d: Buffer) => { out += d.toString(); });
  child.stderr.on('data', (d: Buffer) => { out += d.toString(); });
  const code = await new Promise<number | null>((resolve) => child.once('exit', (c) => resolve(c)));
  assert.notEqual(code, 0);
  assert.match(out, /AUTHZ_WORKERS/);
  assert.match(out, /REDIS_URL/);
});

test('process – after the seal it keeps answering sealed while requests arrive, and exits 0 once none has for 0.5 s, well before SHUTDOWN_GRACE_MS', async () => {
  const [grpc, market, admin] = [await freePort(), await freePort(), await freePort()];
  const token = tokenFile();
  const child = spawn(`${ROOT}scripts/node`, [`${ROOT}authz/src/main.ts`], {
    env: {
      ...process.env, REDIS_URL: '', LOG_LEVEL: 'warn', SHUTDOWN_GRACE_MS: '20000',
      AUTHZ_ADMIN_TOKEN_FILE: token.file, AUTHZ_SEAL_FILE: join(token.dir, 'sealed'),
      EDGE_INGEST_HMAC: `hex:${randomBytes(32).toString('hex')}`, EDGE_FEED_ED25519_PUBLIC_KEY: newFeedKey().publicHex,
      AUTHZ_GRPC_PORT: String(grpc), MARKET_PORT: String(market), AUTHZ_ADMIN_PORT: String(admin),
    },
    stdio: ['ignore', 'ignore', 'ignore'],
  });
  const exited = new Promise<number | null>((resolve) => child.once('exit', (code) => resolve(code)));
  try {
    for (let i = 0; i < 100; i++) {
      if (await fetch(`http://127.0.0.1:${market}/`).then((r) => r.status === 200, () => false)) break;
      await sleep(100);
    }
    assert.equal((await fetch(`http://127.0.0.1:${admin}/admin/seal`, { method: 'POST', headers: { authorization: `Bearer ${token.token}` } })).status, 202);
    // Requests keep arriving for 2 s (every 200 ms): the process keeps answering them as sealed.
    const busyUntil = Date.now() + 2_000;
    while (Date.now() < busyUntil) {
      const r = await fetch(`http://127.0.0.1:${market}/`);
      assert.equal(r.status, 503, 'answered sealed while draining');
      await r.text();
      await sleep(200);
    }
    const quietFrom = Date.now();
    assert.equal(await Promise.race([exited, sleep(5_000).then(() => 'still running')]), 0, 'exits once nothing asks');
    const drainMs = Date.now() - quietFrom;
    assert.ok(drainMs < 2_000, `exited ${drainMs} ms after the last request (SHUTDOWN_GRACE_MS 20000)`);
  } finally {
    child.kill('SIGKILL');
    token.remove();
  }
});

/** Runs main.ts (with `args`) and `env` added to this process's: its exit status and everything it printed. */
async function runToExit(env: Record<string, string>, args: readonly string[] = []): Promise<{ code: number | null; out: string }> {
  const child = spawn(`${ROOT}scripts/node`, [`${ROOT}authz/src/main.ts`, ...args], { env: { ...process.env, ...env }, stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '';
  child.stdout.on('data', (d: Buffer) => { out += d.toString(); });
  child.stderr.on('data', (d: Buffer) => { out += d.toString(); });
  const code = await Promise.race([
    new Promise<number | null>((resolve) => child.once('exit', (c) => resolve(c))),
    sleep(20_000).then(() => { child.kill('SIGKILL'); return -1; }),
  ]);
  return { code, out };
}

/** Starts main.ts with one of its ports already taken; resolves with its exit code and output. */
async function startWithPortTaken(setting: 'AUTHZ_GRPC_PORT' | 'MARKET_PORT' | 'AUTHZ_ADMIN_PORT', workers: number, redisUrl = '', marker = ''): Promise<{ code: number | null; out: string; port: number }> {
  const { createServer } = await import('node:net');
  const ports = { AUTHZ_GRPC_PORT: await freePort(), MARKET_PORT: await freePort(), AUTHZ_ADMIN_PORT: await freePort() };
  const squatter = createServer();
  await new Promise<void>((resolve) => squatter.listen(ports[setting], '127.0.0.1', resolve));
  try {
    const { code, out } = await runToExit({
      REDIS_URL: redisUrl, AUTHZ_WORKERS: String(workers), LOG_LEVEL: 'warn',
      EDGE_INGEST_HMAC: `hex:${randomBytes(32).toString('hex')}`, EDGE_FEED_ED25519_PUBLIC_KEY: newFeedKey().publicHex,
      AUTHZ_GRPC_PORT: String(ports.AUTHZ_GRPC_PORT), MARKET_PORT: String(ports.MARKET_PORT), AUTHZ_ADMIN_PORT: String(ports.AUTHZ_ADMIN_PORT),
    }, marker === '' ? [] : [marker]);
    return { code, out, port: ports[setting] };
  } finally {
    squatter.close();
  }
}

for (const setting of ['AUTHZ_GRPC_PORT', 'MARKET_PORT', 'AUTHZ_ADMIN_PORT'] as const) {
  test(`process – ${setting} already in use: exits 1 with one fatal line naming the setting and the address, no stack trace`, async () => {
    const { code, out, port } = await startWithPortTaken(setting, 1);
    assert.equal(code, 1, out);
    const fatal = out.split('\n').filter((l) => l.includes('"start-up failed"'));
    assert.equal(fatal.length, 1, out);
    const line = JSON.parse(fatal[0]!) as { level: number; err: string };
    assert.equal(line.level, 60);
    assert.equal(line.err, `${setting}: cannot listen on 127.0.0.1:${port}: the address is already in use (another process listens there; choose another port or stop it)`);
    assert.doesNotMatch(out, /^\s+at /m, 'no stack trace');
  });
}

/** The one fatal line a refused setting prints: JSON naming the variable, no stack trace. */
function invalidSettingLine(out: string): { level: number; setting: string; err: string } {
  assert.doesNotMatch(out, /^\s+at /m, 'no stack trace');
  const lines = out.split('\n').filter((l) => l.includes('"invalid setting"'));
  assert.equal(lines.length, 1, out);
  return JSON.parse(lines[0]!) as { level: number; setting: string; err: string };
}

test('process – a bad setting, the service run directly: exits 1 with one fatal JSON line naming the variable, no stack trace', async () => {
  const { code, out } = await runToExit({ RPS_PER_IP: 'abc' });
  assert.equal(code, 1, out);
  const line = invalidSettingLine(out);
  assert.equal(line.level, 60);
  assert.equal(line.setting, 'RPS_PER_IP');
  assert.equal(line.err, 'RPS_PER_IP: expected an integer in [1, 1000000], got "abc"');
});

test('process – AUTHZ_WORKERS=2 with a key that is not one: the primary exits 1 with one fatal line naming the variable, not the value', async () => {
  const redis = await PrivateRedis.start();
  try {
    const bad = `hex:${'ab'.repeat(8)}`; // 8 bytes: shorter than any key the service accepts
    const { code, out } = await runToExit({ AUTHZ_WORKERS: '2', REDIS_URL: redis.url, EDGE_INGEST_HMAC: bad, EDGE_FEED_ED25519_PUBLIC_KEY: newFeedKey().publicHex });
    assert.equal(code, 1, out);
    const line = invalidSettingLine(out);
    assert.equal(line.setting, 'EDGE_INGEST_HMAC');
    assert.doesNotMatch(out, new RegExp('ab'.repeat(8)), 'the key is never printed');
  } finally {
    await redis.stop();
  }
});

test('process – AUTHZ_WORKERS=2 with the market port in use: the primary stops with status 1 instead of restarting workers that cannot start', async () => {
  const redis = await PrivateRedis.start();
  try {
    const { code, out } = await startWithPortTaken('MARKET_PORT', 2, redis.url);
    assert.equal(code, 1, out);
    assert.match(out, /a worker could not start/);
    assert.match(out, /MARKET_PORT: cannot listen/);
    assert.doesNotMatch(out, /starting a new one/);
  } finally {
    await redis.stop();
  }
});

test('process – AUTHZ_WORKERS=2 with the admin port in use: the primary exits 1 and takes its workers with it (none is left running)', async () => {
  const redis = await PrivateRedis.start();
  const marker = `--edge-test-${randomBytes(6).toString('hex')}`;
  const { execFileSync } = await import('node:child_process');
  const running = (): string => {
    try {
      return execFileSync('pgrep', ['-f', '--', marker]).toString().trim();
    } catch {
      return '';
    }
  };
  try {
    const { code, out } = await startWithPortTaken('AUTHZ_ADMIN_PORT', 2, redis.url, marker);
    assert.equal(code, 1, out);
    assert.match(out, /AUTHZ_ADMIN_PORT: cannot listen/);
    let left = running();
    for (let i = 0; i < 20 && left !== ''; i++) {
      await sleep(100);
      left = running();
    }
    assert.equal(left, '', 'no worker outlives the primary');
  } finally {
    await redis.stop();
  }
});
