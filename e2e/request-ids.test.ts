/**
 * Decision ids end to end (issue 18 point 4): through real Envoy 1.40 and the real
 * TS service, every error body carries `requestId` equal to the `x-request-id` header of the same
 * answer, whoever wrote it (the authz service, an Envoy local reply, the market service); the
 * decision behind a denial is one log line found by that id, holding no secret; Envoy's access
 * log has the same id.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { connect } from 'node:net';
import { setTimeout as sleep } from 'node:timers/promises';
import { geoFixtures } from '../testkit/geo-fixtures.ts';
import { traceAudit } from '../testkit/trace-ledger.ts';
import { startStack, type Stack } from './lib/driver.ts';
import { allowedIp, errorCode, KP_IP, request, signed, type Reply } from './lib/client.ts';
import { isoSeconds } from '../authz/src/authz/decision-log.ts';
import { geoipBuildEpochSecs } from '../authz/src/common/geoip-default.ts';

const ENV = { XFF_NUM_TRUSTED_HOPS: '1', BLOCKED_COUNTRIES: 'KP', RPS_PER_IP: '1', RATE_BURST: '3', ORDER_MAX_BYTES: '4096', ORDER_PAYLOAD_MAX_BYTES: '1024' };
const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/;

let stack: Stack;
before(async () => { stack = await startStack({ env: ENV, geoipDb: geoFixtures().geoip2 }); });
after(async () => stack?.stop());

/** The answer's status and code, after errorCode checked body.requestId === the x-request-id header. */
function idOf(r: Reply, status: number, code: string): string {
  assert.deepEqual([r.status, errorCode(r)], [status, code], r.text);
  const id = r.headers.get('x-request-id') ?? '';
  assert.match(id, UUID);
  assert.equal(r.json()['requestId'], id);
  return id;
}

/** Every JSON line the processes wrote (the `[name] ` prefix the stack adds stripped). */
function jsonLines(): Record<string, unknown>[] {
  const out: Record<string, unknown>[] = [];
  for (const raw of stack.logs().split('\n')) {
    const l = raw.replace(/^\[[a-z]+\] /, '');
    if (!l.startsWith('{')) continue;
    try { out.push(JSON.parse(l) as Record<string, unknown>); } catch { /* a partial line */ }
  }
  return out;
}

/**
 * The JSON lines for `id` that `want` accepts, waiting up to `ms`: the TS service writes its
 * lines at once; Envoy flushes its access log every 10 s (--file-flush-interval-msec).
 */
async function linesFor(id: string, want: (l: Record<string, unknown>) => boolean, ms = 2000): Promise<Record<string, unknown>[]> {
  for (const end = Date.now() + ms; Date.now() < end;) {
    const found = jsonLines().filter((l) => (l['requestId'] === id || l['request_id'] === id) && want(l));
    if (found.length > 0) return found;
    await sleep(20);
  }
  return [];
}

