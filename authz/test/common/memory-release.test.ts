/**
 * The memory release after a burst (common/memory-release.ts): a quiet process whose heap holds
 * more unused committed space than the slack gets one compacting collection that gives pages
 * back; a busy one gets none.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { setTimeout as sleep } from 'node:timers/promises';
import { getHeapStatistics } from 'node:v8';
import { startMemoryRelease } from '../../src/common/memory-release.ts';

/** A burst: ~80 MB of short-lived objects, some kept across a few turns so they reach old space. */
async function burst(): Promise<void> {
  const keep: string[][] = [];
  for (let round = 0; round < 8; round++) {
    keep.push(Array.from({ length: 40_000 }, (_, i) => `${round}-${i}-${'x'.repeat(200)}`));
    await sleep(1);
  }
  assert.ok(keep.length === 8);
  keep.length = 0;
}

test('quiet after a burst: one collection, and the heap commits less afterwards', async () => {
  const releases: { before: number; after: number }[] = [];
  // Started before the burst (its baseline is the heap before it); checks every second.
  const stop = startMemoryRelease({
    intervalMs: 1_000, slackBytes: 8 * 1_048_576, maxUtilization: 0.9, minGapMs: 60_000,
    onRelease: (b, a) => releases.push({ before: b.heapTotal, after: a.heapTotal }),
  });
  try {
    await burst();
    // Up to 15 s for a check to see a quiet interval (a loaded machine delays timers).
    for (let i = 0; i < 150 && releases.length === 0; i++) await sleep(100);
    assert.equal(releases.length, 1, 'one release');
    assert.ok(releases[0]!.after < releases[0]!.before, `heap total ${releases[0]!.before} → ${releases[0]!.after}`);
    await sleep(4_500);
    assert.equal(releases.length, 1, 'no second release within minGapMs');
  } finally {
    stop();
  }
});

test('busy: no collection while the event loop is busier than maxUtilization', async () => {
  await burst();
  const slack = getHeapStatistics();
  assert.ok(slack.total_heap_size > slack.used_heap_size);
  let released = 0;
  const stop = startMemoryRelease({ intervalMs: 100, slackBytes: 0, maxUtilization: 0.5, minGapMs: 0, onRelease: () => { released++; } });
  try {
    // ~1.5 s with the loop never idle: 20 ms of work, then setImmediate (timers run, no wait in the poll phase).
    for (const end = Date.now() + 1_500; Date.now() < end;) {
      const until = Date.now() + 20;
      while (Date.now() < until) { /* busy */ }
      await new Promise((resolve) => setImmediate(resolve));
    }
    assert.equal(released, 0);
  } finally {
    stop();
  }
});
