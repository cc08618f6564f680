/**
 * Geo (docs/api.md "Client address, geo and rate limit"): both MaxMind record layouts, the classifier's verdicts, the shipped
 * default database, reload/watch of a replaced file, and the one uniform 451 denial.
 * Test databases come from testkit/fixtures/make-mmdb.py (documentation ranges only), generated
 * into a temporary directory at test time.
 */
import { HmacSha256Key } from '../src/common/crypto/hmac.ts';
import { after, test } from 'node:test';
import assert from 'node:assert/strict';
import { copyFileSync, mkdirSync, renameSync, symlinkSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import type { MethodDefinition } from '@grpc/proto-loader';
import { loadPackageDefinition, SERVICE_NAMES } from '../../proto/index.ts';
import { GeoDatabase, toGeoRecord } from '../src/common/adapters/geoip.ts';
import { MemoryNonceStore } from '../src/common/adapters/nonce-store.ts';
import { DEFAULT_GEOIP_DB, DEFAULT_GEO_NOTICE, loadConfig } from '../src/common/config.ts';
import { denialBody, geoDenial, type Decision } from '../src/authz/decision.ts';
import { encodeDecision, type Serialize } from '../src/authz/codec/response.ts';
import { evaluate, type PipelineDeps } from '../src/authz/pipeline.ts';
import type { GeoLookup, GeoRecord } from '../src/common/ports.ts';
import { createGeoClassifier, normalizeIp, type GeoPolicy, type GeoVerdict } from '../src/authz/stages/geo.ts';
import { geoFixtures, scratchDir } from '../../testkit/geo-fixtures.ts';
import { fakeMarkets, fixedClock, HMAC_KEY } from './helpers.ts';
import { newFeedKey } from '../../testkit/feed.ts';

const fx = geoFixtures();
const opened: GeoDatabase[] = [];
function open(path: string, events: ConstructorParameters<typeof GeoDatabase>[1] = {}): GeoDatabase {
  const db = new GeoDatabase(path, events);
  opened.push(db);
  return db;
}
after(() => {
  for (const db of opened) db.close();
});

// ---------------------------------------------------------------------------------------
// toGeoRecord: both layouts, country preferred over registered_country
// ---------------------------------------------------------------------------------------
const records: Record<string, [raw: Parameters<typeof toGeoRecord>[0], expected: GeoRecord]> = {
  'GeoIP2: country, registered_country, subdivisions': [
    { country: { iso_code: 'CA' }, registered_country: { iso_code: 'CA' }, subdivisions: [{ iso_code: 'ON' }] },
    { country: 'CA', regions: ['CA-ON'] },
  ],
  'GeoIP2: country preferred over a different registered_country': [
    { country: { iso_code: 'CH' }, registered_country: { iso_code: 'KP' } },
    { country: 'CH', regions: [] },
  ],
  'GeoIP2: registered_country used when country is absent': [{ registered_country: { iso_code: 'IR' } }, { country: 'IR', regions: [] }],
  // docs/api.md "Which country a record gives": a country without iso_code is no location (GEO_UNKNOWN decides).
  'GeoIP2: a country without iso_code gives no country; registered_country is not used': [
    { country: {}, registered_country: { iso_code: 'IR' } },
    { country: undefined, regions: [] },
  ],
  'GeoIP2: a code that is not a string is no code': [
    { country: { iso_code: 7 }, registered_country: { iso_code: 'IR' }, subdivisions: [{ iso_code: 1 }] },
    { country: undefined, regions: [] },
  ],
  'GeoIP2: several subdivisions, all prefixed with the country': [
    { country: { iso_code: 'GB' }, subdivisions: [{ iso_code: 'ENG' }, { iso_code: 'LND' }] },
    { country: 'GB', regions: ['GB-ENG', 'GB-LND'] },
  ],
  'GeoIP2: subdivision without iso_code skipped': [
    { country: { iso_code: 'CA' }, subdivisions: [{}, { iso_code: 'qc' }] },
    { country: 'CA', regions: ['CA-QC'] },
  ],
  'GeoIP2: lower-case codes upper-cased': [{ country: { iso_code: 'ca' }, subdivisions: [{ iso_code: 'on' }] }, { country: 'CA', regions: ['CA-ON'] }],
  'ip-location-db: country_code only': [{ country_code: 'KP' }, { country: 'KP', regions: [] }],
  'ip-location-db: lower-case country_code': [{ country_code: 'cu' }, { country: 'CU', regions: [] }],
  'no country at all': [{}, { country: undefined, regions: [] }],
  'subdivisions without a country give no regions': [{ subdivisions: [{ iso_code: 'ON' }] }, { country: undefined, regions: [] }],
};

for (const [name, [rawRec, expected]] of Object.entries(records)) {
  test(`toGeoRecord – ${name}`, () => {
    const r = toGeoRecord(rawRec);
    assert.deepEqual({ country: r.country, regions: [...r.regions] }, { country: expected.country, regions: [...expected.regions] });
    assert.ok(Object.isFrozen(r));
  });
}

// ---------------------------------------------------------------------------------------
// Lookups in generated databases (IPv4 and IPv6, both layouts)
// ---------------------------------------------------------------------------------------
const lookups: Record<string, [db: string, ip: string, expected: { country: string | undefined; regions: string[] } | null]> = {
  'GeoIP2 v4 country': [fx.geoip2, '198.51.100.1', { country: 'KP', regions: [] }],
  'GeoIP2 v4 country + subdivision': [fx.geoip2, '203.0.113.10', { country: 'CA', regions: ['CA-ON'] }],
  'GeoIP2 v4 other subdivision': [fx.geoip2, '203.0.113.70', { country: 'CA', regions: ['CA-QC'] }],
  'GeoIP2 v4 country wins over registered_country': [fx.geoip2, '203.0.113.130', { country: 'CH', regions: [] }],
  'GeoIP2 v4 registered_country fallback': [fx.geoip2, '203.0.113.200', { country: 'IR', regions: [] }],
  'GeoIP2 v4 record without any country': [fx.geoip2, '192.0.2.130', { country: undefined, regions: [] }],
  'GeoIP2 v4 no record': [fx.geoip2, '192.0.2.200', null],
  'GeoIP2 v6 country': [fx.geoip2, '2001:db8:1::1', { country: 'KP', regions: [] }],
  'GeoIP2 v6 two subdivisions': [fx.geoip2, '2001:db8:2:ffff::1', { country: 'CA', regions: ['CA-ON', 'CA-TOR'] }],
  'GeoIP2 v6 registered_country fallback': [fx.geoip2, '2001:db8:4::1', { country: 'CU', regions: [] }],
  'GeoIP2 v6 no record': [fx.geoip2, '2001:db8:9::1', null],
  'ip-location-db v4': [fx.iplocation, '198.51.100.1', { country: 'KP', regions: [] }],
  'ip-location-db v4 lower-case in the file': [fx.iplocation, '198.51.100.200', { country: 'CU', regions: [] }],
  'ip-location-db v4 no subdivisions': [fx.iplocation, '203.0.113.10', { country: 'CA', regions: [] }],
  'ip-location-db v6': [fx.iplocation, '2001:db8:3::abcd', { country: 'CH', regions: [] }],
  'ip-location-db v6 no record': [fx.iplocation, '2001:db8:2::1', null],
  'ip-location-db IPv4-only tree, v4': [fx.iplocationV4, '192.0.2.5', { country: 'CH', regions: [] }],
  // In an IPv4-only database (ip_version 4, e.g. ip-location-db's *-ipv4.mmdb) mmdb-lib would
  // walk an IPv6 address through the IPv4 tree by its first 32 bits (2001:db8:5::1 answered as
  // 32.1.13.184, here KP): an IPv6 address has no record there.
  'ip-location-db IPv4-only tree, an IPv6 address has no record': [fx.iplocationV4, '2001:db8:5::1', null],
};

for (const [name, [file, ip, expected]] of Object.entries(lookups)) {
  test(`geo lookup – ${name}`, () => {
    const r = open(file).lookup(ip);
    assert.deepEqual(r === null ? null : { country: r.country, regions: [...r.regions] }, expected);
  });
}

test('geo lookup – the script wrote what the tests assume (fixture sanity)', () => {
  const g = fx.layout['geoip2'] as Record<string, { country?: { iso_code: string } }>;
  assert.equal(g['198.51.100.0/25']?.country?.iso_code, 'KP');
  assert.equal(g['127.0.0.0/8']?.country?.iso_code, 'KP', 'loopback is deliberately in a blocked country');
  assert.equal(open(fx.geoip2).lookup('127.0.0.1')?.country, 'KP');
});

test('geo lookup – an unparseable address answers null, never throws', () => {
  const db = open(fx.geoip2);
  for (const ip of ['', 'not-an-ip', '1.2.3', '1.2.3.4.5', '::g', '198.51.100.1:443']) assert.equal(db.lookup(ip), null, ip);
});

// ---------------------------------------------------------------------------------------
// Classifier verdicts
// ---------------------------------------------------------------------------------------
const POLICY: GeoPolicy = {
  blockedCountries: new Set(['KP', 'CU', 'IR']),
  blockedRegions: new Set(['CA-ON']),
  geoUnknown: 'block',
  geoTrustedCidrs: loadConfig({}).geoTrustedCidrs,
};

interface VerdictCase {
  db: string;
  ip: string;
  verdict: GeoVerdict;
  unknown?: 'block' | 'allow';
}

const verdicts: Record<string, VerdictCase> = {
  'blocked country, IPv4 (GeoIP2)': { db: fx.geoip2, ip: '198.51.100.1', verdict: 'blocked_country' },
  'blocked country, IPv6 (GeoIP2)': { db: fx.geoip2, ip: '2001:db8:1::42', verdict: 'blocked_country' },
  'blocked country, IPv4 (ip-location-db)': { db: fx.iplocation, ip: '198.51.100.1', verdict: 'blocked_country' },
  'blocked country, IPv6 (ip-location-db)': { db: fx.iplocation, ip: '2001:db8:1::42', verdict: 'blocked_country' },
  'second blocked country (lower-case in file)': { db: fx.iplocation, ip: '198.51.100.200', verdict: 'blocked_country' },
  'blocked region CA-ON, IPv4': { db: fx.geoip2, ip: '203.0.113.10', verdict: 'blocked_region' },
  'blocked region CA-ON, IPv6 (one of two subdivisions)': { db: fx.geoip2, ip: '2001:db8:2::1', verdict: 'blocked_region' },
  'same country, other region (CA-QC) allowed': { db: fx.geoip2, ip: '203.0.113.70', verdict: 'allowed' },
  // A region rule for CA and a record of CA without a subdivision: GEO_REGION_UNKNOWN (strictest),
  // not the country's full tier (start-up refuses such a database with a region rule anyway).
  'region rule, record without subdivision: ip-location-db CA is unknown_region': { db: fx.iplocation, ip: '203.0.113.10', verdict: 'unknown_region' },
  'allowed country, IPv4': { db: fx.geoip2, ip: '192.0.2.10', verdict: 'allowed' },
  'allowed country, IPv6': { db: fx.geoip2, ip: '2001:db8:3::1', verdict: 'allowed' },
  'country CH wins over registered_country KP': { db: fx.geoip2, ip: '203.0.113.130', verdict: 'allowed' },
  'registered_country IR used when country absent': { db: fx.geoip2, ip: '203.0.113.200', verdict: 'blocked_country' },
  'no record, GEO_UNKNOWN=block': { db: fx.geoip2, ip: '192.0.2.200', verdict: 'unknown_blocked' },
  'no record, GEO_UNKNOWN=allow': { db: fx.geoip2, ip: '192.0.2.200', verdict: 'unknown_allowed', unknown: 'allow' },
  'record without country, GEO_UNKNOWN=block': { db: fx.geoip2, ip: '192.0.2.130', verdict: 'unknown_blocked' },
  'record without country, GEO_UNKNOWN=allow': { db: fx.geoip2, ip: '192.0.2.130', verdict: 'unknown_allowed', unknown: 'allow' },
  'IPv6 no record, GEO_UNKNOWN=block': { db: fx.geoip2, ip: '2001:db8:9::1', verdict: 'unknown_blocked' },
  'trusted 127.0.0.1 never blocked though its country is KP': { db: fx.geoip2, ip: '127.0.0.1', verdict: 'trusted' },
  'trusted 127.255.255.254': { db: fx.geoip2, ip: '127.255.255.254', verdict: 'trusted' },
  'trusted ::1 never blocked though its country is KP': { db: fx.geoip2, ip: '::1', verdict: 'trusted' },
  'trusted [::1]': { db: fx.geoip2, ip: '[::1]', verdict: 'trusted' },
  'trusted ::ffff:127.0.0.1 (IPv4-mapped)': { db: fx.geoip2, ip: '::ffff:127.0.0.1', verdict: 'trusted' },
  'trusted ::ffff:7f00:1 (IPv4-mapped, hex form)': { db: fx.geoip2, ip: '::ffff:7f00:1', verdict: 'trusted' },
  'IPv4-mapped ::ffff:198.51.100.1 is the v4 address': { db: fx.geoip2, ip: '::ffff:198.51.100.1', verdict: 'blocked_country' },
  'IPv4-mapped upper case ::FFFF:198.51.100.1': { db: fx.geoip2, ip: '::FFFF:198.51.100.1', verdict: 'blocked_country' },
  'IPv4-mapped allowed address ::ffff:192.0.2.10': { db: fx.geoip2, ip: '::ffff:192.0.2.10', verdict: 'allowed' },
  'bracketed IPv6 [2001:db8:1::1]': { db: fx.geoip2, ip: '[2001:db8:1::1]', verdict: 'blocked_country' },
  'bracketed IPv4-mapped [::ffff:198.51.100.1]': { db: fx.geoip2, ip: '[::ffff:198.51.100.1]', verdict: 'blocked_country' },
  'IPv6 with a zone id': { db: fx.geoip2, ip: 'fe80::1%eth0', verdict: 'unknown_blocked' },
  'surrounding whitespace trimmed': { db: fx.geoip2, ip: ' 198.51.100.1 ', verdict: 'blocked_country' },
  'garbage string → unknown (block)': { db: fx.geoip2, ip: 'not-an-ip', verdict: 'unknown_blocked' },
  'garbage string → unknown (allow)': { db: fx.geoip2, ip: 'not-an-ip', verdict: 'unknown_allowed', unknown: 'allow' },
  'empty address → unknown': { db: fx.geoip2, ip: '', verdict: 'unknown_blocked' },
  'address with a port → unknown': { db: fx.geoip2, ip: '198.51.100.1:443', verdict: 'unknown_blocked' },
  'an X-Forwarded-For style list → unknown': { db: fx.geoip2, ip: '192.0.2.10, 198.51.100.1', verdict: 'unknown_blocked' },
  'octal-looking IPv4 → unknown': { db: fx.geoip2, ip: '0198.051.100.001', verdict: 'unknown_blocked' },
  // Every RFC 4291 spelling of an IPv4-mapped address is its IPv4 ('::ffff:c633:6401',
  // '0:0:0:0:0:ffff:198.51.100.1'): as IPv6 it would miss the IPv4 records (the packaged default
  // database has none under ::ffff:0:0/96) and fall to GEO_UNKNOWN, so with GEO_UNKNOWN=allow a
  // client in a blocked country would be allowed.
  'IPv4-mapped hex form ::ffff:c633:6401 is the v4 address (GEO_UNKNOWN=allow)': {
    db: fx.geoip2, ip: '::ffff:c633:6401', verdict: 'blocked_country', unknown: 'allow',
  },
  'IPv4-mapped full form 0:0:0:0:0:ffff:198.51.100.1 is the v4 address (GEO_UNKNOWN=allow)': {
    db: fx.geoip2, ip: '0:0:0:0:0:ffff:198.51.100.1', verdict: 'blocked_country', unknown: 'allow',
  },
  // See the lookup table above: an IPv6 client is never classified by an unrelated IPv4 network.
  'IPv6 address in an IPv4-only database is unknown, not the country of its first 32 bits': {
    db: fx.iplocationV4, ip: '2001:db8:5::1', verdict: 'unknown_allowed', unknown: 'allow',
  },
};

for (const [name, c] of Object.entries(verdicts)) {
  test(`geo classifier – ${name} → ${c.verdict}`, () => {
    const classify = createGeoClassifier({ ...POLICY, geoUnknown: c.unknown ?? 'block' }, open(c.db));
    assert.equal(classify(c.ip).verdict, c.verdict);
  });
}

test('geo classifier – GEO_TRUSTED_CIDRS empty: loopback is looked up like any address', () => {
  const classify = createGeoClassifier({ ...POLICY, geoTrustedCidrs: [] }, open(fx.geoip2));
  assert.equal(classify('127.0.0.1').verdict, 'blocked_country');
});

test('geo classifier – a trusted CIDR wins even inside a blocked region and country', () => {
  const classify = createGeoClassifier({ ...POLICY, geoTrustedCidrs: ['203.0.113.0/28', '2001:db8:1::/64'] }, open(fx.geoip2));
  assert.equal(classify('203.0.113.5').verdict, 'trusted');
  assert.equal(classify('203.0.113.20').verdict, 'blocked_region');
  assert.equal(classify('2001:db8:1::5').verdict, 'trusted');
  assert.equal(classify('2001:db8:1:1::5').verdict, 'blocked_country');
});

test('geo classifier – normalizeIp', () => {
  const table: Record<string, string> = {
    '198.51.100.1': '198.51.100.1',
    '[2001:db8::1]': '2001:db8::1',
    '::ffff:198.51.100.1': '198.51.100.1',
    'fe80::1%eth0': 'fe80::1',
    'garbage': '',
    '[198.51.100.1]': '198.51.100.1',
    '::ffff:c633:6401': '198.51.100.1',
    '::FFFF:C633:6401': '198.51.100.1',
    '[::ffff:c633:6401]': '198.51.100.1',
    '0:0:0:0:0:ffff:198.51.100.1': '198.51.100.1',
    '0000:0000:0000:0000:0000:ffff:c633:6401': '198.51.100.1',
    '::ffff:198.51.100.1%eth0': '198.51.100.1',
    '::ffff:0:0': '0.0.0.0',
    '::ffff:ffff:ffff': '255.255.255.255',
    '::ffff:7f00:1': '127.0.0.1',
    // Not IPv4-mapped: stay IPv6.
    '::198.51.100.1': '::198.51.100.1',
    '64:ff9b::198.51.100.1': '64:ff9b::198.51.100.1',
    'fe80::ffff:c633:6401': 'fe80::ffff:c633:6401',
    '::1:ffff:c633:6401': '::1:ffff:c633:6401',
    '::fffe:c633:6401': '::fffe:c633:6401',
    // Not addresses.
    '::ffff:198.51.100': '',
    '::ffff:256.1.1.1': '',
    '[198.51.100.1': '',
  };
  for (const [input, out] of Object.entries(table)) assert.equal(normalizeIp(input), out, input);
});

// ---------------------------------------------------------------------------------------
// The shipped default database
// ---------------------------------------------------------------------------------------
test('geo default database – DEFAULT_GEOIP_DB opens and answers a country for well-known addresses (v4 and v6)', () => {
  assert.equal(loadConfig({}).geoipDb, DEFAULT_GEOIP_DB);
  const db = open(DEFAULT_GEOIP_DB);
  assert.equal(db.lookup('8.8.8.8')?.country, 'US');
  assert.equal(db.lookup('2001:4860:4860::8888')?.country, 'US');
  assert.match(db.lookup('1.1.1.1')?.country ?? '', /^[A-Z]{2}$/);
  const age = Date.now() / 1000 - db.buildEpochSecs;
  assert.ok(db.buildEpochSecs > 1_600_000_000 && age > -86_400, `build epoch ${db.buildEpochSecs}`);
});

// ---------------------------------------------------------------------------------------
// reload() and watch()
// ---------------------------------------------------------------------------------------
const unopenable: Record<string, string> = {
  'truncated file': fx.corruptTruncated,
  'garbage with a metadata marker': fx.corruptGarbage,
  'missing file': join(fx.dir, 'does-not-exist.mmdb'),
};

for (const [name, path] of Object.entries(unopenable)) {
  test(`geo database – refuses to open a ${name}`, () => {
    assert.throws(() => new GeoDatabase(path));
  });
}

test('geo database – an empty file or a gzip file is refused', () => {
  const dir = scratchDir();
  writeFileSync(join(dir, 'empty.mmdb'), '');
  writeFileSync(join(dir, 'gz.mmdb'), Buffer.from([0x1f, 0x8b, 0x08, 0x00, 0, 0, 0, 0]));
  assert.throws(() => new GeoDatabase(join(dir, 'empty.mmdb')));
  assert.throws(() => new GeoDatabase(join(dir, 'gz.mmdb')));
});

type ReloadEvent = [ok: boolean, path: string, err: unknown];

const reloadCorrupt: Record<string, string> = {
  'truncated': fx.corruptTruncated,
  'garbage': fx.corruptGarbage,
};

for (const [name, corrupt] of Object.entries(reloadCorrupt)) {
  test(`geo reload – a new valid file swaps answers; a ${name} replacement keeps the old ones and reports onReload(false)`, async () => {
    const path = join(scratchDir(), 'geo.mmdb');
    copyFileSync(fx.geoip2, path);
    const events: ReloadEvent[] = [];
    const db = open(path, { onReload: (ok, p, err) => events.push([ok, p, err]) });
    assert.equal(db.lookup('198.51.100.1')?.country, 'KP');
    assert.deepEqual(db.lookup('203.0.113.10')?.regions, ['CA-ON']);

    copyFileSync(fx.geoip2Swapped, path);
    assert.equal(await db.reload(), true);
    assert.equal(db.lookup('198.51.100.1')?.country, 'CH');
    assert.deepEqual(db.lookup('203.0.113.10')?.regions, ['CA-BC']);
    assert.equal(db.lookup('2001:db8:1::1')?.country, 'CH');
    assert.deepEqual(events.map(([ok, p]) => [ok, p]), [[true, path]]);

    copyFileSync(corrupt, path);
    assert.equal(await db.reload(), false);
    assert.equal(db.lookup('198.51.100.1')?.country, 'CH', 'old answers kept');
    assert.equal(db.lookup('2001:db8:1::1')?.country, 'CH');
    assert.equal(events.length, 2);
    assert.equal(events[1]?.[0], false);
    assert.equal(events[1]?.[1], path);
    assert.ok(events[1]?.[2] instanceof Error, 'the error is reported');
  });
}

async function until(cond: () => boolean, timeoutMs: number, what: string): Promise<void> {
  const end = Date.now() + timeoutMs;
  while (!cond()) {
    if (Date.now() > end) assert.fail(`timed out waiting for ${what}`);
    await sleep(5);
  }
}

test('geo watch – picks up atomic rename replacements, refuses a corrupt one, never stops answering', async () => {
  const dir = scratchDir();
  const path = join(dir, 'geo.mmdb');
  copyFileSync(fx.geoip2, path);
  const events: boolean[] = [];
  const db = open(path, { onReload: (ok) => events.push(ok) });
  const INTERVAL = 25;
  db.watch(INTERVAL);
  db.watch(INTERVAL); // idempotent

  // Readers hammer the database the whole time.
  let running = true;
  let reads = 0;
  const seen = new Set<string>();
  const problems: string[] = [];
  const reader = (async () => {
    while (running) {
      for (const ip of ['198.51.100.1', '2001:db8:1::1', '192.0.2.10']) {
        try {
          const r = db.lookup(ip);
          if (r === null || r.country === undefined) problems.push(`${ip} → ${JSON.stringify(r)}`);
          else seen.add(r.country);
        } catch (err) {
          problems.push(`${ip} threw ${String(err)}`);
        }
        reads++;
      }
      await sleep(1);
    }
  })();

  const replace = (src: string, tag: string): void => {
    const tmp = join(dir, `.geo.mmdb.${tag}`);
    copyFileSync(src, tmp);
    renameSync(tmp, path);
  };

  try {
    assert.equal(db.lookup('198.51.100.1')?.country, 'KP');
    // Let the poller take its first stat (see the late-replacement tests below for why this matters).
    await sleep(INTERVAL * 4);
    replace(fx.geoip2Swapped, 'a');
    await until(() => db.lookup('198.51.100.1')?.country === 'CH', 2000, 'the swapped database');
    assert.deepEqual(events, [true]);

    replace(fx.corruptTruncated, 'b');
    await until(() => events.length === 2, 2000, 'the corrupt replacement to be reported');
    assert.equal(events[1], false);
    assert.equal(db.lookup('198.51.100.1')?.country, 'CH', 'old database still answering');

    replace(fx.geoip2, 'c');
    await until(() => db.lookup('198.51.100.1')?.country === 'KP', 2000, 'the original database again');
    assert.deepEqual(events, [true, false, true]);
  } finally {
    running = false;
    await reader;
  }
  assert.deepEqual(problems, [], 'lookups never threw nor answered null during replacements');
  assert.ok(reads > 30, `readers ran (${reads} reads)`);
  assert.deepEqual([...seen].sort(), ['CH', 'KP']);

  db.close();
  replace(fx.geoip2Swapped, 'd');
  await sleep(INTERVAL * 6);
  assert.equal(db.lookup('198.51.100.1')?.country, 'KP', 'no reload after close()');
  assert.equal(events.length, 3);
});

test('geo watch – follows a Kubernetes-style ..data symlink swap', async () => {
  const dir = scratchDir();
  for (const [v, src] of [['v1', fx.geoip2], ['v2', fx.geoip2Swapped]] as const) {
    mkdirSync(join(dir, v));
    copyFileSync(src, join(dir, v, 'geo.mmdb'));
  }
  symlinkSync('v1', join(dir, '..data'));
  symlinkSync(join('..data', 'geo.mmdb'), join(dir, 'geo.mmdb'));
  const events: boolean[] = [];
  const db = open(join(dir, 'geo.mmdb'), { onReload: (ok) => events.push(ok) });
  db.watch(25);
  assert.equal(db.lookup('198.51.100.1')?.country, 'KP');
  await sleep(100); // the poller's first stat (see the late-replacement tests below)
  symlinkSync('v2', join(dir, '..data_tmp'));
  renameSync(join(dir, '..data_tmp'), join(dir, '..data'));
  await until(() => db.lookup('198.51.100.1')?.country === 'CH', 2000, 'the swapped ..data target');
  assert.deepEqual(events, [true]);
  db.close();
});

// A replacement that lands before the watcher's first poll (between `new GeoDatabase()` and
// watch(), or in the same tick) is noticed: changes are compared with the stat of the file that
// was actually loaded, not with fs.watchFile's own first stat, which would miss it and keep the
// old database serving until the next change (for a monthly update: a month).
const lateWatch: Record<string, (path: string, dir: string) => void> = {
  'replaced by rename before watch() is called': (path, dir) => {
    copyFileSync(fx.geoip2Swapped, join(dir, 'tmp.mmdb'));
    renameSync(join(dir, 'tmp.mmdb'), path);
  },
  'rewritten in place before watch() is called': (path) => copyFileSync(fx.geoip2Swapped, path),
};

for (const [name, replaceIt] of Object.entries(lateWatch)) {
  test(`geo watch – a database ${name} is still picked up`, async () => {
    const dir = scratchDir();
    const path = join(dir, 'geo.mmdb');
    copyFileSync(fx.geoip2, path);
    const db = open(path);
    assert.equal(db.lookup('198.51.100.1')?.country, 'KP');
    replaceIt(path, dir);
    db.watch(25);
    await until(() => db.lookup('198.51.100.1')?.country === 'CH', 1000, 'the database replaced before watch()');
  });
}

// ---------------------------------------------------------------------------------------
// The uniform 451 denial, end to end through the pipeline
// ---------------------------------------------------------------------------------------
const pd = loadPackageDefinition();
const checkDef = (pd[SERVICE_NAMES.authorization] as Record<string, MethodDefinition<object, object>>)['Check']!;
const serialize = checkDef.responseSerialize as Serialize;

function pipeline(geo: GeoLookup, blockedByUrl: string | undefined, notice = DEFAULT_GEO_NOTICE): PipelineDeps {
  const clock = fixedClock(1763700000);
  const feed = newFeedKey();
  return {
    classifyGeo: createGeoClassifier(POLICY, geo),
    geoDenial: geoDenial(notice, blockedByUrl),
    ingest: {
      hmacKeys: [new HmacSha256Key(HMAC_KEY)], feedKeys: [feed.publicKey], nonces: new MemoryNonceStore(), clock, replayWindowSecs: 300, nonceTtlSecs: 600,
    },
    order: { markets: fakeMarkets([]), clock, orderMaxTtlSecs: 86_400, orderMaxSize: undefined, orderPayloadMaxBytes: 32_768 },
    isSealed: () => false,
  };
}

const input = (clientIp: string, method = 'GET', path = '/v1/markets') => ({
  method, path, clientIp, timestamp: undefined, nonce: undefined, signature: undefined, requestId: undefined, body: undefined, phase: undefined, route: undefined,
});

const blockedClients: Record<string, string> = {
  'KP over IPv4': '198.51.100.1',
  'CU over IPv4': '198.51.100.200',
  'KP over IPv6': '2001:db8:1::9',
  'IR via registered_country': '203.0.113.200',
  'region CA-ON': '203.0.113.10',
  'unknown address (GEO_UNKNOWN=block)': '192.0.2.200',
};

const linkCases: Record<string, string | undefined> = {
  'with GEO_BLOCKED_BY_URL': 'https://venue.example/legal/blocked',
  'without GEO_BLOCKED_BY_URL': undefined,
};

for (const [lname, url] of Object.entries(linkCases)) {
  test(`geo denial – ${lname}: every blocked client gets the byte-identical 451 but for its request id`, async () => {
    const deps = pipeline(open(fx.geoip2), url);
    const decisions: Decision[] = [];
    for (const ip of Object.values(blockedClients)) decisions.push(await evaluate(input(ip), deps));
    const id = '5f0c6a4e-1b7d-4c1e-9a55-0d3c2b1a0f9e';
    const wire = decisions.map((d) => encodeDecision(d, serialize, id));
    for (const [i, d] of decisions.entries()) {
      assert.equal(d.httpStatus, 451);
      assert.equal(d.code, 'restricted_jurisdiction');
      assert.equal(d.body, decisions[0]!.body);
      assert.deepEqual(d.headers, decisions[0]!.headers);
      assert.deepEqual(wire[i], wire[0], 'byte-identical CheckResponse');
    }
    const d = decisions[0]!;
    assert.equal(denialBody(d, id), `{"error":"restricted_jurisdiction","message":${JSON.stringify(DEFAULT_GEO_NOTICE)},"requestId":"${id}"}`);
    for (const cc of ['KP', 'CU', 'IR', 'CA-ON', 'ON']) assert.ok(!denialBody(d, id).includes(cc), `the body never names ${cc}`);
    // Another request id changes those bytes of the answer and nothing else.
    const other = 'a1b2c3d4-0000-4000-8000-000000000000';
    assert.deepEqual(encodeDecision(d, serialize, other), Buffer.from(wire[0]!.toString('latin1').replace(id, other), 'latin1'));
    const headers = new Map(d.headers);
    assert.equal(headers.get('content-type'), 'application/json');
    assert.equal(headers.get('cache-control'), 'no-store');
    assert.equal(headers.get('link'), url === undefined ? undefined : `<${url}>; rel="blocked-by"`);
    // On the wire: the 451 number survives encoding (not mapped to 403 by an enum).
    const res = checkDef.responseDeserialize(wire[0]!) as { denied_response?: { status?: { code?: number }; body?: string } };
    assert.equal(res.denied_response?.status?.code, 451);
    assert.equal(res.denied_response?.body, denialBody(d, id));
  });
}

test('geo denial – GEO_NOTICE is the message, verbatim', async () => {
  const notice = 'Access from your jurisdiction is restricted. Voir: https://venue.example/legal';
  const d = await evaluate(input('198.51.100.1'), pipeline(open(fx.geoip2), undefined, notice));
  assert.equal((JSON.parse(d.body) as { message: string }).message, notice);
});

const routes: Record<string, [method: string, path: string]> = {
  'GET /': ['GET', '/'],
  'GET /healthz': ['GET', '/healthz'],
  'GET /v1/markets': ['GET', '/v1/markets'],
  'GET /v1/quotes': ['GET', '/v1/quotes'],
  'POST /v1/orders': ['POST', '/v1/orders'],
  'POST /internal/ingest/market': ['POST', '/internal/ingest/market'],
};

for (const [name, [method, path]] of Object.entries(routes)) {
  test(`geo denial – applies to ${name}; an allowed client passes geo there`, async () => {
    const deps = pipeline(open(fx.geoip2), undefined);
    const blocked = await evaluate(input('2001:db8:1::1', method, path), deps);
    assert.equal(blocked.httpStatus, 451);
    const allowed = await evaluate(input('192.0.2.10', method, path), deps);
    assert.notEqual(allowed.httpStatus, 451);
  });
}
