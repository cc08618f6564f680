/**
 * Hang-up (issue 32): SIGHUP, or a log output that can no longer be written (EPIPE: the reader of
 * the pipe is gone; EIO: the terminal is gone), seals the TS service and stops it like SIGTERM;
 * it never keeps retrying the write. The real entry point as a child process.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { copyFileSync, mkdtempSync, renameSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { DEFAULT_GEOIP_DB } from '../src/common/config.ts';
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
