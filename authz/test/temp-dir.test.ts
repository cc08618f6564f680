/**
 * The tests leave nothing in TMPDIR (testkit/temp-dir.ts): a test process that fails half way
 * still removes its temporary directories, key files included, and kills the private
 * redis-server it started; `npm test`'s scripts/test-tmpdir.sh fails a run that leaves anything.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdtempSync, readdirSync, rmSync } from 'node:fs';
import { connect } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { fileURLToPath } from 'node:url';

const ROOT = fileURLToPath(new URL('../../', import.meta.url));
const NODE = join(ROOT, 'scripts/node');

/** Runs `code` (an ES module in authz/test) with TMPDIR a fresh directory; what it printed and what it left there. */
function inFreshTmp(code: string, env: Record<string, string> = {}): { status: number | null; out: string; left: string[]; dir: string } {
  // A directory of this test's own: removed below, whatever the child left.
  const dir = mkdtempSync(join(tmpdir(), 'edge-tmpcheck-'));
  try {
    const r = spawnSync(NODE, ['--input-type=module', '-e', code], { cwd: join(ROOT, 'authz/test'), env: { ...process.env, ...env, TMPDIR: dir }, encoding: 'utf8', timeout: 30_000 });
    return { status: r.status, out: `${r.stdout}${r.stderr}`, left: readdirSync(dir), dir };
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

test('temp dirs – a process that fails with its temporary directories (key files in one) still removes them at exit', () => {
  const r = inFreshTmp(`
    import { writeFileSync } from 'node:fs';
    import { join } from 'node:path';
    import { tempDir, withTempDir } from '../../testkit/temp-dir.ts';
    const keys = tempDir('edge-secret-');
    writeFileSync(join(keys, 'hmac'), 'hex:' + 'ab'.repeat(32), { mode: 0o400 });
    tempDir('edge-geo-');
    await withTempDir('edge-policy-', () => { throw new Error('an assertion failed'); });
  `);
  assert.notEqual(r.status, 0, r.out);
  assert.match(r.out, /an assertion failed/);
  assert.deepEqual(r.left, [], 'nothing left in TMPDIR');
});

test('temp dirs – E2E_KEEP keeps them for a look', () => {
  const r = inFreshTmp(`
    import { tempDir } from '../../testkit/temp-dir.ts';
    tempDir('edge-e2e-');
  `, { E2E_KEEP: '1' });
  assert.equal(r.status, 0, r.out);
  assert.equal(r.left.length, 1);
  assert.match(r.left[0]!, /^edge-e2e-/);
});

test('temp dirs – a private redis-server never stopped is killed at exit, then its data directory removed', async () => {
  const r = inFreshTmp(`
    import { PrivateRedis } from '../../testkit/redis-server.ts';
    const redis = await PrivateRedis.start();
    console.log('port', redis.port);
  `);
  assert.equal(r.status, 0, r.out);
  assert.deepEqual(r.left, [], 'nothing left in TMPDIR');
  const port = /port (\d+)/.exec(r.out)?.[1];
  assert.ok(port !== undefined, r.out);
  // Nothing listens on its port any more (the server was killed, not left running).
  const listening = (): Promise<boolean> => new Promise((resolve) => {
    const sock = connect(Number(port), '127.0.0.1', () => { sock.destroy(); resolve(true); });
    sock.once('error', () => resolve(false));
  });
  for (let i = 0; i < 20 && await listening(); i++) await sleep(100);
  if (await listening()) {
    // Broken: stop the leaked server before failing.
    const sock = connect(Number(port), '127.0.0.1', () => sock.end('SHUTDOWN NOSAVE\r\n'));
    sock.once('error', () => undefined);
    await sleep(200);
    assert.fail(`redis-server on ${port} was left running`);
  }
});

test('temp dirs – scripts/test-tmpdir.sh fails a run that leaves something, lists it and removes it', () => {
  const parent = mkdtempSync(join(tmpdir(), 'edge-tmpcheck-'));
  try {
    const env = { ...process.env, TMPDIR: parent };
    const leaves = spawnSync('bash', [join(ROOT, 'scripts/test-tmpdir.sh'), 'sh', '-c', 'mkdir "$TMPDIR/edge-secret-x" && echo k > "$TMPDIR/edge-secret-x/hmac"'], { env, encoding: 'utf8' });
    assert.equal(leaves.status, 1, leaves.stderr);
    assert.match(leaves.stderr, /^test-tmpdir: the run left these in its temporary directory .*\/edge-test-run\.\w+:\n {2}edge-secret-x\n$/);
    const clean = spawnSync('bash', [join(ROOT, 'scripts/test-tmpdir.sh'), 'sh', '-c', 'd=$(mktemp -d) && rmdir "$d"'], { env, encoding: 'utf8' });
    assert.equal(clean.status, 0, clean.stderr);
    const failing = spawnSync('bash', [join(ROOT, 'scripts/test-tmpdir.sh'), 'sh', '-c', 'exit 3'], { env, encoding: 'utf8' });
    assert.equal(failing.status, 3, 'the command\'s own failure is passed on');
    assert.deepEqual(readdirSync(parent), [], 'each run\'s directory is removed');
  } finally {
    rmSync(parent, { recursive: true, force: true });
  }
});
