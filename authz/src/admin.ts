/**
 * The admin HTTP server (AUTHZ_ADMIN_PORT, loopback by default): GET /metrics and POST /admin/seal.
 *
 * - GET /metrics stays open to whoever reaches the port (Prometheus; the metrics carry no secret,
 *   and the bind address and the NetworkPolicy decide who that is).
 * - POST /admin/seal, the one operation that changes anything, needs both a loopback peer (any
 *   other peer gets 404, whatever the bind address) and `authorization: Bearer <token>` with the
 *   token of AUTHZ_ADMIN_TOKEN_FILE (401 `unauthorized` otherwise, and always when no token is
 *   configured): sharing the network namespace (a pod's other containers, any local user under
 *   `npm start`) is not enough. The seal is kept in AUTHZ_SEAL_FILE before it takes effect
 *   (docs/api.md "Seal").
 */
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { Registry } from 'prom-client';
import { errorJson } from './common/errors.ts';
import type { Logger } from './common/log.ts';
import type { TokenCheck } from './common/token.ts';

/** What a seal through the admin port did. */
export interface AdminSealResult {
  /** The marker was written (or was there already): the seal outlives a restart. */
  readonly persistent: boolean;
}

export interface AdminDeps {
  readonly registry: Registry;
  /** Records the seal in AUTHZ_SEAL_FILE, then seals. */
  readonly seal: (reason: string) => AdminSealResult;
  /** The admin token; undefined: POST /admin/seal is refused to everyone. */
  readonly token: TokenCheck | undefined;
  readonly logger: Logger;
}

const LOOPBACK = /^(127\.[0-9.]+|::1|::ffff:127\.[0-9.]+)$/;
/** Refusals are logged at most this often (a local caller could otherwise fill the log). */
const REFUSAL_LOG_INTERVAL_MS = 10_000;

function send(res: ServerResponse, status: number, body: string, type = 'application/json', extra: Record<string, string> = {}): void {
  res.writeHead(status, { 'content-type': type, 'cache-control': 'no-store', 'content-length': Buffer.byteLength(body), ...extra });
  res.end(body);
}

export function createAdminServer(deps: AdminDeps): Server {
  let refused = 0;
  let lastLog = -Infinity;
  const noteRefusal = (peer: string, why: string): void => {
    refused++;
    const now = Date.now();
    if (now - lastLog < REFUSAL_LOG_INTERVAL_MS) return;
    lastLog = now;
    deps.logger.warn({ peer, why, refusedSoFar: refused }, 'POST /admin/seal refused: no valid admin token');
  };
  return createServer((req: IncomingMessage, res: ServerResponse) => {
    const path = (req.url ?? '/').split('?')[0];
    if (path === '/metrics') {
      if (req.method !== 'GET') return send(res, 405, errorJson('method_not_allowed'));
      deps.registry.metrics().then(
        (text) => send(res, 200, text, deps.registry.contentType),
        (err: unknown) => send(res, 503, errorJson('service_unavailable', `metrics unavailable: ${String(err).slice(0, 200)}`)),
      );
      return;
    }
    if (path === '/admin/seal') {
      if (req.method !== 'POST') return send(res, 405, errorJson('method_not_allowed'));
      const peer = req.socket.remoteAddress ?? '';
      if (!LOOPBACK.test(peer)) return send(res, 404, errorJson('not_found'));
      req.resume();
      if (deps.token === undefined) {
        noteRefusal(peer, 'AUTHZ_ADMIN_TOKEN_FILE is not set');
        return send(res, 401, errorJson('unauthorized', 'admin operations are off: AUTHZ_ADMIN_TOKEN_FILE is not set'));
      }
      if (!deps.token.accepts(req.headers.authorization)) {
        noteRefusal(peer, req.headers.authorization === undefined ? 'no authorization header' : 'wrong token');
        return send(res, 401, errorJson('unauthorized', 'POST /admin/seal needs authorization: Bearer <the admin token>'), 'application/json', { 'www-authenticate': 'Bearer' });
      }
      const { persistent } = deps.seal('admin');
      return send(res, 202, JSON.stringify({ status: 'sealing', persistent }));
    }
    send(res, 404, errorJson('not_found'));
  });
}
