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
    intervalMs: 1_000, slackBytes: 8 * 1_048_576, maxUtilization: 0.9, minGapMs: 60_000, confirmMs: 250, quietNowUtilization: 0.2,
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
  const stop = startMemoryRelease({ intervalMs: 100, slackBytes: 0, maxUtilization: 0.5, minGapMs: 0, confirmMs: 50, quietNowUtilization: 0.5, onRelease: () => { released++; } });
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

/** ~`ms` of a loop busy about half the time: 4 ms of work, then 4 ms of waiting (timers run then). */
async function halfBusy(ms: number): Promise<void> {
  for (const end = Date.now() + ms; Date.now() < end;) {
    const until = Date.now() + 4;
    while (Date.now() < until) { /* busy */ }
    await sleep(4);
  }
}

for (const [quietNow, want] of [[0.02, 'none'], [0.95, 'some']] as const) {
  test(`load resuming at the check: the confirmation window (busy ~50 %, quietNowUtilization ${quietNow}) ${want === 'none' ? 'holds the collection back' : 'lets it run (the control)'}`, async () => {
    await burst();
    let released = 0;
    // The interval check always passes (maxUtilization 1, no slack, no gap): only the window decides.
    const stop = startMemoryRelease({ intervalMs: 100, slackBytes: 0, maxUtilization: 1, minGapMs: 0, confirmMs: 100, quietNowUtilization: quietNow, onRelease: () => { released++; } });
    try {
      await halfBusy(1_500);
      if (want === 'none') assert.equal(released, 0, 'no collection while the window is busy');
      else assert.ok(released > 0, 'collections run when the window allows them');
    } finally {
      stop();
    }
  });
}
