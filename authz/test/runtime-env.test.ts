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
import { HEAP_GROWING_PERCENT, SERVICE_RUNTIME_ENV, withServiceRuntime } from '../src/common/runtime-env.ts';
import { ROOT } from '../../deploy/paths.ts';
import { ServiceChild } from './service-child.ts';

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

/** The environment without an inherited NODE_OPTIONS (the test runner's own must not count). */
function cleanEnv(): NodeJS.ProcessEnv {
  const { NODE_OPTIONS: _drop, ...clean } = process.env;
  return clean;
}

test('runtime env – a process started with it has a 256-MiB old generation whatever the machine\'s memory (Node sizes it from the host\'s or the container\'s)', () => {
  const limit = (env: NodeJS.ProcessEnv): number => Number(execFileSync(join(ROOT, 'scripts/node'), ['-p', "require('v8').getHeapStatistics().heap_size_limit"], { env, encoding: 'utf8' }));
  const mib = limit(withServiceRuntime(cleanEnv())) / 1_048_576;
  // heap_size_limit = the old generation's 256 MiB + the young generation's (a few MiB).
  assert.ok(mib >= 256 && mib <= 300, `heap_size_limit ${mib.toFixed(0)} MiB`);
});

/**
 * Full collections in a child process with the service's heap limit that keeps ~20 MB live and
 * promotes garbage (arrays of 300,000 small objects that outlive two scavenges), with or without
 * applyHeapGrowth() first. Deterministic allocation; the count varies by a few between runs.
 */
function fullCollections(growth: boolean): number {
  const runtimeEnv = join(ROOT, 'authz/src/common/runtime-env.ts');
  const script = `${growth ? `(await import(${JSON.stringify(runtimeEnv)})).applyHeapGrowth();` : ''}
    const { PerformanceObserver, constants } = await import('node:perf_hooks');
    let majors = 0;
    new PerformanceObserver((l) => { for (const e of l.getEntries()) if (e.detail.kind === constants.NODE_PERFORMANCE_GC_MAJOR) majors++; }).observe({ entryTypes: ['gc'] });
    const live = []; for (let i = 0; i < 200000; i++) live.push({ i, s: 'v' + i });
    let keep = []; for (let i = 0; i < 6e6; i++) { keep.push({ a: i, b: [i, i + 1] }); if (keep.length > 300000) keep = []; }
    setTimeout(() => process.stdout.write(String(majors) + ' ' + live.length), 200);`;
  const out = execFileSync(join(ROOT, 'scripts/node'), ['--input-type=module', '-e', script], { env: withServiceRuntime(cleanEnv()), encoding: 'utf8' });
  return Number(out.split(' ')[0]);
}

test('runtime env – applyHeapGrowth: with the 256-MiB heap, promoted garbage starts far fewer full collections (V8 alone grows the old generation by ~1.1–1.3×)', () => {
  const without = fullCollections(false);
  const withGrowth = fullCollections(true);
  // Measured here: 39–44 without, 25–27 with (×2). The bound allows 0.8×: a margin of ~12 collections.
  assert.ok(without >= 10, `the workload must promote enough to start full collections: ${without}`);
  assert.ok(withGrowth <= 0.8 * without, `${withGrowth} full collections with ×${1 + HEAP_GROWING_PERCENT / 100} growth, ${without} without`);
});

test('runtime env – the service started with it reports its heap limit (read from V8) and growth factor in its ready line', async () => {
  const svc = await ServiceChild.start({ ...SERVICE_RUNTIME_ENV, REDIS_URL: '', LOG_LEVEL: 'info' });
  try {
    assert.ok(await svc.ready(), svc.out());
    const ready = svc.out().split('\n').filter((l) => l.startsWith('{')).map((l) => JSON.parse(l) as Record<string, unknown>).find((l) => l['msg'] === 'edge authz ready');
    assert.ok(ready !== undefined, svc.out());
    const mib = Number(ready['heapLimitMb']);
    assert.ok(mib >= 256 && mib <= 300, `heapLimitMb ${String(ready['heapLimitMb'])}`);
    assert.equal(ready['heapGrowingPercent'], HEAP_GROWING_PERCENT);
  } finally {
    svc.kill();
    await svc.exited;
  }
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
