/**
 * The short variant of reliability scenario 9 (the full one: npm run reliability): the Redis
 * master is SIGKILLed under signed-ingest load through Envoy, after its replicas lagged for 1 s,
 * with REDIS_URL=redis+sentinel://… and REDIS_MIN_REPLICAS=1 — a master, two replicas and three
 * Sentinels as real processes on loopback. Afterwards no acknowledged ingest is missing and no
 * acknowledged nonce is accepted again (with REDIS_MIN_REPLICAS=0 the same procedure loses both:
 * scripts/reliability.ts runs it, authz/test/replica-wait.test.ts proves it on the stores).
 */
import { test } from 'node:test';
import { FAILOVER_SHORT, sentinelFailover } from './reliability/failover.ts';

test('Sentinel failover under ingest load, REDIS_MIN_REPLICAS=1 → 0 acknowledged ingests missing, 0 acknowledged nonces accepted again, recovery reported', async () => {
  const r = await sentinelFailover(1, FAILOVER_SHORT);
  process.stdout.write(`# ${r.row.scenario} | ${r.row.fault} | ${r.row.outcome} | ${r.row.recovery}\n`);
});
