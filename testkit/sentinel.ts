/**
 * A Redis Sentinel deployment as real processes on loopback, for failover tests: one master,
 * `replicas` replicas (`--replicaof`), three Sentinels (`redis-server <conf> --sentinel`, each
 * with its own conf file: Sentinel rewrites it), all on free ports, in one temp dir. Every node
 * runs as production must (docs/operations.md "Redis"): append-only file, fsync on every write.
 *
 * Faults: `kill(port)` is a SIGKILL (the node is gone, nothing flushed); `freezeReplication()`
 * stops every replication link in both directions while its TCP connection stays up (a replica
 * that lags: the master still takes writes and counts its replicas as connected, no replica
 * receives anything), for tests that must show what an acknowledgement given before replication
 * is worth when the master then dies. For that the first master is known to everyone (Sentinels,
 * replicas, clients) by the port of a small proxy in front of it, which holds only the
 * connections that sent PSYNC/SYNC (a replica's, not a client's). Only the proxy will do:
 * Sentinel re-points a replica whose `replicaof` names another address than the master's
 * (`+fix-slave-config`, within seconds). After a failover the replicas follow the new master
 * directly.
 *
 * Every wait is bounded; `stop()` kills every process and removes the temp dir.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdirSync, writeFileSync, readFileSync, existsSync } from 'node:fs';
import { createServer, Socket, type Server } from 'node:net';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { Redis } from 'ioredis';
import { freePort } from './redis-server.ts';
import { removeTempDir, tempDir } from './temp-dir.ts';

export const MASTER_NAME = 'edge';

export interface SentinelOptions {
  /** Replicas of the first master (default 1). */
  readonly replicas?: number;
  /** Sentinel `down-after-milliseconds` (default 1000): how long the master must not answer. */
  readonly downAfterMs?: number;
  /** Sentinel `failover-timeout` (default 3000). */
  readonly failoverTimeoutMs?: number;
}

/** One connection to one node that gives up quickly: the test's own view of the deployment. */
function probe(port: number): Redis {
  const r = new Redis({ port, host: '127.0.0.1', lazyConnect: true, enableOfflineQueue: false, maxRetriesPerRequest: 0, connectTimeout: 500, commandTimeout: 1000, retryStrategy: () => null, enableReadyCheck: false });
  r.on('error', () => {});
  return r;
}

/** Runs one command on a node over a fresh connection; undefined when the node does not answer. */
export async function ask(port: number, ...args: string[]): Promise<unknown> {
  const r = probe(port);
  try {
    await r.connect();
    return await r.call(args[0] as string, ...args.slice(1));
  } catch {
    return undefined;
  } finally {
    r.disconnect();
  }
}

async function waitUntil<T>(what: string, timeoutMs: number, fn: () => Promise<T | undefined>): Promise<T> {
  const end = Date.now() + timeoutMs;
  for (;;) {
    const v = await fn().catch(() => undefined);
    if (v !== undefined) return v;
    if (Date.now() > end) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await sleep(50);
  }
}

/** `INFO replication` as a map. */
export async function replicationInfo(port: number): Promise<Map<string, string> | undefined> {
  const text = await ask(port, 'INFO', 'replication');
  if (typeof text !== 'string') return undefined;
  return new Map(text.split('\r\n').filter((l) => l.includes(':')).map((l) => [l.slice(0, l.indexOf(':')), l.slice(l.indexOf(':') + 1)]));
}

/** A TCP relay; `frozen` holds what either side of a replication connection sends. */
class LinkProxy {
  readonly #server: Server;
  readonly #held: { to: Socket; data: Buffer }[] = [];
  readonly #sockets = new Set<Socket>();
  #frozen = false;
  port = 0;

