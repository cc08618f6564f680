/**
 * TLS on the client listener (EDGE_TLS_CERT_FILE/EDGE_TLS_KEY_FILE) through the real Envoy, with
 * real clients (curl from Debian, Node's https, http2 and tls) and certificates generated at test
 * time: TLS 1.3 with ALPN h2 and TLS 1.2 with http/1.1 answered; TLS 1.1 and plaintext HTTP
 * refused; the order backend sees `x-forwarded-proto: https`. Local processes only (the
 * containers pass has no TLS variant of its stack).
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { connect } from 'node:net';
import { freePort } from '../authz/test/redis-server.ts';
import { removeTempDir } from '../authz/test/temp-dir.ts';
import { startStack, type Stack } from './lib/stack.ts';
import { ingest, orderBody, uniqueId } from './lib/client.ts';
import { curl, edgeTlsPki, handshake, https1, https2, type EdgeTlsPki } from './lib/edge-tls.ts';

const containers = process.env['E2E_DRIVER'] === 'containers';

/** Sends `text` on a plain TCP connection and collects what comes back until the peer closes (at most 5 s). */
function plaintext(port: number, text: string): Promise<{ closed: boolean; received: string }> {
  return new Promise((resolve) => {
    const s = connect(port, '127.0.0.1');
    let received = '';
    const timer = setTimeout(() => { s.destroy(); resolve({ closed: false, received }); }, 5000);
    s.on('data', (d: Buffer) => { received += d.toString('latin1'); });
    s.on('close', () => { clearTimeout(timer); resolve({ closed: true, received }); });
    s.on('error', () => { /* a reset ends in close */ });
    s.write(text);
  });
}

describe('TLS on the client listener', { skip: containers ? 'local processes only: the containers stack has no TLS variant' : false }, () => {
  let pki: EdgeTlsPki;
  let stack: Stack;
  let port: number;
  let market: string;

  before(async () => {
    pki = edgeTlsPki();
    stack = await startStack({
      env: { EDGE_TLS_CERT_FILE: pki.certFile, EDGE_TLS_KEY_FILE: pki.keyFile, INGEST_PORT: String(await freePort()) },
    });
    port = Number(new URL(stack.edgeUrl).port);
    market = uniqueId('0xtls');
    assert.equal((await ingest(stack, market, 1)).status, 200);
  });
  after(async () => {
    await stack?.stop();
    if (pki !== undefined) removeTempDir(pki.dir);
  });

  test('curl --cacert: TLS 1.3 with ALPN h2 gets 200 over HTTP/2', async () => {
    const r = await curl(['--cacert', pki.caFile, '--tlsv1.3', '--http2', `${stack.edgeUrl}/healthz`]);
    assert.equal(r.code, 0, r.err);
    assert.equal(r.out, '200 2');
  });

  test('curl --cacert: TLS 1.2 with http/1.1 gets 200 over HTTP/1.1', async () => {
    const r = await curl(['--cacert', pki.caFile, '--tlsv1.2', '--tls-max', '1.2', '--http1.1', `${stack.edgeUrl}/healthz`]);
    assert.equal(r.code, 0, r.err);
    assert.equal(r.out, '200 1.1');
  });

  test('Node http2: TLS 1.3, ALPN h2 negotiated, 200', async () => {
    const r = await https2(stack.edgeUrl, '/healthz', { ca: pki.caFile });
    assert.deepEqual([r.status, r.protocol, r.alpn], [200, 'TLSv1.3', 'h2']);
  });

  test('Node https pinned to TLS 1.2: ALPN http/1.1 negotiated, 200', async () => {
    const r = await https1(`${stack.edgeUrl}/healthz`, { ca: pki.caFile, version: 'TLSv1.2' });
    assert.deepEqual([r.status, r.protocol, r.alpn], [200, 'TLSv1.2', 'http/1.1']);
  });

  test('TLS 1.1 and TLS 1.0 handshakes are refused by the server (protocol_version alert); TLS 1.2 and 1.3 complete', async () => {
    for (const v of ['TLSv1.1', 'TLSv1'] as const) {
      const r = await handshake(port, { ca: pki.caFile, min: v, max: v });
      assert.equal(r.ok, false, `${v} must be refused`);
      assert.match((r as { code: string }).code, /ALERT_PROTOCOL_VERSION/, `${v}: the server's alert, not the client's own refusal`);
    }
    assert.deepEqual(await handshake(port, { ca: pki.caFile, min: 'TLSv1.2', max: 'TLSv1.2' }), { ok: true, protocol: 'TLSv1.2' });
    assert.deepEqual(await handshake(port, { ca: pki.caFile, min: 'TLSv1.3', max: 'TLSv1.3' }), { ok: true, protocol: 'TLSv1.3' });
  });

  test('plaintext HTTP on the TLS port: the connection is closed at once, no HTTP answer, counted as a TLS error', async () => {
    const stat = async (): Promise<number> => {
      const text = await (await fetch(`${stack.envoyAdmin}/stats?filter=^listener\\.edge\\.ssl\\.connection_error$`)).text();
      return Number(/: (\d+)/.exec(text)?.[1] ?? 0);
    };
    const before = await stat();
    const r = await plaintext(port, 'GET /healthz HTTP/1.1\r\nhost: localhost\r\n\r\n');
    assert.equal(r.closed, true, 'closed by Envoy within 5 s');
    assert.doesNotMatch(r.received, /^HTTP\//, 'no HTTP answer on the TLS port');
    assert.equal(await stat(), before + 1);
  });

  test('an order over TLS reaches the backend with x-forwarded-proto: https (a client-sent http is overwritten)', async () => {
    const n = stack.backend.deliveries.length;
    const payload = randomBytes(16);
    const r = await https2(stack.edgeUrl, '/v1/orders', {
      ca: pki.caFile, method: 'POST', body: orderBody(market, payload),
      headers: { 'content-type': 'application/json', 'x-forwarded-proto': 'http' },
    });
    assert.equal(r.status, 200, r.body);
    const d = stack.backend.deliveries[n]!;
    assert.deepEqual(d.body, payload);
    assert.equal(d.headers['x-forwarded-proto'], 'https');
  });
});
