/**
 * A /v1/geoblock answer without its `policy` (the version of the geo policy in force, which every
 * answer carries: `env-<hash>` for a policy given by settings), after checking it is one; tests
 * that compare the rest of the answer use it.
 */
import assert from 'node:assert/strict';
import { POLICY_VERSION } from '../../authz/src/common/geo-policy-file.ts';

export function sansPolicy(answer: unknown): Record<string, unknown> {
  const { policy, ...rest } = answer as Record<string, unknown>;
  assert.ok(typeof policy === 'string' && POLICY_VERSION.test(policy), `geoblock answer without a policy version: ${JSON.stringify(answer)}`);
  return rest;
}
