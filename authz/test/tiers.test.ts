/**
 * Jurisdiction tiers (docs/api.md "Jurisdiction tiers"): block / close-only / full per
 * country and per region, a region rule overriding its country's in both directions; trusted and
 * unknown addresses; the settings; the order allow's x-edge-access / x-edge-jurisdiction (on the
 * wire, over a real gRPC socket); the geoblock route (pipeline and market service).
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { Writable } from 'node:stream';
import fc from 'fast-check';
import { Registry } from 'prom-client';
import { GeoDatabase } from '../src/common/adapters/geoip.ts';
import { MemoryNonceStore } from '../src/common/adapters/nonce-store.ts';
import { ConfigError, configWarnings, loadConfig } from '../src/common/config.ts';
import { JURISDICTION_NONE } from '../src/common/contract.ts';
import { classify } from '../src/common/routes.ts';
import { geoDenial } from '../src/authz/decision.ts';
import { evaluate, type PipelineDeps } from '../src/authz/pipeline.ts';
import { createGeoClassifier, type GeoPolicy } from '../src/authz/stages/geo.ts';
import { createMarketService, type MarketService } from '../src/market/http.ts';
import { MemoryMarketStore } from '../src/market/store.ts';
import { createLogger } from '../src/common/log.ts';
import { createMetrics, GEO_VERDICTS } from '../src/common/metrics.ts';
import type { GeoLookup, GeoRecord } from '../src/common/ports.ts';
import { geoFixtures } from '../../testkit/geo-fixtures.ts';
import { fakeMarkets, fixedClock, HMAC_KEY } from './helpers.ts';
import { newFeedKey } from '../../testkit/feed.ts';
import { HmacSha256Key } from '../src/common/crypto/hmac.ts';
import { startFixture, type Fixture } from './server-fixture.ts';

const fx = geoFixtures();
const NONE = new Set<string>();

/** The tier settings of the e2e suite too (e2e/tiers.test.ts): see the fixture's networks. */
const POLICY: GeoPolicy = {
  blockedCountries: new Set(['KP']),
  blockedRegions: new Set(['UA-43', 'CA-ON']),
  closeOnlyCountries: new Set(['CU', 'UA', 'IR']),
  closeOnlyRegions: new Set(['CA-QC']),
  geoUnknown: 'block',
  geoTrustedCidrs: ['127.0.0.0/8', '::1/128'],
};

type Expect = [verdict: string, access: string, jurisdiction: string, country: string | null, region: string | null];

