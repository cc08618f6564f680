/**
 * `npm run reliability`: the full fault scenarios (10-minute soak) through real Envoy, results
 * written to docs/reliability.md. RELIABILITY_SOAK_SECS overrides the soak length.
 */
import { writeFileSync } from 'node:fs';
import { cpus } from 'node:os';
import { fileURLToPath } from 'node:url';
import { authzKilled, backendFaults, certRotation, FULL, geoReplace, logsClean, redisDown, replays, soak, startEnv, type Row } from '../e2e/reliability/scenarios.ts';

const scale = { ...FULL, soakMs: Number(process.env['RELIABILITY_SOAK_SECS'] ?? FULL.soakMs / 1000) * 1000 };
const env = await startEnv();
const rows: Row[] = [];
const started = Date.now();
try {
  for (const run of [() => replays(env, scale), () => redisDown(env, scale), () => authzKilled(env), () => backendFaults(env), () => certRotation(env), () => geoReplace(env), () => soak(env, scale)]) {
    const row = await run();
    rows.push(row);
    process.stdout.write(`${row.scenario}: ${row.outcome} (recovery ${row.recovery})\n`);
  }
  rows.push(logsClean(env));
} finally {
  await env.stack.stop();
}
const md = `# Reliability: faults under load

Written by \`npm run reliability\` (scripts/reliability.ts) on ${new Date().toISOString().slice(0, 10)}, ${Math.round((Date.now() - started) / 1000)} s.
Machine: ${cpus().length} vCPUs (shared), Node ${process.versions.node}, Envoy 1.40.0, Redis 7 — everything on one host.
Method: the whole stack as local processes (e2e/lib/stack.ts: private redis-server, the TS service, real Envoy,
the demo mTLS order backend), load from bounded pools of HTTP clients through Envoy's port, one fault at a time
(e2e/reliability/scenarios.ts). Every row's rule is asserted; a violated rule fails the run. The short variants
(60 s soak) run in \`npm test\` (e2e/reliability.test.ts).

| scenario | load | fault | outcome | recovery |
| --- | --- | --- | --- | --- |
${rows.map((r) => `| ${r.scenario} | ${r.load} | ${r.fault} | ${r.outcome} | ${r.recovery} |`).join('\n')}
`;
writeFileSync(fileURLToPath(new URL('../docs/reliability.md', import.meta.url)), md);
process.stdout.write(md);
