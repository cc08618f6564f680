/**
 * geo:audit (scripts/geo-audit.ts; docs/operations.md "Show us how addresses in X are treated"):
 * run as the operator runs it (a child process reading the environment), its answers are the live
 * service's. The service is the real entry point (authz/src/main.ts) with the same environment and
 * the same test databases, asked GET /v1/geoblock for each of 10,000 addresses.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { geoFixtures, scratchDir } from '../../testkit/geo-fixtures.ts';
import { anonymizerFixtures } from '../../testkit/anonymizer-fixtures.ts';
import { ServiceChild } from './service-child.ts';
import { HEADER } from '../src/common/contract.ts';

const ROOT = fileURLToPath(new URL('../../', import.meta.url));

interface Row {
  address: string; tier: string; jurisdiction: string; country: string | null; region: string | null; verdict: string;
  rule: string; embedded: string | null; lookedUp: string; database: string; databaseBuilt: string | null; policy: string;
}
interface Report { policy: string; source: string; databases: Record<string, { built: string | null }>; addresses: Row[]; errors: { line: number; text: string }[] }

function runAudit(env: Record<string, string>, args: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  return new Promise((resolve) => {
    execFile(`${ROOT}scripts/node`, [`${ROOT}scripts/geo-audit.ts`, ...args], { env: { ...process.env, ...env }, maxBuffer: 64 << 20 },
      (err, stdout, stderr) => resolve({ code: err === null ? 0 : Number((err as { code?: number }).code ?? 1), stdout, stderr }));
  });
}

/** A deterministic pseudo-random source (the same 10,000 addresses every run). */
function rng(seed: number): () => number {
  let s = seed >>> 0;
  return () => {
    s = (Math.imul(s, 1664525) + 1013904223) >>> 0;
    return s / 2 ** 32;
  };
}

const hex4 = (n: number): string => n.toString(16);

/** IPv4 addresses across every record of the fixtures (and none), with their 6to4, NAT64, SIIT and Teredo forms. */
function addresses(n: number): string[] {
  const r = rng(30);
  const pick = <T>(xs: readonly T[]): T => xs[Math.floor(r() * xs.length)]!;
  const v4Bases = ['198.51.100', '203.0.113', '192.0.2', '198.18.0', '198.18.1', '198.18.2', '127.0.0', '8.8.8', '10.1.2'];
  const v6Bases = ['2001:db8:1', '2001:db8:2', '2001:db8:3', '2001:db8:4', '2001:db8:5', '2001:db8:6', '2001:db8:10', '2001:db8:11', '2001:db8:12', '2001:db8:99', '2001:db8:3:a000', '2001:db8:3:b000'];
  const out: string[] = [];
  while (out.length < n) {
    const a = pick(v4Bases).split('.').map(Number);
    const last = Math.floor(r() * 256);
    const v4 = `${a.join('.')}.${last}`;
    const g1 = (a[0]! << 8) | a[1]!;
    const g2 = (a[2]! << 8) | last;
    switch (Math.floor(r() * 7)) {
      case 0: case 1: out.push(v4); break;
      case 2: out.push(`2002:${hex4(g1)}:${hex4(g2)}::${hex4(Math.floor(r() * 65536))}`); break; // 6to4
      case 3: out.push(`64:ff9b::${hex4(g1)}:${hex4(g2)}`); break; // NAT64
      case 4: out.push(`::ffff:0:${v4}`); break; // SIIT
      case 5: out.push(`2001:0:4136:e378:8000:${hex4(0xffff - Math.floor(r() * 65536))}:${hex4(g1 ^ 0xffff)}:${hex4(g2 ^ 0xffff)}`); break; // Teredo
      default: out.push(`${pick(v6Bases)}::${hex4(Math.floor(r() * 65536))}`);
    }
  }
  return out;
}