describe('every error body names the x-request-id the client received', () => {
  test('451 restricted_jurisdiction (authz): the id is the only difference between two blocked clients', async () => {
    const a = await request(stack, 'GET', '/v1/markets', { ip: KP_IP });
    const b = await request(stack, 'GET', '/healthz', { ip: '198.51.100.8' });
    const [ida, idb] = [idOf(a, 451, 'restricted_jurisdiction'), idOf(b, 451, 'restricted_jurisdiction')];
    assert.notEqual(ida, idb);
    assert.equal(a.text.replace(ida, idb), b.text, 'byte-identical apart from requestId');
  });

  test('401 unauthorized (authz, a wrong ingest signature)', async () => {
    const s = signed(stack, Buffer.from('{"conditionId":"x"}'), 'x');
    const r = await request(stack, 'POST', '/internal/ingest/market', { body: s.body, headers: { ...s.headers, 'x-edge-signature': `v1=${'0'.repeat(64)}` } });
    idOf(r, 401, 'unauthorized');
  });

  test('429 too many requests (Envoy local reply): otherwise the same body as before', async () => {
    const ip = allowedIp();
    let r: Reply | undefined;
    for (let i = 0; i < 10 && r?.status !== 429; i++) r = await request(stack, 'GET', '/healthz', { ip });
    const id = idOf(r!, 429, 'too many requests');
    assert.equal(r!.text, `{"error":"too many requests","message":"rate limit exceeded for this client address","requestId":"${id}"}\n`);
    assert.equal(r!.headers.get('x-ratelimit-limit'), '3');
  });

  test('404 not_found (Envoy local reply and the market service)', async () => {
    idOf(await request(stack, 'GET', '/internal/nothing-here'), 404, 'not_found');
    idOf(await request(stack, 'GET', '/no/such/path'), 404, 'not_found');
  });

  test('400 bad_request (Envoy: an X-Forwarded-For without a usable trusted entry)', async () => {
    const r = await request(stack, 'GET', '/v1/markets', { headers: { 'x-forwarded-for': 'unknown' } });
    idOf(r, 400, 'bad_request');
  });

  test('413 payload_too_large (Envoy local reply, authz never asked)', async () => {
    const r = await request(stack, 'POST', '/v1/orders', { body: Buffer.alloc(5000, 0x61), headers: { 'content-type': 'application/json' } });
    idOf(r, 413, 'payload_too_large');
  });

  test('400 invalid_query (the market service, behind Envoy)', async () => {
    idOf(await request(stack, 'GET', '/v1/markets?limit=x'), 400, 'invalid_query');
  });

  test('HTTP Envoy refuses before the request has an id: no x-request-id header, requestId null', async () => {
    const raw = await new Promise<string>((resolve) => {
      const u = new URL(stack.edgeUrl);
      const s = connect(Number(u.port), u.hostname, () => s.write('GET /a b c HTTP/1.1\r\nhost: edge\r\n\r\n'));
      let out = '';
      s.on('data', (c) => { out += String(c); });
      s.on('close', () => resolve(out));
      s.setTimeout(5000, () => s.destroy());
    });
    const [head = '', body = ''] = raw.split('\r\n\r\n');
    assert.match(head, /^HTTP\/1\.1 400 /);
    assert.doesNotMatch(head, /x-request-id/i);
    assert.deepEqual(Object.entries(JSON.parse(body) as object), [['error', 'bad_request'], ['message', 'malformed HTTP request'], ['requestId', null]]);
  });
});

