/**
 * A private redis-server on a free port for fault tests: these stop and restart their own
 * instance, never the machine's shared one on 6379.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { createServer } from 'node:net';
import { setTimeout as sleep } from 'node:timers/promises';
import { Socket } from 'node:net';
import { tempDir } from './temp-dir.ts';

export async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = createServer();
    s.once('error', reject);
    s.listen(0, '127.0.0.1', () => {
      const a = s.address();
      s.close(() => resolve(typeof a === 'object' && a !== null ? a.port : 0));
    });
  });
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