test('geo:audit – its tier, country, region and policy are the live /v1/geoblock answers for 10,000 addresses (policy file, two databases, anonymizer rule)', { timeout: 600_000 }, async () => {
  const geo = geoFixtures();
  const anon = anonymizerFixtures();
  const dir = scratchDir();
  const policyFile = join(dir, 'policy.yaml');
  writeFileSync(policyFile, [
    'version: audit-2026-11',
    // KP full, CH close-only: where the databases swap them (198.51.100.0/25, 192.0.2.0/25) the secondary decides once each way.
    'blocked_countries: [CU, IR]',
    'blocked_regions: [US-NV, UA-43, CA-ON]',
    'close_only_countries: [CH]',
    'close_only_regions: [US-MA]',
    'geo_unknown: close-only',
    '',
  ].join('\n'));
  const env = {
    GEOIP_DB: geo.geoip2, GEOIP_DB_SECONDARY: geo.geoip2Swapped, GEO_POLICY_FILE: policyFile, GEO_TRUSTED_CIDRS: '127.0.0.0/8',
    ANONYMIZER_DB: anon.anonymizer, REDIS_URL: '', LOG_LEVEL: 'warn', NODE_ENV: 'development',
  };
  const list = addresses(10_000);
  const listFile = join(dir, 'addresses.txt');
  writeFileSync(listFile, `# 10,000 test addresses\n\n${list.join('\n')}\nnot-an-address\n`);

  const svc = await ServiceChild.start(env);
  try {
    assert.ok(await svc.ready(), svc.out());
    const audit = await runAudit(env, ['--json', listFile]);
    assert.equal(audit.code, 0, audit.stderr);
    const report = JSON.parse(audit.stdout) as Report;
    assert.equal(report.policy, 'audit-2026-11');
    assert.deepEqual(report.errors, [{ line: list.length + 3, text: 'not-an-address' }], 'the bad line is reported, the rest audited');
    assert.match(audit.stderr, /:10003: not an IP address, skipped/);
    assert.equal(report.addresses.length, list.length);

    const live: { access: string; country: string | null; region: string | null; policy?: string }[] = new Array(list.length);
    let next = 0;
    await Promise.all(Array.from({ length: 8 }, async () => {
      for (let i = next++; i < list.length; i = next++) {
        const res = await fetch(`http://127.0.0.1:${svc.marketPort}/v1/geoblock`, { headers: { [HEADER.clientIp]: list[i]! } });
        assert.equal(res.status, 200);
        live[i] = await res.json() as (typeof live)[number];
      }
    }));
    const mismatches = report.addresses.flatMap((row, i) => {
      const l = live[i]!;
      return row.tier === l.access && row.country === l.country && row.region === l.region && row.policy === l.policy ? [] : [{ row, live: l }];
    });
    assert.deepEqual(mismatches.slice(0, 5), [], `${mismatches.length} of ${list.length} differ`);

    // The audit covered every rule, every embedded form and both databases (else the comparison proves less).
    const seen = (k: keyof Row): Set<unknown> => new Set(report.addresses.map((a) => a[k]));
    assert.deepEqual([...seen('rule')].sort(), ['anonymizer', 'country', 'region', 'trusted', 'unknown', 'unknown_region']);
    assert.deepEqual([...seen('tier')].sort(), ['blocked', 'close-only', 'full']);
    assert.deepEqual([...seen('embedded')].sort(), [null, '6to4', 'nat64', 'siit', 'teredo'].sort());
    assert.deepEqual([...seen('database')].sort(), ['none', 'primary', 'secondary']);
    assert.ok(report.databases['primary']?.built !== null && report.databases['secondary']?.built !== null);
  } finally {
    svc.kill();
    await svc.exited;
  }
});

test('geo:audit – CSV by default: one row per address with the rule, the embedded form and the deciding database; settings give an env- version', async () => {
  const geo = geoFixtures();
  const dir = scratchDir();
  const listFile = join(dir, 'list.txt');
  writeFileSync(listFile, '# Nevada and a US range without subdivision\n198.18.0.7\n2002:c612:107::1  # the second, as 6to4\n192.0.2.9\n\n127.0.0.1\n999.1.1.1\n');
  const env = { GEOIP_DB: geo.geoip2, GEOIP_DB_SECONDARY: geo.geoip2Swapped, BLOCKED_REGIONS: 'US-NV', CLOSE_ONLY_COUNTRIES: 'CH', GEO_TRUSTED_CIDRS: '127.0.0.0/8', REDIS_URL: '' };
  const out = await runAudit(env, [listFile]);
  assert.equal(out.code, 0, out.stderr);
  const [header, ...rows] = out.stdout.trimEnd().split('\n');
  assert.equal(header, 'address,tier,jurisdiction,country,region,verdict,rule,embedded,looked_up,database,database_built,policy');
  const cells = rows.map((r) => r.split(','));
  assert.deepEqual(cells.map((c) => c.slice(0, 10)), [
    ['198.18.0.7', 'blocked', 'US-NV', 'US', 'US-NV', 'blocked_region', 'region', '', '198.18.0.7', 'primary'],
    ['2002:c612:107::1', 'blocked', 'US', 'US', '', 'unknown_region', 'unknown_region', '6to4', '198.18.1.7', 'primary'],
    // 192.0.2.0/25: CH (close-only) in the primary, KP (full under these settings) in the secondary: the stricter, the primary's.
    ['192.0.2.9', 'close-only', 'CH', 'CH', '', 'close_only_country', 'country', '', '192.0.2.9', 'primary'],
    ['127.0.0.1', 'full', 'ZZ', '', '', 'trusted', 'trusted', '', '127.0.0.1', 'none'],
  ]);
  assert.match(cells[0]![10]!, /^\d{4}-\d\d-\d\dT/);
  assert.equal(cells[3]![10], '');
  assert.match(cells[0]![11]!, /^env-[0-9a-f]{12}$/);
  assert.match(out.stderr, /:7: not an IP address, skipped: "999\.1\.1\.1"/);
});

test('geo:audit – the secondary database is named when its answer decided; a refused setting exits 2 with one line', async () => {
  const geo = geoFixtures();
  const dir = scratchDir();
  const listFile = join(dir, 'list.txt');
  writeFileSync(listFile, '192.0.2.9\n');
  const ok = await runAudit({ GEOIP_DB: geo.geoip2, GEOIP_DB_SECONDARY: geo.geoip2Swapped, BLOCKED_COUNTRIES: 'KP', REDIS_URL: '' }, ['--json', listFile]);
  assert.equal(ok.code, 0, ok.stderr);
  const row = (JSON.parse(ok.stdout) as Report).addresses[0]!;
  assert.deepEqual([row.tier, row.country, row.database], ['blocked', 'KP', 'secondary']);
  const bad = await runAudit({ GEOIP_DB: geo.country, BLOCKED_REGIONS: 'US-NV', REDIS_URL: '' }, [listFile]);
  assert.equal(bad.code, 2);
  assert.match(bad.stderr, /^geo:audit: .*GEOIP_DB.*\n$/);
  assert.equal(bad.stdout, '');
  const usage = await runAudit({}, []);
  assert.equal(usage.code, 2);
  assert.match(usage.stderr, /usage: npm run geo:audit/);
});
