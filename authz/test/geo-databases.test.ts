/**
 * What GEOIP_DB and ANONYMIZER_DB must be before they serve (issue 26 points 5 and 9; docs/api.md
 * "Which databases are accepted"): the `database_type` of each, boolean anonymizer flags in every
 * record; refused at start
 * (a ConfigError naming the setting and the type) and on reload (the old database kept,
 * onReload(false)). And which country a record gives (`represented_country` judged beside
 * `country`, docs/api.md "Which country a record gives"). Databases from fixtures/make-mmdb.py and
 * fixtures/make-anonymizer-mmdb.py, generated at test time.
 */
import { after, test } from 'node:test';
import assert from 'node:assert/strict';
import { copyFileSync, readFileSync, renameSync } from 'node:fs';
import { join } from 'node:path';
import { Reader } from 'maxmind';
import { AnonymizerDatabase, flagBits } from '../src/common/adapters/anonymizer.ts';
import { GeoDatabase, toGeoRecord } from '../src/common/adapters/geoip.ts';
import { DatabaseRefused } from '../src/common/adapters/mmdb-file.ts';
import { walkRecords, WALK_SLICE_NODES } from '../src/common/adapters/mmdb-records.ts';
import { ConfigError, DEFAULT_GEOIP_DB } from '../src/common/config.ts';
import { JURISDICTION_NONE } from '../src/common/contract.ts';
import { createGeoClassifier, type GeoPolicy } from '../src/authz/stages/geo.ts';
import { anonymizerFixtures } from './anonymizer-fixtures.ts';
import { geoFixtures, scratchDir } from './geo-fixtures.ts';

const geo = geoFixtures();
const anon = anonymizerFixtures();
const opened: { close(): void }[] = [];
const keep = <T extends { close(): void }>(db: T): T => {
  opened.push(db);
  return db;
};
after(() => {
  for (const db of opened) db.close();
});

/** The refusal a constructor throws: a ConfigError (start-up ends as for a bad value), its one line. */
function refusal(open: () => unknown): string {
  try {
    keep(open() as { close(): void });
  } catch (err) {
    assert.ok(err instanceof DatabaseRefused && err instanceof ConfigError, String(err));
    assert.doesNotMatch(err.message, /\n/, 'one line');
    return err.message;
  }
  return assert.fail('accepted');
}

const GEO_EXPECTED = 'a country or city database (database_type of GeoIP2/GeoLite2 Country, City or Enterprise, '
  + 'DB-IP Country or City, or ip-location-db country or city; docs/api.md lists them)';

// ---------------------------------------------------------------------------------------
// GEOIP_DB: country or city layouts
// ---------------------------------------------------------------------------------------
const geoAccepted: Record<string, [path: string]> = {
  'GeoIP2-City (the fixture)': [geo.geoip2],
  'GeoLite2-Country': [geo.country],
  'DBIP-City-Lite': [geo.dbipCity],
  'ip-location-db "country ipvAll"': [geo.iplocation],
  'ip-location-db "country ipv4" (IPv4-only tree)': [geo.iplocationV4],
  'the shipped default (@ip-location-db/geo-whois-asn-country-mmdb, "country ipvAll")': [DEFAULT_GEOIP_DB],
};
for (const [name, [path]] of Object.entries(geoAccepted)) {
  test(`GEOIP_DB – accepts ${name}`, () => {
    keep(new GeoDatabase(path));
  });
}

const geoRefused: Record<string, [path: string, message: string]> = {
  'an Anonymous IP database': [anon.anonymizer, `GEOIP_DB: expected ${GEO_EXPECTED}, got database_type "GeoIP2-Anonymous-IP"`],
  'a City-typed database whose records give no country': [geo.noCountry,
    `GEOIP_DB: expected ${GEO_EXPECTED} whose records give a country, got database_type "GeoIP2-City" with no country in its 2 records`],
};
for (const [name, [path, message]] of Object.entries(geoRefused)) {
  test(`GEOIP_DB – refuses ${name}: one line naming the setting, the database_type and what was expected`, () => {
    assert.equal(refusal(() => new GeoDatabase(path)), message);
  });
}

test('GEOIP_DB – the setting named is the one given (a second database names its own)', () => {
  assert.match(refusal(() => new GeoDatabase(anon.anonymizer, { setting: 'GEOIP_DB_SECONDARY' })), /^GEOIP_DB_SECONDARY: expected a country or city database/);
});

// ---------------------------------------------------------------------------------------
// ANONYMIZER_DB: Anonymous IP or Anonymous Plus, boolean flags in every record
// ---------------------------------------------------------------------------------------
const ANON_TYPE = 'a GeoIP2 Anonymous IP or GeoIP Anonymous Plus database (database_type GeoIP2-Anonymous-IP or GeoIP-Anonymous-Plus)';
const BOOLEANS = 'ANONYMIZER_DB: expected anonymizer flags stored as booleans (true/false), got database_type "GeoIP2-Anonymous-IP" with ';

