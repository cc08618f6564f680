/**
 * GEO_POLICY_FILE through real Envoy 1.40 (e2e/lib/stack.ts), two authz workers (AUTHZ_WORKERS=2)
 * behind it, real Redis, the demo mTLS order backend recording what it received.
 *
 * 1. deploy/policy/venue-example.yaml, as shipped, passes its table: every jurisdiction it names
 *    (and a few it does not) read, ordered and asked about through /v1/geoblock, in a City
 *    database generated at test time (e2e/fixtures/make-city-mmdb.py).
 * 2. The file replaced under load (~100 requests/s): no request fails, the new version is in
 *    force in both workers within 1 s of the rename, it reaches the backend as x-edge-policy and
 *    the decision log; a client's own x-edge-policy never reaches the backend.
 * 3. A broken replacement is refused: the old policy keeps serving, counted and logged.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { copyFileSync, readFileSync, renameSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { setTimeout as sleep } from 'node:timers/promises';
import { tempDir } from '../testkit/temp-dir.ts';
import { startStack, type Stack } from './lib/driver.ts';
import { allowedIp, errorCode, ingest, orderBody, request, uniqueId } from './lib/client.ts';
import { sansPolicy } from './lib/geoblock.ts';

const ROOT = fileURLToPath(new URL('../', import.meta.url));
const VENUE = join(ROOT, 'deploy/policy/venue-example.yaml');
const VERSION = 'venue-example-2026-05-14';

/** The table: address → [country, subdivision | null] in the generated database, and what the venue policy gives it. */
type Tier = 'blocked' | 'close-only' | 'full';
const TABLE: [name: string, ip: string, country: string, sub: string | null, tier: Tier, jurisdiction: string, region: string | null][] = [
  ['Cuba (OFAC)', '198.19.2.7', 'CU', null, 'blocked', 'CU', null],
  ['Iran (OFAC)', '198.19.3.7', 'IR', null, 'blocked', 'IR', null],
  ['North Korea (OFAC)', '198.19.1.7', 'KP', null, 'blocked', 'KP', null],
  ['Syria (OFAC)', '198.19.4.7', 'SY', null, 'blocked', 'SY', null],
  ['Russia', '198.19.5.7', 'RU', null, 'blocked', 'RU', null],
  ['Belarus', '198.19.6.7', 'BY', null, 'blocked', 'BY', null],
  ['Crimea (UA-43)', '198.19.10.7', 'UA', '43', 'blocked', 'UA-43', 'UA-43'],
  ['Donetsk (UA-14)', '198.19.11.7', 'UA', '14', 'blocked', 'UA-14', 'UA-14'],
  ['Luhansk (UA-09)', '198.19.12.7', 'UA', '09', 'blocked', 'UA-09', 'UA-09'],
  ['Kyiv (UA-30): full', '198.19.13.7', 'UA', '30', 'full', 'UA', 'UA-30'],
  ['Ontario (CA-ON)', '198.19.20.7', 'CA', 'ON', 'blocked', 'CA-ON', 'CA-ON'],
  ['Quebec (CA-QC): full', '198.19.21.7', 'CA', 'QC', 'full', 'CA', 'CA-QC'],
  ['Nevada (US-NV)', '198.19.30.7', 'US', 'NV', 'blocked', 'US-NV', 'US-NV'],
  ['Massachusetts (US-MA): close-only', '198.19.31.7', 'US', 'MA', 'close-only', 'US-MA', 'US-MA'],
  ['California (US-CA): full', '198.19.32.7', 'US', 'CA', 'full', 'US', 'US-CA'],
  ['a US record without a state: the strictest US rule (blocked)', '198.19.33.7', 'US', null, 'blocked', 'US', null],
  ['Poland: close-only', '198.19.40.7', 'PL', null, 'close-only', 'PL', null],
  ['Singapore: close-only', '198.19.41.7', 'SG', null, 'close-only', 'SG', null],
  ['Thailand: close-only', '198.19.42.7', 'TH', null, 'close-only', 'TH', null],
  ['Taiwan: close-only', '198.19.43.7', 'TW', null, 'close-only', 'TW', null],
  ['Switzerland: full', '198.19.50.7', 'CH', null, 'full', 'CH', null],
];
const NO_RECORD = '198.19.60.7';

