/**
 * A seal that meets a cluster worker still starting (AUTHZ_WORKERS=2, real processes): the worker
 * never serves unsealed, the primary exits 0 once every worker is sealed or gone, and none is left
 * running. The worker's start is held deterministically by the test-only hook
 * TEST_ONLY_HOLD_WORKER_START (process.ts): every worker but the first waits for a file the test
 * creates only after the primary logged its seal. Seen first as a pod-test failure ("1 of 2 workers
 * sealed": SIGTERM while the second worker started; docs/reliability.md "Flakes and their causes").
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { existsSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { tokenFile } from './helpers.ts';
import { freePort, PrivateRedis } from '../../testkit/redis-server.ts';
import { ServiceChild } from './service-child.ts';

type Line = Record<string, unknown>;
const lines = (svc: ServiceChild): Line[] => svc.out().split('\n').filter((l) => l.startsWith('{')).map((l) => JSON.parse(l) as Line);

/** Waits until `cond` holds (polled every 50 ms), failing after `ms` with the service's output. */
async function until(svc: ServiceChild, what: string, cond: () => boolean, ms = 30_000): Promise<void> {
  for (const end = Date.now() + ms; !cond(); await sleep(50)) {
    if (Date.now() > end) assert.fail(`${what}: not within ${ms} ms\n${svc.out()}`);
  }
}

/** The processes whose command line carries `marker` (the primary and its workers). */
function running(marker: string): string[] {
  try {
    return execFileSync('pgrep', ['-f', '--', marker]).toString().trim().split('\n').filter((l) => l !== '');
  } catch {
    return [];
  }
}

type Seal = 'SIGTERM' | 'admin';

async function sealWhileStarting(how: Seal, opts: { crashFirst?: boolean } = {}): Promise<void> {
  const redis = await PrivateRedis.start();
  const token = tokenFile();
  const release = join(token.dir, 'release-held-workers');
  const sealFile = join(token.dir, 'sealed');
  // A marker on the command line (main.ts ignores it): finds every process of this service.
  const marker = `--edge-test-${randomBytes(6).toString('hex')}`;
  const admin = await freePort();
  const svc = await ServiceChild.start({
    AUTHZ_WORKERS: '2', REDIS_URL: redis.url, LOG_LEVEL: 'info',
    // Long, so the primary's last-resort exit (SHUTDOWN_GRACE_MS + 2 s) cannot hide a worker left unsealed.
    SHUTDOWN_GRACE_MS: '30000',
    AUTHZ_ADMIN_TOKEN_FILE: token.file, AUTHZ_SEAL_FILE: sealFile,
    AUTHZ_ADMIN_PORT: String(admin), TEST_ONLY_HOLD_WORKER_START: release,
  }, [marker]);
  // GET / on the market port: its status, or the error (nothing answers once the service is gone).
  const market = (): Promise<number | string> => fetch(`http://127.0.0.1:${svc.marketPort}/`, { signal: AbortSignal.timeout(3000) })
    .then(async (r) => { await r.text(); return r.status; }, (err: unknown) => String(err));
  try {
    const held = (): Line[] => lines(svc).filter((l) => String(l['msg']).startsWith('TEST ONLY: worker start held'));
    await until(svc, 'the first worker serves', () => lines(svc).some((l) => l['msg'] === 'edge authz ready'));
    assert.equal(await market(), 200);
    await until(svc, 'the second worker is held while starting', () => held().length === 1);
    if (opts.crashFirst === true) {
      // The first worker crashes; its replacement is forked and held while starting too.
      const heldPid = String(held()[0]!['pid']);
      const first = running(marker).filter((pid) => pid !== heldPid && pid !== String(svc.child.pid));
      assert.equal(first.length, 1, `one other worker: ${first.join(' ')}`);
      process.kill(Number(first[0]), 'SIGKILL');
      await until(svc, 'its replacement is held while starting', () => held().length === 2);
    }

    if (how === 'SIGTERM') {
      svc.child.kill('SIGTERM');
    } else {
      const r = await fetch(`http://127.0.0.1:${admin}/admin/seal`, { method: 'POST', headers: { authorization: `Bearer ${token.token}` } });
      assert.equal(r.status, 202, await r.text());
    }
    await until(svc, 'the primary seals', () => lines(svc).some((l) => l['msg'] === 'sealing every worker'));
    // Only now may the held workers go on starting.
    writeFileSync(release, '');
    const afterSeal = (): Line[] => {
      const all = lines(svc);
      return all.slice(all.findIndex((l) => l['msg'] === 'sealing every worker'));
    };
    const unsealedReady = (): Line[] => afterSeal().filter((l) => l['msg'] === 'edge authz ready');
    await until(svc, 'the primary exits, or a worker is ready after the seal', () => svc.child.exitCode !== null || unsealedReady().length > 0);
    // The evidence on failure: what a few GET / get (round-robin: one sealed worker answers 503).
    const served = svc.child.exitCode === null ? await Promise.all([market(), market(), market(), market()]) : 'nothing: it exited';
    assert.deepEqual(unsealedReady(), [], `no worker serves unsealed after the seal (GET / answered ${String(served)})\n${svc.out()}`);
    assert.deepEqual(await svc.exited, { code: 0, signal: null }, svc.out());
    assert.equal(afterSeal().filter((l) => l['msg'] === 'worker exited; starting a new one').length, 0, 'no worker is forked after the seal');
    const sealLine = afterSeal()[0]!;
    assert.deepEqual([sealLine['workers'], sealLine['stoppedStarting']], opts.crashFirst === true ? [0, 2] : [1, 1], 'sealed: the ready workers; stopped: the starting ones');
    // (The whole output: the processes' lines interleave, a worker's may come before the primary's.)
    assert.equal(lines(svc).filter((l) => String(l['msg']).startsWith('sealed: credentials zeroed')).length, opts.crashFirst === true ? 0 : 1);
    let left = running(marker);
    for (let i = 0; i < 40 && left.length > 0; i++) {
      await sleep(50);
      left = running(marker);
    }
    assert.deepEqual(left, [], 'no worker outlives the primary');
    assert.equal(existsSync(sealFile), how === 'admin', 'an admin seal is recorded, a stop is not');
  } finally {
    svc.kill();
    for (const pid of running(marker)) process.kill(Number(pid), 'SIGKILL');
    token.remove();
    await redis.stop();
  }
}

test('seal while a worker starts – SIGTERM: the starting worker never serves unsealed; the primary exits 0 with every worker gone', () => sealWhileStarting('SIGTERM'));
test('seal while a worker starts – POST /admin/seal: the starting worker never serves unsealed; the primary exits 0, the seal recorded', () => sealWhileStarting('admin'));
test('seal while a worker starts – a replacement forked after a worker crashed, still starting at the seal, never serves unsealed; none is forked after', () => sealWhileStarting('SIGTERM', { crashFirst: true }));
