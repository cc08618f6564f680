/**
 * The TS service's real entry point (authz/src/main.ts) as a child process, for tests of what it
 * does at start, on signals and on its output: free ports, fresh keys, its output collected.
 */
import { spawn, type ChildProcessByStdio } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import type { Readable } from 'node:stream';
import { fileURLToPath } from 'node:url';
import { setTimeout as sleep } from 'node:timers/promises';
import { newFeedKey } from '../../testkit/feed.ts';
import { freePort } from '../../testkit/redis-server.ts';

const ROOT = fileURLToPath(new URL('../../', import.meta.url));

export interface Exit { readonly code: number | null; readonly signal: NodeJS.Signals | null }

export class ServiceChild {
  #out = '';
  readonly child: ChildProcessByStdio<null, Readable, Readable>;
  readonly exited: Promise<Exit>;
  readonly marketPort: number;

  private constructor(env: NodeJS.ProcessEnv, marketPort: number, args: readonly string[]) {
    this.marketPort = marketPort;
    this.child = spawn(`${ROOT}scripts/node`, [`${ROOT}authz/src/main.ts`, ...args], { env, stdio: ['ignore', 'pipe', 'pipe'] });
    this.child.stdout.on('data', (d: Buffer) => { this.#out += d.toString(); });
    this.child.stderr.on('data', (d: Buffer) => { this.#out += d.toString(); });
    this.exited = new Promise((resolve) => this.child.once('exit', (code, signal) => resolve({ code, signal })));
  }

  /**
   * Starts main.ts with `env` over this process's environment, a fresh HMAC key and feed key, and
   * its three ports free ones (any of these can be overridden in `env`); `args` after main.ts (which
   * ignores them: a marker to find the processes by).
   */
  static async start(env: Record<string, string>, args: readonly string[] = []): Promise<ServiceChild> {
    const [grpc, market, admin] = [await freePort(), await freePort(), await freePort()];
    return new ServiceChild({
      ...process.env,
      EDGE_INGEST_HMAC: `hex:${randomBytes(32).toString('hex')}`, EDGE_FEED_ED25519_PUBLIC_KEY: newFeedKey().publicHex,
      AUTHZ_GRPC_PORT: String(grpc), MARKET_PORT: String(market), AUTHZ_ADMIN_PORT: String(admin),
      ...env,
    }, Number(env['MARKET_PORT'] ?? market), args);
  }

  /** Everything it wrote so far, stdout and stderr interleaved. */
  out(): string {
    return this.#out;
  }

  /** Whether GET / on its market port answered 200 within `ms` (false at once if it exited). */
  async ready(ms = 15_000): Promise<boolean> {
    for (const end = Date.now() + ms; Date.now() < end && this.child.exitCode === null;) {
      if (await fetch(`http://127.0.0.1:${this.marketPort}/`).then((r) => r.status === 200, () => false)) return true;
      await sleep(100);
    }
    return false;
  }

  kill(): void {
    this.child.kill('SIGKILL');
  }
}
