/**
 * The shipped deploy/docker-compose.yml, unmodified, run by the real docker-compose (Debian 1.29)
 * on a Docker engine, driven only through the port Envoy publishes (e2e/lib/compose.ts says how
 * the file is run as it is: own project name, free port and subnet, secrets/PKI/GeoIP generated
 * by deploy/compose-setup.ts into a temp project directory, the image built by compose). The
 * client port speaks TLS with the server certificate compose-setup.ts issued: this process trusts
 * its CA (pki/edge-ca.crt), as `curl --cacert` is told to.
 *
 * The GeoIP database is the test fixture (testkit/fixtures/make-mmdb.py, documentation ranges
 * only): 198.51.100.0/25 is KP, 192.0.2.0/25 and 2001:db8:3::/48 are CH; its "monthly update"
 * swaps KP and CH. Compose is given XFF_NUM_TRUSTED_HOPS=1 and BLOCKED_COUNTRIES=KP (both
 * interpolated by the file), so the client address is the last X-Forwarded-For entry.
 *
 * The tests run in order on one stack; the later ones change it (certificate rotated, Redis
 * restarted, GeoIP swapped, stack stopped, then removed). No engine or no docker-compose: the
 * suite skips with one line saying why.
 */
import { after, before, test, type TestContext } from 'node:test';
import assert from 'node:assert/strict';
import { createHash, createPrivateKey, randomBytes, X509Certificate, type KeyObject } from 'node:crypto';
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { connect as tlsConnect } from 'node:tls';
import { setTimeout as sleep } from 'node:timers/promises';
import { parseHmacKey } from '../authz/src/common/credentials.ts';
import { geoFixtures } from '../testkit/geo-fixtures.ts';
import { COMPOSE_FILES } from '../deploy/compose-setup.ts';
import { composeConfig, type ComposeFile } from '../deploy/test/tools.ts';
import { signedIngest } from '../scripts/edge-client.ts';
import { errorCode, ingest, KP_IP, orderBody, request, trustCa, uniqueId, type Reply } from './lib/client.ts';
import { curl } from './lib/edge-tls.ts';
import { composeProject, composeSkipReason, jsonLogLines, ok, until, type ComposeProject } from './lib/compose.ts';
import { containerSuite } from './lib/images.ts';
import type { Stack } from './lib/stack.ts';
import { DRAIN_QUIET_MS } from '../authz/src/process.ts';

const SKIP = composeSkipReason();

/** What the file is given for the variables it interpolates, besides port, subnet and images. */
const VARS = { XFF_NUM_TRUSTED_HOPS: '1', BLOCKED_COUNTRIES: 'KP' };
/** README defaults; the compose file sets neither (checked in `before`). */
const RATE_BURST = 40;
const RPS_PER_IP = 20;
/** MARKET_CACHE_TTL_MS default: the longest a read can be served from the process's cache. */
const MARKET_CACHE_TTL_MS = 2000;
/** The bound issue 15 sets for a rotated client certificate to reach the backend. */
const ROTATION_BOUND_MS = 5000;

/** The services that keep running (render is a one-shot). */
const LONG_RUNNING = ['redis', 'authz', 'backend', 'envoy'];

/** An allowed (CH) IPv4 client of its own: 192.0.2.<n>, n < 128. */
const chIp = (n: number): string => `192.0.2.${n}`;

const PKCS8_ED25519_PREFIX = Buffer.from('302e020100300506032b657004220420', 'hex');

