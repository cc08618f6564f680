/**
 * The anonymizer database (ANONYMIZER_DB; docs/api.md "Anonymizers"): the GeoIP2 Anonymous IP
 * layout read flag by flag, checked against what the fixture script wrote, and a replaced file
 * swapped in (a corrupt one refused, the old answers kept). Test databases come from
 * testkit/fixtures/make-anonymizer-mmdb.py, generated at test time.
 */
import { after, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { copyFileSync, renameSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { AnonymizerDatabase, flagBits, recordBits } from '../src/common/adapters/anonymizer.ts';
import { createAnonymizerCheck, withAnonymizer } from '../src/authz/stages/anonymizer.ts';
import { ConfigError, KNOWN_SETTINGS, loadConfig } from '../src/common/config.ts';
import { GeoDatabase } from '../src/common/adapters/geoip.ts';
import { MemoryNonceStore } from '../src/common/adapters/nonce-store.ts';
import { HmacSha256Key } from '../src/common/crypto/hmac.ts';
import { geoDenial } from '../src/authz/decision.ts';
import { evaluate, type PipelineDeps } from '../src/authz/pipeline.ts';
import { createGeoClassifier } from '../src/authz/stages/geo.ts';
import { fakeMarkets, fixedClock, HMAC_KEY } from './helpers.ts';
import { newFeedKey } from '../../testkit/feed.ts';
import fc from 'fast-check';
import { ANONYMIZER_FLAGS } from '../src/common/ports.ts';
import { anonymizerFixtures } from '../../testkit/anonymizer-fixtures.ts';
import { geoFixtures, scratchDir } from '../../testkit/geo-fixtures.ts';

const fx = anonymizerFixtures();
const opened: AnonymizerDatabase[] = [];
function open(path: string, events: ConstructorParameters<typeof AnonymizerDatabase>[1] = {}): AnonymizerDatabase {
  const db = new AnonymizerDatabase(path, events);
  opened.push(db);
  return db;
}
after(() => {
  for (const db of opened) db.close();
});

/** The flags a layout record sets to true. */
function trueFlags(rec: Readonly<Record<string, boolean>>): string[] {
  return Object.entries(rec).filter(([, v]) => v).map(([k]) => k);
}

/** The first address of an IPv4 /28 or IPv6 network plus one. */
function inside(net: string): string {
  const [addr = ''] = net.split('/');
  if (addr.includes(':')) return `${addr.replace(/::$/, '')}::1`;
  const parts = addr.split('.').map(Number);
  parts[3] = (parts[3] ?? 0) + 1;
  return parts.join('.');
}

test('anonymizer database: every network answers exactly the flags the file holds as true, bit i = ANONYMIZER_FLAGS[i]', () => {
  const db = open(fx.anonymizer);
  const layout = fx.layout['anonymizer'] ?? {};
  assert.ok(Object.keys(layout).length >= 8, 'the fixture holds the networks');
  for (const [net, rec] of Object.entries(layout)) {
    const bits = db.flags(inside(net));
    const got = ANONYMIZER_FLAGS.filter((_, i) => (bits & (1 << i)) !== 0);
    assert.deepEqual(got, ANONYMIZER_FLAGS.filter((f) => trueFlags(rec).includes(f)), net);
  }
});

test('anonymizer database: an address with no record, or a record whose flags are all false, is 0', () => {
  const db = open(fx.anonymizer);
  assert.equal(db.flags('192.0.2.1'), 0, 'no record');
  assert.equal(db.flags('192.0.2.33'), 0, 'all flags false');
  assert.equal(db.flags('8.8.8.8'), 0);
  assert.equal(db.flags('2001:db8:3:1::1'), 0);
  assert.equal(db.flags('not an address'), 0, 'a string that is no address answers no flags, never throws');
});

test('anonymizer flags: recordBits counts only true, flagBits maps names and refuses unknown ones', () => {
  assert.equal(recordBits({ is_anonymous: true, is_anonymous_vpn: 'true', is_tor_exit_node: 1 }), 1);
  assert.equal(recordBits({ is_residential_proxy: true }), 1 << 5);
  assert.equal(flagBits(['is_anonymous_vpn', 'is_tor_exit_node']), (1 << 1) | (1 << 4));
  assert.equal(flagBits([]), 0);
  assert.throws(() => flagBits(['is_vpn']), /not an anonymizer flag: is_vpn/);
});

test('anonymizer reload: a replaced file swaps the answers; a corrupt replacement keeps the old ones and reports onReload(false)', async () => {
  const dir = scratchDir();
  const path = join(dir, 'anon.mmdb');
  copyFileSync(fx.anonymizer, path);
  const events: boolean[] = [];
  const db = open(path, { onReload: (ok) => events.push(ok) });
  const vpn = flagBits(['is_anonymous', 'is_anonymous_vpn']);
  assert.equal(db.flags('192.0.2.65'), vpn);
  assert.equal(db.flags('192.0.2.17'), 0);

  copyFileSync(fx.anonymizerSwapped, join(dir, 'next.mmdb'));
  renameSync(join(dir, 'next.mmdb'), path);
  assert.equal(await db.reload(), true);
  assert.equal(db.flags('192.0.2.65'), 0, 'the VPN range left the list');
  assert.equal(db.flags('192.0.2.17'), vpn, 'the new VPN range is listed');

  writeFileSync(join(dir, 'bad.mmdb'), 'not a database');
  renameSync(join(dir, 'bad.mmdb'), path);
  assert.equal(await db.reload(), false);
  assert.equal(db.flags('192.0.2.17'), vpn, 'the old answers are kept');
  assert.deepEqual(events, [true, false]);
});

test('anonymizer database: a file that is not a MaxMind database is refused at start', () => {
  const dir = scratchDir();
  writeFileSync(join(dir, 'empty.mmdb'), '');
  assert.throws(() => new AnonymizerDatabase(join(dir, 'empty.mmdb')));
  assert.throws(() => new AnonymizerDatabase(geoFixtures().corruptTruncated));
});

// ---------------------------------------------------------------------------------------
// The stage: which routes refuse which flags
// ---------------------------------------------------------------------------------------
test('anonymizer check: a flagged address is refused only on the routes whose action is block, and only for the flags that count', () => {
  const db = open(fx.anonymizer);
  const check = createAnonymizerCheck({
    flagMask: flagBits(['is_anonymous_vpn', 'is_tor_exit_node']),
    actions: { order: 'block', ingest: 'block', read: 'allow', geoblock: 'allow' },
  }, db);
  assert.equal(check('192.0.2.65', 'order'), true, 'VPN on orders');
  assert.equal(check('192.0.2.65', 'ingest'), true, 'VPN on ingest');
  assert.equal(check('192.0.2.65', 'read'), false, 'reads allow anonymizers');
  assert.equal(check('192.0.2.113', 'order'), true, 'Tor exit');
  assert.equal(check('192.0.2.81', 'order'), false, 'hosting provider does not count here');
  assert.equal(check('192.0.2.97', 'order'), false, 'public proxy does not count here');
  assert.equal(check('192.0.2.49', 'order'), false, 'residential proxy does not count here');
  assert.equal(check('192.0.2.1', 'order'), false, 'no record');
  assert.equal(check('::ffff:192.0.2.65', 'order'), true, 'an IPv4-mapped address is its IPv4');
  assert.equal(check('2001:db8:3:a000::7', 'order'), true, 'IPv6 VPN');
  assert.equal(check('garbage', 'order'), false, 'not an address: nothing to look up (geo has already decided it)');
});

test('anonymizer check: a route that allows anonymizers never asks the database', () => {
  let asked = 0;
  const check = createAnonymizerCheck({ flagMask: flagBits(['is_anonymous']), actions: { order: 'block', ingest: 'allow', read: 'allow', geoblock: 'allow' } }, {
    flags: () => {
      asked++;
      return 1;
    },
  });
  assert.equal(check('192.0.2.65', 'read'), false);
  assert.equal(check('192.0.2.65', 'ingest'), false);
  assert.equal(asked, 0);
  assert.equal(check('192.0.2.65', 'order'), true);
  assert.equal(asked, 1);
});

// ---------------------------------------------------------------------------------------
// Settings
// ---------------------------------------------------------------------------------------
test('ANONYMIZER_* settings: none → no rule; the defaults; flags and policy parsed; each refused value names its variable', () => {
  assert.equal(loadConfig({}).anonymizer, undefined);
  const def = loadConfig({ ANONYMIZER_DB: '/x.mmdb' }).anonymizer;
  assert.deepEqual(def?.flags, ['is_anonymous_vpn', 'is_public_proxy', 'is_tor_exit_node', 'is_residential_proxy']);
  assert.deepEqual(def?.actions, { order: 'block', ingest: 'block', read: 'allow', geoblock: 'allow' });
  const set = loadConfig({ ANONYMIZER_DB: '/x.mmdb', ANONYMIZER_FLAGS: 'IS_HOSTING_PROVIDER, is_anonymous', ANONYMIZER_POLICY: 'read=block, ingest=allow' }).anonymizer;
  assert.deepEqual(set?.flags, ['is_hosting_provider', 'is_anonymous']);
  assert.deepEqual(set?.actions, { order: 'block', ingest: 'allow', read: 'block', geoblock: 'allow' }, 'a route not named keeps its default; geoblock always answers');
  for (const [env, variable] of [
    [{ ANONYMIZER_FLAGS: 'is_anonymous' }, 'ANONYMIZER_FLAGS'],
    [{ ANONYMIZER_POLICY: 'order=block' }, 'ANONYMIZER_POLICY'],
    [{ ANONYMIZER_DB: '/x', ANONYMIZER_FLAGS: 'is_vpn' }, 'ANONYMIZER_FLAGS'],
    [{ ANONYMIZER_DB: '/x', ANONYMIZER_FLAGS: ' , ' }, 'ANONYMIZER_FLAGS'],
    [{ ANONYMIZER_DB: '/x', ANONYMIZER_POLICY: 'orders=block' }, 'ANONYMIZER_POLICY'],
    [{ ANONYMIZER_DB: '/x', ANONYMIZER_POLICY: 'geoblock=block' }, 'ANONYMIZER_POLICY'],
    [{ ANONYMIZER_DB: '/x', ANONYMIZER_POLICY: 'order=deny' }, 'ANONYMIZER_POLICY'],
    [{ ANONYMIZER_DB: '/x', ANONYMIZER_POLICY: 'order=block,order=allow' }, 'ANONYMIZER_POLICY'],
    [{ ANONYMIZER_DB: '/x', ANONYMIZER_POLICY: 'order=block=allow' }, 'ANONYMIZER_POLICY'],
  ] as const) {
    assert.throws(() => loadConfig(env), (e: unknown) => e instanceof ConfigError && e.variable === variable, JSON.stringify(env));
  }
  for (const name of ['ANONYMIZER_DB', 'ANONYMIZER_FLAGS', 'ANONYMIZER_POLICY']) assert.ok(KNOWN_SETTINGS.has(name), name);
});

// ---------------------------------------------------------------------------------------
// In the pipeline
// ---------------------------------------------------------------------------------------
describe('anonymizer in the pipeline', () => {
  const NOW = 1763700000;
  const MARKET = { conditionId: '0xmarket-anon', seq: 1, active: true, closed: false, minSize: undefined, maxSize: undefined };
  const orderBody = (): Buffer => Buffer.from(JSON.stringify({ marketId: MARKET.conditionId, deadline: NOW + 60, size: '5', payload: 'AAE=' }));
  const geo = new GeoDatabase(geoFixtures().geoip2);
  const anon = open(fx.anonymizer);
  after(() => geo.close());
  const geoNotice = geoDenial('not here', 'https://example.org/n');
  const denied: string[] = [];
  function deps(): PipelineDeps {
    const clock = fixedClock(NOW);
    return {
      classifyGeo: createGeoClassifier({ blockedCountries: new Set(['KP']), blockedRegions: new Set(), geoUnknown: 'block', geoTrustedCidrs: ['127.0.0.0/8', '192.0.2.64/28'] }, geo),
      geoDenial: geoNotice,
      ingest: { hmacKeys: [new HmacSha256Key(HMAC_KEY)], feedKeys: [newFeedKey().publicKey], nonces: new MemoryNonceStore(), clock, replayWindowSecs: 300, nonceTtlSecs: 600 },
      order: { markets: fakeMarkets([MARKET]), clock, orderMaxTtlSecs: 86_400, orderMaxSize: undefined, orderPayloadMaxBytes: 32_768 },
      isSealed: () => false,
      anonymizer: {
        blocks: createAnonymizerCheck({ flagMask: flagBits(['is_tor_exit_node', 'is_anonymous_vpn']), actions: { order: 'block', ingest: 'block', read: 'allow', geoblock: 'allow' } }, anon),
        denial: geoDenial('not here', 'https://example.org/n', 'restricted_jurisdiction:anonymizer'),
        onDenied: (route) => denied.push(route),
      },
    };
  }
  const input = (clientIp: string, method: string, path: string, body?: Buffer, phase?: 'headers') => ({
    method, path, clientIp, timestamp: undefined, nonce: undefined, signature: undefined, requestId: undefined, body, phase, route: undefined,
  });

  test('a Tor exit\'s order is refused with the geo notice\'s status, headers and body; the reason (never sent to the client) says anonymizer', async () => {
    denied.length = 0;
    const r = await evaluate(input('192.0.2.113', 'POST', '/v1/orders', orderBody()), deps());
    assert.deepEqual([r.allow, r.httpStatus, r.code, r.reason], [false, 451, 'restricted_jurisdiction', 'restricted_jurisdiction:anonymizer']);
    assert.deepEqual(r.headers, geoNotice.headers);
    assert.equal(r.body, geoNotice.body);
    assert.deepEqual(denied, ['order']);
  });

  test('an ingest\'s header phase from a Tor exit is refused before its body exists; a read from it is allowed', async () => {
    denied.length = 0;
    const h = await evaluate(input('192.0.2.113', 'POST', '/internal/ingest/market', undefined, 'headers'), deps());
    assert.deepEqual([h.allow, h.reason], [false, 'restricted_jurisdiction:anonymizer']);
    assert.equal((await evaluate(input('192.0.2.113', 'GET', '/v1/markets'), deps())).allow, true);
    assert.deepEqual(denied, ['ingest_headers']);
  });

  test('a trusted address (GEO_TRUSTED_CIDRS) is not refused even where the database flags it; a geo-blocked one gets the geo denial, not the anonymizer\'s', async () => {
    const trusted = await evaluate(input('192.0.2.65', 'POST', '/v1/orders', orderBody()), deps());
    assert.equal(trusted.allow, true, 'trusted VPN range');
    const kp = await evaluate(input('198.51.100.7', 'POST', '/v1/orders', orderBody()), deps());
    assert.equal(kp.reason, 'restricted_jurisdiction');
  });

  test('GET /v1/geoblock: blocked for an address the rule refuses orders, unchanged for the rest', () => {
    const classify = withAnonymizer(createGeoClassifier({ blockedCountries: new Set(['KP']), blockedRegions: new Set(), geoUnknown: 'block', geoTrustedCidrs: [] }, geo), deps().anonymizer?.blocks);
    const tor = classify('192.0.2.113');
    assert.deepEqual([tor.access, tor.country, tor.orderHeaders.length], ['blocked', 'CH', 0]);
    assert.equal(classify('192.0.2.113'), tor, 'one object per classification, not one per request');
    assert.equal(classify('192.0.2.81').access, 'full', 'hosting provider: not among these flags');
    assert.equal(classify('198.51.100.7').verdict, 'blocked_country');
  });
});

// ---------------------------------------------------------------------------------------
// Property: any address, any flag set, any route policy
// ---------------------------------------------------------------------------------------
test('property: for any address in or around the fixture ranges, any counted flags and any route actions, the check refuses exactly when the route blocks and the address\'s record (the script\'s own layout, IPv4 or IPv4-mapped) holds a counted flag', () => {
  const db = open(fx.anonymizer);
  const layout = Object.entries(fx.layout['anonymizer'] ?? {}).filter(([net]) => !net.includes(':'));
  /** The record of an IPv4 address by the layout (longest prefix; all fixture networks are disjoint). */
  const expected = (ip: string): readonly string[] => {
    const n = ip.split('.').reduce((acc, o) => acc * 256 + Number(o), 0);
    for (const [net, rec] of layout) {
      const [base = '', bits = '32'] = net.split('/');
      const b = base.split('.').reduce((acc, o) => acc * 256 + Number(o), 0);
      const size = 2 ** (32 - Number(bits));
      if (n >= b && n < b + size) return trueFlags(rec);
    }
    return [];
  };
  const action = fc.constantFrom('block' as const, 'allow' as const);
  fc.assert(fc.property(
    fc.integer({ min: 0, max: 255 }), fc.boolean(), fc.subarray([...ANONYMIZER_FLAGS], { minLength: 1 }),
    fc.record({ order: action, ingest: action, read: action }), fc.constantFrom('order' as const, 'ingest' as const, 'read' as const),
    (last, mapped, counted, actions, route) => {
      const ip = `192.0.2.${last}`;
      const check = createAnonymizerCheck({ flagMask: flagBits(counted), actions: { ...actions, geoblock: 'allow' } }, db);
      const want = actions[route] === 'block' && expected(ip).some((f) => counted.includes(f as (typeof ANONYMIZER_FLAGS)[number]));
      assert.equal(check(mapped ? `::ffff:${ip}` : ip, route), want, `${ip} ${counted.join(',')} ${route}`);
    },
  ), { numRuns: 500 });
});
