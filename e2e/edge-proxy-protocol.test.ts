/**
 * EDGE_PROXY_PROTOCOL=required behind a real sender: HAProxy from Debian in TCP mode, sending
 * PROXY v2 (`send-proxy-v2`) to the edge's TLS port. Each HAProxy frontend gives its connections a
 * documentation-range source address (`tcp-request connection set-src`), so the PROXY header
 * carries a blocked country's address, or an allowed one, whatever this machine's own is. Proves:
 * the address in the header is the client address for geo (451 / 200), for the rate limit (each
 * its own bucket) and for the backend's x-forwarded-for; a connection without the header is closed
 * before any request is read and logged as none; the probes still answer. Local processes only.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { writeFileSync } from 'node:fs';
import { connect } from 'node:net';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { geoFixtures } from '../testkit/geo-fixtures.ts';
import { freePort } from '../testkit/redis-server.ts';
import { removeTempDir } from '../testkit/temp-dir.ts';
import { startStack, type Stack } from './lib/stack.ts';
import { ingest, KP_IP, orderBody, uniqueId } from './lib/client.ts';
import { edgeTlsPki, https1, type EdgeTlsPki } from './lib/edge-tls.ts';
import { sansPolicy } from './lib/geoblock.ts';

const containers = process.env['E2E_DRIVER'] === 'containers';
/** CH in the generated GeoIP database (e2e/lib/client.ts): allowed. */
const CH_A = '192.0.2.71';
const CH_B = '192.0.2.72';

