/**
 * GEO_POLICY_FILE (docs/operations.md "The geo policy file"): a whole policy validated before it
 * serves, the settings refused beside it, and the live swap: a replaced file (rename-over, in-place
 * rewrite, Kubernetes' `..data` symlink swap) compiled and in force, its version on every result
 * and in the order's x-edge-policy header; a bad replacement refused, the old policy kept,
 * counted and logged with the reason. Real GeoIP databases (the fixture City and Country ones).
 */
import { after, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdirSync, readFileSync, renameSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { Writable } from 'node:stream';
import { fileURLToPath } from 'node:url';
import { GeoDatabase } from '../src/common/adapters/geoip.ts';
import { checkDatabases } from '../src/common/adapters/databases.ts';
import { ConfigError, loadConfig } from '../src/common/config.ts';
import { createLogger } from '../src/common/log.ts';
import { createMetrics } from '../src/common/metrics.ts';
import { HEADER } from '../src/common/contract.ts';
import { parsePolicy, PolicyRefused, policyWarnings, settingsPolicy, type ParseContext } from '../src/common/geo-policy-file.ts';
import { LiveGeoPolicy } from '../src/authz/geo-policy.ts';
import { geoFixtures } from '../../testkit/geo-fixtures.ts';
import { tempDir } from '../../testkit/temp-dir.ts';

const VENUE = fileURLToPath(new URL('../../deploy/policy/venue-example.yaml', import.meta.url));
const CTX: ParseContext = { anonymizerDb: false, anonymizerDefaults: { flags: ['is_anonymous_vpn'], actions: { order: 'block', ingest: 'block', read: 'allow', geoblock: 'allow' } } };
const fx = geoFixtures();
const dbs: GeoDatabase[] = [];
after(() => { for (const d of dbs) d.close(); });

// Fixture City database: 198.51.100.1 KP · 198.51.100.200 CU · 192.0.2.10 CH · 203.0.113.10 CA-ON.
const KP = '198.51.100.1';
const CH = '192.0.2.10';
const CA_ON = '203.0.113.10';

describe('the policy document', () => {
  test('deploy/policy/venue-example.yaml parses: its version, tiers and GEO_REGION_UNKNOWN as written', () => {
    const doc = parsePolicy(readFileSync(VENUE, 'utf8'), VENUE, CTX);
    assert.equal(doc.version, 'venue-example-2026-05-14');
    assert.deepEqual([...doc.tiers.blockedRegions], ['UA-43', 'UA-14', 'UA-09', 'CA-ON', 'US-NV']);
    assert.deepEqual([...doc.tiers.closeOnlyRegions], ['US-MA']);
    assert.ok(['CU', 'IR', 'KP', 'SY'].every((c) => doc.tiers.blockedCountries.has(c)));
    assert.deepEqual([doc.tiers.geoUnknown, doc.tiers.geoRegionUnknown, doc.shadow], ['block', 'strictest', undefined]);
  });

  test('JSON works too, and a shadow policy names only what it changes (the rest as enforced)', () => {
    const doc = parsePolicy(JSON.stringify({ version: 'v1', blocked_countries: ['kp'], close_only_countries: ['CU'], shadow: { close_only_countries: ['CU', 'CH'] } }), '/p.json', CTX);
    assert.deepEqual([...doc.tiers.blockedCountries], ['KP']);
    assert.deepEqual([...(doc.shadow?.blockedCountries ?? [])], ['KP']);
    assert.deepEqual([...(doc.shadow?.closeOnlyCountries ?? [])], ['CU', 'CH']);
  });

  const refused: Record<string, [text: string, key: RegExp]> = {
    'no version': ['blocked_countries: [KP]', /version: expected a version string/],
    'a version that is no header value': ['version: "v 1"', /version: expected/],
    'an unknown key (a typo never passes silently)': ['version: v1\nblocked_country: [KP]', /blocked_country: expected one of the keys/],
    'an unknown shadow key': ['version: v1\nshadow: {version: v2}', /shadow\.version: expected one of the keys/],
    'a country that is no ISO code': ['version: v1\nblocked_countries: [USA]', /blocked_countries: expected a list of ISO 3166-1 alpha-2 codes, got "USA"/],
    'a region that is no ISO 3166-2 code': ['version: v1\nblocked_regions: [Nevada]', /blocked_regions: expected a list of ISO 3166-2 codes/],
    'a code in both tiers': ['version: v1\nblocked_countries: [CU]\nclose_only_countries: [CU]', /close_only_countries: expected codes not also in blocked_countries/],
    'a bad GEO_UNKNOWN': ['version: v1\ngeo_unknown: deny', /geo_unknown: expected "block" or "close-only" or "allow"/],
    'anonymizer keys without ANONYMIZER_DB': ['version: v1\nanonymizer_flags: [is_tor_exit_node]', /no anonymizer keys without ANONYMIZER_DB/],
    'not YAML': ['version: [v1', /\(file\): expected YAML/],
    'not a map': ['- KP', /\(file\): expected a map/],
  };
  for (const [name, [text, re]] of Object.entries(refused)) {
    test(`refused, one line naming the key – ${name}`, () => {
      assert.throws(() => parsePolicy(text, '/etc/edge/policy.yaml', CTX), (e: unknown) => e instanceof PolicyRefused && re.test(e.message) && !e.message.includes('\n') && e.message.startsWith('GEO_POLICY_FILE: /etc/edge/policy.yaml: '));
    });
  }

  test('a close-only region inside a blocked country is valid, and said (its clients get close-only, not 451)', () => {
    const doc = parsePolicy('version: v1\nblocked_countries: [US]\nclose_only_regions: [US-MA]\n', '/p.yaml', CTX);
    assert.deepEqual(policyWarnings(doc).map((w) => /US-MA inside US/.test(w)), [true]);
    assert.deepEqual(policyWarnings(parsePolicy(readFileSync(VENUE, 'utf8'), VENUE, CTX)), []);
  });

  test('the settings\' policy has a version of its own: env- and 12 hex of its rules, the same for the same rules', () => {
    const a = settingsPolicy(loadConfig({ BLOCKED_COUNTRIES: 'KP,CU' })).version;
    assert.match(a, /^env-[0-9a-f]{12}$/);
    assert.equal(settingsPolicy(loadConfig({ BLOCKED_COUNTRIES: 'CU,KP' })).version, a);
    assert.notEqual(settingsPolicy(loadConfig({ BLOCKED_COUNTRIES: 'KP' })).version, a);
  });

  test('GEO_POLICY_FILE beside a setting it replaces: start-up refused, one line naming them', () => {
    assert.throws(() => loadConfig({ GEO_POLICY_FILE: VENUE, BLOCKED_COUNTRIES: 'KP', SHADOW_GEO_UNKNOWN: 'allow' }),
      (e: unknown) => e instanceof ConfigError && e.variable === 'GEO_POLICY_FILE' && /no BLOCKED_COUNTRIES, SHADOW_GEO_UNKNOWN beside it/.test(e.message) && !e.message.includes('\n'));
    assert.equal(loadConfig({ GEO_POLICY_FILE: VENUE, BLOCKED_COUNTRIES: '' }).geoPolicyFile, VENUE);
  });
});

/** A live policy on a temp file, with the metrics text and the log lines. */
function live(text: string, db = fx.geoip2): { policy: LiveGeoPolicy; path: string; dir: string; lines: string[]; metrics: () => Promise<string> } {
  const dir = tempDir('edge-policy-');
  const path = join(dir, 'policy.yaml');
  writeFileSync(path, text);
  const geo = new GeoDatabase(db);
  dbs.push(geo);
  const metrics = createMetrics({ geoipBuildEpochSecs: () => 0, defaultMetrics: false });
  const lines: string[] = [];
  const logger = createLogger('info', new Writable({ write: (c: Buffer, _e, cb) => { lines.push(c.toString()); cb(); } }));
  const policy = new LiveGeoPolicy({ config: loadConfig({ GEO_POLICY_FILE: path, GEO_TRUSTED_CIDRS: '' }), geo, metrics, logger });
  return { policy, path, dir, lines, metrics: () => metrics.registry.metrics() };
}

const V1 = 'version: v1\nblocked_countries: [KP]\n';
const V2 = 'version: v2\nblocked_countries: [KP]\nclose_only_countries: [CH]\n';

describe('the policy in force, swapped live', () => {
  test('every result carries the version; an allowed order\'s headers carry it as x-edge-policy', () => {
    const { policy } = live(V1);
    const ch = policy.current.classify(CH);
    assert.deepEqual([ch.access, ch.policy], ['full', 'v1']);
    assert.deepEqual(ch.orderHeaders, [[HEADER.access, 'full'], [HEADER.jurisdiction, 'CH'], [HEADER.policy, 'v1']]);
    assert.equal(policy.current.geoblock(KP).policy, 'v1');
  });

  test('a file renamed over the old one: the new version compiled and in force, counted ok, edge_geo_policy_info moves to it', async () => {
    const { policy, path, lines, metrics } = live(V1);
    writeFileSync(`${path}.new`, V2);
    renameSync(`${path}.new`, path);
    assert.equal(await policy.reload(), true);
    const ch = policy.current.classify(CH);
    assert.deepEqual([ch.access, ch.policy, policy.current.version], ['close-only', 'v2', 'v2']);
    const text = await metrics();
    assert.match(text, /edge_geo_policy_info\{version="v2"\} 1/);
    assert.doesNotMatch(text, /version="v1"/);
    assert.match(text, /edge_geo_policy_reloads_total\{result="ok"\} 1/);
    assert.ok(lines.some((l) => l.includes('geo policy replaced') && l.includes('"previous":"v1"') && l.includes('"version":"v2"')));
  });

  test('a broken replacement is refused: the old policy keeps serving, counted refused, logged once with the reason', async () => {
    const { policy, path, lines, metrics } = live(V1);
    writeFileSync(path, 'version: v2\nblocked_countries: [KP, Korea]\n');
    assert.equal(await policy.reload(), false);
    assert.deepEqual([policy.current.version, policy.current.classify(KP).access], ['v1', 'blocked']);
    assert.match(await metrics(), /edge_geo_policy_reloads_total\{result="refused"\} 1/);
    const refusal = lines.filter((l) => l.includes('geo policy replacement refused'));
    assert.equal(refusal.length, 1);
    assert.match(refusal[0] ?? '', /blocked_countries: expected a list of ISO 3166-1 alpha-2 codes, got \\"Korea\\"/);
  });

  test('changed rules under the version in force are refused (the backend records versions, so one version means one policy)', async () => {
    const { policy, path } = live(V1);
    writeFileSync(path, 'version: v1\nblocked_countries: [KP, CU]\n');
    assert.equal(await policy.reload(), false);
    assert.equal(policy.current.classify('198.51.100.200').access, 'full');
  });

  test('a region rule the database cannot serve (a Country database: no subdivisions) is refused, the old policy kept', async () => {
    const { policy, path, lines } = live(V1, fx.country);
    writeFileSync(path, 'version: v2\nblocked_regions: [US-NV]\n');
    assert.equal(await policy.reload(), false);
    assert.equal(policy.current.version, 'v1');
    assert.ok(lines.some((l) => l.includes('geo policy replacement refused') && l.includes('GeoLite2-Country')));
  });

  test('the watch follows a Kubernetes ConfigMap volume: the `..data` symlink swapped to a new directory', async () => {
    const dir = tempDir('edge-policy-k8s-');
    mkdirSync(join(dir, '..2026_01'));
    writeFileSync(join(dir, '..2026_01', 'policy.yaml'), V1);
    symlinkSync('..2026_01', join(dir, '..data'));
    symlinkSync('..data/policy.yaml', join(dir, 'policy.yaml'));
    const { policy } = live(V1);
    const k8s = new LiveGeoPolicy({ config: loadConfig({ GEO_POLICY_FILE: join(dir, 'policy.yaml'), GEO_TRUSTED_CIDRS: '' }), geo: dbs[0]!,
      metrics: createMetrics({ geoipBuildEpochSecs: () => 0, defaultMetrics: false }), logger: createLogger('silent') });
    policy.close();
    k8s.watch(20);
    try {
      // What the kubelet does: write the new directory, point a temporary link at it, rename it over ..data.
      mkdirSync(join(dir, '..2026_02'));
      writeFileSync(join(dir, '..2026_02', 'policy.yaml'), V2);
      symlinkSync('..2026_02', join(dir, '..data_tmp'));
      renameSync(join(dir, '..data_tmp'), join(dir, '..data'));
      rmSync(join(dir, '..2026_01'), { recursive: true });
      for (let i = 0; i < 250 && k8s.current.version !== 'v2'; i++) await new Promise((r) => setTimeout(r, 20));
      assert.equal(k8s.current.version, 'v2');
      assert.equal(k8s.current.classify(CH).access, 'close-only');
    } finally {
      k8s.close();
    }
  });

  test('with a region rule in force, a Country database is refused at start (the region check asks the policy)', () => {
    assert.throws(() => new GeoDatabase(fx.country, { regionRule: () => 'blocked_regions=CA-ON' }), /GEOIP_DB: expected a database with ISO 3166-2 subdivisions for blocked_regions=CA-ON/);
    const { policy } = live('version: v1\nblocked_regions: [CA-ON]\n');
    assert.deepEqual([policy.current.regionRule, policy.current.classify(CA_ON).access], ['blocked_regions=CA-ON', 'blocked']);
  });

  test('npm start\'s database check reads the policy file: its region rules with a Country database refused before anything starts', () => {
    const { path } = live(V1);
    writeFileSync(path, 'version: v1\nblocked_regions: [US-NV]\n');
    assert.throws(() => checkDatabases(loadConfig({ GEO_POLICY_FILE: path, GEOIP_DB: fx.country })), (e: unknown) => e instanceof ConfigError && e.variable === 'GEOIP_DB' && /blocked_regions=US-NV/.test(e.message));
    assert.doesNotThrow(() => checkDatabases(loadConfig({ GEO_POLICY_FILE: path, GEOIP_DB: fx.geoip2 })));
    writeFileSync(path, 'version: v1\nblocked_regions: [Nevada]\n');
    assert.throws(() => checkDatabases(loadConfig({ GEO_POLICY_FILE: path, GEOIP_DB: fx.geoip2 })), PolicyRefused);
  });
});