describe('the decision behind an id', () => {
  test('a 451 and a refused ingest: one decision line each, found by the id, with route, outcome, code, country, tier, latency; no address, nonce, signature or key', async () => {
    const blocked = await request(stack, 'GET', '/v1/quotes', { ip: '198.51.100.9' });
    const blockedId = idOf(blocked, 451, 'restricted_jurisdiction');
    const s = signed(stack, Buffer.from('{"conditionId":"y"}'), 'y');
    const sig = `v1=${'1'.repeat(64)}`;
    const refused = await request(stack, 'POST', '/internal/ingest/market', { ip: '192.0.2.77', body: s.body, headers: { ...s.headers, 'x-edge-signature': sig } });
    const refusedId = idOf(refused, 401, 'unauthorized');

    const [geoLine, ...moreGeo] = await linesFor(blockedId, (l) => l['msg'] === 'decision');
    assert.equal(moreGeo.length, 0, 'one line per decision');
    assert.deepEqual(
      [geoLine?.['route'], geoLine?.['outcome'], geoLine?.['code'], geoLine?.['status'], geoLine?.['country'], geoLine?.['tier'], geoLine?.['client']],
      ['read', 'deny', 'restricted_jurisdiction', 451, 'KP', 'blocked', 'ipv4'],
    );
    assert.equal(typeof geoLine?.['latencyMs'], 'number');

    // The ingest is decided twice (its header phase, then the body): each phase is its own line.
    const ingestLines = await linesFor(refusedId, (l) => l['msg'] === 'decision');
    assert.ok(ingestLines.length >= 1);
    const last = ingestLines.at(-1)!;
    assert.deepEqual([last['outcome'], last['code'], last['country']], ['deny', 'unauthorized', 'CH']);
    assert.match(String(last['nonceTag']), /^[0-9a-f]{12}$/);
    const text = JSON.stringify([geoLine, ...ingestLines]);
    for (const secret of ['198.51.100.9', '192.0.2.77', s.headers['x-edge-nonce']!.slice(0, 12), sig.slice(3, 20), stack.hmacKey.toString('hex').slice(0, 16)]) {
      assert.ok(!text.includes(secret), `no ${secret.slice(0, 12)} in the decision lines`);
    }

    // Envoy's access log line for the same request: the same id, and the address for whoever may see it.
    const [access] = await linesFor(blockedId, (l) => l['status'] === 451 && 'request_id' in l, 15_000);
    assert.equal(access?.['request_id'], blockedId);
  });

  test('the line names what decided it: the GeoIP database\'s build time, the policy version (the settings\' env-…), the trace id of the client\'s traceparent', async () => {
    const trace = '0af7651916cd43dd8448eb211c80319c';
    // Two blocked (KP) addresses of their own: RPS_PER_IP=1 with a burst of 3 here.
    const traced = await request(stack, 'GET', '/v1/markets', { ip: '198.51.100.21', headers: { traceparent: `00-${trace}-b7ad6b7169203331-01` } });
    const untraced = await request(stack, 'GET', '/v1/markets', { ip: '198.51.100.22', headers: { traceparent: `00-${trace}-b7ad6b7169203331` } });
    const [line] = await linesFor(idOf(traced, 451, 'restricted_jurisdiction'), (l) => l['msg'] === 'decision');
    const [bad] = await linesFor(idOf(untraced, 451, 'restricted_jurisdiction'), (l) => l['msg'] === 'decision');
    const built = isoSeconds(geoipBuildEpochSecs(geoFixtures().geoip2));
    assert.match(String(built), /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$/);
    assert.match(String(line?.['policy']), /^env-[0-9a-f]{12}$/, 'no GEO_POLICY_FILE: the settings\' version');
    if (traceAudit) {
      // Under the trace audit (npm run audit:traces) traces are on: Envoy removes a client's
      // traceparent and starts every trace itself (docs/envoy.md "Traces"), so both lines name
      // Envoy's trace, never the client's (e2e/traces.test.ts proves which one).
      for (const l of [line, bad]) {
        assert.equal(l?.['geoipBuilt'], built);
        assert.match(String(l?.['traceId']), /^[0-9a-f]{32}$/);
        assert.notEqual(l?.['traceId'], trace, 'with traces on a client\'s traceparent is not honoured');
      }
    } else {
      assert.deepEqual([line?.['geoipBuilt'], line?.['traceId']], [built, trace]);
      assert.deepEqual([bad?.['geoipBuilt'], bad?.['traceId']], [built, null], 'a malformed traceparent: no trace id');
    }
    assert.ok(!JSON.stringify([line, bad]).includes('b7ad6b7169203331'), 'the parent span id is not logged');
  });

  test('LOG_DECISIONS=denials (the default): an allowed request gets no decision line', async () => {
    const ok = await request(stack, 'GET', '/healthz');
    assert.equal(ok.status, 200);
    const id = ok.headers.get('x-request-id') ?? '';
    assert.match(id, UUID);
    const [access] = await linesFor(id, (l) => 'request_id' in l, 15_000);
    assert.ok(access !== undefined, 'the access log has it');
    assert.equal(jsonLines().filter((l) => l['msg'] === 'decision' && l['requestId'] === id).length, 0);
  });
});
