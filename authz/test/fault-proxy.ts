/**
 * A TCP proxy in front of a real redis-server that injects the network faults a real deployment
 * sees, so tests can put a command's outcome in doubt on purpose:
 *   pass       forward both ways
 *   hold       keep what the client sends (in order) until the mode changes: a stalled Redis
 *   cut-reply  forward requests; the first reply bytes cut both connections instead: the command
 *              ran in Redis but its reply is lost
 *   refuse     cut every connection and refuse new ones: Redis gone
 */
import { createServer, Socket, type Server } from 'node:net';

export type FaultMode = 'pass' | 'hold' | 'cut-reply' | 'refuse';

interface Pair { client: Socket; upstream: Socket; held: Buffer[] }

export class FaultProxy {
  readonly #server: Server;
  readonly #pairs = new Set<Pair>();
  #mode: FaultMode = 'pass';
  port = 0;

  private constructor(upstreamPort: number) {
    this.#server = createServer((client) => {
      if (this.#mode === 'refuse') {
        client.destroy();
        return;
      }
      const upstream = new Socket();
      const pair: Pair = { client, upstream, held: [] };
      this.#pairs.add(pair);
      const cut = (): void => {
        client.destroy();
        upstream.destroy();
        this.#pairs.delete(pair);
      };
      client.on('error', cut).on('close', cut);
      upstream.on('error', cut).on('close', cut);
      upstream.connect(upstreamPort, '127.0.0.1');
      client.on('data', (d) => {
        if (this.#mode === 'hold') pair.held.push(d);
        else upstream.write(d);
      });
      upstream.on('data', (d) => {
        if (this.#mode === 'cut-reply') cut();
        else client.write(d);
      });
    });
  }

  static async start(upstreamPort: number): Promise<FaultProxy> {
    const p = new FaultProxy(upstreamPort);
    await new Promise<void>((resolve) => p.#server.listen(0, '127.0.0.1', resolve));
    const a = p.#server.address();
    p.port = typeof a === 'object' && a !== null ? a.port : 0;
    return p;
  }

  get url(): string {
    return `redis://127.0.0.1:${this.port}/0`;
  }

  set mode(m: FaultMode) {
    this.#mode = m;
    for (const pair of this.#pairs) {
      if (m === 'refuse') {
        pair.client.destroy();
        pair.upstream.destroy();
      } else if (m !== 'hold') {
        for (const d of pair.held.splice(0)) pair.upstream.write(d);
      }
    }
    if (m === 'refuse') this.#pairs.clear();
  }

  async close(): Promise<void> {
    this.mode = 'refuse';
    await new Promise<void>((resolve) => this.#server.close(() => resolve()));
  }
}
