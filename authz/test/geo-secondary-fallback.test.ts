/**
 * GEOIP_DB_SECONDARY when the PRIMARY database has no record for an address and the secondary
 * has one (docs/api.md "Two databases": a database without a country for the address yields to
 * the other). geo-secondary.test.ts proves the other direction (the secondary without a record);
 * this one is the branch no test ran: the secondary's country must decide, in the enforced and in
 * the shadow policy, never GEO_UNKNOWN's tier. Real databases: the fixture City database and its
 * "monthly update", generated at test time, here with the update as the primary.
 *
 *   scripts/node --test authz/test/geo-secondary-fallback.test.ts
 */
import { after, test } from 'node:test';
import assert from 'node:assert/strict';
import { GeoDatabase } from '../src/common/adapters/geoip.ts';
import { loadConfig } from '../src/common/config.ts';
import { createLogger } from '../src/common/log.ts';
import { createMetrics } from '../src/common/metrics.ts';
import { createGeoClassifier } from '../src/authz/stages/geo.ts';
import { secondaryGeo } from '../src/authz/geo-secondary.ts';
import { geoFixtures } from '../../testkit/geo-fixtures.ts';

const fx = geoFixtures();
// The update has no record for 203.0.113.130, the original database says CH (geo-secondary.test.ts).
const primary = new GeoDatabase(fx.geoip2Swapped);
const secondary = new GeoDatabase(fx.geoip2);
after(() => { primary.close(); secondary.close(); });
const NONE_CH = '203.0.113.130';

function classifier(env: Record<string, string>, withSecondary = true): ReturnType<typeof createGeoClassifier> {
  const config = loadConfig({ GEO_TRUSTED_CIDRS: '', ...env });
  const metrics = createMetrics({ geoipBuildEpochSecs: () => 0, defaultMetrics: false });
  return createGeoClassifier(config, primary, withSecondary ? secondaryGeo(config, secondary, metrics, createLogger('silent')) : {});
}

test('two GeoIP databases – the primary without a record, the secondary with a blocked country: blocked by that country, not allowed as unknown', () => {
  const env = { BLOCKED_COUNTRIES: 'CH', GEO_UNKNOWN: 'allow' };
  // The primary alone: no record, so GEO_UNKNOWN decides (the premise of this test).
  assert.deepEqual([classifier(env, false)(NONE_CH).access, classifier(env, false)(NONE_CH).country], ['full', null]);
  const r = classifier(env)(NONE_CH);
  assert.deepEqual([r.access, r.country, r.jurisdiction], ['blocked', 'CH', 'CH']);
});

test('two GeoIP databases – the primary without a record, the secondary with an allowed country: full by that country, not blocked as unknown', () => {
  const r = classifier({ GEO_UNKNOWN: 'block' })(NONE_CH);
  assert.deepEqual([r.access, r.country], ['full', 'CH']);
  assert.notEqual(r.verdict, 'unknown_blocked');
});

test('two GeoIP databases – the primary without a record: the shadow policy also judges by the secondary\'s country', () => {
  const r = classifier({ GEO_UNKNOWN: 'allow', SHADOW_CLOSE_ONLY_COUNTRIES: 'CH' })(NONE_CH);
  assert.deepEqual([r.access, r.shadow?.access, r.shadow?.country], ['full', 'close-only', 'CH']);
});
