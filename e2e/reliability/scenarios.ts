/**
 * The eight fault scenarios. Each drives load through Envoy, injects one fault, asserts what
 * must hold (throws otherwise) and returns a row for docs/reliability.md.
 * `scale` 1 = the short variants of `npm test`; the full run (`npm run reliability`) uses more.
 */
import assert from 'node:assert/strict';
import { X509Certificate } from 'node:crypto';
import { copyFileSync, readFileSync, renameSync } from 'node:fs';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { geoFixtures } from '../../testkit/geo-fixtures.ts';
import { issue, publishClientCert } from '../../scripts/dev/certs.ts';
import { startStack, type Stack } from '../lib/driver.ts';
import { ingest } from '../lib/client.ts';
import { count, drive, explainFailures, hit, metric, openFds, orderFor, recoveryMs, rssKb, uniqueIngest, type Outcome } from './harness.ts';
import { removeTempDir, tempDir } from '../../testkit/temp-dir.ts';

export interface Row { scenario: string; load: string; fault: string; outcome: string; recovery: string }
export interface Scale { replays: number; redisDownMs: number; soakMs: number }
export const SHORT: Scale = { replays: 10_000, redisDownMs: 10_000, soakMs: 60_000 };
export const FULL: Scale = { replays: 10_000, redisDownMs: 10_000, soakMs: 600_000 };

const CLIENT = { 'x-forwarded-for': '203.0.113.10' }; // CA in both test GeoIP databases: allowed
const JSONH = { ...CLIENT, 'content-type': 'application/json' };

export interface Env { stack: Stack; market: string; geoFile: string; secrets: string[] }

export async function startEnv(): Promise<Env> {
  const dir = tempDir('edge-rel-geo-');
  const geoFile = join(dir, 'country.mmdb');
  copyFileSync(geoFixtures().geoip2, geoFile);
  const stack = await startStack({
    geoipDb: geoFile,
    env: {
      XFF_NUM_TRUSTED_HOPS: '1', BLOCKED_COUNTRIES: 'KP,CU', RPS_PER_IP: '1000000', RATE_BURST: '1000000',
      GEOIP_RELOAD_INTERVAL_MS: '200', ORDER_BACKEND_MAX_CONN_SECS: '2', ORDER_BACKEND_TIMEOUT_MS: '1000', LOG_LEVEL: 'info',
      // One address stands for the whole feed here, 200 ingests at a time (and replays of them): the
      // pending-body bound per client is the attack suite's (e2e/attacks.test.ts, default 8).
      INGEST_MAX_PENDING_PER_CLIENT: '10000',
    },
  }).catch((err: unknown) => {
    removeTempDir(dir);
    throw err;
  });
  // The database's directory goes with the stack.
  const stopStack = stack.stop.bind(stack);
  stack.stop = async () => {
    await stopStack();
    removeTempDir(dir);
  };
  const market = `0xrel-${Date.now()}`;
  const r = await ingest(stack, market, 1, {}, '203.0.113.10');
  assert.equal(r.status, 200, r.text);
  return { stack, market, geoFile, secrets: [stack.hmacKey.toString('hex')] };
}

function onlyJsonErrors(outcomes: readonly Outcome[], allowed: readonly number[]): void {
  for (const o of outcomes) {
    if (o.status === 200) continue;
    assert.ok(allowed.includes(o.status), `${o.kind}: unexpected status ${o.status} ${o.body}`);
    assert.ok(o.json, `${o.kind} ${o.status}: not JSON: ${o.body}`);
  }
}

