/**
 * The shadow geo policy (issue 18 point 3; docs/operations.md "Changing the geo policy: shadow
 * first"): SHADOW_* settings, the classifier's shadow results (no second lookup), the pipeline's
 * disagreement hook (never enforced), and over a real gRPC socket the metric and the log line.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { GeoDatabase } from '../src/common/adapters/geoip.ts';
import { MemoryNonceStore } from '../src/common/adapters/nonce-store.ts';
import { ConfigError, KNOWN_SETTINGS, loadConfig, SHADOW_SETTINGS } from '../src/common/config.ts';
import { geoDenial } from '../src/authz/decision.ts';
import type { AuthzInput } from '../src/authz/codec/request.ts';
import { evaluate, type PipelineDeps } from '../src/authz/pipeline.ts';
import { SHADOW_MSG } from '../src/authz/shadow.ts';
import { createGeoClassifier, type GeoResult } from '../src/authz/stages/geo.ts';
import { HmacSha256Key } from '../src/common/crypto/hmac.ts';
import type { GeoRecord } from '../src/common/ports.ts';
import { geoFixtures } from '../../testkit/geo-fixtures.ts';
import { fakeMarkets, fixedClock, HMAC_KEY } from './helpers.ts';
import { newFeedKey } from '../../testkit/feed.ts';
import { startFixture, type Fixture } from './server-fixture.ts';

const fx = geoFixtures();

describe('shadow settings', () => {
  test('shadow settings – none given: no shadow policy at all', () => {
    assert.equal(loadConfig({ BLOCKED_COUNTRIES: 'KP' }).shadow, undefined);
  });

  test('shadow settings – each SHADOW_* is read; one left unset keeps the enforced value; an empty one means none', () => {
    const c = loadConfig({ BLOCKED_COUNTRIES: 'KP', BLOCKED_REGIONS: 'UA-43', CLOSE_ONLY_COUNTRIES: 'PL', GEO_UNKNOWN: 'allow', SHADOW_CLOSE_ONLY_COUNTRIES: 'pl,sg', SHADOW_BLOCKED_REGIONS: '' });
    assert.ok(c.shadow !== undefined);
    assert.deepEqual([...c.shadow.closeOnlyCountries], ['PL', 'SG']);
    assert.deepEqual([...c.shadow.blockedRegions], [], 'an empty value: no blocked region in the candidate');
    assert.deepEqual([...c.shadow.blockedCountries], ['KP'], 'unset: as enforced');
    assert.equal(c.shadow.geoUnknown, 'allow', 'unset: as enforced');
    assert.equal(loadConfig({ SHADOW_GEO_UNKNOWN: 'close-only' }).shadow?.geoUnknown, 'close-only');
    // The enforced policy is untouched.
    assert.deepEqual([...c.closeOnlyCountries], ['PL']);
    assert.deepEqual([...c.blockedRegions], ['UA-43']);
  });

  test('shadow settings – bad codes and values are refused naming the SHADOW_ setting; a code in both shadow tiers too', () => {
    for (const [name, value] of [['SHADOW_BLOCKED_COUNTRIES', 'KPX'], ['SHADOW_BLOCKED_REGIONS', 'UA43'], ['SHADOW_CLOSE_ONLY_COUNTRIES', '1'], ['SHADOW_CLOSE_ONLY_REGIONS', 'x-1'], ['SHADOW_GEO_UNKNOWN', 'maybe']]) {
      assert.throws(() => loadConfig({ [name!]: value }), (e: unknown) => e instanceof ConfigError && e.variable === name, `${name}=${value}`);
    }
    // PL blocked by the enforced policy and close-only in the shadow one: the shadow's BLOCKED_COUNTRIES is the enforced one.
    assert.throws(() => loadConfig({ BLOCKED_COUNTRIES: 'PL', SHADOW_CLOSE_ONLY_COUNTRIES: 'PL' }),
      (e: unknown) => e instanceof ConfigError && e.variable === 'SHADOW_CLOSE_ONLY_COUNTRIES' && /PL/.test(e.message));
    assert.doesNotThrow(() => loadConfig({ BLOCKED_COUNTRIES: 'PL', SHADOW_BLOCKED_COUNTRIES: '', SHADOW_CLOSE_ONLY_COUNTRIES: 'PL' }));
  });

  test('shadow settings – all six are known settings (README documents them)', () => {
    for (const name of SHADOW_SETTINGS) assert.ok(KNOWN_SETTINGS.has(name), name);
  });
});

describe('shadow classification', () => {
  const rec: Record<string, GeoRecord> = { '192.0.2.1': { country: 'PL', regions: [] }, '192.0.2.2': { country: 'UA', regions: ['UA-43'] }, '192.0.2.3': { country: 'CH', regions: [] } };
  const counting = () => {
    let lookups = 0;
    return { geo: { lookup: (ip: string) => { lookups++; return rec[ip] ?? null; } }, lookups: () => lookups };
  };
  const ENFORCED = { blockedCountries: new Set(['KP']), blockedRegions: new Set<string>(), closeOnlyCountries: new Set(['UA']), closeOnlyRegions: new Set<string>(), geoUnknown: 'block' as const, geoTrustedCidrs: ['127.0.0.0/8'] };

  test('shadow classification – without a shadow policy no result carries `shadow`', () => {
    const { geo } = counting();
    const classify = createGeoClassifier(ENFORCED, geo);
    for (const ip of ['192.0.2.1', '192.0.2.2', '192.0.2.9', '127.0.0.1', 'junk']) assert.equal(classify(ip).shadow, undefined, ip);
  });

  test('shadow classification – each address gets both outcomes from one lookup; trusted agrees; unknown follows SHADOW_GEO_UNKNOWN', () => {
    const { geo, lookups } = counting();
    const shadow = { blockedCountries: new Set(['KP']), blockedRegions: new Set(['UA-43']), closeOnlyCountries: new Set(['UA', 'PL']), closeOnlyRegions: new Set<string>(), geoUnknown: 'allow' as const };
    const classify = createGeoClassifier({ ...ENFORCED, shadow }, geo);
    const pl = classify('192.0.2.1');
    assert.deepEqual([pl.access, pl.shadow?.access, pl.shadow?.jurisdiction], ['full', 'close-only', 'PL']);
    const ua = classify('192.0.2.2');
    assert.deepEqual([ua.access, ua.jurisdiction, ua.shadow?.access, ua.shadow?.jurisdiction], ['close-only', 'UA', 'blocked', 'UA-43']);
    const ch = classify('192.0.2.3');
    assert.equal(ch.shadow?.access, ch.access);
    assert.equal(lookups(), 3, 'one lookup per request, shadow included');
    assert.equal(classify('192.0.2.1'), pl, 'cached with the record');
    assert.deepEqual([classify('127.0.0.1').access, classify('127.0.0.1').shadow?.access], ['full', 'full']);
    assert.deepEqual([classify('192.0.2.9').access, classify('192.0.2.9').shadow?.access], ['blocked', 'full']);
  });
});

describe('shadow classification of a record without subdivision (GEO_REGION_UNKNOWN)', () => {
  const rec: Record<string, GeoRecord> = { '192.0.2.1': { country: 'US', regions: [] }, '192.0.2.2': { country: 'US', regions: ['US-NV'] } };
  const geo = { lookup: (ip: string) => rec[ip] ?? null };
  const ENFORCED = { blockedCountries: new Set<string>(), blockedRegions: new Set<string>(), closeOnlyCountries: new Set<string>(), closeOnlyRegions: new Set<string>(), geoUnknown: 'block' as const, geoTrustedCidrs: [] };

  test('shadow – a candidate region rule gives its country\'s records without subdivision the strictest tier in the shadow only; SHADOW_GEO_REGION_UNKNOWN=country keeps the country\'s', () => {
    const shadow = { ...ENFORCED, blockedRegions: new Set(['US-NV']) };
    const strict = createGeoClassifier({ ...ENFORCED, shadow }, geo)('192.0.2.1');
    assert.deepEqual([strict.verdict, strict.access, strict.shadow?.verdict, strict.shadow?.access, strict.shadow?.region], ['allowed', 'full', 'unknown_region', 'blocked', null]);
    const lax = createGeoClassifier({ ...ENFORCED, shadow: { ...shadow, geoRegionUnknown: 'country' as const } }, geo)('192.0.2.1');
    assert.deepEqual([lax.shadow?.verdict, lax.shadow?.access], ['unknown_region', 'full']);
  });

  test('shadow settings – SHADOW_GEO_REGION_UNKNOWN is read, defaults to the enforced GEO_REGION_UNKNOWN, a bad value is refused naming it', () => {
    assert.equal(loadConfig({ GEO_REGION_UNKNOWN: 'country', SHADOW_BLOCKED_REGIONS: 'US-NV' }).shadow?.geoRegionUnknown, 'country');
    assert.equal(loadConfig({ SHADOW_GEO_REGION_UNKNOWN: 'Country' }).shadow?.geoRegionUnknown, 'country');
    assert.throws(() => loadConfig({ SHADOW_GEO_REGION_UNKNOWN: 'loose' }), (e: unknown) => e instanceof ConfigError && e.variable === 'SHADOW_GEO_REGION_UNKNOWN');
  });
});

describe('shadow in the pipeline: counted, never enforced', () => {
  const db = new GeoDatabase(fx.geoip2);
  after(() => db.close());
  const NOW = 1763700000;
  const MARKET = { conditionId: '0xmarket-shadow', seq: 1, active: true, closed: false, minSize: undefined, maxSize: undefined };
  const order = Buffer.from(JSON.stringify({ marketId: MARKET.conditionId, deadline: NOW + 60, size: '5', payload: 'AAE=' }));

  function deps(seen: [string, string, string][]): PipelineDeps {
    const clock = fixedClock(NOW);
    return {
      // Enforced: KP blocked, CU close-only. Shadow: CU blocked, CH close-only, KP as enforced.
      classifyGeo: createGeoClassifier({
        blockedCountries: new Set(['KP']), blockedRegions: new Set(), closeOnlyCountries: new Set(['CU']), closeOnlyRegions: new Set(), geoUnknown: 'block', geoTrustedCidrs: [],
        shadow: { blockedCountries: new Set(['KP', 'CU']), blockedRegions: new Set(), closeOnlyCountries: new Set(['CH']), closeOnlyRegions: new Set(), geoUnknown: 'block' },
      }, db),
      geoDenial: geoDenial('blocked', undefined),
      ingest: { hmacKeys: [new HmacSha256Key(HMAC_KEY)], feedKeys: [newFeedKey().publicKey], nonces: new MemoryNonceStore(), clock, replayWindowSecs: 300, nonceTtlSecs: 600 },
      order: { markets: fakeMarkets([MARKET]), clock, orderMaxTtlSecs: 86_400, orderMaxSize: undefined, orderPayloadMaxBytes: 32_768 },
      isSealed: () => false,
      onShadowDisagreement: (input: AuthzInput, e: GeoResult, s: GeoResult) => { seen.push([input.requestId ?? '', e.access, s.access]); },
    };
  }
  const input = (ip: string, over: Partial<AuthzInput> = {}): AuthzInput => ({
    method: 'GET', path: '/v1/markets', clientIp: ip, timestamp: undefined, nonce: undefined, signature: undefined, requestId: 'rid-1', body: undefined, phase: undefined, route: undefined, ...over,
  });

  test('shadow – a disagreement is reported with both tiers; the enforced decision stands (CU close-only order allowed as close-only, CH full)', async () => {
    const seen: [string, string, string][] = [];
    const d = deps(seen);
    const cu = await evaluate(input('198.51.100.200', { method: 'POST', path: '/v1/orders', body: order, route: 'order', requestId: 'rid-cu' }), d);
    assert.equal(cu.allow, true, 'the shadow would block CU; it is not enforced');
    assert.equal(Object.fromEntries(cu.headers)['x-edge-access'], 'close-only');
    const ch = await evaluate(input('192.0.2.10', { requestId: 'rid-ch' }), d);
    assert.equal(ch.allow, true);
    assert.deepEqual(seen, [['rid-cu', 'close-only', 'blocked'], ['rid-ch', 'full', 'close-only']]);
  });

  test('shadow – agreement is not reported; the geoblock route and an ingest\'s header phase are not counted', async () => {
    const seen: [string, string, string][] = [];
    const d = deps(seen);
    assert.equal((await evaluate(input('198.51.100.1'), d)).httpStatus, 451, 'KP: both block');
    await evaluate(input('192.0.2.10', { method: 'GET', path: '/v1/geoblock', route: 'geoblock' }), d);
    await evaluate(input('192.0.2.10', { method: 'POST', path: '/internal/ingest/market', route: 'ingest', phase: 'headers' }), d);
    assert.deepEqual(seen, []);
  });
});

describe('shadow over a real gRPC socket', () => {
  let f: Fixture;
  let db: GeoDatabase;
  before(async () => {
    db = new GeoDatabase(fx.geoip2);
    f = await startFixture({
      env: { BLOCKED_COUNTRIES: 'KP', CLOSE_ONLY_COUNTRIES: 'CU', SHADOW_CLOSE_ONLY_COUNTRIES: 'CU,CH', SHADOW_BLOCKED_REGIONS: 'CA-QC' },
      geo: db, markets: fakeMarkets([]), nonces: 'memory',
    });
  });
  after(async () => {
    await f.close();
    db.close();
  });

  test('gRPC – each disagreement is counted with both tiers as labels and logged at info with its request id; the answer is the enforced one', async () => {
    const ch = await f.check({ headers: { 'x-edge-client-ip': '192.0.2.10', 'x-request-id': 'shadow-ch-1' }, contextExtensions: { route: 'read' } });
    const qc = await f.check({ headers: { 'x-edge-client-ip': '203.0.113.70', 'x-request-id': 'shadow-qc-1' }, contextExtensions: { route: 'read' } });
    await f.check({ headers: { 'x-edge-client-ip': '198.51.100.200', 'x-request-id': 'shadow-cu-agrees' }, contextExtensions: { route: 'read' } });
    assert.deepEqual([ch.status, qc.status], [200, 200], 'never enforced');
    const text = await f.core.metricsText();
    assert.match(text, /edge_geo_shadow_disagreements_total\{enforced="full",shadow="close-only"\} 1\b/);
    assert.match(text, /edge_geo_shadow_disagreements_total\{enforced="full",shadow="blocked"\} 1\b/);
    assert.match(text, /edge_geo_shadow_disagreements_total\{enforced="close-only",shadow="blocked"\} 0\b/);
    const lines = f.logs.flatMap((l) => l.split('\n')).filter((l) => l.includes(SHADOW_MSG)).map((l) => JSON.parse(l) as Record<string, unknown>);
    assert.equal(lines.length, 2, lines.map((l) => JSON.stringify(l)).join('\n'));
    const byId = Object.fromEntries(lines.map((l) => [l['requestId'], l]));
    assert.deepEqual([byId['shadow-ch-1']?.['enforced'], byId['shadow-ch-1']?.['shadow'], byId['shadow-ch-1']?.['level']], ['full', 'close-only', 30]);
    assert.deepEqual([byId['shadow-qc-1']?.['shadow'], byId['shadow-qc-1']?.['shadowVerdict'], byId['shadow-qc-1']?.['region']], ['blocked', 'blocked_region', 'CA-QC']);
  });
});
