/**
 * GEOIP_DB_SECONDARY (docs/api.md "Two databases"): each address looked up in both databases, the
 * stricter tier wins (and the shadow policy's stricter tier, independently); a database without a
 * country for the address yields to the other; each disagreement counted by the pair of countries
 * (bounded labels) and logged at debug, never with the address. Real databases: the fixture City
 * database and its "monthly update" (KP and CH swapped), generated at test time.
 */
import { after, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { Writable } from 'node:stream';
import { GeoDatabase } from '../src/common/adapters/geoip.ts';
import { checkDatabases } from '../src/common/adapters/databases.ts';
import { ConfigError, loadConfig } from '../src/common/config.ts';
import { createLogger } from '../src/common/log.ts';
import { createMetrics } from '../src/common/metrics.ts';
import { createGeoClassifier } from '../src/authz/stages/geo.ts';
import { pairLabel, ruledCountries, secondaryGeo } from '../src/authz/geo-secondary.ts';
import { geoFixtures } from '../../testkit/geo-fixtures.ts';

const fx = geoFixtures();
const primary = new GeoDatabase(fx.geoip2);
const secondary = new GeoDatabase(fx.geoip2Swapped);
after(() => { primary.close(); secondary.close(); });

// 198.51.100.1: KP in the primary, CH in the secondary; 192.0.2.10: CH / KP; 198.51.100.200: CU in
// both; 203.0.113.130: CH in the primary, no record in the secondary.
const KP_CH = '198.51.100.1';
const CH_KP = '192.0.2.10';
const CU_CU = '198.51.100.200';
const CH_NONE = '203.0.113.130';

function setup(env: Record<string, string>, level: 'debug' | 'info' = 'info'): { classify: (ip: string) => ReturnType<ReturnType<typeof createGeoClassifier>>; metricsText: () => Promise<string>; lines: string[] } {
  const config = loadConfig({ GEO_TRUSTED_CIDRS: '', ...env });
  const metrics = createMetrics({ geoipBuildEpochSecs: () => 0, defaultMetrics: false });
  const lines: string[] = [];
  const logger = createLogger(level, new Writable({ write: (c: Buffer, _e, cb) => { lines.push(c.toString()); cb(); } }));
  const classify = createGeoClassifier(config, primary, secondaryGeo(config, secondary, metrics, logger));
  return { classify, metricsText: () => metrics.registry.metrics(), lines };
}

function count(text: string, p: string, s: string): number {
  return Number(new RegExp(`edge_geoip_disagreements_total\\{primary="${p}",secondary="${s}"\\} ([0-9]+)`).exec(text)?.[1] ?? 0);
}

describe('two GeoIP databases', () => {
  test('disagreeing on the country: the stricter tier wins whichever database holds it, counted by the pair (a country no rule names is other)', async () => {
    const { classify, metricsText } = setup({ BLOCKED_COUNTRIES: 'KP' });
    assert.deepEqual([classify(KP_CH).access, classify(KP_CH).country], ['blocked', 'KP'], 'the primary is stricter');
    assert.deepEqual([classify(CH_KP).access, classify(CH_KP).country], ['blocked', 'KP'], 'the secondary is stricter');
    assert.equal(classify(CU_CU).access, 'full');
    const text = await metricsText();
    assert.deepEqual([count(text, 'KP', 'other'), count(text, 'other', 'KP')], [2, 2]);
    assert.ok(!/primary="CU"/.test(text), 'agreement is not counted');
  });

  test('a tie keeps the primary\'s answer (its country and jurisdiction)', () => {
    const { classify } = setup({ CLOSE_ONLY_COUNTRIES: 'KP,CH' });
    assert.deepEqual([classify(KP_CH).access, classify(KP_CH).jurisdiction], ['close-only', 'KP']);
    assert.deepEqual([classify(CH_KP).access, classify(CH_KP).jurisdiction], ['close-only', 'CH']);
  });

  test('no country in one database: the other decides (not GEO_UNKNOWN), counted as (CH, none)', async () => {
    const { classify, metricsText } = setup({ GEO_UNKNOWN: 'block' });
    const r = classify(CH_NONE);
    assert.deepEqual([r.access, r.country], ['full', 'CH']);
    assert.equal(count(await metricsText(), 'other', 'none'), 1, 'one request, one count');
    assert.equal(classify('192.0.2.200').verdict, 'unknown_blocked', 'in neither: GEO_UNKNOWN');
  });

  test('the shadow policy takes its own stricter tier: enforced from one database, shadow from the other', () => {
    const { classify } = setup({ BLOCKED_COUNTRIES: 'KP', SHADOW_BLOCKED_COUNTRIES: '', SHADOW_CLOSE_ONLY_COUNTRIES: 'CH' });
    const r = classify(KP_CH);
    assert.deepEqual([r.access, r.country, r.shadow?.access, r.shadow?.country], ['blocked', 'KP', 'close-only', 'CH']);
    assert.equal(classify(KP_CH), r, 'the mixed result is built once and shared');
  });

  test('logged at debug with the pair, tiers and the deciding database, never the address; nothing at info', () => {
    const quiet = setup({ BLOCKED_COUNTRIES: 'KP' });
    quiet.classify(CH_KP);
    assert.deepEqual(quiet.lines, []);
    const loud = setup({ BLOCKED_COUNTRIES: 'KP' }, 'debug');
    loud.classify(CH_KP);
    assert.equal(loud.lines.length, 1);
    const line = JSON.parse(loud.lines[0]!) as Record<string, unknown>;
    assert.deepEqual([line['msg'], line['primary'], line['secondary'], line['primaryTier'], line['secondaryTier'], line['decidedBy']],
      ['GeoIP databases disagree', 'CH', 'KP', 'full', 'blocked', 'secondary']);
    assert.ok(!loud.lines[0]!.includes(CH_KP));
  });

  test('labels: countries of every rule (enforced and shadow, regions\' countries) are themselves, others other, none none', () => {
    const ruled = ruledCountries(loadConfig({ BLOCKED_COUNTRIES: 'KP', CLOSE_ONLY_REGIONS: 'US-MA', SHADOW_CLOSE_ONLY_COUNTRIES: 'PL' }));
    assert.deepEqual([...ruled].sort(), ['KP', 'PL', 'US']);
    assert.deepEqual([pairLabel(ruled, 'US'), pairLabel(ruled, 'FR'), pairLabel(ruled, null)], ['US', 'other', 'none']);
  });

  test('GEOIP_DB_SECONDARY is checked at start like GEOIP_DB, naming itself: a country database with a region rule is refused', () => {
    assert.equal(loadConfig({ GEOIP_DB_SECONDARY: fx.geoip2Swapped }).geoipDbSecondary, fx.geoip2Swapped);
    assert.equal(loadConfig({}).geoipDbSecondary, undefined);
    const base = loadConfig({ GEOIP_DB: fx.geoip2, BLOCKED_REGIONS: 'CA-ON', GEOIP_DB_SECONDARY: fx.country });
    assert.throws(() => checkDatabases(base), (e: unknown) => e instanceof ConfigError && e.variable === 'GEOIP_DB_SECONDARY' && /GeoLite2-Country/.test(e.message));
    assert.throws(() => checkDatabases({ ...base, geoipDbSecondary: fx.corruptGarbage }), (e: unknown) => e instanceof ConfigError && e.variable === 'GEOIP_DB_SECONDARY');
    assert.doesNotThrow(() => checkDatabases({ ...base, geoipDbSecondary: fx.geoip2Swapped }));
  });

  test('without GEOIP_DB_SECONDARY: one lookup, no hook', () => {
    const config = loadConfig({});
    const metrics = createMetrics({ geoipBuildEpochSecs: () => 0, defaultMetrics: false });
    assert.deepEqual(secondaryGeo(config, undefined, metrics, createLogger('silent')), {});
  });
});
