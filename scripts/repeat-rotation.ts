/**
 * Runs reliability scenario 5 (client certificate rotated under ~500 orders/s) back to back on
 * one stack, to measure how often it fails (docs/reliability.md, "Flakes and their causes").
 *
 *   scripts/node scripts/repeat-rotation.ts [runs=20] [--redis-pause-ms N]
 *
 * --redis-pause-ms N: during each run, Redis stops answering for N ms once a second
 * (`CLIENT PAUSE N ALL` on the stack's private redis-server), as a slow fsync or a starved host
 * would. Put other load on the machine yourself (e.g. `node -e 'for(;;){}' &`). Each failed run
 * prints the failures with their access-log lines; exit status 1 if any run failed.
 */
import { parseArgs } from 'node:util';
import { setTimeout as sleep } from 'node:timers/promises';
import { createRedis } from '../authz/src/common/adapters/redis.ts';
import { certRotation, startEnv } from '../e2e/reliability/scenarios.ts';

const { values, positionals } = parseArgs({ allowPositionals: true, options: { 'redis-pause-ms': { type: 'string' } } });
const runs = Number(positionals[0] ?? 20);
const pauseMs = Number(values['redis-pause-ms'] ?? 0);
if (!Number.isInteger(runs) || runs < 1 || !Number.isInteger(pauseMs) || pauseMs < 0) {
  process.stderr.write('usage: scripts/node scripts/repeat-rotation.ts [runs] [--redis-pause-ms N]\n');
  process.exit(2);
}

const env = await startEnv();
const redis = createRedis(env.stack.redis.url, { commandTimeout: undefined });
if (redis.status !== 'ready') await new Promise((resolve) => redis.once('ready', resolve));
let failed = 0;
let pauses = 0;
try {
  for (let i = 1; i <= runs; i++) {
    let running = true;
    const pausing = (async () => {
      while (pauseMs > 0 && running) {
        await sleep(1000);
        if (!running) break;
        await redis.call('CLIENT', 'PAUSE', String(pauseMs), 'ALL');
        pauses++;
      }
    })();
    const t0 = Date.now();
    try {
      const row = await certRotation(env);
      process.stdout.write(`run ${i}: ok, ${row.outcome} (${Date.now() - t0} ms)\n`);
    } catch (err) {
      failed++;
      process.stdout.write(`run ${i}: FAILED ${(err as Error).message}\n`);
    } finally {
      running = false;
      await pausing;
    }
  }
} finally {
  process.stdout.write(`${failed} of ${runs} runs failed${pauseMs > 0 ? `; Redis paused ${pauses} × ${pauseMs} ms` : ''}\n`);
  redis.disconnect();
  await env.stack.stop();
}
process.exit(failed > 0 ? 1 : 0);