const cases: Record<string, [ip: string, expect: Expect, policy?: Partial<GeoPolicy>]> = {
  'a close-only country (no subdivisions) is close-only, jurisdiction its country': ['198.51.100.200', ['close_only_country', 'close-only', 'CU', 'CU', null]],
  'a close-only region inside a full country is close-only, jurisdiction the region': ['203.0.113.70', ['close_only_region', 'close-only', 'CA-QC', 'CA', 'CA-QC']],
  'a blocked region inside a close-only country is blocked (region overrides country)': ['2001:db8:5::1', ['blocked_region', 'blocked', 'UA-43', 'UA', 'UA-43']],
  'another region of that close-only country is close-only, jurisdiction the country': ['2001:db8:6::1', ['close_only_country', 'close-only', 'UA', 'UA', 'UA-32']],
  'a blocked country is blocked': ['198.51.100.1', ['blocked_country', 'blocked', 'KP', 'KP', null]],
  'a blocked region of a full country is blocked': ['203.0.113.10', ['blocked_region', 'blocked', 'CA-ON', 'CA', 'CA-ON']],
  'a full country is full, jurisdiction its country': ['192.0.2.10', ['allowed', 'full', 'CH', 'CH', null]],
  'close-only via registered_country (no country in the record)': ['203.0.113.200', ['close_only_country', 'close-only', 'IR', 'IR', null]],
  'two subdivisions, one blocked: blocked wins over the country': ['2001:db8:2::1', ['blocked_region', 'blocked', 'CA-ON', 'CA', 'CA-ON']],
  'a close-only region inside a blocked country is close-only (region overrides country)': [
    '2001:db8:6::1', ['close_only_region', 'close-only', 'UA-32', 'UA', 'UA-32'],
    { blockedCountries: new Set(['UA']), closeOnlyCountries: NONE, closeOnlyRegions: new Set(['UA-32']), blockedRegions: NONE },
  ],
  'trusted address: full, no jurisdiction (ZZ), not looked up (its record is KP)': ['127.0.0.1', ['trusted', 'full', JURISDICTION_NONE, null, null]],
  'unknown address, GEO_UNKNOWN=block: blocked': ['192.0.2.200', ['unknown_blocked', 'blocked', JURISDICTION_NONE, null, null]],
  'unknown address, GEO_UNKNOWN=allow: full, ZZ': ['192.0.2.200', ['unknown_allowed', 'full', JURISDICTION_NONE, null, null], { geoUnknown: 'allow' }],
  'unknown address, GEO_UNKNOWN=close-only: close-only, ZZ': ['192.0.2.130', ['unknown_close_only', 'close-only', JURISDICTION_NONE, null, null], { geoUnknown: 'close-only' }],
  // GEO_REGION_UNKNOWN (issue: a US record without subdivision must not slip past US-NV).
  'a record without subdivision in a country with a blocked region (strictest, the default): blocked, region null': [
    '198.18.1.7', ['unknown_region', 'blocked', 'US', 'US', null], { blockedRegions: new Set(['US-NV']) },
  ],
  'the same with GEO_REGION_UNKNOWN=country: the country\'s tier (full), still counted as unknown_region': [
    '198.18.1.7', ['unknown_region', 'full', 'US', 'US', null], { blockedRegions: new Set(['US-NV']), geoRegionUnknown: 'country' },
  ],
  'strictest of a close-only region and a full country: close-only': [
    '198.18.1.7', ['unknown_region', 'close-only', 'US', 'US', null], { blockedRegions: NONE, closeOnlyRegions: new Set(['US-MA']) },
  ],
  'strictest of a blocked and a close-only region: blocked': [
    '198.18.1.7', ['unknown_region', 'blocked', 'US', 'US', null], { blockedRegions: new Set(['US-NV']), closeOnlyRegions: new Set(['US-MA']) },
  ],
  'a blocked country stays blocked under GEO_REGION_UNKNOWN=country': [
    '198.18.1.7', ['unknown_region', 'blocked', 'US', 'US', null], { blockedCountries: new Set(['US']), closeOnlyRegions: new Set(['US-MA']), geoRegionUnknown: 'country' },
  ],
  'a close-only country with a close-only region, strictest: close-only (never looser than the country)': [
    '198.18.1.7', ['unknown_region', 'close-only', 'US', 'US', null], { closeOnlyCountries: new Set(['US']), blockedRegions: NONE, closeOnlyRegions: new Set(['US-MA']) },
  ],
  'a US record with a subdivision no rule names: the country\'s tier (full)': [
    '198.18.2.7', ['allowed', 'full', 'US', 'US', 'US-CA'], { blockedRegions: new Set(['US-NV']) },
  ],
  'the blocked region itself: blocked_region': ['198.18.0.7', ['blocked_region', 'blocked', 'US-NV', 'US', 'US-NV'], { blockedRegions: new Set(['US-NV']) }],
  'a country without region rules is unaffected by another country\'s': ['198.51.100.200', ['close_only_country', 'close-only', 'CU', 'CU', null], { blockedRegions: new Set(['US-NV']) }],
  'a represented country with a region rule gives its own tier, not the unknown-region one (a base abroad is in none of its regions)': [
    '2001:db8:10::1', ['allowed', 'full', 'DE', 'DE', null], { blockedRegions: new Set(['US-NV']) },
  ],
  'no tier settings at all: a region is full under its country': ['203.0.113.70', ['allowed', 'full', 'CA', 'CA', 'CA-QC'], { blockedCountries: NONE, blockedRegions: NONE, closeOnlyCountries: NONE, closeOnlyRegions: NONE }],
};

