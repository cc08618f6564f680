/**
 * Hang-up (issue 32): SIGHUP, or a log output that can no longer be written (EPIPE: the reader of
 * the pipe is gone; EIO: the terminal is gone), seals the TS service and stops it like SIGTERM;
 * it never keeps retrying the write. The real entry point as a child process, on a pipe and on a
 * pseudo-terminal (`npm run authz` in a terminal that is closed).
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { copyFileSync, mkdtempSync, readFileSync, renameSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { connect } from 'node:net';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { setTimeout as sleep } from 'node:timers/promises';
import { DEFAULT_GEOIP_DB } from '../src/common/config.ts';
import { newFeedKey } from '../../testkit/feed.ts';
import { freePort } from '../../testkit/redis-server.ts';
import { ServiceChild } from './service-child.ts';

async function startService(geoipDb: string): Promise<ServiceChild> {
  const svc = await ServiceChild.start({ REDIS_URL: '', LOG_LEVEL: 'info', SHUTDOWN_GRACE_MS: '300', GEOIP_DB: geoipDb });
  assert.ok(await svc.ready(), `the service came up:\n${svc.out()}`);
  return svc;
}

/** Exits within `ms`, or 'still running'. */
const within = <T>(p: Promise<T>, ms: number): Promise<T | 'still running'> => Promise.race([p, sleep(ms, 'still running' as const, { ref: false })]);

test('hang-up – SIGHUP seals the service and it exits 0 after draining, like SIGTERM', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'edge-hangup-'));
  copyFileSync(DEFAULT_GEOIP_DB, join(dir, 'geo.mmdb'));
  const svc = await startService(join(dir, 'geo.mmdb'));
  try {
    svc.child.kill('SIGHUP');
    // Grace 300 ms; 10 s is the margin for a busy machine.
    assert.deepEqual(await within(svc.exited, 10_000), { code: 0, signal: null });
    assert.match(svc.out(), /"reason":"SIGHUP".*sealed: credentials zeroed/);
  } finally {
    svc.kill();
    rmSync(dir, { recursive: true, force: true });
  }
});

test('hang-up – its log output gone (the reader of the pipe closed): the next line written seals and stops it; it does not keep writing', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'edge-hangup-'));
  const db = join(dir, 'geo.mmdb');
  copyFileSync(DEFAULT_GEOIP_DB, db);
  const svc = await startService(db);
  try {
    svc.child.stdout.destroy();
    // A line to write: the GeoIP database replaced (the reload is logged at info).
    copyFileSync(DEFAULT_GEOIP_DB, join(dir, 'next.mmdb'));
    renameSync(join(dir, 'next.mmdb'), db);
    const how = await within(svc.exited, 15_000);
    assert.deepEqual(how, { code: 0, signal: null }, `exited after its output went away:\n${svc.out()}`);
  } finally {
    svc.kill();
    rmSync(dir, { recursive: true, force: true });
  }
});

/**
 * Runs argv[1:] on a pseudo-terminal (Python's pty module: Node has none), prints the child's pid,
 * keeps reading the terminal (so the child's writes never block), and on a line on its stdin exits
 * without waiting: the terminal goes away with it (SIGHUP to the child, EIO on every later write).
 */
const PTY_HOLDER = `
import os, pty, select, sys
pid, fd = pty.fork()
if pid == 0:
    os.execv(sys.argv[1], sys.argv[1:])
sys.stdout.write(str(pid) + '\\n')
sys.stdout.flush()
while True:
    ready = select.select([fd, 0], [], [])[0]
    if fd in ready:
        try:
            os.read(fd, 65536)
        except OSError:
            break
    if 0 in ready:
        break
os._exit(0)
`;

/** Whether something accepts a TCP connection on 127.0.0.1:`port`. */
function portOpen(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const sock = connect(port, '127.0.0.1', () => { sock.destroy(); resolve(true); });
    sock.on('error', () => resolve(false));
  });
}

/** Whether process `pid` still runs (a zombie nobody reaped has stopped running). */
function running(pid: number): boolean {
  try {
    return !/^\d+ \(.*\) Z/.test(readFileSync(`/proc/${pid}/stat`, 'utf8'));
  } catch {
    return false;
  }
}

test('hang-up – its terminal closed while requests come in: the service stops within its grace, its ports freed; it does not keep writing to the terminal', { timeout: 60_000 }, async () => {
  const root = fileURLToPath(new URL('../../', import.meta.url));
  const [grpc, market, admin] = [await freePort(), await freePort(), await freePort()];
  const env = {
    ...process.env, REDIS_URL: '', LOG_LEVEL: 'info', SHUTDOWN_GRACE_MS: '300',
    EDGE_INGEST_HMAC: `hex:${randomBytes(32).toString('hex')}`, EDGE_FEED_ED25519_PUBLIC_KEY: newFeedKey().publicHex,
    AUTHZ_GRPC_PORT: String(grpc), MARKET_PORT: String(market), AUTHZ_ADMIN_PORT: String(admin),
  };
  const holder = spawn('python3', ['-c', PTY_HOLDER, `${root}scripts/node`, `${root}authz/src/main.ts`], { env, stdio: ['pipe', 'pipe', 'inherit'] });
  const pid = await new Promise<number>((resolve, reject) => {
    holder.stdout.once('data', (d: Buffer) => resolve(Number(d.toString().trim())));
    holder.once('exit', (code) => reject(new Error(`the pty holder exited ${code}`)));
  });
  try {
    let up = false;
    for (let i = 0; i < 150 && !up; i++) {
      up = await fetch(`http://127.0.0.1:${market}/`).then((r) => r.status === 200, () => false);
      if (!up) await sleep(100);
    }
    assert.ok(up, 'the service came up on the terminal');
    // Requests while the terminal goes away (each answered or refused; the loop ends once refused).
    let answered = 0;
    const load = (async () => {
      for (const end = Date.now() + 10_000; Date.now() < end;) {
        const ok = await Promise.all([0, 1, 2, 3].map(() => fetch(`http://127.0.0.1:${market}/v1/markets?limit=1`, { signal: AbortSignal.timeout(2000) })
          .then(async (r) => { await r.arrayBuffer(); return true; }, () => false)));
        answered += ok.filter(Boolean).length;
        if (!ok.every(Boolean)) break;
      }
    })();
    await sleep(300);
    const t0 = Date.now();
    holder.stdin.end('x\n');
    // Grace 300 ms; 10 s is the margin for a busy 2-core machine. Before the fix it never stopped.
    while (running(pid) && Date.now() - t0 < 10_000) await sleep(100);
    assert.equal(running(pid), false, `still running ${Date.now() - t0} ms after its terminal went away`);
    await load;
    assert.ok(answered > 0, 'requests were answered while the terminal went away');
    for (const port of [grpc, market, admin]) assert.equal(await portOpen(port), false, `port ${port} is free`);
  } finally {
    try {
      process.kill(pid, 'SIGKILL');
    } catch { /* gone */ }
    holder.kill('SIGKILL');
  }
});
