/**
 * The anonymizer database (ANONYMIZER_DB; docs/api.md "Anonymizers"): the GeoIP2 Anonymous IP
 * layout read flag by flag, checked against what the fixture script wrote, and a replaced file
 * swapped in (a corrupt one refused, the old answers kept). Test databases come from
 * fixtures/make-anonymizer-mmdb.py, generated at test time.
 */
import { after, test } from 'node:test';
import assert from 'node:assert/strict';
import { copyFileSync, renameSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { AnonymizerDatabase, flagBits, recordBits } from '../src/shared/adapters/anonymizer.ts';
import { ANONYMIZER_FLAGS } from '../src/shared/ports.ts';
import { anonymizerFixtures } from './anonymizer-fixtures.ts';
import { geoFixtures, scratchDir } from './geo-fixtures.ts';

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

test('anonymizer reload: a replaced file swaps the answers; a corrupt replacement keeps the old ones and reports onReload(false)', () => {
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
  assert.equal(db.reload(), true);
  assert.equal(db.flags('192.0.2.65'), 0, 'the VPN range left the list');
  assert.equal(db.flags('192.0.2.17'), vpn, 'the new VPN range is listed');

  writeFileSync(join(dir, 'bad.mmdb'), 'not a database');
  renameSync(join(dir, 'bad.mmdb'), path);
  assert.equal(db.reload(), false);
  assert.equal(db.flags('192.0.2.17'), vpn, 'the old answers are kept');
  assert.deepEqual(events, [true, false]);
});

test('anonymizer database: a file that is not a MaxMind database is refused at start', () => {
  const dir = scratchDir();
  writeFileSync(join(dir, 'empty.mmdb'), '');
  assert.throws(() => new AnonymizerDatabase(join(dir, 'empty.mmdb')));
  assert.throws(() => new AnonymizerDatabase(geoFixtures().corruptTruncated));
});