describe('tier resolution on the fixture database', () => {
  const db = new GeoDatabase(fx.geoip2);
  after(() => db.close());
  for (const [name, [ip, [verdict, access, jurisdiction, country, region], over]] of Object.entries(cases)) {
    test(`tiers – ${name}`, () => {
      const r = createGeoClassifier({ ...POLICY, ...over }, db)(ip);
      assert.deepEqual([r.verdict, r.access, r.jurisdiction, r.country, r.region], [verdict, access, jurisdiction, country, region]);
      const headers = Object.fromEntries(r.orderHeaders);
      if (access === 'blocked') assert.deepEqual(r.orderHeaders, [], 'a blocked result has no order headers');
      else assert.deepEqual(headers, { 'x-edge-access': access, 'x-edge-jurisdiction': jurisdiction });
    });
  }

  test('tiers – the same result object (and header array) comes back for every address of a record: nothing built per request', () => {
    const classify = createGeoClassifier(POLICY, db);
    const a = classify('198.51.100.130');
    const b = classify('198.51.100.250');
    assert.equal(a, b);
    assert.ok(Object.isFrozen(a));
    // Two classifiers, one jurisdiction: one shared header array.
    assert.equal(createGeoClassifier(POLICY, db)('198.51.100.131').orderHeaders, a.orderHeaders);
  });

  test('tiers – a database code that is no ISO code never reaches a header: such a country is unknown, such a subdivision ignored', () => {
    const weird: Record<string, GeoRecord> = {
      '192.0.2.1': { country: 'C\r\nX', regions: [] },
      '192.0.2.2': { country: 'CA', regions: ['CA-Q\nC', 'CA-QC'] },
      '192.0.2.3': { country: 'CA', regions: ['CA-ON\u0000'] },
    };
    const classify = createGeoClassifier({ ...POLICY, geoUnknown: 'allow' }, { lookup: (ip) => weird[ip] ?? null });
    assert.deepEqual([classify('192.0.2.1').verdict, classify('192.0.2.1').jurisdiction, classify('192.0.2.1').country], ['unknown_allowed', JURISDICTION_NONE, null]);
    assert.deepEqual([classify('192.0.2.2').access, classify('192.0.2.2').jurisdiction], ['close-only', 'CA-QC']);
    // Its only subdivision ignored, the record names none: CA has a region rule (CA-ON blocked), so
    // GEO_REGION_UNKNOWN (strictest) gives it the blocked tier, not CA's full one.
    assert.deepEqual([classify('192.0.2.3').access, classify('192.0.2.3').jurisdiction, classify('192.0.2.3').region, classify('192.0.2.3').verdict], ['blocked', 'CA', null, 'unknown_region']);
  });

  test('tiers – every verdict is one of the exported metric labels (bounded cardinality)', () => {
    for (const [ip, , over] of Object.values(cases)) {
      assert.ok(GEO_VERDICTS.includes(createGeoClassifier({ ...POLICY, ...over }, db)(ip).verdict));
    }
  });
});

// ---------------------------------------------------------------------------------------
// Property: the classifier agrees with the rule as written, for any policy and any record
// ---------------------------------------------------------------------------------------

/** The rule of docs/api.md, written the obvious way: the most specific rule wins, block before close-only. */
function oracle(p: GeoPolicy, rec: GeoRecord | null): { access: string; jurisdiction: string } {
  if (rec === null || rec.country === undefined) {
    return { access: p.geoUnknown === 'allow' ? 'full' : p.geoUnknown === 'close-only' ? 'close-only' : 'blocked', jurisdiction: JURISDICTION_NONE };
  }
  const rank = { full: 0, 'close-only': 1, blocked: 2 } as const;
  const own = p.blockedCountries.has(rec.country) ? 'blocked' : p.closeOnlyCountries?.has(rec.country) === true ? 'close-only' : 'full';
  if (rec.regions.length === 0) {
    // GEO_REGION_UNKNOWN: a country with any region rule, a record without subdivision.
    const ruled = (set: ReadonlySet<string> | undefined): boolean => [...(set ?? [])].some((r) => r.startsWith(`${rec.country}-`));
    const regionTier = ruled(p.blockedRegions) ? 'blocked' : ruled(p.closeOnlyRegions) ? 'close-only' : undefined;
    if (regionTier !== undefined && (p.geoRegionUnknown ?? 'strictest') === 'strictest' && rank[regionTier] > rank[own]) return { access: regionTier, jurisdiction: rec.country };
    return { access: own, jurisdiction: rec.country };
  }
  const blockedRegion = rec.regions.find((r) => p.blockedRegions.has(r));
  if (blockedRegion !== undefined) return { access: 'blocked', jurisdiction: blockedRegion };
  const closeRegion = rec.regions.find((r) => p.closeOnlyRegions?.has(r) === true);
  if (closeRegion !== undefined) return { access: 'close-only', jurisdiction: closeRegion };
  if (p.blockedCountries.has(rec.country)) return { access: 'blocked', jurisdiction: rec.country };
  if (p.closeOnlyCountries?.has(rec.country) === true) return { access: 'close-only', jurisdiction: rec.country };
  return { access: 'full', jurisdiction: rec.country };
}

