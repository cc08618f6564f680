/**
 * Picks the e2e driver: local processes (default) or containers (E2E_DRIVER=containers,
 * needs a Docker engine). Scenario files import startStack from here.
 */
import { CONTAINER_TRUSTED_CIDRS } from '../containers/definitions.ts';
import { startStack as startLocal, type Stack, type StackOptions } from './stack.ts';

export type { Stack, StackOptions };

/**
 * CIDRs covering the TCP peer Envoy sees for this process's requests: loopback with local
 * processes; the Docker network's gateway with containers (e2e/containers/definitions.ts).
 * Scenarios that trust "the proxy" (a load balancer in front) trust these.
 */
export const PEER_CIDRS = process.env['E2E_DRIVER'] === 'containers' ? CONTAINER_TRUSTED_CIDRS : '127.0.0.0/8,::1/128';

export async function startStack(opts: StackOptions = {}): Promise<Stack> {
  if (process.env['E2E_DRIVER'] === 'containers') {
    const { startContainerStack } = await import('../containers/stack.ts');
    return startContainerStack(opts);
  }
  return startLocal(opts);
}
