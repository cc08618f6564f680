/**
 * Picks the e2e driver: local processes (default) or containers (E2E_DRIVER=containers,
 * needs a Docker engine). Scenario files import startStack from here.
 */
import { startStack as startLocal, type Stack, type StackOptions } from './stack.ts';

export type { Stack, StackOptions };

export async function startStack(opts: StackOptions = {}): Promise<Stack> {
  if (process.env['E2E_DRIVER'] === 'containers') {
    const { startContainerStack } = await import('../containers/stack.ts');
    return startContainerStack(opts);
  }
  return startLocal(opts);
}
