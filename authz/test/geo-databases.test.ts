/**
 * What GEOIP_DB and ANONYMIZER_DB must be before they serve (issue 26 points 5 and 9, issue 30
 * point 1; docs/api.md "Which databases are accepted"): the `database_type` of each, boolean
 * anonymizer flags in every record, subdivisions when a region rule is in force; refused at start
 * (a ConfigError naming the setting and the type) and on reload (the old database kept,
 * onReload(false)). And which country a record gives (`represented_country` judged beside
 * `country`, docs/api.md "Which country a record gives"). Databases from testkit/fixtures/make-mmdb.py and
 * testkit/fixtures/make-anonymizer-mmdb.py, generated at test time.
 */
import { after, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { fileURLToPath } from 'node:url';
import { setTimeout as sleep } from 'node:timers/promises';
import { copyFileSync, readFileSync, renameSync } from 'node:fs';
import { join } from 'node:path';
import { Reader } from 'maxmind';
import { AnonymizerDatabase, flagBits } from '../src/common/adapters/anonymizer.ts';
import { GeoDatabase, regionRuleOf, toGeoRecord } from '../src/common/adapters/geoip.ts';
import { DatabaseRefused } from '../src/common/adapters/mmdb-file.ts';
import { walkRecords, WALK_SLICE_NODES } from '../src/common/adapters/mmdb-records.ts';
import { ConfigError, DEFAULT_GEOIP_DB, loadConfig } from '../src/common/config.ts';
import { JURISDICTION_NONE } from '../src/common/contract.ts';
import { createGeoClassifier, type GeoPolicy } from '../src/authz/stages/geo.ts';
import { checkDatabases } from '../src/common/adapters/databases.ts';
import { anonymizerFixtures } from '../../testkit/anonymizer-fixtures.ts';
import { geoFixtures, scratchDir } from '../../testkit/geo-fixtures.ts';
import { newFeedKey } from '../../testkit/feed.ts';
import { freePort } from '../../testkit/redis-server.ts';

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
const REGIONS_EXPECTED = 'GEOIP_DB: expected a database with ISO 3166-2 subdivisions for BLOCKED_REGIONS=CA-ON (a City or Enterprise database), got ';

// ---------------------------------------------------------------------------------------
// GEOIP_DB: country or city layouts; with a region rule, subdivisions
// ---------------------------------------------------------------------------------------
const geoAccepted: Record<string, [path: string, regionRule?: string]> = {
  'GeoIP2-City (the fixture)': [geo.geoip2],
  'GeoIP2-City with a region rule': [geo.geoip2, 'BLOCKED_REGIONS=CA-ON'],
  'GeoLite2-Country': [geo.country],
  'DBIP-City-Lite (no region rule)': [geo.dbipCity],
  'ip-location-db "country ipvAll"': [geo.iplocation],
  'ip-location-db "country ipv4" (IPv4-only tree)': [geo.iplocationV4],
  'the shipped default (@ip-location-db/geo-whois-asn-country-mmdb, "country ipvAll")': [DEFAULT_GEOIP_DB],
};
for (const [name, [path, regionRule]] of Object.entries(geoAccepted)) {
  test(`GEOIP_DB – accepts ${name}`, () => {
    keep(new GeoDatabase(path, { regionRule }));
  });
}

const geoRefused: Record<string, [path: string, regionRule: string | undefined, message: string]> = {
  'an Anonymous IP database': [anon.anonymizer, undefined, `GEOIP_DB: expected ${GEO_EXPECTED}, got database_type "GeoIP2-Anonymous-IP"`],
  'a City-typed database whose records give no country': [geo.noCountry, undefined,
    `GEOIP_DB: expected ${GEO_EXPECTED} whose records give a country, got database_type "GeoIP2-City" with no country in its 2 records`],
  'a GeoLite2 Country database under a region rule': [geo.country, 'BLOCKED_REGIONS=CA-ON',
    `${REGIONS_EXPECTED}database_type "GeoLite2-Country", a country layout without subdivisions`],
  'an ip-location-db country database under a region rule': [geo.iplocation, 'BLOCKED_REGIONS=CA-ON',
    `${REGIONS_EXPECTED}database_type "country ipvAll", a country layout without subdivisions`],
  'a DB-IP City database whose subdivisions have no iso_code, under a region rule': [geo.dbipCity, 'BLOCKED_REGIONS=CA-ON',
    `${REGIONS_EXPECTED}database_type "DBIP-City-Lite" with no subdivisions[].iso_code in its 2 records`],
};
for (const [name, [path, regionRule, message]] of Object.entries(geoRefused)) {
  test(`GEOIP_DB – refuses ${name}: one line naming the setting, the database_type and what was expected`, () => {
    assert.equal(refusal(() => new GeoDatabase(path, { regionRule })), message);
  });
}

test('GEOIP_DB – the setting named is the one given (a second database names its own)', () => {
  assert.match(refusal(() => new GeoDatabase(anon.anonymizer, { setting: 'GEOIP_DB_SECONDARY' })), /^GEOIP_DB_SECONDARY: expected a country or city database/);
});

test('regionRuleOf – the first region rule in force, enforced before shadow; none without one', () => {
  const rule = (env: Record<string, string>): string | undefined => regionRuleOf(loadConfig(env));
  assert.equal(rule({}), undefined);
  assert.equal(rule({ BLOCKED_COUNTRIES: 'KP', CLOSE_ONLY_COUNTRIES: 'CA' }), undefined);
  assert.equal(rule({ BLOCKED_REGIONS: 'ca-on,UA-43' }), 'BLOCKED_REGIONS=CA-ON,UA-43');
  assert.equal(rule({ CLOSE_ONLY_REGIONS: 'CA-QC' }), 'CLOSE_ONLY_REGIONS=CA-QC');
  assert.equal(rule({ SHADOW_BLOCKED_REGIONS: 'UA-43' }), 'SHADOW_BLOCKED_REGIONS=UA-43');
  assert.equal(rule({ SHADOW_CLOSE_ONLY_REGIONS: 'CA-ON' }), 'SHADOW_CLOSE_ONLY_REGIONS=CA-ON');
  assert.equal(rule({ SHADOW_BLOCKED_COUNTRIES: 'KP' }), undefined, 'a shadow policy without regions');
});

const DEFAULT_WITH_REGIONS = `${REGIONS_EXPECTED}database_type "country ipvAll", a country layout without subdivisions`;

test('checkDatabases (npm start) – the databases a configuration names, checked as the service checks them: the region rule comes from the settings', () => {
  const refused = (env: Record<string, string>): string => {
    try {
      checkDatabases(loadConfig(env));
    } catch (err) {
      assert.ok(err instanceof ConfigError, String(err));
      return err.message;
    }
    return 'accepted';
  };
  assert.equal(refused({}), 'accepted');
  assert.equal(refused({ BLOCKED_REGIONS: 'CA-ON' }), DEFAULT_WITH_REGIONS);
  assert.match(refused({ SHADOW_CLOSE_ONLY_REGIONS: 'CA-QC', GEOIP_DB: geo.country }), /for SHADOW_CLOSE_ONLY_REGIONS=CA-QC .*got database_type "GeoLite2-Country"/);
  assert.equal(refused({ BLOCKED_REGIONS: 'CA-ON', GEOIP_DB: geo.geoip2, ANONYMIZER_DB: anon.anonymizer }), 'accepted');
  assert.match(refused({ GEOIP_DB: geo.geoip2, ANONYMIZER_DB: geo.geoip2 }), /^ANONYMIZER_DB: expected .*, got database_type "GeoIP2-City"$/);
  assert.match(refused({ GEOIP_DB: join(geo.dir, 'missing.mmdb') }), /^GEOIP_DB: expected a readable MaxMind DB \(\.mmdb\) file, got ".*missing\.mmdb: ENOENT/);
});

test('the service (main.ts) with a region rule and the packaged country database: exit 1, one fatal line naming the database type and the rule', async () => {
  const root = fileURLToPath(new URL('../../', import.meta.url));
  const env: Record<string, string> = {
    ...process.env as Record<string, string>, BLOCKED_REGIONS: 'CA-ON', LOG_LEVEL: 'warn',
    EDGE_INGEST_HMAC: `hex:${randomBytes(32).toString('hex')}`, EDGE_FEED_ED25519_PUBLIC_KEY: newFeedKey().publicHex,
    AUTHZ_GRPC_PORT: String(await freePort()), MARKET_PORT: String(await freePort()), AUTHZ_ADMIN_PORT: String(await freePort()),
  };
  for (const k of ['GEOIP_DB', 'REDIS_URL', 'NODE_TEST_CONTEXT']) delete env[k];
  const child = spawn(join(root, 'scripts/node'), [join(root, 'authz/src/main.ts')], { env, stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '';
  child.stdout.on('data', (d: Buffer) => { out += d.toString(); });
  child.stderr.on('data', (d: Buffer) => { out += d.toString(); });
  const code = await Promise.race([
    new Promise<number | null>((resolve) => child.once('exit', resolve)),
    sleep(20_000).then(() => { child.kill('SIGKILL'); return -1; }),
  ]);
  assert.equal(code, 1, out);
  const fatal = out.split('\n').filter((l) => l.includes('"start-up failed"')).map((l) => (JSON.parse(l) as { err: string }).err);
  assert.deepEqual(fatal, [DEFAULT_WITH_REGIONS]);
});

test('GEOIP_DB reload – with a region rule, a replacement without subdivisions is refused: the old database keeps answering, onReload(false) says why', async () => {
  const dir = scratchDir();
  const path = join(dir, 'geo.mmdb');
  copyFileSync(geo.geoip2, path);
  const events: [boolean, unknown][] = [];
  const db = keep(new GeoDatabase(path, { regionRule: 'BLOCKED_REGIONS=CA-ON', onReload: (ok, _p, err) => events.push([ok, err]) }));
  for (const [bad, type] of [[geo.country, 'GeoLite2-Country'], [anon.anonymizer, 'GeoIP2-Anonymous-IP']] as const) {
    copyFileSync(bad, join(dir, 'next.mmdb'));
    renameSync(join(dir, 'next.mmdb'), path);
    assert.equal(await db.reload(), false);
    assert.deepEqual(db.lookup('203.0.113.10')?.regions, ['CA-ON'], 'the old database answers');
    const err = events.at(-1)?.[1];
    assert.ok(err instanceof DatabaseRefused);
    assert.match(err.message, new RegExp(`^GEOIP_DB: expected .*, got database_type "${type}"`));
  }
  copyFileSync(geo.geoip2Swapped, join(dir, 'next.mmdb'));
  renameSync(join(dir, 'next.mmdb'), path);
  assert.equal(await db.reload(), true);
  assert.deepEqual(db.lookup('203.0.113.10')?.regions, ['CA-BC']);
  assert.deepEqual(events.map(([ok]) => ok), [false, false, true]);
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
