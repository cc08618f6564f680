/**
 * The admin HTTP server (AUTHZ_ADMIN_PORT, loopback by default): GET /metrics and
 * POST /admin/seal. Seal is accepted only from a loopback peer, whatever the bind address.
 */
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { Registry } from 'prom-client';
import { errorJson } from './common/errors.ts';

export interface AdminDeps {
  readonly registry: Registry;
  readonly seal: (reason: string) => void;
}

const LOOPBACK = /^(127\.[0-9.]+|::1|::ffff:127\.[0-9.]+)$/;

function send(res: ServerResponse, status: number, body: string, type = 'application/json'): void {
  res.writeHead(status, { 'content-type': type, 'cache-control': 'no-store', 'content-length': Buffer.byteLength(body) });
  res.end(body);
}

export function createAdminServer(deps: AdminDeps): Server {
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
      if (!LOOPBACK.test(req.socket.remoteAddress ?? '')) return send(res, 404, errorJson('not_found'));
      req.resume();
      deps.seal('admin');
      return send(res, 202, JSON.stringify({ status: 'sealing' }));
    }
    send(res, 404, errorJson('not_found'));
  });
}
