/**
 * What a decision was made with (issue 31 point 4): every decision log line names the GeoIP
 * database's build time, the policy version (null until a versioned policy exists) and the W3C
 * trace id of a well-formed `traceparent`; a malformed one is not logged at all, and no other part
 * of the header (parent span id, flags) is. Real gRPC (grpc-js client and server).
 */
import { after, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { decisionLine, isoSeconds, traceIdOf } from '../src/authz/decision-log.ts';
import { deny } from '../src/authz/decision.ts';
import type { AuthzInput } from '../src/authz/codec/request.ts';
import { startFixture, type Fixture } from './server-fixture.ts';
import { fakeMarkets } from './helpers.ts';

const TRACE = '4bf92f3577b34da6a3ce929d0e0e4736';
const PARENT = '00f067aa0ba902b7';

describe('traceIdOf: the trace id of a well-formed traceparent only', () => {
  test('version 00: exactly version-traceid-parentid-flags, lower-case hex', () => {
    assert.equal(traceIdOf(`00-${TRACE}-${PARENT}-01`), TRACE);
    assert.equal(traceIdOf(`00-${TRACE}-${PARENT}-00`), TRACE, 'not sampled is still a trace');
  });

  test('a later version may append fields after a dash; version ff is invalid', () => {
    assert.equal(traceIdOf(`01-${TRACE}-${PARENT}-01-what-comes-next`), TRACE);
    assert.equal(traceIdOf(`01-${TRACE}-${PARENT}-01`), TRACE);
    assert.equal(traceIdOf(`ff-${TRACE}-${PARENT}-01`), null);
    assert.equal(traceIdOf(`01-${TRACE}-${PARENT}-01x`), null);
  });

  test('malformed: absent, empty, upper case, wrong lengths, all-zero ids, extra text on version 00, junk', () => {
    for (const bad of [
      undefined, '', `00-${TRACE.toUpperCase()}-${PARENT}-01`, `00-${TRACE.slice(1)}-${PARENT}-01`, `00-${TRACE}-${PARENT.slice(1)}-01`,
      `00-${'0'.repeat(32)}-${PARENT}-01`, `00-${TRACE}-${'0'.repeat(16)}-01`, `00-${TRACE}-${PARENT}-01-extra`, `00-${TRACE}-${PARENT}-1`,
      `0-${TRACE}-${PARENT}-01`, `00_${TRACE}_${PARENT}_01`, `00-${TRACE}-${PARENT}-01\n{"forged":1}`, `"><script>${TRACE}`,
      `01-${TRACE}-${PARENT}-01-${'x'.repeat(600)}`,
    ]) assert.equal(traceIdOf(bad), null, String(bad));
  });
});

describe('the decision line names what it was decided with', () => {
  const input = (over: Partial<AuthzInput> = {}): AuthzInput => ({
    method: 'GET', path: '/v1/markets', clientIp: '81.2.69.160', timestamp: undefined, nonce: undefined, signature: undefined,
    requestId: 'r-1', body: undefined, phase: undefined, route: 'read', ...over,
  });

  test('geoipBuilt from the context, the policy version from the input, traceId from the header; all null without them', () => {
    const line = decisionLine(input({ traceparent: `00-${TRACE}-${PARENT}-01`, policy: 'v7' }), deny('sealed'), 'read', 0, { geoipBuilt: '2026-06-17T08:00:00Z' });
    assert.deepEqual([line.geoipBuilt, line.policy, line.traceId], ['2026-06-17T08:00:00Z', 'v7', TRACE]);
    assert.ok(!JSON.stringify(line).includes(PARENT), 'the parent span id is not logged');
    const bare = decisionLine(input(), deny('sealed'), 'read', 0);
    assert.deepEqual([bare.geoipBuilt, bare.policy, bare.traceId], [null, null, null]);
  });

  test('isoSeconds: Unix seconds as ISO 8601 UTC to the second; nothing usable → null', () => {
    assert.equal(isoSeconds(1781683200), '2026-06-17T08:00:00Z');
    for (const bad of [undefined, 0, -1, Number.NaN, Number.POSITIVE_INFINITY]) assert.equal(isoSeconds(bad), null);
  });
});

describe('over real gRPC', () => {
  // A GeoLookup whose database is "reloaded" by changing its build time, as GeoDatabase's is.
  const geo = { buildEpochSecs: 1781683200, lookup: (ip: string) => (ip.startsWith('198.51.100.') ? { country: 'KP', regions: [] } : { country: 'CH', regions: [] }) };
  let f: Fixture | undefined;
  after(async () => f?.close());
  const lineOf = (id: string): Record<string, unknown> | undefined =>
    f!.logs.map((l) => JSON.parse(l) as Record<string, unknown>).find((l) => l['msg'] === 'decision' && l['requestId'] === id);

  test('a 451 line: the database build time, the settings\' policy version (env-…), the trace id; after a reload the new build time; a malformed traceparent logs null', async () => {
    f = await startFixture({ env: { BLOCKED_COUNTRIES: 'KP' }, geo, markets: fakeMarkets([]), nonces: 'memory' });
    const r = await f.check({ headers: { 'x-edge-client-ip': '198.51.100.1', 'x-request-id': 'tp-1', traceparent: `00-${TRACE}-${PARENT}-01` } });
    assert.equal(r.status, 451);
    const first = lineOf('tp-1');
    assert.deepEqual([first?.['geoipBuilt'], first?.['traceId']], ['2026-06-17T08:00:00Z', TRACE]);
    assert.match(String(first?.['policy']), /^env-[0-9a-f]{12}$/, 'without GEO_POLICY_FILE: the settings\' version');

    geo.buildEpochSecs = 1784361600;
    await f.check({ headers: { 'x-edge-client-ip': '198.51.100.2', 'x-request-id': 'tp-2', traceparent: `00-${TRACE.toUpperCase()}-${PARENT}-01` } });
    const second = lineOf('tp-2');
    assert.deepEqual([second?.['geoipBuilt'], second?.['traceId']], ['2026-07-18T08:00:00Z', null]);
    assert.ok(!f.logs.join('\n').includes(PARENT), 'no part of the header but the trace id is logged');
  });
});