test('property – tiers (2000 policies × records): the classifier equals the written rule; access, verdict and headers agree', () => {
  const cc = fc.constantFrom('AA', 'BB', 'CC');
  const region = fc.tuple(cc, fc.constantFrom('1', '2', '3')).map(([c, r]) => `${c}-${r}`);
  const policy = fc.record({
    blockedCountries: fc.uniqueArray(cc), closeOnlyCountries: fc.uniqueArray(cc),
    blockedRegions: fc.uniqueArray(region, { maxLength: 3 }), closeOnlyRegions: fc.uniqueArray(region, { maxLength: 3 }),
    geoUnknown: fc.constantFrom('block' as const, 'close-only' as const, 'allow' as const),
    geoRegionUnknown: fc.constantFrom('strictest' as const, 'country' as const),
  }).map((p) => ({
    // A code has one tier (loadConfig refuses both): close-only keeps what block does not list.
    blockedCountries: new Set(p.blockedCountries), blockedRegions: new Set(p.blockedRegions),
    closeOnlyCountries: new Set(p.closeOnlyCountries.filter((c) => !p.blockedCountries.includes(c))),
    closeOnlyRegions: new Set(p.closeOnlyRegions.filter((r) => !p.blockedRegions.includes(r))),
    geoUnknown: p.geoUnknown, geoRegionUnknown: p.geoRegionUnknown, geoTrustedCidrs: [],
  }));
  const record = fc.option(fc.tuple(fc.option(cc, { nil: undefined }), fc.uniqueArray(fc.constantFrom('1', '2', '3'), { maxLength: 2 }))
    .map(([country, subs]): GeoRecord => ({ country, regions: country === undefined ? [] : subs.map((s) => `${country}-${s}`) })), { nil: null });
  const seen = new Set<string>();
  fc.assert(fc.property(policy, record, (p, rec) => {
    const r = createGeoClassifier(p, { lookup: () => rec })('192.0.2.1');
    const want = oracle(p, rec);
    assert.deepEqual({ access: r.access, jurisdiction: r.jurisdiction }, want);
    seen.add(r.verdict);
    if (r.verdict === 'unknown_region') {
      assert.ok(rec !== null && rec.country !== undefined && rec.regions.length === 0 && r.region === null && r.jurisdiction === rec.country);
    } else {
      assert.equal(r.verdict.startsWith('blocked') || r.verdict === 'unknown_blocked', r.access === 'blocked');
      assert.equal(r.verdict.startsWith('close_only') || r.verdict === 'unknown_close_only', r.access === 'close-only');
      assert.equal(r.verdict.endsWith('_region'), rec !== null && rec.regions.includes(r.jurisdiction));
    }
    if (r.access !== 'blocked') assert.deepEqual(Object.fromEntries(r.orderHeaders), { 'x-edge-access': r.access, 'x-edge-jurisdiction': r.jurisdiction });
    assert.equal(r.country, rec?.country ?? null);
  }), { numRuns: 2000 });
  for (const v of GEO_VERDICTS.filter((x) => x !== 'trusted')) assert.ok(seen.has(v), `verdict ${v} exercised`);
});

// ---------------------------------------------------------------------------------------
// Settings
// ---------------------------------------------------------------------------------------

