/**
 * Policy testing with the real grpcurl (.venv/bin/grpcurl) against a running authz gRPC
 * server (reflection, no proto flags): every deploy/policy/*.json CheckRequest, filled by
 * deploy/policy/fill.ts (current time; signed ingests signed with the server's keys), gets the
 * decision in its *.expected.json (`first`: the answer to a first send, the rest to a second
 * send of the same request). The server runs with the packaged default GeoIP database,
 * BLOCKED_COUNTRIES=KP, an open market 0xdemo and a closed market 0xclosed.
 */
import { settingsPolicy } from '../../authz/src/common/geo-policy-file.ts';
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { fileURLToPath } from 'node:url';
import { GeoDatabase } from '../../authz/src/common/adapters/geoip.ts';
import { DEFAULT_GEOIP_DB, loadConfig } from '../../authz/src/common/config.ts';
import { startFixture, type Fixture } from '../../authz/test/server-fixture.ts';
import { fakeMarkets, GRPCURL } from '../../authz/test/helpers.ts';
import { feedPrivateKey, fillPolicy } from '../policy/fill.ts';
import { loadPackageDefinition } from '../../proto/index.ts';
import { tempDir } from '../../testkit/temp-dir.ts';

const run = promisify(execFile);
const DIR = fileURLToPath(new URL('../policy/', import.meta.url));
const ROOT = fileURLToPath(new URL('../../', import.meta.url));

let f: Fixture;
before(async () => {
  f = await startFixture({
    env: { BLOCKED_COUNTRIES: 'KP' },
    geo: new GeoDatabase(DEFAULT_GEOIP_DB),
    markets: fakeMarkets([
      { conditionId: '0xdemo', seq: 1, active: true, closed: false, minSize: '1', maxSize: '100000' },
      { conditionId: '0xclosed', seq: 1, active: false, closed: true, minSize: '1', maxSize: '100000' },
    ]),
    nonces: 'memory',
  });
});
after(async () => f.close());

// grpcurl prints HTTP statuses by their envoy.type.v3.StatusCode name ("Unauthorized"), and
// only statuses the enum lacks (451) as numbers: map names back with the proto's own enum.
const statusEnum = (loadPackageDefinition()['envoy.type.v3.StatusCode'] as unknown as { type: { value: { name: string; number: number }[] } }).type.value;
const STATUS_BY_NAME = new Map(statusEnum.map((v) => [v.name, v.number]));
const statusNumber = (v: unknown): number => (typeof v === 'number' ? v : STATUS_BY_NAME.get(String(v)) ?? Number.NaN);

async function grpcurl(body: string): Promise<{ status: number; error?: string }> {
  const { stdout } = await run(GRPCURL, ['-plaintext', '-d', body, `127.0.0.1:${f.port}`, 'envoy.service.auth.v3.Authorization/Check']);
  const res = JSON.parse(stdout) as { status?: { code?: number }; denied_response?: { status?: { code?: number | string }; body?: string } };
  if ((res.status?.code ?? 0) === 0) return { status: 200 };
  return { status: statusNumber(res.denied_response?.status?.code ?? 403), error: (JSON.parse(res.denied_response?.body ?? '{}') as { error?: string }).error };
}

const templates = readdirSync(DIR).filter((n) => n.endsWith('.json') && !n.endsWith('.expected.json')).sort();

test('policy – every decision has a ready request: allowed, geo, each ingest and each order outcome', () => {
  const codes = new Set(templates.map((t) => (JSON.parse(readFileSync(join(DIR, t.replace(/\.json$/, '.expected.json')), 'utf8')) as { error?: string }).error ?? 'allowed'));
  for (const c of ['allowed', 'restricted_jurisdiction', 'unauthorized', 'timestamp expired', 'ingest_replay', 'invalid_json', 'invalid_envelope',
    'invalid_content_signature', 'invalid_order', 'unknown_market', 'market_closed', 'deadline_expired', 'deadline_too_far', 'invalid_size']) {
    assert.ok(codes.has(c), `no request in deploy/policy gets ${c}`);
  }
});