describe('PROXY protocol from HAProxy (send-proxy-v2) in front of the TLS edge', { skip: containers ? 'HAProxy runs on the host and sends PROXY v2 to Envoy\'s own port; the containers driver puts Docker\'s port proxy in between (the local-process pass runs it on real Envoy)' : false }, () => {
  let pki: EdgeTlsPki;
  let stack: Stack;
  let haproxy: ChildProcess;
  let edgePort: number;
  const fronts: Record<string, number> = {};
  let market: string;

  const stat = async (name: string): Promise<number> => {
    const text = await (await fetch(`${stack.envoyAdmin}/stats?filter=${encodeURIComponent(`^${name.replaceAll('.', '\\.')}$`)}`)).text();
    return Number(/: (\d+)/.exec(text)?.[1] ?? 0);
  };
  /** A request through HAProxy's frontend for `ip` (a new TLS connection each). */
  const via = (ip: string, path: string, o: { method?: string; body?: string; headers?: Record<string, string> } = {}) =>
    https1(`https://localhost:${fronts[ip]}${path}`, { ca: pki.caFile, ...o });

  before(async () => {
    pki = edgeTlsPki();
    stack = await startStack({
      env: {
        EDGE_TLS_CERT_FILE: pki.certFile, EDGE_TLS_KEY_FILE: pki.keyFile, EDGE_PROXY_PROTOCOL: 'required',
        BLOCKED_COUNTRIES: 'KP', RPS_PER_IP: '1', RATE_BURST: '3', INGEST_PORT: String(await freePort()),
      },
      geoipDb: geoFixtures().geoip2,
    });
    edgePort = Number(new URL(stack.edgeUrl).port);
    for (const ip of [KP_IP, CH_A, CH_B]) fronts[ip] = await freePort();
    const cfg = [
      'global', '  maxconn 256',
      'defaults', '  mode tcp', '  timeout connect 5s', '  timeout client 30s', '  timeout server 30s',
      ...Object.entries(fronts).flatMap(([ip, port], i) => [
        `frontend f${i}`, `  bind 127.0.0.1:${port}`, `  tcp-request connection set-src ipv4(${ip})`, '  default_backend edge',
      ]),
      'backend edge', `  server envoy 127.0.0.1:${edgePort} send-proxy-v2`, '',
    ].join('\n');
    writeFileSync(join(pki.dir, 'haproxy.cfg'), cfg);
    haproxy = spawn('haproxy', ['-db', '-f', join(pki.dir, 'haproxy.cfg')], { stdio: ['ignore', 'ignore', 'pipe'] });
    let err = '';
    haproxy.stderr?.on('data', (d: Buffer) => { err += d.toString(); });
    const end = Date.now() + 10_000;
    for (;;) {
      const up = await new Promise<boolean>((resolve) => {
        const s = connect(fronts[CH_A]!, '127.0.0.1', () => { s.destroy(); resolve(true); });
        s.on('error', () => resolve(false));
      });
      if (up) break;
      if (Date.now() > end || haproxy.exitCode !== null) throw new Error(`haproxy did not start: ${err}`);
      await sleep(100);
    }
    market = uniqueId('0xproxy');
    assert.equal((await ingest(stack, market, 1)).status, 200);
  });
  after(async () => {
    if (haproxy !== undefined && haproxy.exitCode === null) {
      haproxy.kill('SIGTERM');
      await new Promise((r) => haproxy.once('exit', r));
    }
    await stack?.stop();
    if (pki !== undefined) removeTempDir(pki.dir);
  });

  test('a blocked country\'s address in the PROXY header → 451 (and /v1/geoblock names it); an allowed one → 200 (this machine\'s own address plays no part)', async () => {
    const blocked = await via(KP_IP, '/healthz');
    assert.equal(blocked.status, 451, blocked.body);
    assert.equal(JSON.parse(blocked.body).error, 'restricted_jurisdiction');
    assert.equal((await via(CH_A, '/healthz')).status, 200);
    assert.ok(await stat('proxy_proto.edge.versions.v2.found') >= 2, 'v2 headers were read');
    // /v1/geoblock tells the blocked client why, naming the address from the PROXY header.
    const geo = await via(KP_IP, '/v1/geoblock');
    assert.equal(geo.status, 200, geo.body);
    assert.deepEqual(sansPolicy(JSON.parse(geo.body)), { blocked: true, access: 'blocked', country: 'KP', region: null, ip: KP_IP });
  });

  test('the rate limit is keyed on the PROXY address: one address\'s bucket empties (429), another\'s is untouched', async () => {
    // RATE_BURST=3, RPS_PER_IP=1: CH_A has used one token above; a few more empty it.
    const statuses: number[] = [];
    for (let i = 0; i < 5; i++) statuses.push((await via(CH_A, '/healthz')).status);
    assert.ok(statuses.includes(429), `CH_A: ${statuses.join(',')}`);
    assert.equal((await via(CH_B, '/healthz')).status, 200, 'CH_B has its own bucket');
  });

  test('an order through HAProxy reaches the backend with the PROXY address as x-forwarded-for and x-edge-client-ip', async () => {
    const n = stack.backend.deliveries.length;
    const r = await via(CH_B, '/v1/orders', { method: 'POST', body: orderBody(market, randomBytes(8)), headers: { 'content-type': 'application/json', 'x-forwarded-for': '6.6.6.6' } });
    assert.equal(r.status, 200, r.body);
    const d = stack.backend.deliveries[n]!;
    assert.equal(d.headers['x-forwarded-for'], CH_B);
    assert.equal(d.headers['x-edge-client-ip'], CH_B);
  });

  test('no PROXY header: the connection is closed before any request is read, and no request is counted or logged', async () => {
    const requestsBefore = await stat('http.edge.downstream_rq_total');
    const notFound = await stat('proxy_proto.edge.not_found_disallowed');
    const logBefore = stack.logs().split('\n').filter((l) => l.startsWith('[envoy] {')).length;
    // A TLS client straight to the edge: its ClientHello is not a PROXY header.
    await assert.rejects(https1(`${stack.edgeUrl}/healthz`, { ca: pki.caFile }));
    // Plain HTTP straight to the edge: closed, no answer.
    const answer = await new Promise<string>((resolve) => {
      let got = '';
      const s = connect(edgePort, '127.0.0.1', () => s.write('GET /healthz HTTP/1.1\r\nhost: localhost\r\n\r\n'));
      s.on('data', (d: Buffer) => { got += d.toString('latin1'); });
      s.on('close', () => resolve(got));
      s.on('error', () => { /* reset: close follows */ });
      setTimeout(() => { s.destroy(); resolve(`still open: ${got}`); }, 5000).unref();
    });
    assert.equal(answer, '', 'closed without a byte');
    assert.equal(await stat('proxy_proto.edge.not_found_disallowed'), notFound + 2);
    assert.equal(await stat('http.edge.downstream_rq_total'), requestsBefore, 'no request reached the HTTP connection manager');
    await sleep(200);
    assert.equal(stack.logs().split('\n').filter((l) => l.startsWith('[envoy] {')).length, logBefore, 'no access-log line');
  });

  test('probes without a PROXY header still answer: Envoy admin /ready (readiness) and a TCP connect to the edge port (liveness)', async () => {
    assert.equal((await (await fetch(`${stack.envoyAdmin}/ready`)).text()).trim(), 'LIVE');
    const accepted = await new Promise<boolean>((resolve) => {
      const s = connect(edgePort, '127.0.0.1', () => { s.destroy(); resolve(true); });
      s.on('error', () => resolve(false));
    });
    assert.equal(accepted, true);
  });
});