describe('tier settings', () => {
  test('settings – CLOSE_ONLY_COUNTRIES / CLOSE_ONLY_REGIONS are read upper-cased; empty by default', () => {
    const c = loadConfig({ CLOSE_ONLY_COUNTRIES: 'pl, sg', CLOSE_ONLY_REGIONS: 'ca-qc' });
    assert.deepEqual([...c.closeOnlyCountries], ['PL', 'SG']);
    assert.deepEqual([...c.closeOnlyRegions], ['CA-QC']);
    assert.equal(loadConfig({}).closeOnlyCountries.size, 0);
    assert.equal(loadConfig({}).closeOnlyRegions.size, 0);
  });

  test('settings – malformed codes are refused naming the setting, as for BLOCKED_*', () => {
    for (const [name, value] of [['CLOSE_ONLY_COUNTRIES', 'POL'], ['CLOSE_ONLY_COUNTRIES', 'P1'], ['CLOSE_ONLY_REGIONS', 'CAQC'], ['CLOSE_ONLY_REGIONS', 'CA-ABCD']]) {
      assert.throws(() => loadConfig({ [name!]: value }), (e: unknown) => e instanceof ConfigError && e.variable === name, `${name}=${value}`);
    }
  });

  test('settings – a country or region in both BLOCKED and CLOSE_ONLY is a config error naming both settings and the code', () => {
    assert.throws(() => loadConfig({ BLOCKED_COUNTRIES: 'KP,PL', CLOSE_ONLY_COUNTRIES: 'pl' }),
      (e: unknown) => e instanceof ConfigError && e.variable === 'CLOSE_ONLY_COUNTRIES' && /BLOCKED_COUNTRIES/.test(e.message) && /PL/.test(e.message));
    assert.throws(() => loadConfig({ BLOCKED_REGIONS: 'UA-43', CLOSE_ONLY_REGIONS: 'UA-43' }),
      (e: unknown) => e instanceof ConfigError && e.variable === 'CLOSE_ONLY_REGIONS' && /BLOCKED_REGIONS/.test(e.message) && /UA-43/.test(e.message));
    // A region may have another tier than its country: that is what a region rule is for.
    assert.doesNotThrow(() => loadConfig({ CLOSE_ONLY_COUNTRIES: 'UA', BLOCKED_REGIONS: 'UA-43' }));
  });

  test('settings – GEO_UNKNOWN takes block, close-only and allow; anything else is refused', () => {
    assert.equal(loadConfig({ GEO_UNKNOWN: 'Close-Only' }).geoUnknown, 'close-only');
    assert.equal(loadConfig({}).geoUnknown, 'block');
    assert.throws(() => loadConfig({ GEO_UNKNOWN: 'closeonly' }), (e: unknown) => e instanceof ConfigError && e.variable === 'GEO_UNKNOWN');
  });

  test('settings – a close-only region inside a blocked country is warned about at start-up; a blocked region inside a close-only one is not', () => {
    const w = configWarnings(loadConfig({ BLOCKED_COUNTRIES: 'UA', CLOSE_ONLY_REGIONS: 'UA-32' }));
    assert.equal(w.filter((x) => x.includes('UA-32')).length, 1, w.join('\n'));
    assert.equal(configWarnings(loadConfig({ CLOSE_ONLY_COUNTRIES: 'UA', BLOCKED_REGIONS: 'UA-43' })).filter((x) => x.includes('UA-43')).length, 0);
  });
});

// ---------------------------------------------------------------------------------------
// Pipeline: the order allow carries the tier; the geoblock route skips geo
// ---------------------------------------------------------------------------------------

const NOW = 1763700000;
const MARKET = { conditionId: '0xmarket-tiers', seq: 1, active: true, closed: false, minSize: undefined, maxSize: undefined };
const orderBody = (): Buffer => Buffer.from(JSON.stringify({ marketId: MARKET.conditionId, deadline: NOW + 60, size: '5', payload: 'AAE=' }));