for (const file of templates) {
  test(`policy – ${file} gets its expected decision through grpcurl`, async () => {
    const { first, ...expected } = JSON.parse(readFileSync(join(DIR, file.replace(/\.json$/, '.expected.json')), 'utf8')) as { status: number; error?: string; first?: { status: number; error?: string } };
    const request = fillPolicy(readFileSync(join(DIR, file), 'utf8'), { keys: () => ({ hmacKey: f.hmacKey, feedKey: feedPrivateKey(f.feedSeedHex) }) });
    if (first !== undefined) assert.deepEqual(await grpcurl(request), first, 'first send');
    assert.deepEqual(await grpcurl(request), expected);
  });
}

test('policy – fill.ts as a command: signs with the keys from the environment (*_FILE as the service reads them)', async () => {
  const dir = tempDir('edge-policy-');
  writeFileSync(join(dir, 'hmac'), `hex:${f.hmacKey.toString('hex')}\n`, { mode: 0o400 });
  writeFileSync(join(dir, 'feed'), `${f.feedSeedHex}\n`, { mode: 0o400 });
  const { stdout } = await run(join(ROOT, 'scripts/node'), [join(DIR, 'fill.ts'), join(DIR, 'ingest-good.json')], {
    env: { ...process.env, EDGE_INGEST_HMAC_FILE: join(dir, 'hmac'), EDGE_FEED_ED25519_KEY_FILE: join(dir, 'feed'), EDGE_INGEST_HMAC: '', EDGE_FEED_ED25519_KEY: '' },
  });
  assert.deepEqual(await grpcurl(stdout), { status: 200 });
  const missing = await run(join(ROOT, 'scripts/node'), [join(DIR, 'fill.ts'), join(DIR, 'ingest-good.json')], { env: { PATH: process.env['PATH'] ?? '' } }).catch((e: { code: number; stderr: string }) => e);
  assert.equal((missing as { code: number }).code, 1);
  assert.match((missing as { stderr: string }).stderr, /EDGE_INGEST_HMAC/);
  rmSync(dir, { recursive: true, force: true });
});

test('policy – a signed ingest printed by edge-client check-request is allowed once, then ingest_replay', async () => {
  const { stdout } = await run(join(ROOT, 'scripts/node'), [join(ROOT, 'scripts/edge-client.ts'), 'check-request', '0xdemo', '1'], {
    env: { ...process.env, EDGE_INGEST_HMAC: `hex:${f.hmacKey.toString('hex')}`, EDGE_FEED_ED25519_KEY: f.feedSeedHex },
  });
  assert.deepEqual(await grpcurl(stdout), { status: 200 });
  assert.deepEqual(await grpcurl(stdout), { status: 401, error: 'ingest_replay' });
});

test('policy – an allowed order shows, in grpcurl, the payload metadata and the docs/api.md "POST /v1/orders" headers Envoy will use', async () => {
  const request = fillPolicy(readFileSync(join(DIR, 'order-good.json'), 'utf8'), { keys: () => ({ hmacKey: f.hmacKey, feedKey: feedPrivateKey(f.feedSeedHex) }) });
  const sent = JSON.parse((JSON.parse(request) as { attributes: { request: { http: { body: string } } } }).attributes.request.http.body) as
    { marketId: string; size: string; deadline: number; payload: string };
  const { stdout } = await run(GRPCURL, ['-plaintext', '-d', request, `127.0.0.1:${f.port}`, 'envoy.service.auth.v3.Authorization/Check']);
  const res = JSON.parse(stdout) as { ok_response?: { headers?: { header: { key: string; value: string } }[] }; dynamic_metadata?: Record<string, unknown> };
  assert.deepEqual(res.dynamic_metadata, { order_payload: sent.payload });
  assert.deepEqual(Object.fromEntries((res.ok_response?.headers ?? []).map((h) => [h.header.key, h.header.value])), {
    'content-type': 'application/octet-stream', 'x-edge-market-id': sent.marketId, 'x-edge-deadline': String(sent.deadline), 'x-edge-size': sent.size,
    // The client's tier (docs/api.md "Jurisdiction tiers"): 81.2.69.160 is GB, neither blocked nor close-only here.
    'x-edge-access': 'full', 'x-edge-jurisdiction': 'GB',
    // The version of the geo policy that admitted it: the settings' (BLOCKED_COUNTRIES=KP) hash.
    'x-edge-policy': settingsPolicy(loadConfig({ BLOCKED_COUNTRIES: 'KP' })).version,
  });
});
