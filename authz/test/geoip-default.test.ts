/** The default GeoIP database is announced as development-only when it would serve production. */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { copyFileSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { DEFAULT_GEOIP_DB } from '../src/common/config.ts';
import { defaultGeoipWarning, DEFAULT_GEOIP_PRODUCTION_WARNING, GEOIP_STALE_DAYS, geoipBuildEpochSecs, staleGeoipWarning } from '../src/common/geoip-default.ts';
import { parse } from 'yaml';
import { geoFixtures } from '../../testkit/geo-fixtures.ts';
import { ServiceChild } from './service-child.ts';
import { withTempDir } from '../../testkit/temp-dir.ts';

const ROOT = fileURLToPath(new URL('../../', import.meta.url));

test('default GeoIP – warned only for NODE_ENV=production with the default database', () => {
  assert.equal(defaultGeoipWarning(DEFAULT_GEOIP_DB, { NODE_ENV: 'production' }), DEFAULT_GEOIP_PRODUCTION_WARNING);
  assert.equal(defaultGeoipWarning(DEFAULT_GEOIP_DB, {}), undefined, 'development: no warning');
  assert.equal(defaultGeoipWarning(geoFixtures().geoip2, { NODE_ENV: 'production' }), undefined, 'a database of your own: no warning');
  assert.equal(defaultGeoipWarning('/nonexistent.mmdb', { NODE_ENV: 'production' }), undefined);
  return withTempDir('edge-geoip-copy-', (dir) => {
    copyFileSync(DEFAULT_GEOIP_DB, join(dir, 'country.mmdb'));
    assert.equal(defaultGeoipWarning(join(dir, 'country.mmdb'), { NODE_ENV: 'production' }), DEFAULT_GEOIP_PRODUCTION_WARNING, 'a copy of it (compose-setup) is the default too');
  });
});

test('default GeoIP – the shipped package still describes its npm data as containing errors (re-check the warning when it changes)', () => {
  const readme = execFileSync('cat', [`${ROOT}node_modules/@ip-location-db/geo-whois-asn-country-mmdb/README.md`], { encoding: 'utf8' });
  assert.match(readme, /contains bugs resulting in incorrect data/);
  assert.match(readme, /updates via `npm` are completely deprecated/);
});

test('default GeoIP – the service logs the warning once at start under NODE_ENV=production', async () => {
  const svc = await ServiceChild.start({ NODE_ENV: 'production', GEOIP_DB: '', REDIS_URL: '', LOG_LEVEL: 'warn' });
  try {
    assert.ok(await svc.ready(), svc.out());
    const lines = svc.out().split('\n').filter((l) => l.includes('fit for development and tests only'));
    assert.equal(lines.length, 1, svc.out().slice(-2000));
  } finally {
    svc.kill();
  }
});

const DAY_MS = 86_400_000;
const staleCases: Record<string, { db: () => string; ageDays: number | undefined; says: RegExp | undefined }> = {
  'a database built 10 days ago: nothing': { db: () => geoFixtures().geoip2, ageDays: 10, says: undefined },
  'exactly at the threshold: nothing (the alert needs more)': { db: () => geoFixtures().geoip2, ageDays: GEOIP_STALE_DAYS, says: undefined },
  'one of your own, 46 days old: the alert, replace it': { db: () => geoFixtures().geoip2, ageDays: 46, says: /^the GeoIP database was built on \d{4}-\d{2}-\d{2}, 46 days ago: the EdgeGeoipStale alert \(older than 45 days, deploy\/prometheus\/alerts\.yaml\) fires for it within the hour\. Replace it/ },
  'the default, 162 days old: the alert, and that it is the default one': { db: () => DEFAULT_GEOIP_DB, ageDays: 162, says: /162 days ago: the EdgeGeoipStale alert .* It is the default database, which its publisher no longer updates on npm: expected in development; in production set GEOIP_DB/ },
  'a build time that cannot be read: nothing': { db: () => DEFAULT_GEOIP_DB, ageDays: undefined, says: undefined },
};
for (const [name, tc] of Object.entries(staleCases)) {
  test(`stale GeoIP warning – ${name}`, () => {
    const built = 1_780_000_000;
    const warning = staleGeoipWarning(tc.db(), tc.ageDays === undefined ? undefined : built, built * 1000 + (tc.ageDays ?? 0) * DAY_MS);
    if (tc.says === undefined) assert.equal(warning, undefined);
    else assert.match(warning ?? '', tc.says);
  });
}

test('stale GeoIP warning – the threshold is EdgeGeoipStale\'s in deploy/prometheus/alerts.yaml', () => {
  const alerts = parse(readFileSync(join(ROOT, 'deploy/prometheus/alerts.yaml'), 'utf8')) as { groups: { rules: { alert?: string; expr?: string }[] }[] };
  const rule = alerts.groups.flatMap((g) => g.rules).find((r) => r.alert === 'EdgeGeoipStale');
  assert.equal(rule?.expr, `max(edge_geoip_database_age_seconds) > ${GEOIP_STALE_DAYS} * 86400`);
});

test('stale GeoIP warning – the service says it once at start for the default database, naming its build date', async () => {
  const built = geoipBuildEpochSecs(DEFAULT_GEOIP_DB);
  assert.ok(built !== undefined && Date.now() / 1000 - built > GEOIP_STALE_DAYS * 86_400, 'the packaged database is past the threshold');
  assert.equal(staleGeoipWarning(geoFixtures().geoip2, geoipBuildEpochSecs(geoFixtures().geoip2)), undefined, 'a database generated now is not');
  const svc = await ServiceChild.start({ NODE_ENV: 'development', GEOIP_DB: '', REDIS_URL: '', LOG_LEVEL: 'warn' });
  try {
    assert.ok(await svc.ready(), svc.out());
    const lines = svc.out().split('\n').filter((l) => l.includes('EdgeGeoipStale'));
    assert.equal(lines.length, 1, svc.out().slice(-2000));
    const date = new Date(built * 1000).toISOString().slice(0, 10);
    assert.match(lines[0]!, new RegExp(`"level":40,.*"msg":"the GeoIP database was built on ${date}, \\d+ days ago: the EdgeGeoipStale alert`));
  } finally {
    svc.kill();
  }
});
