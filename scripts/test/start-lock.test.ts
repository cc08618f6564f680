/**
 * npm start's stack lock (scripts/start/lock.ts) on its own: one stack per run directory (its pid
 * file) and per port, the holder of a port found through /proc and named. The "other stacks" are
 * real processes whose command line names scripts/start.ts, as npm start's does.
 */
import { after, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { createServer, type Server } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { once } from 'node:events';
import { isStack, portInUse, portOwner, runningProblem, stackOf } from '../start/lock.ts';

const dir = mkdtempSync(join(tmpdir(), 'start-lock-'));
const children: ChildProcess[] = [];
after(() => {
  for (const c of children) c.kill('SIGKILL');
  rmSync(dir, { recursive: true, force: true });
});

/** A process that looks like npm start (`scripts/start.ts` on its command line); with `listen`, it listens on a free port. */
async function fakeStack(listen: boolean): Promise<{ pid: number; port: number | undefined }> {
  const code = listen
    ? "require('net').createServer().listen(0, '0.0.0.0', function () { console.log(this.address().port) })"
    : "console.log('up'); setInterval(() => {}, 1000)";
  const child = spawn(process.execPath, ['-e', code, 'scripts/start.ts'], { stdio: ['ignore', 'pipe', 'inherit'] });
  children.push(child);
  const [line] = await once(child.stdout, 'data') as [Buffer];
  return { pid: child.pid ?? 0, port: listen ? Number(line.toString().trim()) : undefined };
}

async function listening(): Promise<{ server: Server; port: number }> {
  const server = createServer().listen(0, '0.0.0.0');
  await once(server, 'listening');
  const a = server.address();
  return { server, port: typeof a === 'object' && a !== null ? a.port : 0 };
}

/** A port nothing listens on (taken, then released). */
async function freePort(): Promise<number> {
  const { server, port } = await listening();
  server.close();
  await once(server, 'close');
  return port;
}

test('stack lock – no pid file and free ports: nothing refuses the start', async () => {
  const port = await freePort();
  assert.equal(await portInUse(port), false);
  assert.equal(await runningProblem(join(dir, 'none.pid'), dir, [['EDGE_PORT', port]]), undefined);
});

test('stack lock – a port held by another process is named with its setting, port and holder', async () => {
  const { server, port } = await listening();
  try {
    assert.equal(await portInUse(port), true);
    assert.equal(portOwner(port), process.pid);
    assert.equal(stackOf(process.pid), undefined, 'the test runner is no npm start');
    const msg = await runningProblem(join(dir, 'none.pid'), dir, [['EDGE_PORT', port]]);
    assert.match(msg ?? '', new RegExp(`^ports already in use: EDGE_PORT ${port} by pid ${process.pid} \\(.*node.*\\); stop that process or choose other ports \\(README "Settings"\\)$`));
  } finally {
    server.close();
  }
});

test('stack lock – the run directory\'s pid file naming a running npm start refuses the start, naming it', async () => {
  const stack = await fakeStack(false);
  assert.equal(isStack(stack.pid), true);
  const pidFile = join(dir, 'start.pid');
  writeFileSync(pidFile, JSON.stringify({ pid: stack.pid, edge: 'http://127.0.0.1:8080' }));
  assert.equal(await runningProblem(pidFile, '/some/run', []),
    `a stack is already running from /some/run (pid ${stack.pid}, http://127.0.0.1:8080); `
    + `stop it first (Ctrl-C in its terminal, or kill ${stack.pid}), or give this one another DEV_RUN_DIR and ports`);
});

test('stack lock – a pid file naming this process, a process that is no npm start, or garbage is ignored', async () => {
  const pidFile = join(dir, 'stale.pid');
  const other = spawn(process.execPath, ['-e', 'setInterval(() => {}, 1000)'], { stdio: 'ignore' });
  children.push(other);
  for (const text of [JSON.stringify({ pid: process.pid }), JSON.stringify({ pid: other.pid }), 'not json']) {
    writeFileSync(pidFile, text);
    assert.equal(await runningProblem(pidFile, dir, []), undefined, text);
  }
});

test('stack lock – a port held by another npm start names that stack', async () => {
  const stack = await fakeStack(true);
  const port = stack.port ?? 0;
  assert.equal(portOwner(port), stack.pid);
  assert.equal(stackOf(stack.pid), stack.pid);
  const free = await freePort();
  assert.equal(await runningProblem(join(dir, 'none.pid'), dir, [['DEV_REDIS_PORT', free], ['EDGE_PORT', port]]),
    `a stack is already running on these ports (pid ${stack.pid}): EDGE_PORT ${port}; stop it first (Ctrl-C in its terminal, or kill ${stack.pid})`);
});
