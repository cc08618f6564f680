/**
 * A private redis-server on a free port for fault tests: these stop and restart their own
 * instance, never the machine's shared one on 6379.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { setTimeout as sleep } from 'node:timers/promises';
import { Socket } from 'node:net';
import { tempDir } from './temp-dir.ts';

/**
 * The ports the kernel may give an outgoing connection as its local port (ip_local_port_range).
 * A port from bind(0) lies in that range too, so between our check and the real listener any
 * loopback client (a Redis connection, a health probe) could take it as its local end, and the
 * listener then fails with EADDRINUSE (seen: the pod test's `podman kube play` could not publish
 * 127.0.0.1:42757 in a CI run). Ports are therefore chosen below the range.
 */
function ephemeralLow(): number {
  try {
    const low = Number(readFileSync('/proc/sys/net/ipv4/ip_local_port_range', 'utf8').trim().split(/\s+/)[0]);
    return Number.isInteger(low) && low > 12_000 ? low : 32_768;
  } catch {
    return 32_768;
  }
}
const PICK_LOW = 10_000;
const PICK_HIGH = ephemeralLow() - 1;
/** Ports this process has handed out: never handed out twice (seven in a row must differ). */
const handedOut = new Set<number>();

function bindsOn(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const s = createServer();
    s.once('error', () => resolve(false));
    s.listen(port, '127.0.0.1', () => s.close(() => resolve(true)));
  });
}

/**
 * A free TCP port on 127.0.0.1 for a listener a test starts next: random below the kernel's
 * ephemeral range (so no outgoing connection holds it meanwhile), checked by binding it, and
 * never one this process returned before.
 */
export async function freePort(): Promise<number> {
  for (let attempt = 0; attempt < 200; attempt++) {
    const port = PICK_LOW + Math.floor(Math.random() * (PICK_HIGH - PICK_LOW + 1));
    if (handedOut.has(port)) continue;
    if (await bindsOn(port)) {
      handedOut.add(port);
      return port;
    }
  }
  throw new Error(`no free port found between ${PICK_LOW} and ${PICK_HIGH} in 200 attempts`);
}

async function answersPing(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const sock = new Socket();
    sock.setTimeout(300);
    sock.once('error', () => resolve(false));
    sock.once('timeout', () => { sock.destroy(); resolve(false); });
    sock.connect(port, '127.0.0.1', () => sock.write('PING\r\n'));
    sock.once('data', (d) => { sock.destroy(); resolve(d.toString().startsWith('+PONG')); });
  });
}

/**
 * Runs the way production must (docs/operations.md): append-only file with fsync on every
 * write, so what Redis acknowledged — a stored market, a recorded nonce — survives a crash.
 */
export class PrivateRedis {
  readonly port: number;
  readonly dir: string;
  #proc: ChildProcess | undefined;
  private constructor(port: number) {
    this.port = port;
    // A test that ends without stop() leaves no redis-server behind; then its data directory goes (temp-dir.ts).
    process.once('exit', () => {
      if (this.#proc !== undefined && this.#proc.exitCode === null && this.#proc.signalCode === null) this.#proc.kill('SIGKILL');
    });
    this.dir = tempDir('edge-redis-');
  }
  static async start(): Promise<PrivateRedis> {
    const r = new PrivateRedis(await freePort());
    await r.resume();
    return r;
  }
  get url(): string {
    return `redis://127.0.0.1:${this.port}/0`;
  }
  /** (Re)starts redis-server on the same port and waits until it answers. */
  async resume(): Promise<void> {
    this.#proc = spawn('redis-server', ['--port', String(this.port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'yes', '--appendfsync', 'always', '--dir', this.dir], { stdio: 'ignore' });
    // A test that forgets stop() still ends (then the exit listener above kills the server).
    this.#proc.unref();
    for (let i = 0; i < 100; i++) {
      if (await answersPing(this.port)) return;
      await sleep(50);
    }
    throw new Error(`redis-server on ${this.port} did not start`);
  }
  /** Stops it (SIGKILL: an abrupt failure, not a graceful shutdown) and waits for exit. */
  async stop(): Promise<void> {
    const p = this.#proc;
    if (p === undefined || p.exitCode !== null) return;
    const exited = new Promise((resolve) => p.once('exit', resolve));
    p.ref(); // until it has exited
    p.kill('SIGKILL');
    await exited;
    this.#proc = undefined;
  }
}
