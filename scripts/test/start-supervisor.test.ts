/**
 * npm start's supervisor (scripts/start/supervisor.ts) on its own, with real child processes:
 * once the stack is ready a TS service, Redis or demo backend that exits is restarted with a
 * doubling delay (0.5 s, 1 s, 2 s, … at most 5 s); Envoy's exit, or any exit while starting, stops
 * the stack; a child that ignores SIGTERM is killed. Assertions are on what is said and done, in
 * order, never on how long it took.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { setTimeout as sleep } from 'node:timers/promises';
import { Supervisor, type Name, type Service } from '../start/supervisor.ts';

interface Harness { readonly supervisor: Supervisor; readonly said: string[]; readonly output: string[]; readonly exited: Promise<number>; afterStops: number }

function harness(opts: { sealed?: boolean } = {}): Harness {
  const said: string[] = [];
  const output: string[] = [];
  let exit = (_code: number): void => undefined;
  const exited = new Promise<number>((resolve) => { exit = resolve; });
  const h: Harness = {
    said, output, exited, afterStops: 0,
    supervisor: new Supervisor({
      say: (m) => said.push(m),
      emit: (_stream, chunk) => output.push(Buffer.from(chunk).toString()),
      sealed: () => opts.sealed === true,
      sealedNote: () => 'the stack is SEALED',
      afterStop: () => { h.afterStops++; },
      exit: (code) => exit(code),
    }),
  };
  return h;
}

/** A child running `code` under Node, ready when its probe says so. */
function service(name: Name, code: string, label = `svc-${name}`): Service {
  return { name, label, cmd: process.execPath, args: ['-e', code], env: {}, ready: () => Promise.resolve({ ok: true, answer: 'up' }), delayMs: 500, restarts: 0 };
}

async function until(what: string, cond: () => boolean): Promise<void> {
  for (let i = 0; i < 600 && !cond(); i++) await sleep(50);
  assert.ok(cond(), `timed out waiting for: ${what}`);
}

test('supervisor – a child that keeps exiting once the stack is ready is restarted after 0.5 s, 1 s, 2 s', async () => {
  const h = harness();
  h.supervisor.supervising = true;
  const svc = service('backend', 'process.exit(3)');
  h.supervisor.add(svc);
  const restarting = (): string[] => h.said.filter((m) => m.includes('restarting'));
  await until('three restarts', () => restarting().length >= 3);
  void h.supervisor.stop(0);
  assert.equal(await h.exited, 0);
  assert.deepEqual(restarting().slice(0, 3), [
    'svc-backend exited (code 3); restarting it in 0.5 s (restart 1)',
    'svc-backend exited (code 3); restarting it in 1 s (restart 2)',
    'svc-backend exited (code 3); restarting it in 2 s (restart 3)',
  ]);
  assert.ok(h.said.some((m) => /^svc-backend is back \(pid \d+\)$/.test(m)), h.said.join('\n'));
  assert.equal(h.afterStops, 1);
});

test('supervisor – the restart delay doubles up to 5 s, never more', async () => {
  const h = harness();
  h.supervisor.supervising = true;
  const svc = { ...service('redis', 'process.exit(1)'), delayMs: 4000 };
  h.supervisor.add(svc);
  await until('the exit', () => svc.restarts === 1);
  assert.equal(h.said.at(-1), 'svc-redis exited (code 1); restarting it in 4 s (restart 1)');
  assert.equal(svc.delayMs, 5000);
  void h.supervisor.stop(0); // clears the pending restart
  assert.equal(await h.exited, 0);
  assert.equal(svc.restarts, 1);
});

test('supervisor – the TS service exiting while sealed says it comes back sealed', async () => {
  const h = harness({ sealed: true });
  h.supervisor.supervising = true;
  h.supervisor.add(service('authz', 'process.exit(0)', 'the TS service'));
  await until('the note', () => h.said.includes('the stack is SEALED'));
  assert.deepEqual(h.said.slice(0, 2), ['the TS service exited (code 0); restarting it in 0.5 s (restart 1)', 'the stack is SEALED']);
  await until('back', () => h.said.some((m) => m.endsWith(', SEALED')));
  void h.supervisor.stop(0);
  await h.exited;
});

const stopsTheStack: Record<string, { name: Name; supervising: boolean }> = {
  'Envoy exiting, even once the stack is ready': { name: 'envoy', supervising: true },
  'a child exiting while the stack starts': { name: 'backend', supervising: false },
};
for (const [name, tc] of Object.entries(stopsTheStack)) {
  test(`supervisor – ${name} stops the stack with exit code 1`, async () => {
    const h = harness();
    h.supervisor.supervising = tc.supervising;
    h.supervisor.add(service(tc.name, 'process.exit(7)', 'the child'));
    assert.equal(await h.exited, 1);
    assert.equal(h.said[0], 'the child exited (code 7); stopping the stack');
    assert.equal(h.said[1], 'stopping: Envoy stops taking requests, the TS service seals and drains, then the backend and Redis stop');
    assert.match(h.said[2] ?? '', /^stopped in \d+\.\d s$/);
    assert.equal(h.afterStops, 1);
    assert.equal(h.supervisor.stopping, true);
  });
}

test('supervisor – a child\'s output is passed through; a child that ignores SIGTERM is killed after the grace', async () => {
  const h = harness();
  const svc = service('backend', "process.on('SIGTERM', () => console.log('ignored')); console.log('listening'); setInterval(() => {}, 1000)");
  h.supervisor.add(svc);
  await until('its output', () => h.output.join('').includes('listening'));
  const pid = svc.run?.proc.pid ?? 0;
  await h.supervisor.halt(svc, 300);
  assert.equal(h.said[0], 'svc-backend did not stop within 0.3 s; killing it');
  assert.throws(() => process.kill(pid, 0), /ESRCH/, 'the child is gone');
  assert.equal(svc.run, undefined);
  // Not supervising (the stack was starting): its exit stops the stack.
  assert.equal(await h.exited, 1);
  assert.equal(h.said[1], 'svc-backend exited (signal SIGKILL); stopping the stack');
});

test('supervisor – a child that cannot be started is said so, and stops a starting stack', async () => {
  const h = harness();
  h.supervisor.add({ ...service('redis', ''), cmd: '/nonexistent/redis-server' });
  assert.equal(await h.exited, 1);
  assert.match(h.said[0] ?? '', /^svc-redis exited \(could not start: spawn \/nonexistent\/redis-server ENOENT\); stopping the stack$/);
});

test('supervisor – waitFor: the last probe\'s outcome when none passes in time, the passing one otherwise', async () => {
  const h = harness();
  let n = 0;
  const probe = (): Promise<{ ok: boolean; answer: string }> => Promise.resolve({ ok: ++n >= 3, answer: `try ${n}` });
  assert.deepEqual(await h.supervisor.waitFor(probe, 10_000), { ok: true, answer: 'try 3' });
  assert.deepEqual(await h.supervisor.waitFor(() => Promise.resolve({ ok: false, answer: 'no' }), 250), { ok: false, answer: 'no' });
});