  constructor(upstreamPort: number) {
    this.#server = createServer((client) => {
      const upstream = new Socket();
      this.#sockets.add(client).add(upstream);
      const cut = (): void => {
        client.destroy();
        upstream.destroy();
        this.#sockets.delete(client);
        this.#sockets.delete(upstream);
      };
      client.on('error', cut).on('close', cut);
      upstream.on('error', cut).on('close', cut);
      // Small frames (REPLCONF GETACK/ACK) must not wait for Nagle: Redis itself sets TCP_NODELAY.
      client.setNoDelay(true);
      upstream.setNoDelay(true);
      upstream.connect(upstreamPort, '127.0.0.1');
      // A replica's connection: it asks for the replication stream (RESP `PSYNC …` or `SYNC`).
      let replication = false;
      const relay = (to: Socket) => (data: Buffer): void => {
        if (!replication && to === upstream && /\$5\r\nPSYNC\r\n|\$4\r\nSYNC\r\n/i.test(data.toString('latin1'))) replication = true;
        if (replication && this.#frozen) this.#held.push({ to, data });
        else to.write(data);
      };
      client.on('data', relay(upstream));
      upstream.on('data', relay(client));
    });
  }

  async listen(): Promise<void> {
    await new Promise<void>((resolve) => this.#server.listen(0, '127.0.0.1', resolve));
    const a = this.#server.address();
    this.port = typeof a === 'object' && a !== null ? a.port : 0;
  }

  set frozen(f: boolean) {
    this.#frozen = f;
    if (!f) for (const { to, data } of this.#held.splice(0)) if (!to.destroyed) to.write(data);
  }

  async close(): Promise<void> {
    for (const s of this.#sockets) s.destroy();
    await new Promise<void>((resolve) => this.#server.close(() => resolve()));
  }
}

interface Node {
  readonly port: number;
  /** The port everyone knows it by (the first master's proxy), else `port`. */
  readonly known: number;
  readonly dir: string;
  /** The args it was first started with (a restart reuses them, as a supervisor would). */
  readonly args: string[];
  proc: ChildProcess | undefined;
}

function exited(p: ChildProcess): Promise<void> {
  return p.exitCode !== null || p.signalCode !== null ? Promise.resolve() : new Promise((r) => p.once('exit', () => r()));
}

export class SentinelDeployment {
  readonly dir: string;
  readonly nodes: Node[] = [];
  readonly sentinels: Node[] = [];
  #front: LinkProxy | undefined;

  private constructor() {
    // A test that ends without stop() leaves no redis-server behind; then the directory goes (temp-dir.ts).
    process.once('exit', () => {
      for (const n of [...this.nodes, ...this.sentinels]) if (n.proc?.exitCode === null && n.proc.signalCode === null) n.proc.kill('SIGKILL');
    });
    this.dir = tempDir('edge-sentinel-');
  }

  static async start(opts: SentinelOptions = {}): Promise<SentinelDeployment> {
    const d = new SentinelDeployment();
    try {
      await d.#start(opts);
      return d;
    } catch (err) {
      const logs = d.logs().slice(-3000);
      await d.stop();
      throw new Error(`${String(err)}\n${logs}`, { cause: err });
    }
  }

  async #start(opts: SentinelOptions): Promise<void> {
    const replicas = opts.replicas ?? 1;
    const realPort = await freePort();
    this.#front = new LinkProxy(realPort);
    await this.#front.listen();
    const masterPort = this.#front.port;
    await this.#spawnNode(realPort, [], masterPort);
    for (let i = 0; i < replicas; i++) await this.#spawnNode(await freePort(), ['--replicaof', '127.0.0.1', String(masterPort)]);
    // Every replica in sync before the Sentinels look: they learn the replicas from the master.
    await waitUntil(`${replicas} replica(s) online`, 10_000, async () => {
      const info = await replicationInfo(masterPort);
      const online = [...(info?.values() ?? [])].filter((v) => v.includes('state=online')).length;
      return online === replicas ? true : undefined;
    });
    for (let i = 0; i < 3; i++) {
      const port = await freePort();
      const dir = join(this.dir, `sentinel-${port}`);
      mkdirSync(dir);
      const conf = join(dir, 'sentinel.conf');
      writeFileSync(conf, [
        `port ${port}`, 'bind 127.0.0.1', `dir ${dir}`, `logfile ${join(dir, 'log')}`,
        `sentinel monitor ${MASTER_NAME} 127.0.0.1 ${masterPort} 2`,
        `sentinel down-after-milliseconds ${MASTER_NAME} ${opts.downAfterMs ?? 1000}`,
        `sentinel failover-timeout ${MASTER_NAME} ${opts.failoverTimeoutMs ?? 3000}`,
        `sentinel parallel-syncs ${MASTER_NAME} 1`, '',
      ].join('\n'));
      const node: Node = { port, known: port, dir, args: [conf, '--sentinel'], proc: undefined };
      this.sentinels.push(node);
      await this.#run(node);
    }
    // Each Sentinel has found the other two (hello messages over the master) and every replica.
    await waitUntil('the Sentinels to know each other and the replicas', 15_000, async () => {
      for (const s of this.sentinels) {
        const m = await this.#sentinelMaster(s.port);
        if (m === undefined || m.get('num-other-sentinels') !== '2' || m.get('num-slaves') !== String(replicas)) return undefined;
      }
      return true;
    });
  }

  async #spawnNode(port: number, extra: string[], known = port): Promise<Node> {
    const dir = join(this.dir, `redis-${port}`);
    mkdirSync(dir);
    const node: Node = {
      port, known, dir, proc: undefined,
      args: ['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'yes', '--appendfsync', 'always',
        '--dir', dir, '--logfile', join(dir, 'log'), '--repl-diskless-sync-delay', '0', ...extra],
    };
    this.nodes.push(node);
    await this.#run(node);
    return node;
  }

  async #run(node: Node): Promise<void> {
    node.proc = spawn('redis-server', node.args, { stdio: 'ignore' });
    await waitUntil(`redis-server on ${node.port}`, 5000, async () => ((await ask(node.port, 'PING')) === 'PONG' ? true : undefined));
  }

  async #sentinelMaster(sentinelPort: number): Promise<Map<string, string> | undefined> {
    const flat = await ask(sentinelPort, 'SENTINEL', 'MASTER', MASTER_NAME);
    if (!Array.isArray(flat)) return undefined;
    const m = new Map<string, string>();
    for (let i = 0; i + 1 < flat.length; i += 2) m.set(String(flat[i]), String(flat[i + 1]));
    return m;
  }

  /** `redis+sentinel://` naming the three Sentinels (the form REDIS_URL takes). */
  get url(): string {
    return `redis+sentinel://${this.sentinels.map((s) => `127.0.0.1:${s.port}`).join(',')}/${MASTER_NAME}`;
  }

  /** The master's port as a quorum of Sentinels reports it (undefined while they disagree). */
  async master(): Promise<number | undefined> {
    const seen = new Map<number, number>();
    for (const s of this.sentinels) {
      const a = await ask(s.port, 'SENTINEL', 'GET-MASTER-ADDR-BY-NAME', MASTER_NAME);
      if (Array.isArray(a)) seen.set(Number(a[1]), (seen.get(Number(a[1])) ?? 0) + 1);
    }
    for (const [port, n] of seen) if (n >= 2) return port;
    return undefined;
  }

  /** SIGKILLs the node known by `port` (as master() names it) and waits for its exit. */
  async kill(port: number): Promise<void> {
    const node = this.nodes.find((n) => n.known === port);
    const p = node?.proc;
    if (node === undefined || p === undefined) throw new Error(`no node on ${port}`);
    p.kill('SIGKILL');
    await exited(p);
    node.proc = undefined;
  }

  /**
   * Waits until a quorum of Sentinels names a master other than `oldPort` and that node says it
   * is one (role:master); returns its port.
   */
  async promotion(oldPort: number, timeoutMs = 20_000): Promise<number> {
    return waitUntil(`a replica promoted in place of ${oldPort}`, timeoutMs, async () => {
      const port = await this.master();
      if (port === undefined || port === oldPort) return undefined;
      return (await replicationInfo(port))?.get('role') === 'master' ? port : undefined;
    });
  }

  /**
   * Waits until a quorum of Sentinels names one master and that node says it is one; returns its
   * port. After a failover this may be another node than promotion() returned: on a busy host the
   * promoted master can miss Sentinel's PINGs for down-after-milliseconds (an fsync with
   * appendfsync always blocks its main thread) and be failed over in turn.
   */
  async settledMaster(timeoutMs = 20_000): Promise<number> {
    return waitUntil('the Sentinels to agree on a master that says it is one', timeoutMs, async () => {
      const port = await this.master();
      if (port === undefined) return undefined;
      return (await replicationInfo(port))?.get('role') === 'master' ? port : undefined;
    });
  }

  /** Restarts a killed node with its first args and its data dir (a supervisor bringing it back). */
  async restart(port: number): Promise<void> {
    const node = this.nodes.find((n) => n.known === port);
    if (node === undefined) throw new Error(`no node on ${port}`);
    await this.#run(node);
  }

  /** Waits until the master on `port` has `n` replicas online (bounded). */
  async replicasOnline(port: number, n: number, timeoutMs = 20_000): Promise<void> {
    await waitUntil(`${n} replica(s) online at ${port}`, timeoutMs, async () => {
      const info = await replicationInfo(port);
      const online = [...(info?.values() ?? [])].filter((v) => v.includes('state=online')).length;
      return online >= n ? true : undefined;
    });
  }

  /** Holds every replication link (both directions) until `thawReplication()`; the TCP connections stay up. */
  freezeReplication(): void {
    if (this.#front !== undefined) this.#front.frozen = true;
  }

  thawReplication(): void {
    if (this.#front !== undefined) this.#front.frozen = false;
  }

  pids(): number[] {
    return [...this.nodes, ...this.sentinels].map((n) => n.proc?.pid).filter((p): p is number => p !== undefined);
  }

  /** The tail of every node's log file, for a failed test's message. */
  logs(): string {
    return [...this.nodes, ...this.sentinels].map((n) => {
      const f = join(n.dir, 'log');
      return existsSync(f) ? `--- ${n.port}\n${readFileSync(f, 'utf8').split('\n').slice(-15).join('\n')}` : '';
    }).join('\n');
  }

  async stop(): Promise<void> {
    const procs = [...this.nodes, ...this.sentinels].map((n) => n.proc).filter((p): p is ChildProcess => p !== undefined);
    for (const p of procs) p.kill('SIGKILL');
    const ac = new AbortController();
    await Promise.race([Promise.all(procs.map(exited)), sleep(5000, undefined, { signal: ac.signal }).catch(() => {})]);
    ac.abort();
    await this.#front?.close();
    if (process.env['E2E_KEEP'] === undefined) removeTempDir(this.dir);
  }
}