const anonRefused: Record<string, [path: string, message: string]> = {
  'a City database (the finding: it logged "anonymizer rule on" and flagged nobody)': [geo.geoip2, `ANONYMIZER_DB: expected ${ANON_TYPE}, got database_type "GeoIP2-City"`],
  'a Country database': [geo.country, `ANONYMIZER_DB: expected ${ANON_TYPE}, got database_type "GeoLite2-Country"`],
  'flags written as integers (1 for true)': [anon.anonymizerInt, `${BOOLEANS}is_anonymous = 1 (number) for 192.0.2.64/28`],
  // The walk reads every record: this one is the last in the tree, after the valid ones.
  'one record with integer flags at the far end of the address space': [anon.anonymizerLateInt, `${BOOLEANS}is_anonymous = 1 (number) for 2001:db8:ffff::/48`],
  'a database whose records set no flag': [anon.anonymizerUnflagged,
    'ANONYMIZER_DB: expected a database that flags at least one network, got database_type "GeoIP2-Anonymous-IP" whose 2 records set no flag'],
};
for (const [name, [path, message]] of Object.entries(anonRefused)) {
  test(`ANONYMIZER_DB – refuses ${name}: one line naming the setting, the database_type and what was expected`, () => {
    assert.equal(refusal(() => new AnonymizerDatabase(path)), message);
  });
}

test('ANONYMIZER_DB – accepts GeoIP2 Anonymous IP and GeoIP Anonymous Plus (its own integer and string fields beside boolean flags)', () => {
  const vpn = flagBits(['is_anonymous', 'is_anonymous_vpn']);
  assert.equal(keep(new AnonymizerDatabase(anon.anonymizer)).flags('192.0.2.65'), vpn);
  const plus = keep(new AnonymizerDatabase(anon.anonymizerPlus));
  assert.equal(plus.flags('192.0.2.65'), vpn);
  assert.equal(plus.flags('192.0.2.50'), flagBits(['is_residential_proxy']));
  assert.equal(plus.flags('192.0.2.5'), 0);
});

test('ANONYMIZER_DB reload – a City database or integer flags are refused: the old list keeps answering, onReload(false) says why; a valid one is taken', async () => {
  const dir = scratchDir();
  const path = join(dir, 'anon.mmdb');
  copyFileSync(anon.anonymizer, path);
  const events: [boolean, unknown][] = [];
  const db = keep(new AnonymizerDatabase(path, { onReload: (ok, _p, err) => events.push([ok, err]) }));
  const vpn = flagBits(['is_anonymous', 'is_anonymous_vpn']);
  for (const [bad, why] of [[geo.geoip2, /got database_type "GeoIP2-City"$/], [anon.anonymizerInt, /is_anonymous = 1 \(number\)/]] as const) {
    copyFileSync(bad, join(dir, 'next.mmdb'));
    renameSync(join(dir, 'next.mmdb'), path);
    assert.equal(await db.reload(), false);
    assert.equal(db.flags('192.0.2.65'), vpn, 'the VPN range is still flagged');
    const err = events.at(-1)?.[1];
    assert.ok(err instanceof DatabaseRefused);
    assert.match(err.message, /^ANONYMIZER_DB: expected /);
    assert.match(err.message, why);
  }
  copyFileSync(anon.anonymizerSwapped, join(dir, 'next.mmdb'));
  renameSync(join(dir, 'next.mmdb'), path);
  assert.equal(await db.reload(), true);
  assert.equal(db.flags('192.0.2.65'), 0);
  assert.equal(db.flags('192.0.2.17'), vpn);
  assert.deepEqual(events.map(([ok]) => ok), [false, false, true]);
});

// ---------------------------------------------------------------------------------------
// walkRecords: every distinct record once, in slices
// ---------------------------------------------------------------------------------------
test('walkRecords – every distinct record once, with a network holding it (IPv6 tree with IPv4 inside, and an IPv4 tree)', () => {
  const walk = (path: string): Map<string, string> => {
    const buf = readFileSync(path);
    const seen = new Map<string, string>();
    for (const _ of walkRecords(new Reader(buf), buf, (r) => {
      const key = JSON.stringify(r.data);
      assert.ok(!seen.has(key), `${key} visited twice`);
      seen.set(key, r.network());
      return false;
    })) { /* slices */ }
    return seen;
  };
  // anonymizer.mmdb: 8 networks, 6 distinct records (the IPv6 VPN and Tor records are the IPv4 ones).
  const records = walk(anon.anonymizer);
  assert.equal(records.size, 6);
  assert.equal(records.get(JSON.stringify({ is_anonymous: true, is_anonymous_vpn: true })), '192.0.2.64/28');
  assert.deepEqual([...walk(geo.iplocationV4).values()].sort(), ['192.0.2.0/25', '32.1.13.0/24']);
  assert.ok([...walk(geo.geoip2).values()].includes('2001:db8:10::/48'));
});