export async function replays(env: Env, scale: Scale): Promise<Row> {
  const s = uniqueIngest(env.stack, '0xreplay');
  env.secrets.push(s.headers['x-edge-signature']!.slice(3), s.headers['x-edge-nonce']!);
  const out = await drive(() => hit(env.stack, 'replay', 'POST', '/internal/ingest/market', s.body, { ...CLIENT, ...s.headers }), { concurrency: 200, durationMs: 120_000, maxRequests: scale.replays });
  const c = count(out);
  assert.equal(out.length, scale.replays);
  const other = out.filter((o) => o.status !== 200 && o.status !== 401);
  const why = other.length === 0 ? '' : `\n${await explainFailures(env.stack, other)}`;
  assert.equal(c['replay:200'], 1, JSON.stringify(c) + why);
  // Every other answer refuses: 401 ingest_replay, or 503 when the nonce store did not answer
  // within its 250-ms deadline (fail closed: seen on a 2-core host at load ~12, 214 of 10,000,
  // Redis itself starved of CPU). More than 5 % of those would be a regression, not the host.
  const refusedReplay = out.filter((o) => o.status === 401 && o.json && o.body.includes('"error":"ingest_replay"')).length;
  const failedClosed = out.filter((o) => o.status === 503 && o.json && o.body.includes('"error":"service_unavailable"')).length;
  assert.equal(refusedReplay + failedClosed, scale.replays - 1, JSON.stringify(c) + why);
  assert.ok(failedClosed <= scale.replays * 0.05, `${failedClosed} answered 503 (nonce store deadline)${why}`);
  return { scenario: '1. replays of one signed ingest', load: `${scale.replays} requests, 200 at a time`, fault: 'the same nonce every time', outcome: `200: ${c['replay:200']}, 401 ingest_replay: ${refusedReplay}${failedClosed === 0 ? '' : `, 503 service_unavailable (the nonce store's deadline, failed closed): ${failedClosed}`}`, recovery: '–' };
}

export async function redisDown(env: Env, scale: Scale): Promise<Row> {
  const pidsBefore = env.stack.pids();
  const stored = new Map<string, Outcome>();
  const sent: { id: string; o: Outcome }[] = [];
  let stopAt = 0;
  let resumeAt = 0;
  const load = drive(async () => {
    const s = uniqueIngest(env.stack, '0xredis');
    const o = await hit(env.stack, 'ingest', 'POST', '/internal/ingest/market', s.body, { ...CLIENT, ...s.headers });
    sent.push({ id: s.id, o });
    if (o.status === 200) stored.set(s.id, o);
    return o;
  }, { concurrency: 8, durationMs: scale.redisDownMs + 8000, rps: 200 });
  const reads = drive(() => hit(env.stack, 'read', 'GET', `/v1/markets?conditionId=${env.market}`, undefined, CLIENT), { concurrency: 2, durationMs: scale.redisDownMs + 8000, rps: 50 });
  await sleep(2000);
  stopAt = Date.now();
  await env.stack.redis.stop();
  await sleep(scale.redisDownMs);
  await env.stack.redis.resume();
  resumeAt = Date.now();
  const out = [...(await load), ...(await reads)];
  // Requests that started after Redis was gone and ended before it returned: none acknowledged.
  // 300 ms after the kill: a request started just before it may still have reached Redis.
  const during = out.filter((o) => o.kind === 'ingest' && o.startedAt > stopAt + 300 && o.endedAt < resumeAt);
  // ~200/s for the 10 s down (measured 1942): 50 only proves there was load.
  assert.ok(during.length > 50, `load while down: ${during.length}`);
  assert.equal(during.filter((o) => o.status === 200).length, 0, 'an ingest was acknowledged while Redis was down');
  onlyJsonErrors(out, [503, 504]);
  // 504 backend_timeout = the write went out and Redis died before answering (outcome unknown):
  // only the ingests in flight at the kill, never a read.
  const unknown = out.filter((o) => o.status === 504);
  assert.ok(unknown.every((o) => o.kind === 'ingest' && o.json && o.body.includes('"error":"backend_timeout"') && o.startedAt <= stopAt + 300), 'a 504 other than an ingest in flight at the kill');
  assert.ok(unknown.length <= 8, `${unknown.length} outcome-unknown ingests; at most the 8 in flight`);
  const rec = recoveryMs(out, 'ingest', resumeAt);
  // The promised bound; measured 480 ms (docs/reliability.md): ~10× margin.
  assert.ok(rec !== undefined && rec <= 5000, `recovery ${rec} ms`);
  // Nothing half-written: every acknowledged ingest is readable; no rejected one appears.
  const ids = sent.map((s) => s.id);
  const found = new Set<string>();
  // At most 100 ids a query (docs/api.md "Limits").
  for (let i = 0; i < ids.length; i += 100) {
    const res = await fetch(`${env.stack.edgeUrl}/v1/markets?limit=500&conditionId=${ids.slice(i, i + 100).join(',')}`, { headers: CLIENT });
    assert.equal(res.status, 200);
    for (const m of ((await res.json()) as { markets: { conditionId: string }[] }).markets) found.add(m.conditionId);
  }
  for (const id of stored.keys()) assert.ok(found.has(id), `acknowledged ${id} not stored`);
  // Every rejection is the truth: a 503 (or any answer but 200 and the outcome-unknown 504) stored nothing.
  const rejectedButStored = sent.filter((s) => s.o.status !== 200 && s.o.status !== 504 && found.has(s.id)).length;
  assert.equal(rejectedButStored, 0, 'a rejected ingest was stored');
  assert.deepEqual(env.stack.pids(), pidsBefore, 'no process restarted');
  const c = count(out);
  return { scenario: '2. Redis stopped during ingest load', load: '200 ingests/s + 50 reads/s', fault: `Redis down ${scale.redisDownMs / 1000} s`, outcome: `acknowledged while down: 0 of ${during.length}; ingest 200/503/504: ${c['ingest:200'] ?? 0}/${c['ingest:503'] ?? 0}/${c['ingest:504'] ?? 0} (504 = in flight at the kill, outcome unknown); rejected but stored: 0; reads 200/503: ${c['read:200'] ?? 0}/${c['read:503'] ?? 0}; half-written: 0`, recovery: `${rec} ms` };
}

export async function authzKilled(env: Env): Promise<Row> {
  const before = env.stack.backend.deliveries.length;
  let killAt = 0;
  let startAt = 0;
  const load = drive(async () => (Math.random() < 0.5
    ? hit(env.stack, 'order', 'POST', '/v1/orders', orderFor(env.market), JSONH)
    : hit(env.stack, 'read', 'GET', '/v1/quotes', undefined, CLIENT)), { concurrency: 8, durationMs: 60_000, rps: 300, until: () => startAt > 0 && Date.now() > startAt + 4000 });
  await sleep(2000);
  killAt = Date.now();
  await env.stack.killAuthz();
  await sleep(3000);
  await env.stack.startAuthz();
  startAt = Date.now();
  const out = await load;
  // While surely down: from 200 ms after the kill (in-flight Checks end) to 1.5 s before
  // startAuthz returned (the new process answers Checks during its own start-up, before
  // startAuthz sees its market port).
  const down = out.filter((o) => o.startedAt > killAt + 200 && o.endedAt < startAt - 1500);
  // ~300/s over at least ~1.3 s (measured 544): 20 only proves there was load.
  assert.ok(down.length > 20, `load while down: ${down.length}`);
  assert.ok(down.every((o) => o.status === 503 && o.json), 'only 503 JSON while authz is down');
  onlyJsonErrors(out, [503]);
  const accepted = out.filter((o) => o.kind === 'order' && o.status === 200).length;
  const delivered = env.stack.backend.deliveries.length - before;
  assert.equal(delivered, accepted, 'every delivered order was checked and acknowledged; none unchecked');
  const rec = recoveryMs(out, 'order', startAt);
  // The promised bound; measured 25 ms (docs/reliability.md).
  assert.ok(rec !== undefined && rec <= 5000, `recovery ${rec} ms`);
  return { scenario: '3. authz killed and restarted', load: '300 req/s, orders + reads', fault: 'SIGKILL, restart after 3 s', outcome: `while down: ${down.length} × 503 JSON, 0 upstream; orders delivered = accepted = ${accepted}`, recovery: `${rec} ms after restart` };
}

export async function backendFaults(env: Env): Promise<Row> {
  const rows: string[] = [];
  const phase = async (name: string, setup: () => Promise<void>, allowed: number[]): Promise<void> => {
    await setup();
    const before = env.stack.backend.deliveries.length;
    const out = await drive(() => hit(env.stack, 'order', 'POST', '/v1/orders', orderFor(env.market), JSONH), { concurrency: 6, durationMs: 2500, rps: 60 });
    onlyJsonErrors(out, allowed);
    const ids = env.stack.backend.deliveries.slice(before).map((d) => String(d.headers['x-request-id']));
    assert.equal(new Set(ids).size, ids.length, `${name}: an order was delivered twice (retried)`);
    const c = count(out);
    rows.push(`${name}: ${Object.entries(c).map(([k, v]) => `${k.split(':')[1]}×${v}`).join(' ')}, delivered ${ids.length}`);
  };
  await phase('killed', () => env.stack.swapBackend('down'), [502]);
  await phase('slow', async () => {
    await env.stack.swapBackend('good');
    env.stack.backend.mode = 'slow';
    env.stack.backend.delayMs = 2000;
  }, [504]);
  await phase('rogue CA', () => env.stack.swapBackend('rogue'), [502]);
  assert.equal(env.stack.backend.deliveries.length, 0, 'bytes delivered to the peer with the wrong certificate');
  await env.stack.swapBackend('good');
  return { scenario: '4. order backend killed, slow, wrong CA', load: '60 orders/s per phase', fault: 'nothing listening → 2 s answers (timeout 1 s) → certificate from another CA', outcome: `${rows.join('; ')}; rogue received 0 bytes; no x-request-id twice`, recovery: '–' };
}

export async function certRotation(env: Env): Promise<Row> {
  const { pki } = env.stack;
  issue(pki.dir, 'client-ca', 'client-rot', 'edge-client-rot', 'DNS:edge.internal', 'clientAuth');
  const newFp = new X509Certificate(readFileSync(join(pki.dir, 'client-rot.crt'))).fingerprint256;
  const load = drive(() => hit(env.stack, 'order', 'POST', '/v1/orders', orderFor(env.market), JSONH), { concurrency: 20, durationMs: 6000, rps: 500 });
  await sleep(1500);
  const rotatedAt = Date.now();
  publishClientCert(join(pki.dir, 'client'), readFileSync(join(pki.dir, 'client-rot.crt')), readFileSync(join(pki.dir, 'client-rot.key')));
  const out = await load;
  const failed = out.filter((o) => o.status !== 200);
  if (failed.length > 0) assert.fail(`failed orders: ${JSON.stringify(count(failed))}\n${await explainFailures(env.stack, failed, rotatedAt)}`);
  const seenNew = env.stack.backend.deliveries.filter((d) => d.clientCertFingerprint === newFp).length;
  // Margin: connections live ≤ 2 s (ORDER_BACKEND_MAX_CONN_SECS) and the load goes on 4.5 s after the swap.
  assert.ok(seenNew > 0, 'the backend never saw the new certificate');
  const rate = Math.round(out.length / 6);
  return { scenario: '5. client certificate rotated on disk', load: `${rate} orders/s`, fault: 'k8s-style ..data swap', outcome: `${out.length} orders, 0 failed; ${seenNew} delivered with the new certificate`, recovery: `new certificate in use during the 4.5 s after the swap (connections live ≤ ORDER_BACKEND_MAX_CONN_SECS=2 s)` };
}

export async function geoReplace(env: Env): Promise<Row> {
  const refusedBefore = await metric(env.stack, 'edge_geoip_reloads_total{result="failed"}');
  const okBefore = await metric(env.stack, 'edge_geoip_reloads_total{result="ok"}');
  const load = drive(() => hit(env.stack, 'read', 'GET', '/v1/quotes', undefined, CLIENT), { concurrency: 8, durationMs: 6000, rps: 300 });
  await sleep(1500);
  // Written next to GEOIP_DB's directory, then renamed over it (the files leave it; it is removed).
  const dir = tempDir('edge-rel-geo2-');
  try {
    copyFileSync(geoFixtures().geoip2Swapped, join(dir, 'new.mmdb'));
    renameSync(join(dir, 'new.mmdb'), env.geoFile);
    await sleep(1500);
    copyFileSync(geoFixtures().corruptGarbage, join(dir, 'bad.mmdb'));
    renameSync(join(dir, 'bad.mmdb'), env.geoFile);
  } finally {
    removeTempDir(dir);
  }
  const out = await load;
  const failed = out.filter((o) => o.status !== 200);
  assert.equal(failed.length, 0, `failed: ${JSON.stringify(count(failed))}`);
  const refused = (await metric(env.stack, 'edge_geoip_reloads_total{result="failed"}')) - refusedBefore;
  const loaded = (await metric(env.stack, 'edge_geoip_reloads_total{result="ok"}')) - okBefore;
  // Margin: each file had 1.5 s on disk, the service polls every 200 ms (GEOIP_RELOAD_INTERVAL_MS).
  assert.ok(loaded >= 1, 'the valid replacement was loaded');
  assert.ok(refused >= 1, 'the corrupt replacement was refused and counted');
  // The swapped database (still serving) blocks 192.0.2.0/25 (KP there, CH before).
  const probe = await hit(env.stack, 'probe', 'GET', '/', undefined, { 'x-forwarded-for': '192.0.2.10' });
  assert.equal(probe.status, 451, 'the last valid database keeps serving');
  return { scenario: '6. GeoIP database replaced under load', load: `${Math.round(out.length / 6)} reads/s`, fault: 'valid new file, then a corrupt one (atomic renames)', outcome: `${out.length} requests, 0 failed; reloads ok +${loaded}, refused +${refused}; old database kept`, recovery: '–' };
}

export async function soak(env: Env, scale: Scale): Promise<Row> {
  const pids = env.stack.pids();
  let i = 0;
  const mixed = (): ReturnType<typeof hit> => {
    i++;
    if (i % 10 === 0) {
      const s = uniqueIngest(env.stack, '0xsoak');
      return hit(env.stack, 'ingest', 'POST', '/internal/ingest/market', s.body, { ...CLIENT, ...s.headers });
    }
    return i % 2 === 0 ? hit(env.stack, 'order', 'POST', '/v1/orders', orderFor(env.market), JSONH) : hit(env.stack, 'read', 'GET', '/v1/markets?limit=10', undefined, CLIENT);
  };
  // Warm-up with the same mix at 4× the rate, so V8 has sized its heap before the baseline and
  // drift means a leak. Measured: at 150 req/s alone the TS process's heap grows from ~99 to
  // ~164 MB (the young generation expanding) within the first 60 s, then RSS stays flat (234.3 →
  // 234.8 MB from 60 to 240 s); without this warm-up that one step failed the 10 % bound.
  // 10 s of warm-up was not enough on a slower machine (2026-11-22: authz +12 % in the 60-s soak,
  // +11 % in its second half alone, reproduced at the previous commit too); after 30 s: -0.4 %.
  await drive(mixed, { concurrency: 12, durationMs: 30_000, rps: 600 });
  await sleep(500);
  const rss0 = pids.map(rssKb);
  const fd0 = pids.map(openFds);
  const out = await drive(mixed, { concurrency: 6, durationMs: scale.soakMs, rps: 150 });
  await sleep(500);
  const rss1 = pids.map(rssKb);
  const fd1 = pids.map(openFds);
  // A Redis reply later than its 250-ms deadline is refused 503 on purpose (fail closed): on a
  // 2-core host shared with other test runs (load ~12) Redis itself is starved of CPU now and
  // then (seen: 9 of ~9,000). Those, and only those, are allowed, up to 0.5 %; any other
  // answer, or more of them, fails the soak.
  const deadline = (o: Outcome): boolean => o.status === 503 && o.json && /"error":"service_unavailable","message":"(nonce|market) store unavailable/.test(o.body);
  const failed = out.filter((o) => o.status !== 200 && o.status !== 429);
  const failedClosed = failed.filter(deadline);
  if (failed.length > failedClosed.length || failedClosed.length > out.length * 0.005) {
    assert.fail(`errors: ${JSON.stringify(count(failed))}\n${await explainFailures(env.stack, failed)}`);
  }
  const drift = rss1.map((r, k) => (r - (rss0[k] ?? r)) / (rss0[k] ?? 1));
  for (const [k, d] of drift.entries()) {
    assert.ok(d < 0.1, `process ${pids[k]} (${['Envoy', 'authz'][k] ?? '?'}) RSS drift ${(d * 100).toFixed(1)} %: ${rss0[k]} → ${rss1[k]} kB`);
  }
  // Margin: 8 descriptors for connections opening or closing at the moment of the count.
  for (const [k, f] of fd1.entries()) assert.ok(f <= (fd0[k] ?? 0) + 8, `process ${pids[k]} fds ${fd0[k]} → ${f}`);
  return { scenario: '7. soak', load: `150 req/s mixed (reads, orders, ingests) for ${scale.soakMs / 1000} s`, fault: '–', outcome: `${out.length} requests, 0 errors${failedClosed.length === 0 ? '' : ` (${failedClosed.length} × 503 on the Redis deadline, failed closed)`}; RSS drift ${drift.map((d) => `${(d * 100).toFixed(1)} %`).join(' / ')} (Envoy / authz); fds ${fd0.join('/')} → ${fd1.join('/')}`, recovery: '–' };
}

export function logsClean(env: Env): Row {
  const logs = env.stack.logs();
  for (const secret of env.secrets) assert.ok(!logs.includes(secret), 'a secret, signature or nonce is in the logs');
  assert.ok(!/"payload"\s*:\s*"[A-Za-z0-9+/=]{16,}/.test(logs), 'an order payload is in the logs');
  return { scenario: '8. logs after the whole run', load: '–', fault: '–', outcome: `${logs.length.toLocaleString('en')} bytes of logs: 0 keys, signatures, nonces or payloads`, recovery: '–' };
}
