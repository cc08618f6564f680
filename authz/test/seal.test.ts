/** The one seal state: set once; while sealed every request is refused and noted, so the drain can end when nothing asks. */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createSealState } from '../src/common/seal.ts';

test('seal state – refuses nothing before the seal; set() is true once; quiet time counts from the seal, then from the last refused request', () => {
  let now = 1_000;
  const s = createSealState(() => now);
  assert.equal(s.refuses(), false);
  assert.equal(s.quietMs(), 0, 'no drain before the seal');
  assert.equal(s.sealed, false);
  assert.equal(s.set(), true);
  assert.equal(s.set(), false, 'a second seal does nothing');
  assert.equal(s.sealed, true);
  now += 300;
  assert.equal(s.quietMs(), 300);
  assert.equal(s.refuses(), true);
  assert.equal(s.quietMs(), 0, 'a refused request restarts the quiet time');
  now += 700;
  assert.equal(s.quietMs(), 700);
});