function deps(geo: GeoLookup): PipelineDeps {
  const clock = fixedClock(NOW);
  return {
    classifyGeo: createGeoClassifier(POLICY, geo),
    geoDenial: geoDenial('blocked here', undefined),
    ingest: { hmacKeys: [new HmacSha256Key(HMAC_KEY)], feedKeys: [newFeedKey().publicKey], nonces: new MemoryNonceStore(), clock, replayWindowSecs: 300, nonceTtlSecs: 600 },
    order: { markets: fakeMarkets([MARKET]), clock, orderMaxTtlSecs: 86_400, orderMaxSize: undefined, orderPayloadMaxBytes: 32_768 },
    isSealed: () => false,
  };
}
const input = (clientIp: string, method: string, path: string, route?: 'geoblock' | 'read' | 'order', body?: Buffer) => ({
  method, path, clientIp, timestamp: undefined, nonce: undefined, signature: undefined, requestId: undefined, body, phase: undefined, route,
});

describe('pipeline', () => {
  const db = new GeoDatabase(fx.geoip2);
  after(() => db.close());

  test('pipeline – an order from each non-blocked tier is allowed with its x-edge-access and x-edge-jurisdiction', async () => {
    const d = deps(db);
    for (const [ip, access, jurisdiction] of [['198.51.100.200', 'close-only', 'CU'], ['203.0.113.70', 'close-only', 'CA-QC'], ['192.0.2.10', 'full', 'CH'], ['127.0.0.1', 'full', 'ZZ']]) {
      const r = await evaluate(input(ip!, 'POST', '/v1/orders', 'order', orderBody()), d);
      assert.equal(r.allow, true, ip);
      const h = Object.fromEntries(r.headers);
      assert.deepEqual([h['x-edge-access'], h['x-edge-jurisdiction'], h['x-edge-market-id']], [access, jurisdiction, MARKET.conditionId], ip);
    }
  });

  test('pipeline – a close-only client reads (allowed, nothing added); a blocked region in a close-only country is 451 on reads and orders', async () => {
    const d = deps(db);
    const read = await evaluate(input('2001:db8:6::1', 'GET', '/v1/markets'), d);
    assert.equal(read.allow, true);
    assert.deepEqual(read.headers, []);
    for (const [m, p, body] of [['GET', '/v1/markets', undefined], ['POST', '/v1/orders', orderBody()]] as const) {
      assert.equal((await evaluate(input('2001:db8:5::1', m, p, undefined, body), d)).httpStatus, 451, `${m} ${p}`);
    }
  });

  test('pipeline – GET/HEAD /v1/geoblock is allowed for a blocked client; another method or a forged route kind on another path is geo-checked', async () => {
    const d = deps(db);
    for (const m of ['GET', 'HEAD']) {
      assert.equal(classify(m, '/v1/geoblock'), 'geoblock');
      assert.equal((await evaluate(input('198.51.100.1', m, '/v1/geoblock', 'geoblock'), d)).allow, true, `${m} via Envoy's route`);
      assert.equal((await evaluate(input('198.51.100.1', m, '/v1/geoblock'), d)).allow, true, `${m} hand-made Check`);
    }
    assert.equal(classify('POST', '/v1/geoblock'), 'read');
    assert.equal((await evaluate(input('198.51.100.1', 'POST', '/v1/geoblock'), d)).httpStatus, 451);
    // Even if a route claimed `geoblock` for another request, geo still applies.
    assert.equal((await evaluate(input('198.51.100.1', 'GET', '/v1/markets', 'geoblock'), d)).httpStatus, 451);
    assert.equal((await evaluate(input('198.51.100.1', 'POST', '/v1/geoblock', 'geoblock'), d)).httpStatus, 451);
  });
});

// ---------------------------------------------------------------------------------------
// Over a real gRPC socket: the allow Envoy receives
// ---------------------------------------------------------------------------------------

