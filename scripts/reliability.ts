/**
 * `npm run reliability`: the full fault scenarios (10-minute soak) through real Envoy, then the
 * scale-out ones (Sentinel failovers, the global rate limit across two edges), results written to
 * docs/reliability.md ("Faults under load" and "Scaling out", each rewritten only by its own run).
 * RELIABILITY_SOAK_SECS overrides the soak length; RELIABILITY_ONLY=faults | scale runs one section.
 */
import { cpus } from 'node:os';
import { fileURLToPath } from 'node:url';
import { writeSection } from '../bench/lib/markdown-section.ts';
import { authzKilled, backendFaults, certRotation, FULL, geoReplace, logsClean, redisDown, replays, soak, startEnv, type Row } from '../e2e/reliability/scenarios.ts';
import { FAILOVER_FULL, sentinelFailover } from '../e2e/reliability/failover.ts';
import { GLOBAL_FULL, globalRateLimit, startTwoEdges } from '../e2e/reliability/global-rate-limit.ts';

const scale = { ...FULL, soakMs: Number(process.env['RELIABILITY_SOAK_SECS'] ?? FULL.soakMs / 1000) * 1000 };
// RELIABILITY_ONLY=faults | scale runs one of the two sections (each rewrites only its own).
const only = process.env['RELIABILITY_ONLY'] ?? '';
if (!['', 'faults', 'scale'].includes(only)) throw new Error(`RELIABILITY_ONLY: expected faults or scale, got ${JSON.stringify(only)}`);
const DOC = fileURLToPath(new URL('../docs/reliability.md', import.meta.url));
const machine = `Machine: ${cpus().length} vCPUs (shared), Node ${process.versions.node}, Envoy 1.40.0, Redis 7 — everything on one host.`;
const table = (rows: readonly Row[]): string => `| scenario | load | fault | outcome | recovery |
| --- | --- | --- | --- | --- |
${rows.map((r) => `| ${r.scenario} | ${r.load} | ${r.fault} | ${r.outcome} | ${r.recovery} |`).join('\n')}
`;
const report = (row: Row): void => {
  process.stdout.write(`${row.scenario}: ${row.outcome} (recovery ${row.recovery})\n`);
};

if (only !== 'scale') {
  const env = await startEnv();
  const rows: Row[] = [];
  const started = Date.now();
  try {
    for (const run of [() => replays(env, scale), () => redisDown(env, scale), () => authzKilled(env), () => backendFaults(env), () => certRotation(env), () => geoReplace(env), () => soak(env, scale)]) {
      const row = await run();
      rows.push(row);
      report(row);
    }
    rows.push(logsClean(env));
  } finally {
    await env.stack.stop();
  }
  const md = `Written by \`npm run reliability\` (scripts/reliability.ts) on ${new Date().toISOString().slice(0, 10)}, ${Math.round((Date.now() - started) / 1000)} s.
${machine}
Method: the whole stack as local processes (e2e/lib/stack.ts: private redis-server, the TS service, real Envoy,
the demo mTLS order backend), load from bounded pools of HTTP clients through Envoy's port, one fault at a time
(e2e/reliability/scenarios.ts). Every row's rule is asserted; a violated rule fails the run. The short variants
(60 s soak) run in \`npm test\` (e2e/reliability.test.ts).

${table(rows)}`;
  // Only this section: "Hostile input" below it is kept by hand beside e2e/attacks.test.ts.
  writeSection(DOC, '## Faults under load', md, '# Reliability');
  process.stdout.write(md);
}

if (only !== 'faults') {
  const rows: Row[] = [];
  const started = Date.now();
  // Sentinel failovers, each on a deployment and stack of its own (e2e/reliability/failover.ts): the
  // replicas lagging 1 s before the kill with and without replica confirmations, then a plain kill.
  for (const [n, minReplicas, lagMs] of [[9, 1, FAILOVER_FULL.lagMs], [10, 0, FAILOVER_FULL.lagMs], [11, 1, 0]] as const) {
    const { row } = await sentinelFailover(minReplicas, { ...FAILOVER_FULL, lagMs }, n);
    rows.push(row);
    report(row);
  }
  // The global rate limit across two edges (two Envoys, two TS services) on one Redis (row 12).
  const two = await startTwoEdges();
  try {
    const row = await globalRateLimit(two, GLOBAL_FULL);
    rows.push(row);
    report(row);
  } finally {
    await two.stop();
  }
  const md = `Written by \`npm run reliability\` (scripts/reliability.ts; \`RELIABILITY_ONLY=scale\` runs this section alone) on ${new Date().toISOString().slice(0, 10)}, ${Math.round((Date.now() - started) / 1000)} s.
${machine}
Method: rows 9–11 run the stack of "Faults under load" with REDIS_URL=redis+sentinel:// on a master, two replicas and
three Sentinels of their own (testkit/sentinel.ts, e2e/reliability/failover.ts; short variant: e2e/failover.test.ts);
row 10 must lose acknowledgements, or the procedure would prove nothing. Row 12 runs two complete edges (two Envoys,
two TS services) on one redis-server, a client alternating between them (e2e/reliability/global-rate-limit.ts; short
variant: e2e/global-rate-limit.test.ts). Every row's rule is asserted; a violated rule fails the run.

${table(rows)}`;
  writeSection(DOC, '## Scaling out: Sentinel failover and the global rate limit', md, '# Reliability');
  process.stdout.write(md);
}
