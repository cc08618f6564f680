/**
 * Envoy's memory budget (envoy/render/budget.ts): the descriptor cap, the connection cap, the
 * overload manager's heap bound and thresholds and the container limit add up, read back from
 * bootstraps the renderer wrote; and a budget that does not add up is refused, naming why.
 * (deploy/test/k8s.test.ts applies the same check to the rendered Kubernetes pod.)
 *
 *   scripts/node --test envoy/test/budget.test.ts
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { parse } from 'yaml';
import { ENVOY_NON_HEAP_MB, loadConfig, type Env } from '../../authz/src/common/config.ts';
import { renderEnvoy } from '../render.ts';
import {
  budgetOfBootstrap, ENVOY_POD_CPUS, ENVOY_UNIT_COSTS, envoyBudget, LOCAL_RATE_LIMIT_DESCRIPTOR_CAP, MAX_DOWNSTREAM_CONNECTIONS,
  MEMORY_THRESHOLDS, requiredEnvoyMemoryLimitMb, type EnvoyBudgetInput,
} from '../render/budget.ts';

const MIB = 1_048_576;

/** The budget input of what the renderer writes for `env` (one Envoy CPU, the settings' refill time). */
function rendered(env: Env, cpus = ENVOY_POD_CPUS): EnvoyBudgetInput {
  const config = loadConfig(env);
  const bootstrap = parse(renderEnvoy(config, { sdsPath: '/etc/envoy/sds.yaml' }).bootstrap) as Record<string, unknown>;
  return {
    ...budgetOfBootstrap(bootstrap as never),
    memoryLimitMb: config.envoyMemoryLimitMb,
    envoyCpus: cpus,
    refillSecs: Math.max(config.rateBurst / config.rpsPerIp, config.prefixBurst / config.rpsPerPrefix),
  };
}

test('budget: read back from a rendered bootstrap — the cap on each of the three descriptor LRUs, the connection cap, the heap bound and every memory threshold', () => {
  const i = rendered({ ENVOY_MEMORY_LIMIT_MB: '448' });
  assert.equal(i.descriptorCap, LOCAL_RATE_LIMIT_DESCRIPTOR_CAP);
  assert.equal(i.descriptorLrus, 3, 'IPv4 clients, IPv6 /64s, IPv6 prefixes');
  assert.equal(i.maxConnections, MAX_DOWNSTREAM_CONNECTIONS);
  assert.equal(i.maxHeapBytes, (448 - ENVOY_NON_HEAP_MB) * MIB);
  assert.deepEqual([...i.thresholds].sort(), [...MEMORY_THRESHOLDS].sort());
  // RATE_PREFIX_V6=64: no prefix bucket, two LRUs.
  assert.equal(rendered({ RATE_PREFIX_V6: '64' }).descriptorLrus, 2);
});

test('budget: the shipped caps add up at the derived container limit (448 MiB), with the spare stated, and the default 1024 MiB too', () => {
  assert.equal(requiredEnvoyMemoryLimitMb(), 448);
  for (const limit of [requiredEnvoyMemoryLimitMb(), 1024]) {
    const b = envoyBudget(rendered({ ENVOY_MEMORY_LIMIT_MB: String(limit) }));
    assert.deepEqual(b.problems, [], `${limit} MiB`);
    assert.ok(b.spareBytes >= 0);
    assert.equal(b.standingBytes, ENVOY_UNIT_COSTS.baseHeapBytes + 3 * LOCAL_RATE_LIMIT_DESCRIPTOR_CAP * ENVOY_UNIT_COSTS.descriptorBytes
      + MAX_DOWNSTREAM_CONNECTIONS * ENVOY_UNIT_COSTS.connectionBytes);
  }
  // One step (64 MiB) smaller does not: the derived limit is the smallest that adds up.
  assert.notDeepEqual(envoyBudget(rendered({ ENVOY_MEMORY_LIMIT_MB: String(requiredEnvoyMemoryLimitMb() - 64) })).problems, []);
});

test('budget: the pod as it was (256 MiB, 200,000 descriptors per LRU) does not add up: the standing heap is named', () => {
  const was = { ...rendered({ ENVOY_MEMORY_LIMIT_MB: '256' }), descriptorCap: 200_000 };
  const b = envoyBudget(was);
  assert.equal(b.problems.length, 1);
  assert.match(b.problems[0]!, /standing heap .* 3 × 200000 descriptors .* exceeds the first memory action/);
  // Three full LRUs alone are more than the whole container.
  assert.ok(b.descriptorsBytes > 256 * MIB);
  // The shipped caps at 256 MiB do not add up either.
  assert.match(envoyBudget(rendered({ ENVOY_MEMORY_LIMIT_MB: '256' })).problems.join('\n'), /exceeds the first memory action/);
});

test('budget: an overload threshold at or over the heap bound, and a heap bound over the container limit, are refused', () => {
  const ok = rendered({ ENVOY_MEMORY_LIMIT_MB: '448' });
  assert.match(envoyBudget({ ...ok, thresholds: [...ok.thresholds, 1] }).problems.join('\n'), /threshold 1 is not under the heap bound/);
  assert.match(envoyBudget({ ...ok, maxHeapBytes: 448 * MIB }).problems.join('\n'), /exceeds the container limit 448 MiB/);
});

test('budget: a descriptor cap under the clients one Envoy meets within a refill is refused (a bucket still refilling could be evicted)', () => {
  // RATE_BURST 200 at 20/s: 10 s to refill, 25,000 new clients/s per CPU → 250,000 needed.
  const slow = rendered({ ENVOY_MEMORY_LIMIT_MB: '448', RATE_BURST: '200' });
  assert.equal(slow.refillSecs, 10);
  const b = envoyBudget(slow);
  assert.equal(b.descriptorsNeeded, 250_000);
  assert.match(b.problems.join('\n'), /descriptor cap 50000 is under the 250000 clients 1 Envoy CPU\(s\) can meet within a 10 s refill/);
  // Two Envoy CPUs at the default 2 s: 100,000 needed.
  assert.match(envoyBudget({ ...rendered({ ENVOY_MEMORY_LIMIT_MB: '448' }), envoyCpus: 2 }).problems.join('\n'), /under the 100000 clients 2 Envoy CPU/);
  // The defaults: 25,000 × 2 s = 50,000, the cap.
  assert.equal(envoyBudget(rendered({ ENVOY_MEMORY_LIMIT_MB: '448' })).descriptorsNeeded, LOCAL_RATE_LIMIT_DESCRIPTOR_CAP);
});
