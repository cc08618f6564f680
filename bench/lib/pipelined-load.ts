/**
 * A load generator for many distinct clients through one trusted hop: raw HTTP/1.1 keep-alive
 * connections, each writing a window of pipelined requests at once (Envoy answers them in order),
 * every request with its own `x-forwarded-for`, as a load balancer in front of the edge writes it.
 * Node's HTTP client (one request per socket at a time) would cost more CPU than the edge it
 * drives; here the loader's cost is a string join and a scan of the answers per window.
 */
import { connect, type Socket } from 'node:net';

export interface PipelinedLoad {
  readonly host: string;
  readonly port: number;
  readonly path: string;
  /** The client address of request i (written as the request's only X-Forwarded-For entry). */
  readonly client: (i: number) => string;
  /** Requests i in [from, to). */
  readonly from: number;
  readonly to: number;
  readonly connections: number;
  /** Requests written at once per connection. */
  readonly window: number;
}

/** Answers counted by status. */
export type StatusCounts = Record<number, number>;

/** Reads whole responses off `sock`: resolves with their statuses once `n` have arrived. */
function responses(sock: Socket, n: number, counts: StatusCounts): Promise<void> {
  return new Promise((resolve, reject) => {
    let buf: Buffer = Buffer.alloc(0);
    let seen = 0;
    const onData = (d: Buffer): void => {
      buf = buf.length === 0 ? d : Buffer.concat([buf, d]);
      for (;;) {
        const end = buf.indexOf('\r\n\r\n');
        if (end === -1) break;
        const head = buf.subarray(0, end).toString('latin1');
        const m = /content-length:\s*(\d+)/i.exec(head);
        const len = m === null ? 0 : Number(m[1]);
        if (buf.length < end + 4 + len) break;
        const status = Number(head.slice(9, 12));
        counts[status] = (counts[status] ?? 0) + 1;
        buf = buf.subarray(end + 4 + len);
        if (++seen === n) {
          sock.off('data', onData);
          sock.off('error', reject);
          resolve();
          return;
        }
      }
    };
    sock.on('data', onData);
    sock.once('error', reject);
  });
}

/** Sends requests [from, to) over `connections` keep-alive connections; resolves with the statuses. */
export async function pipelinedLoad(o: PipelinedLoad): Promise<StatusCounts> {
  const counts: StatusCounts = {};
  let next = o.from;
  const worker = async (): Promise<void> => {
    const sock = connect(o.port, o.host);
    sock.setNoDelay(true);
    await new Promise<void>((resolve, reject) => { sock.once('connect', resolve); sock.once('error', reject); });
    try {
      while (next < o.to) {
        const start = next;
        const end = Math.min(o.to, start + o.window);
        next = end;
        const parts: string[] = [];
        for (let i = start; i < end; i++) {
          parts.push(`GET ${o.path} HTTP/1.1\r\nhost: edge.example\r\nx-forwarded-for: ${o.client(i)}\r\n\r\n`);
        }
        const done = responses(sock, end - start, counts);
        sock.write(parts.join(''));
        await done;
      }
    } finally {
      sock.destroy();
    }
  };
  await Promise.all(Array.from({ length: o.connections }, worker));
  return counts;
}