describe('authz gRPC server with tiers', () => {
  let f: Fixture;
  let db: GeoDatabase;
  before(async () => {
    db = new GeoDatabase(fx.geoip2);
    f = await startFixture({
      env: { BLOCKED_COUNTRIES: 'KP', BLOCKED_REGIONS: 'UA-43', CLOSE_ONLY_COUNTRIES: 'CU,UA', CLOSE_ONLY_REGIONS: 'CA-QC' },
      geo: db, markets: fakeMarkets([MARKET]), nonces: 'memory', clock: fixedClock(NOW),
    });
  });
  after(async () => {
    await f.close();
    db.close();
  });

  const headersOf = (raw: unknown): Record<string, [string, unknown]> => {
    const list = ((raw as { ok_response?: { headers?: { header: { key: string; value: string }; append_action?: unknown }[] } }).ok_response?.headers) ?? [];
    // HeaderValueOption.HeaderAppendAction 2 = OVERWRITE_IF_EXISTS_OR_ADD (a name or its number, as decoded).
    return Object.fromEntries(list.map((h) => [h.header.key, [h.header.value, h.append_action === 2 ? 'OVERWRITE_IF_EXISTS_OR_ADD' : h.append_action]]));
  };

  test('gRPC – an order allow carries x-edge-access and x-edge-jurisdiction set to OVERWRITE_IF_EXISTS_OR_ADD, whatever the client sent', async () => {
    const forged = { 'x-edge-access': 'full', 'x-edge-jurisdiction': 'CH' };
    for (const [ip, access, jurisdiction] of [['198.51.100.200', 'close-only', 'CU'], ['203.0.113.70', 'close-only', 'CA-QC'], ['2001:db8:6::1', 'close-only', 'UA'], ['192.0.2.10', 'full', 'CH']]) {
      const r = await f.check({ method: 'POST', path: '/v1/orders', headers: { 'x-edge-client-ip': ip!, ...forged }, body: orderBody(), contextExtensions: { route: 'order' } });
      assert.equal(r.status, 200, ip);
      const h = headersOf(r.raw);
      // Overwrite: Envoy replaces the client's copy.
      assert.deepEqual(h['x-edge-access'], [access, 'OVERWRITE_IF_EXISTS_OR_ADD'], ip);
      assert.deepEqual(h['x-edge-jurisdiction'], [jurisdiction, 'OVERWRITE_IF_EXISTS_OR_ADD'], ip);
    }
  });

  test('gRPC – a blocked region in a close-only country is denied 451; a read by a close-only client is allowed with no headers', async () => {
    const blocked = await f.check({ method: 'POST', path: '/v1/orders', headers: { 'x-edge-client-ip': '2001:db8:5::1' }, body: orderBody(), contextExtensions: { route: 'order' } });
    assert.deepEqual([blocked.status, blocked.error], [451, 'restricted_jurisdiction']);
    const read = await f.check({ headers: { 'x-edge-client-ip': '198.51.100.200' }, contextExtensions: { route: 'read' } });
    assert.equal(read.status, 200);
    assert.deepEqual(headersOf(read.raw), {});
  });

  test('gRPC – the geoblock route is allowed for a blocked client; the geo verdict metric counts close-only clients', async () => {
    const r = await f.check({ path: '/v1/geoblock', headers: { 'x-edge-client-ip': '198.51.100.1' }, contextExtensions: { route: 'geoblock' } });
    assert.equal(r.status, 200);
    await f.check({ headers: { 'x-edge-client-ip': '203.0.113.70' }, contextExtensions: { route: 'read' } });
    const text = await f.core.metricsText();
    assert.match(text, /edge_geo_verdicts_total\{verdict="close_only_region"\} [1-9]/);
    assert.match(text, /edge_geo_verdicts_total\{verdict="close_only_country"\} [1-9]/);
  });
});

// ---------------------------------------------------------------------------------------
// The market service's answer to GET /v1/geoblock
// ---------------------------------------------------------------------------------------

