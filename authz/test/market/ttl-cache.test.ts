/** The bounded TTL cache behind the market store's lookup and page caches. */
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { AdmissionFilter, TtlCache } from '../../src/market/ttl-cache.ts';

test('ttl cache: a fresh entry is a hit; at its expiry time it is a miss and is dropped', () => {
  const c = new TtlCache<string>({ maxEntries: 10, maxBytes: 1_000 });
  c.set('a', 'A', 100, 10, 0);
  assert.equal(c.get('a', 99), 'A');
  assert.equal(c.get('a', 100), undefined);
  assert.deepEqual([c.size, c.bytes], [0, 0]);
});

test('ttl cache: never more than maxEntries; the oldest entry goes first', () => {
  const c = new TtlCache<number>({ maxEntries: 3, maxBytes: 1_000 });
  for (let i = 0; i < 10; i++) c.set(`k${i}`, i, 1_000, 1, 0);
  assert.equal(c.size, 3);
  assert.deepEqual(['k6', 'k7', 'k8', 'k9'].map((k) => c.get(k, 0)), [undefined, 7, 8, 9]);
});

test('ttl cache: never more than maxBytes; entries are dropped oldest first until the new one fits', () => {
  const c = new TtlCache<number>({ maxEntries: 100, maxBytes: 100 });
  c.set('a', 1, 1_000, 40, 0);
  c.set('b', 2, 1_000, 40, 0);
  c.set('c', 3, 1_000, 40, 0);
  assert.deepEqual([c.get('a', 0), c.get('b', 0), c.get('c', 0), c.bytes], [undefined, 2, 3, 80]);
  c.set('d', 4, 1_000, 90, 0);
  assert.deepEqual([c.size, c.bytes, c.get('d', 0)], [1, 90, 4]);
});

test('ttl cache: an entry larger than maxBytes on its own is not stored and evicts nothing', () => {
  const c = new TtlCache<number>({ maxEntries: 10, maxBytes: 100 });
  c.set('a', 1, 1_000, 50, 0);
  assert.equal(c.set('huge', 2, 1_000, 101, 0), false);
  assert.deepEqual([c.size, c.get('a', 0), c.get('huge', 0)], [1, 1, undefined]);
});

test('ttl cache: an insert drops every expired entry first, even with room to spare', () => {
  const c = new TtlCache<number>({ maxEntries: 1_000, maxBytes: 1_000_000 });
  for (let i = 0; i < 500; i++) c.set(`old${i}`, i, 100, 10, 0);
  c.set('new', 1, 300, 10, 200);
  assert.deepEqual([c.size, c.bytes], [1, 10]);
});

test('ttl cache: replacing a key charges only the new size', () => {
  const c = new TtlCache<number>({ maxEntries: 10, maxBytes: 100 });
  c.set('a', 1, 1_000, 60, 0);
  c.set('a', 2, 1_000, 70, 0);
  assert.deepEqual([c.size, c.bytes, c.get('a', 0)], [1, 70, 2]);
  c.delete('a');
  c.delete('a');
  assert.deepEqual([c.size, c.bytes], [0, 0]);
});

test('ttl cache: limits must allow at least one entry', () => {
  assert.throws(() => new TtlCache({ maxEntries: 0, maxBytes: 1 }), RangeError);
  assert.throws(() => new TtlCache({ maxEntries: 1, maxBytes: Number.NaN }), RangeError);
});

describe('AdmissionFilter (the page cache\'s doorkeeper)', () => {
  test('a key is "seen before" from its second ask on; a key never asked is not', () => {
    const f = new AdmissionFilter(1024);
    assert.equal(f.seenBefore('m|100||=0xa,0xb'), false);
    assert.equal(f.seenBefore('m|100||=0xa,0xb'), true);
    assert.equal(f.seenBefore('m|100||=0xa,0xb'), true);
    assert.equal(f.seenBefore('m|100||=0xa,0xc'), false);
  });

  test('10,000 distinct one-off keys in 1,024 slots: almost none reported as seen, and a later key overwrites its slot', () => {
    const f = new AdmissionFilter(1024);
    let seen = 0;
    for (let i = 0; i < 10_000; i++) if (f.seenBefore(`m|100||=0xknown,0xnone-${i}`)) seen++;
    // Only a 32-bit hash collision in a slot can answer true for a new key: expected ~0.
    assert.ok(seen <= 1, `${seen} of 10,000 one-off keys reported as seen`);
    // The table remembers at most one key per slot: after 10,000 others, the first is likely gone.
    let remembered = 0;
    for (let i = 0; i < 100; i++) if (f.seenBefore(`m|100||=0xknown,0xnone-${i}`)) remembered++;
    assert.ok(remembered < 50, `${remembered} of the first 100 keys still remembered after 10,000 others`);
  });

  test('slots must be a power of two', () => {
    assert.throws(() => new AdmissionFilter(1000), RangeError);
    assert.throws(() => new AdmissionFilter(0), RangeError);
  });
});
