/**
 * Runs the demo mTLS order backend as a process (docker-compose `backend` service):
 * BACKEND_CERT_FILE, BACKEND_KEY_FILE, BACKEND_CLIENT_CA_FILE, BACKEND_PORT (default 8443).
 * Deliveries are logged as one JSON line each (size and SHA-256, never the bytes).
 */
import { createHash } from 'node:crypto';
import { createOrderBackend } from './order-backend.ts';

const need = (name: string): string => {
  const v = process.env[name];
  if (v === undefined || v === '') throw new Error(`${name} is required`);
  return v;
};
const backend = createOrderBackend({ certFile: need('BACKEND_CERT_FILE'), keyFile: need('BACKEND_KEY_FILE'), clientCaFile: need('BACKEND_CLIENT_CA_FILE') });
const port = await backend.listen(Number(process.env['BACKEND_PORT'] ?? 8443), process.env['BACKEND_BIND_ADDRESS'] ?? '0.0.0.0');
process.stdout.write(`${JSON.stringify({ msg: 'demo order backend listening', port })}\n`);
setInterval(() => {
  for (const d of backend.deliveries.splice(0)) {
    process.stdout.write(`${JSON.stringify({ msg: 'order', bytes: d.body.length, sha256: createHash('sha256').update(d.body).digest('hex'), requestId: d.headers['x-request-id'], clientCert: d.clientCertSubject })}\n`);
  }
}, 500).unref();
for (const sig of ['SIGTERM', 'SIGINT'] as const) process.on(sig, () => void backend.close().then(() => process.exit(0)));
