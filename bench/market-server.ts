/**
 * Bench child: the market HTTP service over a Redis market store (REDIS_URL), reporting its
 * port to the parent (bench/lib/child.ts protocol). `fill` stores N signed markets.
 */
import { generateKeyPairSync } from 'node:crypto';
import { createRedis } from '../authz/src/common/adapters/redis.ts';
import { RedisMarketStore } from '../authz/src/market/redis-store.ts';
import { validateDocument } from '../authz/src/common/feed/schema.ts';
import { startMarketService } from './lib/market-service.ts';
import { serveParent } from './lib/serve-parent.ts';

const redis = createRedis(process.env['REDIS_URL'] ?? 'redis://127.0.0.1:6379/0', { commandTimeout: 5000 });
await new Promise<void>((resolve) => redis.once('ready', () => resolve()));
const store = new RedisMarketStore(redis, { cacheTtlMs: 2000 });
const { service, port } = await startMarketService(store, [generateKeyPairSync('ed25519').publicKey]);

function doc(i: number): ReturnType<typeof validateDocument> {
  return validateDocument({
    conditionId: `0x${i.toString(16).padStart(64, '0')}`, seq: 1, question: `Will market ${i} resolve yes?`, active: true, closed: false,
    minSize: '5', maxSize: '100000', tickSize: '0.01',
    outcomes: [{ tokenId: `${i}1`, name: 'Yes', bid: '0.51', ask: '0.53', last: '0.52' }, { tokenId: `${i}2`, name: 'No', bid: '0.47', ask: '0.49', last: '0.48' }],
    updatedAt: 1763700000,
  });
}

serveParent(port, {
  async fill(arg) {
    const n = Number(arg);
    // A realistic envelope size; the bench measures reads, so one signature is reused.
    const envelope = { d: Buffer.alloc(600, 1).toString('base64'), s: 'ab'.repeat(64), k: 'ed25519-sha256' as const };
    for (let i = 0; i < n; i += 1000) {
      await Promise.all(Array.from({ length: Math.min(1000, n - i) }, (_, j) => {
        const r = doc(i + j);
        if (!r.ok) throw new Error(r.message);
        return store.put(r.document, envelope);
      }));
    }
    return `0x${(Math.floor(n / 2)).toString(16).padStart(64, '0')}`;
  },
}, async () => {
  await service.close();
  await store.close();
  redis.disconnect();
});
