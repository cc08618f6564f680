/**
 * A demo order backend: HTTPS with a required client certificate (mTLS), `POST /orders`.
 * It records every delivery (exact body bytes, headers, client certificate fingerprint) so
 * tests can prove byte-exact forwarding, and answers 200 JSON with the body's SHA-256.
 * Modes for fault tests: 'ok', 'slow' (answers after `delayMs`), 'reset' (destroys sockets).
 */
import { createHash } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { createServer, type Server } from 'node:https';
import type { TLSSocket } from 'node:tls';

export interface Delivery {
  readonly method: string;
  readonly path: string;
  readonly headers: Record<string, string | string[] | undefined>;
  readonly body: Buffer;
  /** SHA-256 fingerprint of the client certificate presented on the connection. */
  readonly clientCertFingerprint: string | undefined;
  readonly clientCertSubject: string | undefined;
}

export interface OrderBackend {
  readonly server: Server;
  readonly deliveries: Delivery[];
  mode: 'ok' | 'slow' | 'reset';
  delayMs: number;
  listen(port?: number, host?: string): Promise<number>;
  close(): Promise<void>;
}

export function createOrderBackend(opts: { certFile: string; keyFile: string; clientCaFile: string }): OrderBackend {
  const deliveries: Delivery[] = [];
  const state = { mode: 'ok' as 'ok' | 'slow' | 'reset', delayMs: 0 };
  const server = createServer(
    {
      cert: readFileSync(opts.certFile),
      key: readFileSync(opts.keyFile),
      ca: readFileSync(opts.clientCaFile),
      requestCert: true,
      rejectUnauthorized: true,
      keepAliveTimeout: 60_000,
    },
    (req, res) => {
      const chunks: Buffer[] = [];
      req.on('data', (c: Buffer) => chunks.push(c));
      req.on('end', () => {
        if (state.mode === 'reset') {
          req.socket.destroy();
          return;
        }
        const body = Buffer.concat(chunks);
        const peer = (req.socket as TLSSocket).getPeerCertificate();
        deliveries.push({
          method: req.method ?? '',
          path: req.url ?? '',
          headers: { ...req.headers },
          body,
          clientCertFingerprint: peer?.fingerprint256,
          clientCertSubject: typeof peer?.subject?.CN === 'string' ? peer.subject.CN : undefined,
        });
        const answer = (): void => {
          if (req.method !== 'POST' || req.url !== '/orders') {
            res.writeHead(404, { 'content-type': 'application/json' });
            res.end(JSON.stringify({ error: 'not_found', message: 'backend knows only POST /orders' }));
            return;
          }
          const out = JSON.stringify({ status: 'accepted', bytes: body.length, sha256: createHash('sha256').update(body).digest('hex'), requestId: req.headers['x-request-id'] });
          res.writeHead(200, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(out) });
          res.end(out);
        };
        if (state.mode === 'slow') setTimeout(answer, state.delayMs);
        else answer();
      });
    },
  );
  return {
    server,
    deliveries,
    get mode() { return state.mode; },
    set mode(m) { state.mode = m; },
    get delayMs() { return state.delayMs; },
    set delayMs(d) { state.delayMs = d; },
    listen(port = 0, host = '127.0.0.1') {
      return new Promise((resolve) => server.listen(port, host, () => {
        const a = server.address();
        resolve(typeof a === 'object' && a !== null ? a.port : port);
      }));
    },
    close() {
      return new Promise((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      });
    },
  };
}