containerSuite('compose', SKIP, () => {
  let p: ComposeProject;
  let config: ComposeFile;
  /** What e2e/lib/client.ts reads of a stack: the edge URL and the signing keys. */
  let stack: Stack;
  let setupFailed: unknown;
  let downDone = false;
  const unfinished = new Set<string>();
  const timings: string[] = [];

  const clientCertFile = (): string => join(p.dir, COMPOSE_FILES.clientCertDir, 'tls.crt');
  const cn = (pem: Buffer): string => /(?:^|\n)CN=([^\n]+)/.exec(new X509Certificate(pem).subject)?.[1] ?? '';

  /** A test that, when it fails, carries the containers' recent logs in its error. */
  function step(name: string, timeoutMs: number, fn: (t: TestContext) => Promise<void>): void {
    test(`compose – ${name}`, { timeout: timeoutMs }, async (t) => {
      if (setupFailed !== undefined) throw new Error('the stack did not come up (see the before hook)', { cause: setupFailed });
      unfinished.add(name);
      try {
        await fn(t);
        unfinished.delete(name);
      } catch (err) {
        unfinished.delete(name);
        const logs = await p.logTail(40).catch((e: unknown) => `(no logs: ${String(e)})`);
        throw new Error(`${(err as Error).message}\n${logs}`, { cause: err });
      }
    });
  }

  /** The backend's `order` log line for a request id, once it is written (the backend flushes every 500 ms). */
  async function backendOrderLine(requestId: string, timeoutMs = 10_000): Promise<Record<string, unknown>> {
    return until(`the backend's log line for order ${requestId}`, timeoutMs, async () =>
      jsonLogLines(await p.logs('backend')).find((l) => l.service === 'backend' && l.line['msg'] === 'order' && l.line['requestId'] === requestId)?.line, 300);
  }

  async function order(marketId: string, payload: Buffer): Promise<Reply> {
    return request(stack, 'POST', '/v1/orders', { body: orderBody(marketId, payload), headers: { 'content-type': 'application/json' } });
  }

  async function reloadsOk(): Promise<number> {
    const r = ok(await p.exec('authz', ['node', '-e', "fetch('http://127.0.0.1:9464/metrics').then(r=>r.text()).then(t=>process.stdout.write(t),e=>{console.error(e);process.exit(1)})"]));
    const m = /^edge_geoip_reloads_total\{result="ok"\} (\d+)/m.exec(r.stdout);
    assert.match(r.stdout, /^# TYPE edge_geoip_reloads_total counter/m, 'the metrics endpoint answered');
    return m === null ? 0 : Number(m[1]);
  }

  /** Envoy's admin /stats (loopback inside the envoy container, reached the way its health check does). */
  async function envoyStats(filter: string): Promise<Map<string, number>> {
    const req = `GET /stats?filter=${filter} HTTP/1.1\\r\\nHost: localhost\\r\\nConnection: close\\r\\n\\r\\n`;
    const r = ok(await p.exec('envoy', ['bash', '-c', `exec 3<>/dev/tcp/127.0.0.1/9901 && printf '${req}' >&3 && cat <&3`]));
    return new Map([...r.stdout.matchAll(/^([\w.]+): (\d+)$/gm)].map((m) => [m[1] ?? '', Number(m[2])]));
  }

  before(async () => {
    try {
      const t0 = Date.now();
      p = await composeProject({ vars: VARS });
      ok(await p.setup());
      // The client port speaks TLS with the certificate compose-setup.ts issued: trust its CA.
      trustCa(p.edgeCaFile);
      // The fixture database (known KP and CH ranges) in place of the default one, before `up`.
      p.replaceGeoip(readFileSync(geoFixtures().geoip2));
      config = composeConfig({ projectDir: p.dir, envFile: join(p.dir, COMPOSE_FILES.env), env: { ...p.vars } }).file;
      const authzEnv = config.services['authz']?.environment ?? {};
      assert.equal(authzEnv['XFF_NUM_TRUSTED_HOPS'], '1', 'compose passes XFF_NUM_TRUSTED_HOPS through');
      assert.equal(authzEnv['BLOCKED_COUNTRIES'], 'KP', 'compose passes BLOCKED_COUNTRIES through');
      assert.ok(authzEnv['GEO_TRUSTED_CIDRS']?.includes(p.subnet), 'the project subnet is trusted');
      assert.equal(authzEnv['RATE_BURST'] ?? authzEnv['RPS_PER_IP'], undefined, 'rate limit at its defaults');
      const built = ok(await p.build());
      timings.push(`build ${built.ms} ms`);
      const up = ok(await p.up());
      timings.push(`up -d ${up.ms} ms`);
      await until('GET /healthz 200 through Envoy', 120_000, async () => {
        const r = await fetch(`${p.edgeUrl}/healthz`, { headers: { 'x-forwarded-for': chIp(1) }, signal: AbortSignal.timeout(5000) });
        await r.arrayBuffer();
        return r.status === 200 ? true : undefined;
      }, 250);
      // Envoy's own health check first runs 5 s after it started (interval 5s, no start period).
      await until('every long-running service healthy', 120_000, async () => {
        for (const service of LONG_RUNNING) if ((await p.container(service)).health !== 'healthy') return undefined;
        return true;
      }, 500);
      timings.push(`healthy ${Date.now() - t0} ms after the start of setup`);
      const hmacKey = parseHmacKey('ingest_hmac', readFileSync(join(p.dir, COMPOSE_FILES.ingestHmac), 'utf8').replace(/\n$/, ''));
      const seed = Buffer.from(readFileSync(join(p.dir, COMPOSE_FILES.feedPrivateKey), 'utf8').trim(), 'hex');
      const feedPrivateKey: KeyObject = createPrivateKey({ key: Buffer.concat([PKCS8_ED25519_PREFIX, seed]), format: 'der', type: 'pkcs8' });
      stack = { edgeUrl: p.edgeUrl, ingestUrl: p.ingestUrl, hmacKey, feedPrivateKey } as unknown as Stack;
    } catch (err) {
      setupFailed = err;
      if (p !== undefined) process.stderr.write(`${await p.logTail(100).catch(() => '')}\n`);
      throw err;
    }
  }, { timeout: 15 * 60_000 });

  after(async () => {
    if (p === undefined) return;
    try {
      if (unfinished.size > 0) process.stderr.write(`compose tests did not finish: ${[...unfinished].join('; ')}\n${await p.logTail(100)}\n`);
      if (!downDone) {
        const r = await p.down();
        if (r.status !== 0) process.stderr.write(`cleanup: ${r.cmd} failed:\n${r.stderr}\n`);
      }
      const left = await p.resources();
      if (left.containers.length + left.networks.length + left.volumes.length > 0) {
        throw new Error(`project ${p.name} left behind: ${JSON.stringify(left)}`);
      }
    } finally {
      p.removeDir();
    }
  }, { timeout: 3 * 60_000 });

  step('Envoy answers GET /healthz 200 {"status":"ok"} on the published port; every service is healthy', 60_000, async (t) => {
    t.diagnostic(timings.join(', '));
    const r = await request(stack, 'GET', '/healthz');
    assert.equal(r.status, 200, r.text);
    assert.match(r.headers.get('content-type') ?? '', /^application\/json/);
    assert.deepEqual(r.json(), { status: 'ok' });
    // The port is the one compose published for Envoy, nothing else.
    const port = ok(await p.compose(['port', 'envoy', '8080'])).stdout.trim();
    assert.equal(`https://${port}`, p.edgeUrl);
    for (const service of LONG_RUNNING) {
      assert.equal((await p.container(service)).health, 'healthy', `${service} is healthy`);
    }
    const render = await p.container('render');
    assert.deepEqual([render.status, render.exitCode], ['exited', 0], 'the render one-shot completed');
  });

  step('the client port speaks TLS with the certificate compose-setup.ts issued: curl --cacert gets 200 over TLS 1.3 with h2 and over TLS 1.2 with HTTP/1.1; plaintext HTTP gets no answer', 60_000, async () => {
    const h2 = await curl(['--cacert', p.edgeCaFile, '--tlsv1.3', '--http2', '-H', `x-forwarded-for: ${chIp(3)}`, `${p.edgeUrl}/healthz`]);
    assert.deepEqual([h2.code, h2.out], [0, '200 2'], h2.err);
    const h1 = await curl(['--cacert', p.edgeCaFile, '--tlsv1.2', '--tls-max', '1.2', '--http1.1', '-H', `x-forwarded-for: ${chIp(3)}`, `${p.edgeUrl}/healthz`]);
    assert.deepEqual([h1.code, h1.out], [0, '200 1.1'], h1.err);
    // Without the CA the certificate is not trusted (curl's 60): it is the generated one, not a public one.
    assert.equal((await curl([`${p.edgeUrl}/healthz`])).code, 60);
    const plain = await curl([`${p.edgeUrl.replace('https:', 'http:')}/healthz`]);
    assert.notEqual(plain.code, 0, `plaintext HTTP on the TLS port: ${plain.out}`);
    assert.doesNotMatch(plain.out, /^[1-5]\d\d /, 'no HTTP answer');
  });

  step('a signed ingest is stored (200) and read back from /v1/markets and /v1/quotes; a wrong HMAC key is refused 401', 60_000, async () => {
    const id = uniqueId('0xcompose');
    const stored = await ingest(stack, id, 7, { extraField: 'kept' });
    assert.equal(stored.status, 200, stored.text);
    assert.deepEqual(stored.json(), { status: 'stored', conditionId: id, seq: 7 });

    const m = await request(stack, 'GET', `/v1/markets?conditionId=${id}`);
    assert.equal(m.status, 200, m.text);
    const markets = m.json()['markets'] as Record<string, unknown>[];
    assert.equal(markets.length, 1);
    const rec = markets[0] ?? {};
    assert.deepEqual([rec['conditionId'], rec['seq'], rec['extraField']], [id, 7, 'kept']);
    const envelope = rec['envelope'] as { d: string; k: string };
    assert.equal(envelope.k, 'ed25519-sha256');
    assert.equal((JSON.parse(Buffer.from(envelope.d, 'base64').toString('utf8')) as { conditionId: string }).conditionId, id);

    const q = await request(stack, 'GET', `/v1/quotes?conditionId=${id}`);
    assert.equal(q.status, 200, q.text);
    const rows = (q.json()['quotes'] as Record<string, unknown>[]).map((row) => [row['conditionId'], row['tokenId'], row['outcome'], row['bid'], row['ask'], row['seq']]);
    assert.deepEqual(rows, [[id, '1', 'Yes', '0.50', '0.52', 7], [id, '2', 'No', '0.48', '0.50', 7]]);

    // The key the service holds is the one compose-setup wrote: another key is refused.
    const forged = signedIngest(Buffer.from(JSON.stringify({ conditionId: `${id}-x`, seq: 1, question: 'q?', active: true, closed: false, outcomes: [], updatedAt: 1 })), `${id}-x`, randomBytes(32), stack.feedPrivateKey);
    const refused = await request(stack, 'POST', '/internal/ingest/market', { body: forged.body, headers: forged.headers, baseUrl: stack.ingestUrl });
    assert.deepEqual([refused.status, errorCode(refused)], [401, 'unauthorized']);
    // INGEST_PORT: the clients' port has no ingest route (404 before any body is read).
    const onPublic = await request(stack, 'POST', '/internal/ingest/market', { body: forged.body, headers: forged.headers });
    assert.deepEqual([onPublic.status, errorCode(onPublic)], [404, 'not_found']);
  });

  step('an order is delivered byte-exact to the compose backend over mTLS: its 200 answer and its log line carry the SHA-256', 60_000, async () => {
    const market = uniqueId('0xorder');
    assert.equal((await ingest(stack, market, 1)).status, 200);
    // Every byte value, then random bytes: a transcoding or truncation changes the hash.
    const payload = Buffer.concat([Buffer.from(Array.from({ length: 256 }, (_, i) => i)), randomBytes(1000)]);
    const sha256 = createHash('sha256').update(payload).digest('hex');
    const r = await order(market, payload);
    assert.equal(r.status, 200, r.text);
    assert.match(r.headers.get('content-type') ?? '', /^application\/json/);
    const answer = r.json();
    assert.deepEqual([answer['status'], answer['bytes'], answer['sha256']], ['accepted', payload.length, sha256], 'the backend\'s answer');
    const requestId = answer['requestId'];
    assert.ok(typeof requestId === 'string' && requestId.length > 0, 'the backend saw an x-request-id');
    const line = await backendOrderLine(requestId);
    const clientCn = cn(readFileSync(clientCertFile()));
    assert.deepEqual([line['bytes'], line['sha256'], line['clientCert']], [payload.length, sha256, clientCn],
      'docker-compose logs backend: one line with the bytes, the SHA-256 and the subject of the client certificate compose-setup issued');
  });

  step('a blocked country behind one trusted X-Forwarded-For hop is refused 451 restricted_jurisdiction; allowed ones pass', 60_000, async () => {
    const blocked = await request(stack, 'GET', '/v1/markets', { ip: KP_IP });
    assert.deepEqual([blocked.status, errorCode(blocked)], [451, 'restricted_jurisdiction'], blocked.text);
    assert.equal(blocked.headers.get('cache-control'), 'no-store');
    const allowed = await request(stack, 'GET', '/v1/markets', { ip: chIp(2) });
    assert.equal(allowed.status, 200, allowed.text);
    // One trusted hop: the last entry is the client, whatever the client wrote before it.
    const spoofed = await request(stack, 'GET', '/v1/markets', { ip: `${KP_IP}, ${chIp(3)}` });
    assert.equal(spoofed.status, 200, `the last entry (CH) decides: ${spoofed.text}`);
    const hidden = await request(stack, 'GET', '/v1/markets', { ip: `${chIp(4)}, ${KP_IP}` });
    assert.deepEqual([hidden.status, errorCode(hidden)], [451, 'restricted_jurisdiction'], `the last entry (KP) decides: ${hidden.text}`);
  });

  step(`one client address past the burst (RATE_BURST ${RATE_BURST}) is refused 429 "too many requests"; another address is not`, 60_000, async (t) => {
    const ip = chIp(77);
    const n = 100;
    const t0 = Date.now();
    const replies = await Promise.all(Array.from({ length: n }, () => request(stack, 'GET', '/', { ip })));
    const elapsedS = (Date.now() - t0) / 1000;
    const statuses = replies.map((r) => r.status);
    const passed = statuses.filter((s) => s === 200).length;
    const limited = replies.filter((r) => r.status === 429);
    t.diagnostic(`${passed} × 200, ${limited.length} × 429 in ${elapsedS.toFixed(2)} s`);
    assert.deepEqual([...new Set(statuses)].sort(), [200, 429], `only 200 and 429: ${JSON.stringify(statuses)}`);
    assert.ok(passed >= RATE_BURST, `the full burst passed (${passed})`);
    // Margin: the refill over the measured time rounded up to whole seconds, plus one second's refill.
    assert.ok(passed <= RATE_BURST + (RPS_PER_IP * Math.ceil(elapsedS + 1)), `no more than the burst and its refill passed (${passed} in ${elapsedS} s)`);
    for (const r of limited) assert.equal(errorCode(r), 'too many requests');
    const other = await request(stack, 'GET', '/', { ip: chIp(78) });
    assert.equal(other.status, 200, 'another address has its own bucket');
  });

  /*
   * Envoy loads the rotated pair for NEW backend connections (SDS watched_directory); a connection
   * already open keeps the certificate it was opened with until ORDER_BACKEND_MAX_CONN_SECS, which
   * deploy/docker-compose.yml fixes at 300 s (not interpolated: a test cannot shorten it). So each
   * round sends more orders at once than Envoy has backend connections open: the extra ones need
   * new connections. Sequential orders alone would keep arriving on the old connection for up to
   * 300 s.
   */
  step(`a client certificate rotated with compose-setup.ts --rotate-client-cert is presented to the backend within ${ROTATION_BOUND_MS / 1000} s (new connections)`, 90_000, async (t) => {
    const market = uniqueId('0xrotate');
    assert.equal((await ingest(stack, market, 1)).status, 200);
    const warm = await order(market, randomBytes(32));
    assert.equal(warm.status, 200, warm.text);
    const oldCn = cn(readFileSync(clientCertFile()));
    assert.equal((await backendOrderLine(String(warm.json()['requestId'])))['clientCert'], oldCn, 'the backend sees the current certificate before the rotation');
    const SDS_UPDATES = 'cluster.order_backend.client_ssl_socket_factory.ssl_context_update_by_sds';
    const ACTIVE = 'cluster.order_backend.upstream_cx_active';
    const updatesBefore = (await envoyStats('order_backend')).get(SDS_UPDATES);
    assert.ok(updatesBefore !== undefined, `Envoy reports ${SDS_UPDATES}`);

    ok(await p.setup(['--rotate-client-cert']));
    const rotatedAt = Date.now();
    const newCn = cn(readFileSync(clientCertFile()));
    assert.notEqual(newCn, oldCn, 'the rotation published a certificate with another subject');

    const sent: { requestId: string; at: number }[] = [];
    let first: { requestId: string; at: number } | undefined;
    let oldAfter = 0;
    let updatesAfter = updatesBefore;
    const findNew = async (): Promise<void> => {
      const subjects = new Map(jsonLogLines(await p.logs('backend')).filter((l) => l.line['msg'] === 'order').map((l) => [String(l.line['requestId']), l.line['clientCert']]));
      oldAfter = 0;
      for (const s of sent) {
        const subject = subjects.get(s.requestId);
        assert.ok(subject === undefined || subject === oldCn || subject === newCn, `unexpected client certificate ${String(subject)}`);
        if (subject === oldCn) oldAfter += 1;
        if (subject === newCn && first === undefined) first = s;
      }
    };
    while (first === undefined && Date.now() - rotatedAt <= ROTATION_BOUND_MS) {
      const stats = await envoyStats('order_backend');
      updatesAfter = stats.get(SDS_UPDATES) ?? updatesAfter;
      const at = Date.now();
      const round = await Promise.all(Array.from({ length: (stats.get(ACTIVE) ?? 0) + 4 }, () => order(market, randomBytes(32))));
      for (const r of round) {
        assert.equal(r.status, 200, `no order fails during the rotation: ${r.text}`);
        sent.push({ requestId: String(r.json()['requestId']), at });
      }
      await findNew();
    }
    // The backend writes its log every 500 ms: give the last round's lines time to appear.
    for (let i = 0; first === undefined && i < 4; i++) {
      await sleep(500);
      await findNew();
    }
    updatesAfter = (await envoyStats('order_backend')).get(SDS_UPDATES) ?? updatesAfter;
    t.diagnostic(`Envoy ${SDS_UPDATES} ${updatesBefore} → ${updatesAfter}; ${sent.length} orders after the rotation, ${oldAfter} of them still with ${oldCn} (connections opened before it)`);
    assert.ok(first !== undefined, `none of the ${sent.length} orders sent within ${ROTATION_BOUND_MS} ms of the rotation reached the backend with ${newCn}`);
    const ms = first.at - rotatedAt;
    t.diagnostic(`first order presenting the new certificate (${newCn}) sent ${ms} ms after the rotation`);
    // The bound itself, no margin added: Envoy reloads the pair 6–8 ms after the swap
    // (docs/envoy.md); the rest of the 5 s is for the first new backend connection.
    assert.ok(ms <= ROTATION_BOUND_MS, `${ms} ms`);
    assert.ok(updatesAfter > updatesBefore, 'Envoy reloaded the pair through SDS');
  });

  step(`the client port's server certificate rotated with compose-setup.ts --rotate-server-cert is served to new TLS handshakes within ${ROTATION_BOUND_MS / 1000} s, no restart; requests keep succeeding`, 60_000, async (t) => {
    const file = (): string => new X509Certificate(readFileSync(join(p.dir, COMPOSE_FILES.edgeServerDir, 'tls.crt'))).fingerprint256;
    const served = (): Promise<string> => new Promise((resolve, reject) => {
      const sock = tlsConnect({ host: '127.0.0.1', port: Number(new URL(p.edgeUrl).port), ca: readFileSync(p.edgeCaFile), servername: 'localhost' }, () => {
        resolve(sock.getPeerCertificate().fingerprint256);
        sock.destroy();
      });
      sock.on('error', reject);
    });
    const old = file();
    assert.equal(await served(), old, 'the published certificate is the one served');
    ok(await p.setup(['--rotate-server-cert']));
    const rotatedAt = Date.now();
    const next = file();
    assert.notEqual(next, old, 'the rotation published another certificate');
    let seenMs: number | undefined;
    let requests = 0;
    while (seenMs === undefined && Date.now() - rotatedAt <= ROTATION_BOUND_MS) {
      const fp = await served();
      assert.ok(fp === old || fp === next, `an unexpected certificate ${fp}`);
      if (fp === next) seenMs = Date.now() - rotatedAt;
      const r = await request(stack, 'GET', '/healthz', { ip: chIp(9) });
      assert.equal(r.status, 200, `no request fails during the rotation: ${r.text}`);
      requests += 1;
    }
    t.diagnostic(`the new certificate served to a new handshake ${String(seenMs)} ms after the rotation; ${requests} requests meanwhile, all 200`);
    assert.ok(seenMs !== undefined, `no handshake within ${ROTATION_BOUND_MS} ms of the rotation got the new certificate`);
  });

  step('an acknowledged ingest survives docker-compose restart redis (append-only file)', 120_000, async (t) => {
    const id = uniqueId('0xaof');
    const stored = await ingest(stack, id, 11);
    assert.equal(stored.status, 200, stored.text);
    const ingestedAt = Date.now();
    const before = await p.container('redis');
    const restart = ok(await p.compose(['restart', 'redis'], 90_000));
    const healthy = await until('redis healthy again after the restart', 60_000, async () => {
      const c = await p.container('redis');
      return c.startedAt !== before.startedAt && c.health === 'healthy' ? c : undefined;
    }, 300);
    assert.equal(healthy.id, before.id, 'the same container, restarted (same volume)');
    // Straight from Redis: the record is there after the restart.
    const seq = ok(await p.exec('redis', ['redis-cli', 'HGET', `edge:market:${id}`, 'seq'])).stdout.trim();
    assert.equal(seq, '11', 'redis-cli HGET after the restart');
    // With RDB snapshots off (--save ""), the append-only file is the only thing that kept it.
    const persistence = ok(await p.exec('redis', ['redis-cli', 'CONFIG', 'GET', '*'])).stdout.split('\n').map((l) => l.trim());
    const setting = (name: string): string | undefined => persistence[persistence.indexOf(name) + 1];
    assert.deepEqual([setting('appendonly'), setting('appendfsync'), setting('save')], ['yes', 'always', ''], 'redis runs with AOF, fsync always, no snapshots');
    // Through Envoy, once no in-process cache entry from before the restart can answer.
    await sleep(Math.max(0, ingestedAt + MARKET_CACHE_TTL_MS + 500 - Date.now()));
    const read = await until('the ingest read back through Envoy after the restart', 30_000, async () => {
      const m = await request(stack, 'GET', `/v1/markets?conditionId=${id}`);
      return m.status === 200 ? m : undefined;
    }, 250);
    const markets = read.json()['markets'] as Record<string, unknown>[];
    assert.deepEqual(markets.map((r) => [r['conditionId'], r['seq']]), [[id, 11]]);
    const health = await request(stack, 'GET', '/healthz');
    assert.equal(health.status, 200, health.text);
    t.diagnostic(`restart ${restart.ms} ms, healthy ${Date.now() - ingestedAt} ms after the ingest`);
  });

  step('a GeoIP database renamed over the old one on the host is reloaded: KP and CH swap verdicts, edge_geoip_reloads_total{result="ok"} counts it', 60_000, async (t) => {
    const reloadsBefore = await reloadsOk();
    const kpNow = await request(stack, 'GET', '/', { ip: '198.51.100.20' });
    assert.equal(kpNow.status, 451, 'before: 198.51.100.0/25 is KP');
    const chNow = await request(stack, 'GET', '/', { ip: chIp(20) });
    assert.equal(chNow.status, 200, 'before: 192.0.2.0/25 is CH');

    p.replaceGeoip(readFileSync(geoFixtures().geoip2Swapped));
    const swappedAt = Date.now();
    let i = 21;
    const [wasKp, wasCh] = await until('the swapped database to decide', 20_000, async () => {
      i += 1;
      const a = await request(stack, 'GET', '/', { ip: `198.51.100.${i}` });
      const b = await request(stack, 'GET', '/', { ip: chIp(i) });
      return a.status === 200 && b.status === 451 ? [a, b] : undefined;
    }, 200);
    const ms = Date.now() - swappedAt;
    assert.equal(wasKp.status, 200);
    assert.deepEqual([wasCh.status, errorCode(wasCh)], [451, 'restricted_jurisdiction']);
    const reloadsAfter = await reloadsOk();
    t.diagnostic(`new verdicts ${ms} ms after the rename; reloads ok ${reloadsBefore} → ${reloadsAfter}`);
    assert.ok(reloadsAfter >= reloadsBefore + 1, `edge_geoip_reloads_total{result="ok"} ${reloadsBefore} → ${reloadsAfter}`);
  });

  step('docker-compose stop seals the TS service, which exits 0 within its stop grace period; no secret is in any log', 120_000, async (t) => {
    const authz = config.services['authz'];
    const graceMs = Number(/^(\d+)s$/.exec(authz?.stop_grace_period ?? '')?.[1]) * 1000;
    const shutdownGraceMs = Number(authz?.environment?.['SHUTDOWN_GRACE_MS']);
    assert.ok(graceMs > 0 && shutdownGraceMs > 0, `stop_grace_period ${authz?.stop_grace_period}, SHUTDOWN_GRACE_MS ${shutdownGraceMs}`);
    assert.equal((await p.container('authz')).status, 'running');

    const t0 = Date.now();
    const stop = ok(await p.compose(['stop'], 120_000));
    const state = await p.container('authz');
    assert.deepEqual([state.status, state.exitCode, state.oomKilled], ['exited', 0, false], 'authz exited 0 on its own (137 would be the SIGKILL after the grace period)');
    const finishedAt = Date.parse(state.finishedAt);
    const authzLog = jsonLogLines(await p.logs('authz')).map((l) => l.line);
    const seal = authzLog.find((l) => String(l['msg']).startsWith('sealed') && l['reason'] === 'SIGTERM');
    assert.ok(seal !== undefined, 'authz logged its seal on SIGTERM');
    const sealedAt = typeof seal['time'] === 'number' ? seal['time'] : Date.parse(String(seal['time']));
    const stopMs = finishedAt - t0;
    const drainMs = finishedAt - sealedAt;
    t.diagnostic(`docker-compose stop ${stop.ms} ms; authz: sealed ${sealedAt - t0} ms after stop began, exited 0 ${drainMs} ms after the seal (SHUTDOWN_GRACE_MS ${shutdownGraceMs}, stop_grace_period ${graceMs} ms)`);
    assert.ok(stopMs < graceMs, `authz exited ${stopMs} ms after stop began: within stop_grace_period (${graceMs} ms)`);
    // Envoy stopped first, so nothing asks after the seal: the drain ends after DRAIN_QUIET_MS of
    // quiet, never later than SHUTDOWN_GRACE_MS, and is not skipped. Margins: 100 ms under the quiet
    // period (the seal's log time vs the container's exit time, two clocks at ms resolution) and 1 s
    // over SHUTDOWN_GRACE_MS for the process to exit once the drain ends.
    assert.ok(drainMs >= DRAIN_QUIET_MS - 100 && drainMs <= shutdownGraceMs + 1000, `drained ${drainMs} ms after the seal (quiet ${DRAIN_QUIET_MS} ms, SHUTDOWN_GRACE_MS ${shutdownGraceMs})`);

    // No secret in any container's log: the HMAC key (file content, hex, base64), the feed
    // private key, and every private key of the PKI (the client keys, the rotated one included).
    const logs = await p.logs();
    assert.match(logs, /edge authz ready/, 'the logs are there to search');
    assert.match(logs, /"msg":"order"/, 'the backend\'s order lines are among them');
    const hmacText = readFileSync(join(p.dir, COMPOSE_FILES.ingestHmac), 'utf8').trim();
    const hmacBytes = stack.hmacKey;
    const secrets: [string, string][] = [
      ['ingest_hmac file', hmacText],
      ['ingest_hmac hex', hmacText.replace(/^hex:/, '')],
      ['ingest_hmac base64', hmacBytes.toString('base64')],
      ['feed private key', readFileSync(join(p.dir, COMPOSE_FILES.feedPrivateKey), 'utf8').trim()],
    ];
    const pki = join(p.dir, COMPOSE_FILES.pki);
    const keyFiles = readdirSync(pki).filter((f) => f.endsWith('.key'));
    assert.ok(keyFiles.some((f) => f.startsWith('client-') && f !== 'client-ca.key' && f !== 'client-1.key'), `the rotated client key is among ${keyFiles.join(', ')}`);
    for (const f of keyFiles) {
      const body = readFileSync(join(pki, f), 'utf8').split('\n').filter((l) => l !== '' && !l.startsWith('-----'));
      secrets.push([`${f} (PEM body)`, body.join('')]);
      for (const [i, l] of body.entries()) if (l.length >= 16) secrets.push([`${f} line ${i + 1}`, l]);
    }
    const found = secrets.filter(([, s]) => s.length >= 16 && logs.includes(s)).map(([what]) => what);
    assert.deepEqual(found, [], 'secrets found in docker-compose logs');
  });

  step('down -v --remove-orphans removes every container, network and volume of the project', 120_000, async () => {
    const before = await p.resources();
    assert.ok(before.containers.length >= 5 && before.networks.length >= 1 && before.volumes.length >= 2, `the project exists before down: ${JSON.stringify(before)}`);
    ok(await p.down());
    downDone = true;
    assert.deepEqual(await p.resources(), { containers: [], networks: [], volumes: [] });
  });
});
