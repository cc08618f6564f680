/**
 * throttledWarn: a recurring warning (a Redis that is down, ~7 reconnect errors a second across
 * the process's connections) logged at most once per interval, the left-out ones counted.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { Writable } from 'node:stream';
import { createLogger, throttledWarn } from '../src/common/log.ts';

function capture(): { lines: Record<string, unknown>[]; logger: ReturnType<typeof createLogger> } {
  const lines: Record<string, unknown>[] = [];
  const logger = createLogger('info', new Writable({
    write: (chunk: Buffer, _e, cb) => {
      lines.push(JSON.parse(chunk.toString()) as Record<string, unknown>);
      cb();
    },
  }));
  return { lines, logger };
}

test('throttledWarn – the first at once, then one line per interval counting the ones left out', () => {
  const { lines, logger } = capture();
  let t = 1000;
  const log = throttledWarn(logger, 'redis error', 10_000, () => t);
  // 12 s of a reconnect error every 100 ms: 120 errors.
  for (let i = 0; i < 120; i++, t += 100) log.warn({ err: `connect ECONNREFUSED (${i})` });
  assert.deepEqual(lines.map((l) => [l['msg'], l['err'], l['repeated']]), [
    ['redis error', 'connect ECONNREFUSED (0)', undefined],
    ['redis error', 'connect ECONNREFUSED (100)', 99],
  ]);
  assert.equal(lines[0]!['level'], 40);
});

test('throttledWarn – reset (the connection is back) logs the next failure at once', () => {
  const { lines, logger } = capture();
  let t = 0;
  const log = throttledWarn(logger, 'redis error', 10_000, () => t);
  log.warn({ err: 'a' });
  t += 50;
  log.warn({ err: 'b' });
  log.reset();
  t += 50;
  log.warn({ err: 'c' });
  assert.deepEqual(lines.map((l) => [l['err'], l['repeated']]), [['a', undefined], ['c', undefined]]);
});
