/**
 * GET over a Unix domain socket (the TS service's MARKET_SOCKET), where `fetch` cannot go:
 * npm start's readiness probe and the tests ask the market service's /healthz this way.
 */
import { request } from 'node:http';

export interface UnixAnswer {
  readonly status: number;
  readonly body: string;
}

/** GET `path` from the HTTP server listening on `socketPath`; rejects after `timeoutMs` (an Error named TimeoutError). */
export function getOverSocket(socketPath: string, path: string, timeoutMs = 2000): Promise<UnixAnswer> {
  return new Promise((resolve, reject) => {
    const req = request({ socketPath, path, method: 'GET', headers: { host: 'market.local' }, agent: false }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, body: Buffer.concat(chunks).toString('utf8') }));
      res.on('error', reject);
    });
    req.setTimeout(timeoutMs, () => {
      const err = new Error(`no answer within ${timeoutMs} ms`);
      err.name = 'TimeoutError';
      req.destroy(err);
    });
    req.on('error', reject);
    req.end();
  });
}