/** The City database of the table (plus e2e/lib/client.ts allowedIp's CH range). */
function venueDatabase(dir: string): string {
  const path = join(dir, 'venue-city.mmdb');
  const networks: Record<string, [string, string | null]> = { '2001:db8:8000::/33': ['CH', null] };
  for (const [, ip, country, sub] of TABLE) networks[`${ip.split('.').slice(0, 3).join('.')}.0/24`] = [country, sub];
  execFileSync(join(ROOT, '.venv/bin/python'), [join(ROOT, 'e2e/fixtures/make-city-mmdb.py')], { input: JSON.stringify({ path, networks }) });
  return path;
}

const skip = process.env['E2E_DRIVER'] === 'containers'
  ? 'renames files on the host over the policy file, which a container bind mount of that file does not follow (the local-process pass runs it)' : false;

describe('GEO_POLICY_FILE through Envoy', { skip }, () => {
  let stack: Stack;
  let dir: string;
  let policyPath: string;
  let market: string;

  before(async () => {
    dir = tempDir('edge-geo-policy-');
    policyPath = join(dir, 'policy.yaml');
    copyFileSync(VENUE, policyPath);
    stack = await startStack({
      geoipDb: venueDatabase(dir),
      env: { GEO_POLICY_FILE: policyPath, XFF_NUM_TRUSTED_HOPS: '1', LOG_DECISIONS: 'all', AUTHZ_WORKERS: '2', RPS_PER_IP: '100000', RATE_BURST: '200000' },
    });
    market = uniqueId('0xpolicy');
    const r = await ingest(stack, market, 1);
    assert.equal(r.status, 200, r.text);
  });
  after(async () => stack?.stop());

  async function placeOrder(ip: string, headers: Record<string, string> = {}): Promise<{ status: number; text: string; requestId: string; got: Record<string, string | string[] | undefined> | undefined }> {
    const r = await request(stack, 'POST', '/v1/orders', { ip, body: orderBody(market, randomBytes(16)), headers: { 'content-type': 'application/json', ...headers } });
    const requestId = r.headers.get('x-request-id') ?? '';
    const got = stack.backend.deliveries.find((d) => d.headers['x-request-id'] === requestId)?.headers;
    return { status: r.status, text: r.text, requestId, got };
  }

  describe('deploy/policy/venue-example.yaml: its table', () => {
    for (const [name, ip, country, , tier, jurisdiction, region] of TABLE) {
      test(`${name} → ${tier}`, async () => {
        const read = await request(stack, 'GET', '/v1/markets', { ip });
        const order = await placeOrder(ip);
        if (tier === 'blocked') {
          assert.deepEqual([read.status, errorCode(read)], [451, 'restricted_jurisdiction'], read.text);
          assert.deepEqual([order.status, order.got], [451, undefined], 'refused, nothing delivered');
        } else {
          assert.equal(read.status, 200, read.text);
          assert.equal(order.status, 200, order.text);
          assert.deepEqual([order.got?.['x-edge-access'], order.got?.['x-edge-jurisdiction'], order.got?.['x-edge-policy']], [tier, jurisdiction, VERSION]);
        }
        const g = await request(stack, 'GET', '/v1/geoblock', { ip });
        assert.deepEqual(g.json(), { blocked: tier === 'blocked', access: tier, country, region, ip, policy: VERSION });
      });
    }
    test('an address without a record → 451 (geo_unknown: block)', async () => {
      assert.equal((await request(stack, 'GET', '/v1/markets', { ip: NO_RECORD })).status, 451);
      assert.deepEqual(sansPolicy((await request(stack, 'GET', '/v1/geoblock', { ip: NO_RECORD })).json()), { blocked: true, access: 'blocked', country: null, region: null, ip: NO_RECORD });
    });
  });

  test('a client\'s own x-edge-policy never reaches the backend: the edge\'s version arrives, once', async () => {
    const o = await placeOrder(allowedIp(), { 'x-edge-policy': 'forged-1' });
    assert.equal(o.status, 200, o.text);
    assert.equal(o.got?.['x-edge-policy'], VERSION);
  });

  async function metric(re: RegExp): Promise<number> {
    const text = await (await fetch(`${stack.authzAdmin}/metrics`)).text();
    return Number(re.exec(text)?.[1] ?? 'NaN');
  }

  test('replaced under ~100 requests/s: none fails, the new version in force in both workers within 1 s, at the backend and in the decision log', async () => {
    const V2 = 'venue-example-2026-06-01';
    // v2: Switzerland close-only too (a rule change the backend sees), everything else as shipped.
    const next = readFileSync(VENUE, 'utf8').replace(`version: ${VERSION}`, `version: ${V2}`).replace('close_only_countries: [PL, SG, TH, TW]', 'close_only_countries: [PL, SG, TH, TW, CH]');
    assert.notEqual(next, readFileSync(VENUE, 'utf8'));
    const results: { sentAt: number; status: number; version: unknown; access: unknown; requestId: string }[] = [];
    let renamedAt = 0;
    const inFlight: Promise<void>[] = [];
    const start = Date.now();
    // 100 orders a second from full CH clients for 4 s; the file is renamed over the old one after 1.5 s.
    for (let i = 0; Date.now() - start < 4000; i++) {
      const sentAt = Date.now();
      inFlight.push(placeOrder(allowedIp()).then((o) => {
        results.push({ sentAt, status: o.status, version: o.got?.['x-edge-policy'], access: o.got?.['x-edge-access'], requestId: o.requestId });
      }));
      if (renamedAt === 0 && sentAt - start >= 1500) {
        writeFileSync(`${policyPath}.new`, next);
        renameSync(`${policyPath}.new`, policyPath);
        renamedAt = Date.now();
      }
      await sleep(Math.max(0, start + (i + 1) * 10 - Date.now()));
    }
    await Promise.all(inFlight);
    const failed = results.filter((r) => r.status !== 200);
    assert.deepEqual(failed, [], `${failed.length} of ${results.length} failed`);
    assert.ok(results.length >= 200, `${results.length} requests sent`);
    // Each order was admitted under exactly one version, with that version's tier.
    for (const r of results) {
      assert.ok((r.version === VERSION && r.access === 'full') || (r.version === V2 && r.access === 'close-only'), JSON.stringify(r));
    }
    const lastOld = Math.max(...results.filter((r) => r.version === VERSION).map((r) => r.sentAt));
    const firstNew = Math.min(...results.filter((r) => r.version === V2).map((r) => r.sentAt));
    const settled = lastOld - renamedAt;
    process.stdout.write(`# policy swap: first ${V2} order sent ${firstNew - renamedAt} ms after the rename, last ${VERSION} order sent ${settled} ms after it (${results.length} orders, 2 workers)\n`);
    assert.ok(settled < 1000, `an order sent ${settled} ms after the rename was still admitted under the old version`);
    assert.ok(results.filter((r) => r.sentAt > renamedAt + 1000).every((r) => r.version === V2));
    // The decision log names the version each order was decided under.
    const last = results.at(-1)!;
    let line: Record<string, unknown> | undefined;
    for (let i = 0; i < 50 && line === undefined; i++) {
      const raw = stack.logs().split('\n').find((l) => l.includes('"msg":"decision"') && l.includes(last.requestId) && l.includes('"route":"order"'));
      if (raw !== undefined) line = JSON.parse(raw.slice(raw.indexOf('{'))) as Record<string, unknown>;
      else await sleep(50);
    }
    assert.deepEqual([line?.['policy'], line?.['tier']], [V2, 'close-only']);
    assert.equal(sansPolicy((await request(stack, 'GET', '/v1/geoblock', { ip: '198.19.50.7' })).json())['access'], 'close-only');
    assert.equal(await metric(new RegExp(`edge_geo_policy_info\\{version="${V2}"\\} ([0-9]+)`)), 1);
  });

  test('a broken replacement is refused: the old policy keeps serving, counted refused, logged with the reason', async () => {
    const before = await metric(/edge_geo_policy_reloads_total\{result="refused"\} ([0-9]+)/);
    writeFileSync(`${policyPath}.new`, 'version: venue-broken\nblocked_countries: [KP, North Korea]\n');
    renameSync(`${policyPath}.new`, policyPath);
    // Both workers refuse it (the counter is summed over them).
    for (let i = 0; i < 60 && (await metric(/edge_geo_policy_reloads_total\{result="refused"\} ([0-9]+)/)) < before + 2; i++) await sleep(50);
    assert.equal(await metric(/edge_geo_policy_reloads_total\{result="refused"\} ([0-9]+)/), before + 2);
    assert.ok(stack.logs().includes('geo policy replacement refused'));
    assert.match(stack.logs(), /blocked_countries: expected a list of ISO 3166-1 alpha-2 codes, got \\"North Korea\\"/);
    const o = await placeOrder(allowedIp());
    assert.deepEqual([o.status, o.got?.['x-edge-policy'], o.got?.['x-edge-access']], [200, 'venue-example-2026-06-01', 'close-only']);
    assert.equal(sansPolicy((await request(stack, 'GET', '/v1/geoblock', { ip: '198.19.1.7' })).json())['access'], 'blocked');
  });
});
