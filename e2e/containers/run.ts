/**
 * `npm run test:e2e:containers`: the end-to-end scenario files again, on containers
 * (E2E_DRIVER=containers, e2e/containers/stack.ts), after the local-process pass of
 * `npm run test:e2e`. Without a Docker engine it prints one line saying why and exits 0.
 *
 * The files are those whose stacks come from e2e/lib/driver.ts; start.test.ts (`npm start`) is
 * local by nature, and docker-build/compose run their containers in the first pass already.
 */
import { spawnSync } from 'node:child_process';
import { join } from 'node:path';
import { ROOT } from '../../deploy/paths.ts';
import { dockerEngine } from '../lib/images.ts';

export const CONTAINER_SCENARIO_FILES = ['edge', 'xff', 'attacks', 'load', 'schemathesis', 'reliability'].map((f) => `e2e/${f}.test.ts`);

const engine = dockerEngine();
if (!engine.ok) {
  process.stdout.write(`test:e2e:containers: skipped: ${engine.why}; the same scenarios ran on local processes\n`);
  process.exit(0);
}
process.stdout.write(`test:e2e:containers: ${engine.why}: ${CONTAINER_SCENARIO_FILES.join(' ')}\n`);
const r = spawnSync(join(ROOT, 'scripts/node'), ['--test', '--test-concurrency=1', ...CONTAINER_SCENARIO_FILES], {
  cwd: ROOT, stdio: 'inherit', env: { ...process.env, E2E_DRIVER: 'containers' },
});
process.exit(r.status ?? 1);
