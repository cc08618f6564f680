/**
 * Faults under load — the short variants (the full ones: npm run reliability). One stack, the
 * scenarios in order, each asserting what must hold; the rows are printed.
 */
import { after, before, test } from 'node:test';
import { authzKilled, backendFaults, certRotation, geoReplace, logsClean, redisDown, replays, SHORT, soak, startEnv, type Env, type Row } from './reliability/scenarios.ts';

let env: Env;
const rows: Row[] = [];
before(async () => {
  env = await startEnv();
});
after(async () => {
  for (const r of rows) process.stdout.write(`# ${r.scenario} | ${r.load} | ${r.fault} | ${r.outcome} | ${r.recovery}\n`);
  await env?.stack.stop();
});

test('reliability 1 – 10,000 replays of one signed ingest, 200 at a time → exactly 1 accepted', async () => { rows.push(await replays(env, SHORT)); });
test('reliability 2 – Redis down 10 s under ingest load → 0 acknowledged, 0 half-written, recovery ≤ 5 s', async () => { rows.push(await redisDown(env, SHORT)); });
test('reliability 3 – authz killed and restarted under load → only 503 JSON, nothing unchecked upstream, recovery ≤ 5 s', async () => { rows.push(await authzKilled(env)); });
test('reliability 4 – backend killed, slow, wrong CA → 502/504 JSON, no retries, 0 bytes to the wrong peer', async () => { rows.push(await backendFaults(env)); });
test('reliability 5 – client certificate rotated at ~500 orders/s → 0 failed orders, new certificate seen', async () => { rows.push(await certRotation(env)); });
test('reliability 6 – GeoIP replaced under load (valid, then corrupt) → 0 failed, corrupt refused and counted', async () => { rows.push(await geoReplace(env)); });
// The soak watches the TS process's RSS, sockets and answers over a minute: the same code and
// the same Node in a container as on the host, so the containers pass (npm run test:e2e:containers)
// leaves it to the local-process pass and spends its minute elsewhere.
const soakSkip = process.env['E2E_DRIVER'] === 'containers' ? 'the soak measures the TS process itself, which the local-process pass runs the same; 90 s of the containers pass saved' : false;
test('reliability 7 – 60 s soak → RSS drift < 10 %, 0 errors beyond the rate limit (and ≤ 0.5 % fail-closed Redis deadlines on a starved host), no leaked sockets', { skip: soakSkip }, async () => { rows.push(await soak(env, SHORT)); });
test('reliability 8 – after the whole run: no secret, signature, nonce or payload in any log', () => { rows.push(logsClean(env)); });
