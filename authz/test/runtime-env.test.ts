/**
 * The service's runtime settings (authz/src/common/runtime-env.ts) reach a real Node process and bound
 * what they say; every launcher that is not TypeScript carries the same values (the service
 * image's are checked on the built image by e2e/docker-build.test.ts).
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { SERVICE_RUNTIME_ENV, withServiceRuntime } from '../src/common/runtime-env.ts';
import { ROOT } from '../../deploy/paths.ts';

/** The young generation's size after 60 MB of short-lived garbage, in a process started with `env`. */
function newSpaceAfterChurn(env: NodeJS.ProcessEnv): number {
  const script = "let k=[];for(let i=0;i<2e6;i++){k.push({a:i,b:'x'+i});if(k.length>5e4)k=[]}"
    + "process.stdout.write(String(require('v8').getHeapSpaceStatistics().find(s=>s.space_name==='new_space').space_size))";
  return Number(execFileSync(join(ROOT, 'scripts/node'), ['-e', script], { env, encoding: 'utf8' }));
}

test('runtime env – a process started with it keeps its young generation within 2 × 8 MiB under churn', () => {
  const { NODE_OPTIONS: _drop, ...clean } = process.env;
  const size = newSpaceAfterChurn(withServiceRuntime(clean));
  assert.ok(size <= 2 * 8 * 1_048_576, `new space ${size} bytes`);
});

test('runtime env – an operator\'s NODE_OPTIONS is kept and comes after ours (the later flag wins); MALLOC_ARENA_MAX given is kept', () => {
  const env = withServiceRuntime({ NODE_OPTIONS: '--max-semi-space-size=32 --trace-warnings', MALLOC_ARENA_MAX: '4', X: 'y' });
  assert.equal(env['NODE_OPTIONS'], `${SERVICE_RUNTIME_ENV.NODE_OPTIONS} --max-semi-space-size=32 --trace-warnings`);
  assert.equal(env['MALLOC_ARENA_MAX'], '4');
  assert.equal(env['X'], 'y');
  assert.deepEqual(withServiceRuntime({}), { ...SERVICE_RUNTIME_ENV });
});

test('runtime env – `npm run authz` starts the service with the same settings', () => {
  const script = (JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8')) as { scripts: Record<string, string> }).scripts['authz']!;
  assert.ok(script.includes(`MALLOC_ARENA_MAX=\${MALLOC_ARENA_MAX:-${SERVICE_RUNTIME_ENV.MALLOC_ARENA_MAX}}`), script);
  assert.ok(script.includes(`NODE_OPTIONS="${SERVICE_RUNTIME_ENV.NODE_OPTIONS} \${NODE_OPTIONS:-}"`), script);
  assert.ok(script.endsWith('scripts/node authz/src/main.ts'), script);
});

test('runtime env – the service image\'s Dockerfile sets the same values (checked here without building it)', () => {
  const dockerfile = readFileSync(join(ROOT, 'deploy/Dockerfile'), 'utf8');
  const options = SERVICE_RUNTIME_ENV.NODE_OPTIONS;
  assert.ok(dockerfile.includes(options.includes(' ') ? `NODE_OPTIONS="${options}"` : `NODE_OPTIONS=${options} `), 'NODE_OPTIONS in deploy/Dockerfile');
  assert.ok(dockerfile.includes(`MALLOC_ARENA_MAX=${SERVICE_RUNTIME_ENV.MALLOC_ARENA_MAX}`), 'MALLOC_ARENA_MAX in deploy/Dockerfile');
});
