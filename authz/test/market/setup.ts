/**
 * What the market store and service tests on real Redis set up alike: one feed key, validated
 * market documents and their signed envelopes, and a RedisMarketStore whose caches are on.
 */
import assert from 'node:assert/strict';
import { setTimeout as sleep } from 'node:timers/promises';
import type { Redis } from 'ioredis';
import { createRedis } from '../../src/common/adapters/redis.ts';
import { RedisMarketStore } from '../../src/market/redis-store.ts';
import { validateDocument, type MarketDocument } from '../../src/common/feed/schema.ts';
import { envelopeFor, marketDoc, newFeedKey } from '../../../testkit/feed.ts';

/** The feed key of this test process. */
export const feed = newFeedKey();

/** marketDoc as the store takes it (validated). */
export function doc(id: string, seq: number, extra: Record<string, unknown> = {}): MarketDocument {
  const r = validateDocument(marketDoc(id, seq, extra));
  assert.ok(r.ok);
  return r.document;
}

/** A document's envelope signed with `feed`. */
export const env = (d: object) => envelopeFor(d, feed) as { d: string; s: string; k: 'ed25519-sha256' };

/** A new connection to `url`, once ready. */
export async function connectRedis(url: string): Promise<Redis> {
  const r = createRedis(url);
  await new Promise<void>((res) => r.once('ready', () => res()));
  return r;
}

/**
 * A RedisMarketStore on a new connection, once its caches are on: they switch on when the
 * invalidation subscription has taken effect (bounded wait: a busy machine can take longer than
 * the few ms this usually needs).
 */
export async function cachingStore(url: string, cacheTtlMs: number): Promise<{ redis: Redis; store: RedisMarketStore }> {
  const redis = await connectRedis(url);
  const store = new RedisMarketStore(redis, { cacheTtlMs });
  for (const end = Date.now() + 5_000; !store.caching && Date.now() < end;) await sleep(10);
  assert.ok(store.caching, 'the store subscribed to invalidations within 5 s');
  return { redis, store };
}
