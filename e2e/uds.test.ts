/**
 * `npm start` with its default Unix domain sockets (docs/envoy.md "Unix domain sockets"): Envoy
 * reaches the TS service's ext_authz gRPC server and market service over sockets in the run
 * directory, and the TS service has no TCP listener for either (only its admin port), read from
 * /proc/net/tcp{,6} and the processes' own socket descriptors. Reads, orders and signed ingests go
 * through the edge; Envoy's own counters show its authz and market connections on the sockets. A
 * stale socket file left by a crashed run is removed at start; the files are 0660 and gone after
 * Ctrl-C. Once with one process, once with AUTHZ_WORKERS=2 (node:cluster: the primary holds the
 * sockets).
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile, spawnSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { existsSync, lstatSync, mkdirSync, readdirSync, readFileSync, readlinkSync, writeFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { promisify } from 'node:util';
import { fileURLToPath } from 'node:url';
import { removeTempDir, tempDir } from '../testkit/temp-dir.ts';
import { freshStart, keysOf, startScript } from './lib/npm-start.ts';

const ROOT = fileURLToPath(new URL('../', import.meta.url));
const NODE = join(ROOT, 'scripts', 'node');

/** The TS service's processes of this run (the primary and its workers, or the one process). */
function tsPids(runDir: string): number[] {
  const out: number[] = [];
  for (const d of readdirSync('/proc')) {
    if (!/^\d+$/.test(d) || Number(d) === process.pid) continue;
    try {
      const cmd = readFileSync(`/proc/${d}/cmdline`, 'utf8');
      if (cmd.includes('authz/src/main.ts') && readFileSync(`/proc/${d}/environ`, 'utf8').includes(`DEV_RUN_DIR=${runDir}\0`)) out.push(Number(d));
    } catch { /* gone */ }
  }
  return out;
}

/** The socket inodes a process holds open (its fd table). */
function socketInodes(pid: number): Set<string> {
  const out = new Set<string>();
  for (const fd of readdirSync(`/proc/${pid}/fd`)) {
    try {
      const m = /^socket:\[(\d+)\]$/.exec(readlinkSync(`/proc/${pid}/fd/${fd}`));
      if (m) out.add(m[1]!);
    } catch { /* closed meanwhile */ }
  }
  return out;
}

/** TCP ports in LISTEN (state 0A) on sockets `pids` hold, from /proc/<pid>/net/tcp and tcp6. */
function listeningTcpPorts(pids: readonly number[]): number[] {
  const ports = new Set<number>();
  for (const pid of pids) {
    const mine = socketInodes(pid);
    for (const table of ['tcp', 'tcp6']) {
      for (const line of readFileSync(`/proc/${pid}/net/${table}`, 'utf8').split('\n').slice(1)) {
        const f = line.trim().split(/\s+/);
        if (f.length < 10 || f[3] !== '0A' || !mine.has(f[9]!)) continue;
        ports.add(parseInt(f[1]!.split(':')[1]!, 16));
      }
    }
  }
  return [...ports].sort((a, b) => a - b);
}

/**
 * Unix socket paths in LISTEN (state 01, flag __SO_ACCEPTCON) on sockets `pids` hold, from
 * /proc/net/unix, as absolute paths. With AUTHZ_WORKERS=2 the cluster primary binds the path the
 * worker asked for and may bind it relative to its working directory when that is shorter
 * (seen: `../edge-test-run…/authz.sock` from a checkout in /tmp), so a relative entry is resolved
 * against the cwd of the process holding it.
 */
function listeningUnixPaths(pids: readonly number[]): string[] {
  const owner = new Map<string, number>();
  for (const p of pids) for (const inode of socketInodes(p)) owner.set(inode, p);
  const paths: string[] = [];
  for (const line of readFileSync('/proc/net/unix', 'utf8').split('\n').slice(1)) {
    const f = line.trim().split(/\s+/);
    const pid = owner.get(f[6] ?? '');
    if (f.length >= 8 && f[3] === '00010000' && pid !== undefined) paths.push(resolve(readlinkSync(`/proc/${pid}/cwd`), f[7]!));
  }
  return paths.sort();
}

