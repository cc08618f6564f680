/**
 * The real entry point as a child process (Node 24): single-process and AUTHZ_WORKERS=2
 * cluster mode — serving, aggregated metrics, seal through the admin port, and exit.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { fileURLToPath } from 'node:url';
import { setTimeout as sleep } from 'node:timers/promises';
import { freePort, PrivateRedis } from './redis-server.ts';
import { newFeedKey } from './helpers.ts';

const ROOT = fileURLToPath(new URL('../../', import.meta.url));

async function runMain(workers: number, redisUrl?: string): Promise<void> {
  const [grpc, market, admin] = [await freePort(), await freePort(), await freePort()];
  const child = spawn(`${ROOT}scripts/node`, [`${ROOT}authz/src/main.ts`], {
    env: {
      ...process.env,
      EDGE_INGEST_HMAC: `hex:${randomBytes(32).toString('hex')}`,
      EDGE_FEED_ED25519_PUBLIC_KEY: newFeedKey().publicHex,
      AUTHZ_GRPC_PORT: String(grpc), MARKET_PORT: String(market), AUTHZ_ADMIN_PORT: String(admin),
      AUTHZ_WORKERS: String(workers), SHUTDOWN_GRACE_MS: '200', LOG_LEVEL: 'warn',
      REDIS_URL: redisUrl ?? '',
    },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let out = '';
  child.stdout.on('data', (d: Buffer) => { out += d.toString(); });
  child.stderr.on('data', (d: Buffer) => { out += d.toString(); });
  const exited = new Promise<number | null>((resolve) => child.once('exit', (code) => resolve(code)));
  try {
    let up = false;
    for (let i = 0; i < 100 && !up; i++) {
      try {
        up = (await fetch(`http://127.0.0.1:${market}/`)).status === 200;
      } catch {
        await sleep(100);
      }
    }
    assert.ok(up, `service came up: ${out}`);
    for (let i = 0; i < 6; i++) await (await fetch(`http://127.0.0.1:${market}/`)).text();
    const metrics = await (await fetch(`http://127.0.0.1:${admin}/metrics`)).text();
    assert.match(metrics, /edge_market_requests_total\{route="\/",status="200"\} 7/, 'metrics of every worker are aggregated');
    if (redisUrl === undefined) assert.match(out, /IN-MEMORY/, 'the in-memory store is announced loudly');
    const seal = await fetch(`http://127.0.0.1:${admin}/admin/seal`, { method: 'POST' });
    assert.equal(seal.status, 202);
    const sealed = await fetch(`http://127.0.0.1:${market}/`);
    assert.equal(sealed.status, 503);
    assert.equal(((await sealed.json()) as { error: string }).error, 'sealed');
    assert.equal(await Promise.race([exited, sleep(10_000).then(() => 'timeout')]), 0, 'the process exits after draining');
  } finally {
    child.kill('SIGKILL');
  }
}

test('process – single process: serves, seals through the admin port, exits 0', () => runMain(1));
test('process – AUTHZ_WORKERS=2 (on Redis): metrics aggregated across workers, seal reaches every worker, exits 0', async () => {
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
  const child = spawn(`${ROOT}scripts/node`, [`${ROOT}authz/src/main.ts`], {
    env: {
      ...process.env, REDIS_URL: '', LOG_LEVEL: 'warn', SHUTDOWN_GRACE_MS: '20000',
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
    assert.equal((await fetch(`http://127.0.0.1:${admin}/admin/seal`, { method: 'POST' })).status, 202);
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
  }
});

/** Starts main.ts with one of its ports already taken; resolves with its exit code and output. */
async function startWithPortTaken(setting: 'AUTHZ_GRPC_PORT' | 'MARKET_PORT' | 'AUTHZ_ADMIN_PORT', workers: number, redisUrl = '', marker = ''): Promise<{ code: number | null; out: string; port: number }> {
  const { createServer } = await import('node:net');
  const ports = { AUTHZ_GRPC_PORT: await freePort(), MARKET_PORT: await freePort(), AUTHZ_ADMIN_PORT: await freePort() };
  const squatter = createServer();
  await new Promise<void>((resolve) => squatter.listen(ports[setting], '127.0.0.1', resolve));
  try {
    const child = spawn(`${ROOT}scripts/node`, [`${ROOT}authz/src/main.ts`, ...(marker === '' ? [] : [marker])], {
      env: {
        ...process.env, REDIS_URL: redisUrl, AUTHZ_WORKERS: String(workers), LOG_LEVEL: 'warn',
        EDGE_INGEST_HMAC: `hex:${randomBytes(32).toString('hex')}`, EDGE_FEED_ED25519_PUBLIC_KEY: newFeedKey().publicHex,
        AUTHZ_GRPC_PORT: String(ports.AUTHZ_GRPC_PORT), MARKET_PORT: String(ports.MARKET_PORT), AUTHZ_ADMIN_PORT: String(ports.AUTHZ_ADMIN_PORT),
      },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let out = '';
    child.stdout.on('data', (d: Buffer) => { out += d.toString(); });
    child.stderr.on('data', (d: Buffer) => { out += d.toString(); });
    const code = await Promise.race([
      new Promise<number | null>((resolve) => child.once('exit', (c) => resolve(c))),
      sleep(20_000).then(() => { child.kill('SIGKILL'); return -1; }),
    ]);
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
