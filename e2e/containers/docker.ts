/**
 * Whether a container engine answers, asked the way the driver will connect: testcontainers'
 * own runtime discovery (DOCKER_HOST, ~/.testcontainers.properties, the Docker/Podman sockets).
 */
import { setTimeout as sleep } from 'node:timers/promises';

export interface EngineProbe {
  readonly ok: boolean;
  /** One line: what answered, or why nothing did. */
  readonly why: string;
}

let cached: Promise<EngineProbe> | undefined;

export function dockerAvailable(timeoutMs = 5000): Promise<EngineProbe> {
  cached ??= (async (): Promise<EngineProbe> => {
    try {
      const { getContainerRuntimeClient } = await import('testcontainers');
      const client = await Promise.race([
        getContainerRuntimeClient(),
        sleep(timeoutMs).then(() => { throw new Error(`no answer within ${timeoutMs} ms`); }),
      ]);
      return { ok: true, why: `container engine at ${client.info.containerRuntime.host}` };
    } catch (err) {
      return { ok: false, why: `no Docker engine on this machine (testcontainers: ${(err as Error).message})` };
    }
  })();
  return cached;
}