for (const workers of [1, 2]) {
  test(`npm start (AUTHZ_WORKERS=${workers}): reads, orders and ingests through Envoy over Unix sockets; the TS service listens on no TCP port but its admin port; a stale socket from a crash is replaced; the sockets are 0660 and removed at exit`, { timeout: 180_000 }, async () => {
    const runDir = tempDir('edge-uds-');
    const sockets = { authz: join(runDir, 'sockets', 'authz.sock'), market: join(runDir, 'sockets', 'market.sock') };
    // A crashed run's socket: bound by a process that is gone (nothing accepts, the file stays).
    mkdirSync(join(runDir, 'sockets'));
    const py = spawnSync('python3', ['-c', 'import socket,sys; s=socket.socket(socket.AF_UNIX); s.bind(sys.argv[1])', sockets.authz]);
    assert.equal(py.status, 0, String(py.stderr));
    assert.ok(lstatSync(sockets.authz).isSocket());

    const { ports, env } = await freshStart({
      ports: ['EDGE_PORT', 'AUTHZ_ADMIN_PORT', 'ENVOY_ADMIN_PORT', 'DEV_REDIS_PORT', 'DEV_BACKEND_PORT'], runDir,
      unset: ['AUTHZ_GRPC_PORT', 'MARKET_PORT', 'AUTHZ_GRPC_SOCKET', 'MARKET_SOCKET', 'AUTHZ_ADDRESS', 'MARKET_ADDRESS', 'RATELIMIT_SERVICE_ADDRESS'],
      extra: { AUTHZ_WORKERS: String(workers) },
    });
    const stack = startScript(env);
    try {
      await stack.waitFor(/READY/, 90_000);
      assert.match(stack.out, /removed a stale socket file/, 'the crashed run\'s socket was found and replaced');
      assert.match(stack.out, new RegExp(`authz gRPC +${sockets.authz} +\\(\\.venv/bin/grpcurl -plaintext -unix ${sockets.authz} list\\)`));
      for (const path of Object.values(sockets)) {
        const st = lstatSync(path);
        assert.ok(st.isSocket(), path);
        assert.equal(st.mode & 0o777, 0o660, `${path} is 0660`);
      }

      const edge = `http://127.0.0.1:${ports.EDGE_PORT}`;
      const keys = keysOf(join(runDir, 'dev.env'));
      const client = (...args: string[]) => promisify(execFile)(NODE, [join(ROOT, 'scripts/edge-client.ts'), ...args], {
        cwd: ROOT, env: { ...env, ...keys, EDGE_PORT: String(ports.EDGE_PORT) },
      });
      const ing = await client('demo-ingest', '0xuds');
      assert.match(ing.stdout, /^200 .*"stored"/, ing.stdout);
      const read = await fetch(`${edge}/v1/markets?conditionId=0xuds`);
      assert.equal(read.status, 200);
      assert.equal(((await read.json()) as { markets: unknown[] }).markets.length, 1);
      const orderFile = join(runDir, 'order.bin');
      writeFileSync(orderFile, randomBytes(64));
      const order = await client('order', '0xuds', '10', orderFile);
      assert.match(order.stdout, /^200 /, order.stdout);
      // A denial travels the same way: an unsigned ingest is refused by the Check (401 JSON).
      const unsigned = await fetch(`${edge}/internal/ingest/market`, { method: 'POST', body: '{}', headers: { 'content-type': 'application/json' } });
      assert.equal(unsigned.status, 401);

      // Envoy's view: the authz and market hosts are the socket paths, with requests served on them.
      const clusters = await (await fetch(`http://127.0.0.1:${ports.ENVOY_ADMIN_PORT}/clusters`)).text();
      for (const [cluster, path] of [['authz', sockets.authz], ['market', sockets.market]] as const) {
        const rq = new RegExp(`^${cluster}::${path.replaceAll('.', '\\.')}::rq_total::(\\d+)$`, 'm').exec(clusters);
        assert.ok(rq !== null && Number(rq[1]) >= (cluster === 'authz' ? 4 : 2), `${cluster} requests on ${path}:\n${clusters.split('\n').filter((l) => l.startsWith(`${cluster}::`)).join('\n')}`);
      }
      assert.match(stack.out, new RegExp(`"upstream_host":"${sockets.market.replaceAll('.', '\\.')}"`), 'the access log names the market socket');

      // The TS service's listeners: TCP only on the admin port; the two sockets on Unix.
      const pids = tsPids(runDir);
      assert.equal(pids.length, workers === 1 ? 1 : 3, `the TS service's processes: ${pids.join(', ')}`);
      assert.deepEqual(listeningTcpPorts(pids), [ports.AUTHZ_ADMIN_PORT], 'no TCP listener for ext_authz or the market service');
      assert.deepEqual(listeningUnixPaths(pids), [sockets.authz, sockets.market].sort());
    } finally {
      await stack.stop();
    }
    assert.equal(stack.code, 0, stack.out);
    for (const path of Object.values(sockets)) assert.equal(existsSync(path), false, `${path} is removed at exit`);
    removeTempDir(runDir);
  });
}
