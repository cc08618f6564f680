/**
 * An ingest whose nonce cannot be recorded, through the real core and gRPC Check (core.ts wires
 * the ingest stage's store errors): denied 503 service_unavailable, counted in
 * edge_redis_errors_total under the op that says why — `nonce_replica_wait` when Redis took the
 * nonce but no replica confirmed it within REDIS_MIN_REPLICAS' wait (ReplicaWaitError), `nonce_set`
 * when the write failed — and logged as such. Operators tell a lagging replica from a Redis outage
 * by that label (docs/operations.md); no test asserted either one before.
 *
 *   scripts/node --test authz/test/nonce-store-errors.test.ts
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { ReplicaWaitError } from '../src/common/adapters/replica-wait.ts';
import type { NonceStore } from '../src/common/ports.ts';
import { fakeMarkets, hmacHeaders } from './helpers.ts';
import { ingestBody, marketDoc } from '../../testkit/feed.ts';
import { startFixture } from './server-fixture.ts';

const now = (): number => Math.floor(Date.now() / 1000);

function redisErrors(text: string, op: string): number {
  return Number(new RegExp(`^edge_redis_errors_total\\{op="${op}"\\} ([0-9]+)$`, 'm').exec(text)?.[1] ?? 'NaN');
}

const cases: Record<string, { store: NonceStore; op: string; other: string; log: RegExp }> = {
  'no replica confirmed the nonce (ReplicaWaitError)': {
    store: { recordIfAbsent: () => Promise.reject(new ReplicaWaitError('WAIT 1 100: 0 replicas confirmed')) },
    op: 'nonce_replica_wait', other: 'nonce_set', log: /nonce not confirmed by a replica: ingest denied 503/,
  },
  'the write failed (Redis unreachable)': {
    store: { recordIfAbsent: () => Promise.reject(new Error('connect ECONNREFUSED 127.0.0.1:6379')) },
    op: 'nonce_set', other: 'nonce_replica_wait', log: /nonce store unavailable: ingest denied 503/,
  },
};

for (const [name, c] of Object.entries(cases)) {
  test(`ingest nonce store error – ${name} → 503 service_unavailable, counted as op="${c.op}" (not "${c.other}"), logged`, async () => {
    const f = await startFixture({ markets: fakeMarkets([]), nonces: c.store });
    try {
      const before = await f.core.metricsText();
      assert.deepEqual([redisErrors(before, c.op), redisErrors(before, c.other)], [0, 0]);
      const body = ingestBody(marketDoc('0xmkt-nonce-err', 1), f.feed);
      const headers = { ...hmacHeaders(body, f.hmacKey, now()), 'x-edge-client-ip': '192.0.2.10' };
      const r = await f.check({ method: 'POST', path: '/internal/ingest/market', headers, body });
      assert.deepEqual([r.status, r.error], [503, 'service_unavailable']);
      const after = await f.core.metricsText();
      assert.deepEqual([redisErrors(after, c.op), redisErrors(after, c.other)], [1, 0]);
      assert.ok(f.logs.some((l) => c.log.test(l)), f.logs.join(''));
    } finally {
      await f.close();
    }
  });
}