describe('GET /v1/geoblock (market service)', () => {
  let svc: MarketService;
  let base: string;
  let db: GeoDatabase;
  before(async () => {
    db = new GeoDatabase(fx.geoip2);
    const logger = createLogger('silent', new Writable({ write(_c, _e, cb) { cb(); } }));
    svc = createMarketService({
      store: new MemoryMarketStore(), feedKeys: [], ingestMaxBytes: 1024, logger, registry: createMetrics({ geoipBuildEpochSecs: () => 0, defaultMetrics: false }).registry,
      readiness: () => ({}), isSealed: () => false, geoblock: createGeoClassifier(POLICY, db), host: '127.0.0.1', port: 0,
    });
    base = `http://127.0.0.1:${await svc.listen()}`;
  });
  after(async () => {
    await svc.close();
    db.close();
  });

  const ask = async (ip: string, init: RequestInit = {}, path = '/v1/geoblock'): Promise<[number, Headers, string]> => {
    const res = await fetch(`${base}${path}`, { ...init, headers: { 'x-edge-client-ip': ip, ...(init.headers as Record<string, string> | undefined) } });
    return [res.status, res.headers, await res.text()];
  };

  const answers: Record<string, [ip: string, body: Record<string, unknown>]> = {
    'a blocked country': ['198.51.100.1', { blocked: true, access: 'blocked', country: 'KP', region: null, ip: '198.51.100.1' }],
    'a blocked region of a close-only country': ['2001:db8:5::1', { blocked: true, access: 'blocked', country: 'UA', region: 'UA-43', ip: '2001:db8:5::1' }],
    'a close-only country': ['198.51.100.200', { blocked: false, access: 'close-only', country: 'CU', region: null, ip: '198.51.100.200' }],
    'a close-only region': ['203.0.113.70', { blocked: false, access: 'close-only', country: 'CA', region: 'CA-QC', ip: '203.0.113.70' }],
    'a full country': ['192.0.2.10', { blocked: false, access: 'full', country: 'CH', region: null, ip: '192.0.2.10' }],
    'an unknown address (GEO_UNKNOWN=block)': ['192.0.2.200', { blocked: true, access: 'blocked', country: null, region: null, ip: '192.0.2.200' }],
    'a trusted address': ['127.0.0.1', { blocked: false, access: 'full', country: null, region: null, ip: '127.0.0.1' }],
    'an IPv4-mapped address, answered as its IPv4': ['::ffff:198.51.100.200', { blocked: false, access: 'close-only', country: 'CU', region: null, ip: '198.51.100.200' }],
  };
  for (const [name, [ip, body]] of Object.entries(answers)) {
    test(`geoblock – ${name}: 200 with the tier, no-store`, async () => {
      const [status, headers, text] = await ask(ip);
      assert.equal(status, 200, text);
      assert.deepEqual(JSON.parse(text), body);
      assert.equal(headers.get('cache-control'), 'no-store');
      assert.equal(headers.get('content-type'), 'application/json');
    });
  }

  test('geoblock – HEAD 200 without a body; POST 405 allow GET, HEAD; a query parameter 400 invalid_query', async () => {
    const [headStatus, , headBody] = await ask('192.0.2.10', { method: 'HEAD' });
    assert.deepEqual([headStatus, headBody], [200, '']);
    const [postStatus, postHeaders, postBody] = await ask('192.0.2.10', { method: 'POST' });
    assert.deepEqual([postStatus, postHeaders.get('allow'), (JSON.parse(postBody) as { error: string }).error], [405, 'GET, HEAD', 'method_not_allowed']);
    const [qStatus, , qBody] = await ask('192.0.2.10', {}, '/v1/geoblock?ip=1.2.3.4');
    assert.deepEqual([qStatus, (JSON.parse(qBody) as { error: string }).error], [400, 'invalid_query']);
  });

  test('geoblock – without the header (a direct request), the TCP peer is classified', async () => {
    const res = await fetch(`${base}/v1/geoblock`);
    assert.deepEqual(await res.json(), { blocked: false, access: 'full', country: null, region: null, ip: '127.0.0.1' });
  });

  test('geoblock – a market service built without a classifier answers 404 there', async () => {
    const logger = createLogger('silent', new Writable({ write(_c, _e, cb) { cb(); } }));
    const bare = createMarketService({
      store: new MemoryMarketStore(), feedKeys: [], ingestMaxBytes: 1024, logger, registry: new Registry(),
      readiness: () => ({}), isSealed: () => false, host: '127.0.0.1', port: 0,
    });
    const port = await bare.listen();
    try {
      assert.equal((await fetch(`http://127.0.0.1:${port}/v1/geoblock`)).status, 404);
    } finally {
      await bare.close();
    }
  });
});