test('walkRecords – pauses every WALK_SLICE_NODES nodes (a reload lets requests run), and stops when visit says so', () => {
  const buf = readFileSync(DEFAULT_GEOIP_DB);
  const reader = new Reader(buf);
  let slices = 0;
  let records = 0;
  for (const _ of walkRecords(reader, buf, () => (records++, false))) slices++;
  const nodes = reader.metadata.nodeCount;
  assert.equal(slices, Math.floor(nodes / WALK_SLICE_NODES), `${nodes} nodes`);
  assert.ok(records > 200 && records < 400, `${records} distinct records (one per country)`);
  let visited = 0;
  for (const _ of walkRecords(reader, buf, () => ++visited === 3)) { /* slices */ }
  assert.equal(visited, 3);
});

// ---------------------------------------------------------------------------------------
// Which country a record gives: country, else registered_country; represented_country beside
// ---------------------------------------------------------------------------------------
test('toGeoRecord – represented_country is kept beside country (upper case); absent when the record has none', () => {
  assert.deepEqual({ ...toGeoRecord({ country: { iso_code: 'DE' }, represented_country: { iso_code: 'us' } }) }, { country: 'DE', regions: [], represented: 'US' });
  assert.deepEqual({ ...toGeoRecord({ registered_country: { iso_code: 'CU' }, represented_country: { iso_code: 'US' } }) }, { country: 'CU', regions: [], represented: 'US' });
  assert.ok(!('represented' in toGeoRecord({ country: { iso_code: 'DE' } })));
});

const BASE: GeoPolicy = { blockedCountries: new Set(), blockedRegions: new Set(), geoUnknown: 'block', geoTrustedCidrs: [] };
const BASE_DE_US = '2001:db8:10::1'; // located DE, represented US (a military base)
const BASE_KP_CH = '2001:db8:11::1'; // located KP, represented CH
const NO_ISO = '2001:db8:12::1'; // country without iso_code, registered CH

const represented: Record<string, [ip: string, policy: Partial<GeoPolicy>, verdict: string, country: string | null, jurisdiction: string]> = {
  'the represented country blocked: blocked, named by it': [BASE_DE_US, { blockedCountries: new Set(['US']) }, 'blocked_country', 'US', 'US'],
  'the located country blocked: blocked, named by it': [BASE_DE_US, { blockedCountries: new Set(['DE']) }, 'blocked_country', 'DE', 'DE'],
  'the represented country close-only: close-only under its rule': [BASE_DE_US, { closeOnlyCountries: new Set(['US']) }, 'close_only_country', 'US', 'US'],
  'located blocked, represented close-only: the stricter (blocked) wins': [BASE_DE_US, { blockedCountries: new Set(['DE']), closeOnlyCountries: new Set(['US']) }, 'blocked_country', 'DE', 'DE'],
  'neither has a rule: the location': [BASE_DE_US, {}, 'allowed', 'DE', 'DE'],
  'located in a blocked country, represented an allowed one: blocked': [BASE_KP_CH, { blockedCountries: new Set(['KP']) }, 'blocked_country', 'KP', 'KP'],
  'a country without iso_code is no location (GEO_UNKNOWN=block), though registered_country is allowed': [NO_ISO, {}, 'unknown_blocked', null, JURISDICTION_NONE],
  'a country without iso_code, GEO_UNKNOWN=allow': [NO_ISO, { geoUnknown: 'allow' }, 'unknown_allowed', null, JURISDICTION_NONE],
};
for (const [name, [ip, policy, verdict, country, jurisdiction]] of Object.entries(represented)) {
  test(`geo classifier, represented_country – ${name}`, () => {
    const r = createGeoClassifier({ ...BASE, ...policy }, keep(new GeoDatabase(geo.geoip2)))(ip);
    assert.deepEqual([r.verdict, r.country, r.jurisdiction], [verdict, country, jurisdiction]);
  });
}

test('geo classifier, represented_country – a shadow policy judges it too (shadow blocks US, enforced does not)', () => {
  const classify = createGeoClassifier({ ...BASE, shadow: { ...BASE, blockedCountries: new Set(['US']) } }, keep(new GeoDatabase(geo.geoip2)));
  const r = classify(BASE_DE_US);
  assert.deepEqual([r.verdict, r.country, r.shadow?.verdict, r.shadow?.country], ['allowed', 'DE', 'blocked_country', 'US']);
});
