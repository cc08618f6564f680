/**
 * AUTHZ_GRPC_SOCKET and MARKET_SOCKET (docs/envoy.md "Unix domain sockets"): the settings as
 * config.ts reads them, and the socket files' life as common/unix-socket.ts keeps it — a stale
 * file from a crashed run removed at start, a live one or a non-socket refused and left alone,
 * 0660 once listening, removed at exit only while it is still this process's.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { existsSync, lstatSync, mkdirSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { join } from 'node:path';
import { ConfigError, KNOWN_SETTINGS, loadConfig, type Env } from '../src/common/config.ts';
import { ownSocket, prepareSocket, removeOwnSocket, SOCKET_MODE, SOCKET_PATH_MAX_BYTES, SocketPathError } from '../src/common/unix-socket.ts';
import { removeTempDir, tempDir } from '../../testkit/temp-dir.ts';

function refused(env: Env, variable: string, pattern: RegExp): void {
  assert.throws(() => loadConfig(env), (err: unknown) => err instanceof ConfigError && err.variable === variable && pattern.test(err.message));
}

test('unset or "off": TCP, both servers on their ports', () => {
  for (const env of [{}, { AUTHZ_GRPC_SOCKET: 'off', MARKET_SOCKET: 'OFF' }] as Env[]) {
    const c = loadConfig(env);
    assert.deepEqual([c.authzGrpcSocket, c.marketSocket, c.authzGrpcTcp, c.marketTcp], [undefined, undefined, true, true]);
  }
});

test('a socket path: that service listens there only, unless its port is set too', () => {
  const c = loadConfig({ AUTHZ_GRPC_SOCKET: '/run/edge/authz.sock', MARKET_SOCKET: '/run/edge/market.sock' });
  assert.deepEqual([c.authzGrpcSocket, c.marketSocket, c.authzGrpcTcp, c.marketTcp], ['/run/edge/authz.sock', '/run/edge/market.sock', false, false]);
  const both = loadConfig({ AUTHZ_GRPC_SOCKET: '/run/edge/authz.sock', AUTHZ_GRPC_PORT: '9191', MARKET_SOCKET: '/run/edge/market.sock' });
  assert.deepEqual([both.authzGrpcTcp, both.marketTcp], [true, false]);
});

test('a relative path, one too long for sockaddr_un, or a directory is refused, naming the setting', () => {
  refused({ AUTHZ_GRPC_SOCKET: 'run/authz.sock' }, 'AUTHZ_GRPC_SOCKET', /absolute path/);
  refused({ MARKET_SOCKET: `/${'x'.repeat(SOCKET_PATH_MAX_BYTES)}` }, 'MARKET_SOCKET', /at most 107 bytes/);
  refused({ MARKET_SOCKET: '/run/edge/' }, 'MARKET_SOCKET', /not a directory/);
  // 107 bytes is the longest that fits (108 with the NUL).
  assert.equal(loadConfig({ MARKET_SOCKET: `/${'x'.repeat(SOCKET_PATH_MAX_BYTES - 1)}` }).marketSocket?.length, SOCKET_PATH_MAX_BYTES);
});

test('a socket with the address of the same service is refused rather than one of them ignored; one path for both is refused', () => {
  refused({ AUTHZ_GRPC_SOCKET: '/run/a.sock', AUTHZ_ADDRESS: 'authz.internal' }, 'AUTHZ_ADDRESS', /unset with AUTHZ_GRPC_SOCKET/);
  refused({ MARKET_SOCKET: '/run/m.sock', MARKET_ADDRESS: '10.0.0.2' }, 'MARKET_ADDRESS', /unset with MARKET_SOCKET/);
  refused({ AUTHZ_GRPC_SOCKET: '/run/a.sock', MARKET_SOCKET: '/run/a.sock' }, 'MARKET_SOCKET', /other than AUTHZ_GRPC_SOCKET/);
});

test('both are known setting names (no "unknown setting" warning)', () => {
  assert.ok(KNOWN_SETTINGS.has('AUTHZ_GRPC_SOCKET'));
  assert.ok(KNOWN_SETTINGS.has('MARKET_SOCKET'));
});

function listening(path: string): Promise<ReturnType<typeof createServer>> {
  const srv = createServer();
  return new Promise((resolve) => srv.listen(path, () => resolve(srv)));
}

test('prepareSocket: creates the directory, removes a stale socket, refuses a live one and a non-socket', async (t) => {
  const dir = tempDir('edge-uds-');
  t.after(() => removeTempDir(dir));
  const path = join(dir, 'sub', 'authz.sock');
  assert.equal(await prepareSocket(path), false, 'nothing there');
  assert.equal(statSync(join(dir, 'sub')).mode & 0o777, 0o750);

  // A crashed process's socket: bound, then the process is gone (nothing accepts; the file stays).
  const py = spawnSync('python3', ['-c', 'import socket,sys; s=socket.socket(socket.AF_UNIX); s.bind(sys.argv[1])', path]);
  assert.equal(py.status, 0, String(py.stderr));
  assert.ok(lstatSync(path).isSocket());
  assert.equal(await prepareSocket(path), true, 'the stale socket is removed');
  assert.equal(existsSync(path), false);

  // A live one: another process (here a server) accepts on it: refused, and the file is kept.
  const srv = await listening(path);
  await assert.rejects(prepareSocket(path), (err: unknown) => err instanceof SocketPathError && /another process accepts/.test(err.message));
  assert.ok(lstatSync(path).isSocket());
  await new Promise<void>((resolve) => srv.close(() => resolve()));

  // Not a socket: never removed.
  const file = join(dir, 'sub', 'notes.txt');
  writeFileSync(file, 'keep me');
  await assert.rejects(prepareSocket(file), /is not a socket/);
  assert.ok(existsSync(file));
});

test('ownSocket makes the file 0660; removeOwnSocket removes it only while it is the same file', async (t) => {
  const dir = tempDir('edge-uds-');
  t.after(() => removeTempDir(dir));
  mkdirSync(join(dir, 's'));
  const path = join(dir, 's', 'market.sock');
  const first = await listening(path);
  ownSocket(path);
  assert.equal(lstatSync(path).mode & 0o777, SOCKET_MODE);
  assert.equal(SOCKET_MODE, 0o660);
  // Another process took the path since (its own file at the same name): not removed.
  first.close();
  rmSync(path, { force: true });
  const second = await listening(path);
  removeOwnSocket(path);
  assert.ok(existsSync(path), 'another file at the same path is left alone');
  ownSocket(path);
  removeOwnSocket(path);
  assert.equal(existsSync(path), false);
  second.close();
});
