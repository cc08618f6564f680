/** The default GeoIP database is announced as development-only when it would serve production. */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync, spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { copyFileSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { DEFAULT_GEOIP_DB } from '../src/common/config.ts';
import { defaultGeoipWarning, DEFAULT_GEOIP_PRODUCTION_WARNING } from '../src/common/geoip-default.ts';
import { geoFixtures } from './geo-fixtures.ts';
import { newFeedKey } from './helpers.ts';
import { freePort } from './redis-server.ts';

const ROOT = fileURLToPath(new URL('../../', import.meta.url));

test('default GeoIP – warned only for NODE_ENV=production with the default database', () => {
  assert.equal(defaultGeoipWarning(DEFAULT_GEOIP_DB, { NODE_ENV: 'production' }), DEFAULT_GEOIP_PRODUCTION_WARNING);
  assert.equal(defaultGeoipWarning(DEFAULT_GEOIP_DB, {}), undefined, 'development: no warning');
  assert.equal(defaultGeoipWarning(geoFixtures().geoip2, { NODE_ENV: 'production' }), undefined, 'a database of your own: no warning');
  assert.equal(defaultGeoipWarning('/nonexistent.mmdb', { NODE_ENV: 'production' }), undefined);
  const dir = mkdtempSync(join(tmpdir(), 'edge-geoip-copy-'));
  try {
    copyFileSync(DEFAULT_GEOIP_DB, join(dir, 'country.mmdb'));
    assert.equal(defaultGeoipWarning(join(dir, 'country.mmdb'), { NODE_ENV: 'production' }), DEFAULT_GEOIP_PRODUCTION_WARNING, 'a copy of it (compose-setup) is the default too');
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('default GeoIP – the shipped package still describes its npm data as containing errors (re-check the warning when it changes)', () => {
  const readme = execFileSync('cat', [`${ROOT}node_modules/@ip-location-db/geo-whois-asn-country-mmdb/README.md`], { encoding: 'utf8' });
  assert.match(readme, /contains bugs resulting in incorrect data/);
  assert.match(readme, /updates via `npm` are completely deprecated/);
});

test('default GeoIP – the service logs the warning once at start under NODE_ENV=production', async () => {
  const [grpc, market, admin] = [await freePort(), await freePort(), await freePort()];
  const child = spawn(`${ROOT}scripts/node`, [`${ROOT}authz/src/main.ts`], {
    env: {
      ...process.env, NODE_ENV: 'production', GEOIP_DB: '', REDIS_URL: '', LOG_LEVEL: 'warn',
      EDGE_INGEST_HMAC: `hex:${randomBytes(32).toString('hex')}`, EDGE_FEED_ED25519_PUBLIC_KEY: newFeedKey().publicHex,
      AUTHZ_GRPC_PORT: String(grpc), MARKET_PORT: String(market), AUTHZ_ADMIN_PORT: String(admin),
    },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let out = '';
  child.stdout.on('data', (d: Buffer) => { out += d.toString(); });
  child.stderr.on('data', (d: Buffer) => { out += d.toString(); });
  try {
    for (let i = 0; i < 100; i++) {
      if (await fetch(`http://127.0.0.1:${market}/`).then((r) => r.status === 200, () => false)) break;
      await new Promise((r) => setTimeout(r, 100));
    }
    const lines = out.split('\n').filter((l) => l.includes('fit for development and tests only'));
    assert.equal(lines.length, 1, out.slice(-2000));
  } finally {
    child.kill('SIGKILL');
  }
});
