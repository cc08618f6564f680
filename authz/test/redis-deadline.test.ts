/**
 * The Redis command timeout (authz/src/common/adapters/redis.ts EdgeRedis): a reply that reached
 * the socket in time is never lost to a timer that a stalled event loop ran late, and a Redis that
 * does not answer still fails the command.
 */
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { Redis } from 'ioredis';
import { createRedis } from '../src/common/adapters/redis.ts';
import { PrivateRedis } from '../../testkit/redis-server.ts';

const TIMEOUT_MS = 100;
/** The stall: ten times the timeout, so the reply (loopback, sub-millisecond) is in the socket long before it ends. */
const STALL_MS = 1000;

async function ready(client: Redis): Promise<Redis> {
  if (client.status !== 'ready') await new Promise<void>((resolve) => client.once('ready', () => resolve()));
  return client;
}

/** Sends SET, then blocks the event loop in the check phase (after the write, before the reply is read). */
async function setDuringStall(client: Redis): Promise<string> {
  const answer = client.set('edge:test:deadline', '1').then((r) => String(r), (err: unknown) => `rejected: ${String(err)}`);
  process.nextTick(() => process.nextTick(() => setImmediate(() => {
    const t0 = Date.now();
    while (Date.now() - t0 < STALL_MS) { /* a GC pause or a long callback */ }
  })));
  return answer;
}

describe('Redis command timeout', () => {
  let redis: PrivateRedis;
  before(async () => {
    redis = await PrivateRedis.start();
  });
  after(async () => {
    await redis.stop();
  });

  test('a reply that arrived during an event-loop stall longer than the timeout is taken, not timed out', async () => {
    const client = createRedis(redis.url, { commandTimeout: TIMEOUT_MS });
    try {
      await ready(client);
      assert.equal(await setDuringStall(client), 'OK');
    } finally {
      client.disconnect();
    }
  });

  test('the cause it fixes: ioredis\'s own commandTimeout fails that command although Redis answered', async () => {
    const plain = new Redis(redis.url, { commandTimeout: TIMEOUT_MS, enableOfflineQueue: false });
    plain.on('error', () => { /* the timed-out command is reported as an error event too; asserted below */ });
    try {
      await ready(plain);
      assert.equal(await setDuringStall(plain), 'rejected: Error: Command timed out');
    } finally {
      plain.disconnect();
    }
  });

  test('a Redis that does not answer (every client paused) fails the command after the timeout', async () => {
    const admin = await ready(createRedis(redis.url));
    const client = await ready(createRedis(redis.url, { commandTimeout: TIMEOUT_MS }));
    try {
      await admin.call('CLIENT', 'PAUSE', '1500', 'ALL');
      const t0 = Date.now();
      await assert.rejects(client.get('edge:test:deadline'), /Command timed out/);
      const took = Date.now() - t0;
      // Margin: at least the timeout; under the pause's 1,500 ms (one loop turn more in principle).
      assert.ok(took >= TIMEOUT_MS - 5 && took < 1500, `timed out after ${took} ms`);
    } finally {
      client.disconnect();
      admin.disconnect();
    }
  });
});
