/**
 * Config (docs/api.md "POST /internal/ingest/market", §5, §6, §8): every default equals the contract's, every override is
 * read, and every malformed value is refused at start-up with a ConfigError that names the
 * variable. Nothing is silently coerced (TIMEOUT=abc never becomes 0).
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { ConfigError, configWarnings, DEFAULT_GEOIP_DB, DEFAULT_GEO_NOTICE, loadConfig, type Config, type Env } from '../src/common/config.ts';
import { createGeoClassifier } from '../src/authz/stages/geo.ts';

const BACKEND: Env = {
  ORDER_BACKEND_URL: 'https://orders.internal.example:8443',
  ORDER_BACKEND_CA_FILE: '/etc/edge/ca.pem',
  EDGE_CLIENT_CERT_FILE: '/etc/edge/client.pem',
  EDGE_CLIENT_KEY_FILE: '/etc/edge/client.key',
};

// ---------------------------------------------------------------------------------------
// Defaults: an empty environment gives exactly the documented defaults (docs/api.md, README "Settings").
// ---------------------------------------------------------------------------------------
const defaults: Record<string, [pick: (c: Config) => unknown, expected: unknown]> = {
  'EDGE_PORT 8080': [(c) => c.edgePort, 8080],
  'AUTHZ_GRPC_PORT 9191': [(c) => c.authzGrpcPort, 9191],
  'MARKET_PORT 8081': [(c) => c.marketPort, 8081],
  'AUTHZ_ADMIN_PORT 9464': [(c) => c.authzAdminPort, 9464],
  'ENVOY_ADMIN_PORT 9901': [(c) => c.envoyAdminPort, 9901],
  'servers bind to loopback': [(c) => [c.bindAddress, c.marketBindAddress, c.adminBindAddress], ['127.0.0.1', '127.0.0.1', '127.0.0.1']],
  'XFF_NUM_TRUSTED_HOPS 0': [(c) => c.xffNumTrustedHops, 0],
  'RPS_PER_IP 20': [(c) => c.rpsPerIp, 20],
  'RATE_BURST 40': [(c) => c.rateBurst, 40],
  'REPLAY_WINDOW_SECS 300': [(c) => c.replayWindowSecs, 300],
  'NONCE_TTL_SECS 600': [(c) => c.nonceTtlSecs, 600],
  'INGEST_MAX_BYTES 1048576': [(c) => c.ingestMaxBytes, 1_048_576],
  'ORDER_MAX_BYTES 65536': [(c) => c.orderMaxBytes, 65_536],
  'ORDER_MAX_TTL_SECS 86400': [(c) => c.orderMaxTtlSecs, 86_400],
  'ORDER_PAYLOAD_MAX_BYTES 32768': [(c) => c.orderPayloadMaxBytes, 32_768],
  'ORDER_MAX_SIZE unset': [(c) => c.orderMaxSize, undefined],
  'no order backend without ORDER_BACKEND_URL': [(c) => c.orderBackend, undefined],
  'GEOIP_DB is the packaged default database': [(c) => c.geoipDb, DEFAULT_GEOIP_DB],
  'BLOCKED_COUNTRIES empty': [(c) => [...c.blockedCountries], []],
  'BLOCKED_REGIONS empty': [(c) => [...c.blockedRegions], []],
  'GEO_UNKNOWN block': [(c) => c.geoUnknown, 'block'],
  'GEO_TRUSTED_CIDRS 127.0.0.0/8,::1/128': [(c) => [...c.geoTrustedCidrs], ['127.0.0.0/8', '::1/128']],
  'GEO_NOTICE the uniform default notice': [(c) => c.geoNotice, DEFAULT_GEO_NOTICE],
  'GEO_BLOCKED_BY_URL unset (no Link header)': [(c) => c.geoBlockedByUrl, undefined],
  'REDIS_URL unset (in-memory store)': [(c) => c.redisUrl, undefined],
  'LOG_LEVEL info': [(c) => c.logLevel, 'info'],
};

for (const [name, [pick, expected]] of Object.entries(defaults)) {
  test(`config defaults – ${name}`, () => {
    assert.deepEqual(pick(loadConfig({})), expected);
  });
}

test('config defaults – the config is frozen', () => {
  const c = loadConfig({});
  assert.ok(Object.isFrozen(c));
  assert.throws(() => { (c as { edgePort: number }).edgePort = 1; }, TypeError);
});

const backendDefaults: Record<string, [env: Env, expected: Partial<Record<string, unknown>>]> = {
  'ORDER_BACKEND_TIMEOUT_MS 5000, ORDER_BACKEND_MAX_CONN_SECS 300, SAN = URL host': [
    BACKEND,
    { timeoutMs: 5000, maxConnSecs: 300, san: 'orders.internal.example', host: 'orders.internal.example', port: 8443 },
  ],
  'port 443 when the URL has none': [
    { ...BACKEND, ORDER_BACKEND_URL: 'https://orders.internal.example' },
    { port: 443, san: 'orders.internal.example' },
  ],
  'IPv6 literal host: brackets stripped for host and SAN': [
    { ...BACKEND, ORDER_BACKEND_URL: 'https://[2001:db8::10]:9443' },
    { host: '2001:db8::10', san: '2001:db8::10', port: 9443 },
  ],
  'ORDER_BACKEND_SAN overrides the URL host': [
    { ...BACKEND, ORDER_BACKEND_SAN: 'orders.pinned.example' },
    { san: 'orders.pinned.example', host: 'orders.internal.example' },
  ],
  'timeouts read when set': [
    { ...BACKEND, ORDER_BACKEND_TIMEOUT_MS: '1500', ORDER_BACKEND_MAX_CONN_SECS: '60' },
    { timeoutMs: 1500, maxConnSecs: 60 },
  ],
  'file paths kept as given': [
    BACKEND,
    { caFile: '/etc/edge/ca.pem', clientCertFile: '/etc/edge/client.pem', clientKeyFile: '/etc/edge/client.key' },
  ],
};

for (const [name, [env, expected]] of Object.entries(backendDefaults)) {
  test(`config order backend – ${name}`, () => {
    const b = loadConfig(env).orderBackend as unknown as Record<string, unknown> | undefined;
    assert.ok(b !== undefined);
    for (const [k, v] of Object.entries(expected)) assert.deepEqual(b[k], v, k);
  });
}

// ---------------------------------------------------------------------------------------
// Overrides are read (and normalized only where the contract says so).
// ---------------------------------------------------------------------------------------
const overrides: Record<string, [env: Env, pick: (c: Config) => unknown, expected: unknown]> = {
  'ports': [
    { EDGE_PORT: '18080', AUTHZ_GRPC_PORT: '19191', MARKET_PORT: '18081', AUTHZ_ADMIN_PORT: '19464', ENVOY_ADMIN_PORT: '19901' },
    (c) => [c.edgePort, c.authzGrpcPort, c.marketPort, c.authzAdminPort, c.envoyAdminPort],
    [18080, 19191, 18081, 19464, 19901],
  ],
  'rate limits': [{ RPS_PER_IP: '5', RATE_BURST: '7' }, (c) => [c.rpsPerIp, c.rateBurst], [5, 7]],
  'replay window and nonce TTL': [{ REPLAY_WINDOW_SECS: '60', NONCE_TTL_SECS: '120' }, (c) => [c.replayWindowSecs, c.nonceTtlSecs], [60, 120]],
  'ORDER_MAX_SIZE decimal kept as a string': [{ ORDER_MAX_SIZE: '2500.5' }, (c) => c.orderMaxSize, '2500.5'],
  'BLOCKED_COUNTRIES upper-cased, spaces and empty items dropped': [
    { BLOCKED_COUNTRIES: ' us, kp,,CU ' }, (c) => [...c.blockedCountries].sort(), ['CU', 'KP', 'US'],
  ],
  'BLOCKED_REGIONS upper-cased': [{ BLOCKED_REGIONS: 'ca-on,UA-43' }, (c) => [...c.blockedRegions].sort(), ['CA-ON', 'UA-43']],
  'GEO_UNKNOWN allow (any case)': [{ GEO_UNKNOWN: 'ALLOW' }, (c) => c.geoUnknown, 'allow'],
  'GEO_REGION_UNKNOWN defaults to strictest': [{}, (c) => c.geoRegionUnknown, 'strictest'],
  'GEO_REGION_UNKNOWN country (any case)': [{ GEO_REGION_UNKNOWN: 'Country' }, (c) => c.geoRegionUnknown, 'country'],
  'GEO_TRUSTED_CIDRS replaced, not merged': [
    { GEO_TRUSTED_CIDRS: '10.0.0.0/8, fd00::/8' }, (c) => [...c.geoTrustedCidrs], ['10.0.0.0/8', 'fd00::/8'],
  ],
  'GEO_TRUSTED_CIDRS set empty = nothing trusted': [{ GEO_TRUSTED_CIDRS: '' }, (c) => [...c.geoTrustedCidrs], []],
  'GEO_NOTICE and GEO_BLOCKED_BY_URL': [
    { GEO_NOTICE: 'Not here.', GEO_BLOCKED_BY_URL: 'https://venue.example/legal' },
    (c) => [c.geoNotice, c.geoBlockedByUrl], ['Not here.', 'https://venue.example/legal'],
  ],
  'GEOIP_DB path': [{ GEOIP_DB: '/var/lib/geo/GeoLite2-City.mmdb' }, (c) => c.geoipDb, '/var/lib/geo/GeoLite2-City.mmdb'],
  'MARKET_BIND_ADDRESS follows AUTHZ_BIND_ADDRESS (compose: Envoy in another container)': [
    { AUTHZ_BIND_ADDRESS: '0.0.0.0' }, (c) => [c.bindAddress, c.marketBindAddress], ['0.0.0.0', '0.0.0.0'],
  ],
  'MARKET_BIND_ADDRESS on its own (Kubernetes: gRPC wide for the probe, market on loopback)': [
    { AUTHZ_BIND_ADDRESS: '0.0.0.0', MARKET_BIND_ADDRESS: '127.0.0.1' }, (c) => [c.bindAddress, c.marketBindAddress], ['0.0.0.0', '127.0.0.1'],
  ],
  'REDIS_URL rediss://': [{ REDIS_URL: 'rediss://redis.internal:6380/0' }, (c) => c.redisUrl, 'rediss://redis.internal:6380/0'],
  'blank value = default (not 0)': [{ EDGE_PORT: '   ' }, (c) => c.edgePort, 8080],
};

for (const [name, [env, pick, expected]] of Object.entries(overrides)) {
  test(`config overrides – ${name}`, () => {
    assert.deepEqual(pick(loadConfig(env)), expected);
  });
}

// ---------------------------------------------------------------------------------------
// Malformed values: ConfigError naming the variable, never a silent coercion.
// ---------------------------------------------------------------------------------------
const malformed: Record<string, [env: Env, variable: string]> = {
  'EDGE_PORT=abc': [{ EDGE_PORT: 'abc' }, 'EDGE_PORT'],
  'EDGE_PORT=80.5': [{ EDGE_PORT: '80.5' }, 'EDGE_PORT'],
  'EDGE_PORT=1e3': [{ EDGE_PORT: '1e3' }, 'EDGE_PORT'],
  'EDGE_PORT=0x50': [{ EDGE_PORT: '0x50' }, 'EDGE_PORT'],
  'EDGE_PORT=+8080': [{ EDGE_PORT: '+8080' }, 'EDGE_PORT'],
  'EDGE_PORT=65536': [{ EDGE_PORT: '65536' }, 'EDGE_PORT'],
  'EDGE_PORT=-1': [{ EDGE_PORT: '-1' }, 'EDGE_PORT'],
  'AUTHZ_GRPC_PORT=9191x': [{ AUTHZ_GRPC_PORT: '9191x' }, 'AUTHZ_GRPC_PORT'],
  'MARKET_PORT=eighty': [{ MARKET_PORT: 'eighty' }, 'MARKET_PORT'],
  'AUTHZ_ADMIN_PORT=1 2': [{ AUTHZ_ADMIN_PORT: '1 2' }, 'AUTHZ_ADMIN_PORT'],
  'ENVOY_ADMIN_PORT=99999999999999999999': [{ ENVOY_ADMIN_PORT: '99999999999999999999' }, 'ENVOY_ADMIN_PORT'],
  'XFF_NUM_TRUSTED_HOPS=11': [{ XFF_NUM_TRUSTED_HOPS: '11' }, 'XFF_NUM_TRUSTED_HOPS'],
  'RPS_PER_IP=0': [{ RPS_PER_IP: '0' }, 'RPS_PER_IP'],
  'RPS_PER_IP=abc': [{ RPS_PER_IP: 'abc' }, 'RPS_PER_IP'],
  'RATE_BURST=4.5': [{ RATE_BURST: '4.5' }, 'RATE_BURST'],
  'REPLAY_WINDOW_SECS=abc': [{ REPLAY_WINDOW_SECS: 'abc' }, 'REPLAY_WINDOW_SECS'],
  'REPLAY_WINDOW_SECS=0': [{ REPLAY_WINDOW_SECS: '0' }, 'REPLAY_WINDOW_SECS'],
  'NONCE_TTL_SECS=-5': [{ NONCE_TTL_SECS: '-5' }, 'NONCE_TTL_SECS'],
  'INGEST_MAX_BYTES=1MB': [{ INGEST_MAX_BYTES: '1MB' }, 'INGEST_MAX_BYTES'],
  'ORDER_MAX_BYTES=64k': [{ ORDER_MAX_BYTES: '64k' }, 'ORDER_MAX_BYTES'],
  'ORDER_MAX_TTL_SECS=1.5': [{ ORDER_MAX_TTL_SECS: '1.5' }, 'ORDER_MAX_TTL_SECS'],
  'ORDER_PAYLOAD_MAX_BYTES=0': [{ ORDER_PAYLOAD_MAX_BYTES: '0' }, 'ORDER_PAYLOAD_MAX_BYTES'],
  'ORDER_MAX_SIZE=-1': [{ ORDER_MAX_SIZE: '-1' }, 'ORDER_MAX_SIZE'],
  'ORDER_MAX_SIZE=1e3': [{ ORDER_MAX_SIZE: '1e3' }, 'ORDER_MAX_SIZE'],
  'ORDER_MAX_SIZE=.5': [{ ORDER_MAX_SIZE: '.5' }, 'ORDER_MAX_SIZE'],
  'ORDER_MAX_SIZE=1.': [{ ORDER_MAX_SIZE: '1.' }, 'ORDER_MAX_SIZE'],
  'GEO_UNKNOWN=deny': [{ GEO_UNKNOWN: 'deny' }, 'GEO_UNKNOWN'],
  'GEO_REGION_UNKNOWN=loose': [{ GEO_REGION_UNKNOWN: 'loose' }, 'GEO_REGION_UNKNOWN'],
  'BLOCKED_COUNTRIES=USA': [{ BLOCKED_COUNTRIES: 'US,USA' }, 'BLOCKED_COUNTRIES'],
  'BLOCKED_COUNTRIES=U1': [{ BLOCKED_COUNTRIES: 'U1' }, 'BLOCKED_COUNTRIES'],
  'BLOCKED_REGIONS=ON (no country)': [{ BLOCKED_REGIONS: 'ON' }, 'BLOCKED_REGIONS'],
  'BLOCKED_REGIONS=CA_ON': [{ BLOCKED_REGIONS: 'CA_ON' }, 'BLOCKED_REGIONS'],
  'GEO_TRUSTED_CIDRS=10.0.0.0 (no prefix)': [{ GEO_TRUSTED_CIDRS: '10.0.0.0' }, 'GEO_TRUSTED_CIDRS'],
  'GEO_TRUSTED_CIDRS=localhost/8': [{ GEO_TRUSTED_CIDRS: 'localhost/8' }, 'GEO_TRUSTED_CIDRS'],
  'GEO_BLOCKED_BY_URL=ftp://…': [{ GEO_BLOCKED_BY_URL: 'ftp://venue.example/legal' }, 'GEO_BLOCKED_BY_URL'],
  'GEO_BLOCKED_BY_URL=relative': [{ GEO_BLOCKED_BY_URL: '/legal' }, 'GEO_BLOCKED_BY_URL'],
  'GEO_BLOCKED_BY_URL with > (header injection)': [{ GEO_BLOCKED_BY_URL: 'https://venue.example/a>; rel="x"' }, 'GEO_BLOCKED_BY_URL'],
  'GEOIP_RELOAD_INTERVAL_MS=fast': [{ GEOIP_RELOAD_INTERVAL_MS: 'fast' }, 'GEOIP_RELOAD_INTERVAL_MS'],
  'REDIS_URL=http://…': [{ REDIS_URL: 'http://redis:6379' }, 'REDIS_URL'],
  'MARKET_CACHE_TTL_MS=-1': [{ MARKET_CACHE_TTL_MS: '-1' }, 'MARKET_CACHE_TTL_MS'],
  'SHUTDOWN_GRACE_MS=abc': [{ SHUTDOWN_GRACE_MS: 'abc' }, 'SHUTDOWN_GRACE_MS'],
  'AUTHZ_WORKERS=0': [{ AUTHZ_WORKERS: '0' }, 'AUTHZ_WORKERS'],
  'AUTHZ_WORKERS=2 without REDIS_URL (per-worker nonce stores)': [{ AUTHZ_WORKERS: '2' }, 'AUTHZ_WORKERS'],
  'LOG_LEVEL=verbose': [{ LOG_LEVEL: 'verbose' }, 'LOG_LEVEL'],
  'ORDER_BACKEND_URL=http:// (no TLS)': [{ ...BACKEND, ORDER_BACKEND_URL: 'http://orders.internal.example:8443' }, 'ORDER_BACKEND_URL'],
  'ORDER_BACKEND_URL with a path': [{ ...BACKEND, ORDER_BACKEND_URL: 'https://orders.internal.example/orders' }, 'ORDER_BACKEND_URL'],
  'ORDER_BACKEND_URL without a scheme': [{ ...BACKEND, ORDER_BACKEND_URL: 'orders.internal.example:8443' }, 'ORDER_BACKEND_URL'],
  'ORDER_BACKEND_URL unparseable (https:// only)': [{ ...BACKEND, ORDER_BACKEND_URL: 'https://' }, 'ORDER_BACKEND_URL'],
  'ORDER_BACKEND_URL with a bad port': [{ ...BACKEND, ORDER_BACKEND_URL: 'https://orders.internal.example:99999' }, 'ORDER_BACKEND_URL'],
  'ORDER_BACKEND_TIMEOUT_MS=abc (must not become 0)': [{ ...BACKEND, ORDER_BACKEND_TIMEOUT_MS: 'abc' }, 'ORDER_BACKEND_TIMEOUT_MS'],
  'ORDER_BACKEND_TIMEOUT_MS=0': [{ ...BACKEND, ORDER_BACKEND_TIMEOUT_MS: '0' }, 'ORDER_BACKEND_TIMEOUT_MS'],
  'ORDER_BACKEND_TIMEOUT_MS=5s': [{ ...BACKEND, ORDER_BACKEND_TIMEOUT_MS: '5s' }, 'ORDER_BACKEND_TIMEOUT_MS'],
  'ORDER_BACKEND_MAX_CONN_SECS=abc': [{ ...BACKEND, ORDER_BACKEND_MAX_CONN_SECS: 'abc' }, 'ORDER_BACKEND_MAX_CONN_SECS'],
  'ORDER_BACKEND_CA_FILE missing': [{ ...BACKEND, ORDER_BACKEND_CA_FILE: undefined }, 'ORDER_BACKEND_CA_FILE'],
  'EDGE_CLIENT_CERT_FILE missing': [{ ...BACKEND, EDGE_CLIENT_CERT_FILE: '' }, 'EDGE_CLIENT_CERT_FILE'],
  'EDGE_CLIENT_KEY_FILE missing': [{ ...BACKEND, EDGE_CLIENT_KEY_FILE: undefined }, 'EDGE_CLIENT_KEY_FILE'],
};

function assertConfigError(fn: () => unknown, variable: string): void {
  assert.throws(fn, (err: unknown) => {
    assert.ok(err instanceof ConfigError, `expected a ConfigError, got ${String(err)}`);
    assert.equal(err.variable, variable);
    assert.match(err.message, new RegExp(`^${variable}:`));
    return true;
  });
}

for (const [name, [env, variable]] of Object.entries(malformed)) {
  test(`config malformed – ${name} → ConfigError(${variable})`, () => {
    assertConfigError(() => loadConfig(env), variable);
  });
}

// GEO_TRUSTED_CIDRS: an impossible prefix or a non-address is refused by loadConfig with a
// ConfigError naming the variable, not later by createGeoClassifier as a plain error.
const badCidrs: Record<string, string> = {
  'IPv4 prefix /33': '10.0.0.0/33',
  'IPv6 prefix /129': '::1/129',
  'prefix /999': '10.0.0.0/999',
  'octet 999': '999.0.0.0/8',
  'hex letters, not an address': 'abc/8',
  'three octets': '10.0.0/8',
};

for (const [name, cidr] of Object.entries(badCidrs)) {
  test(`config malformed – GEO_TRUSTED_CIDRS ${name} (${cidr}) is refused at load with ConfigError`, () => {
    assertConfigError(() => loadConfig({ GEO_TRUSTED_CIDRS: cidr }), 'GEO_TRUSTED_CIDRS');
  });
}

test('config – every GEO_TRUSTED_CIDRS value that loadConfig accepts builds a geo classifier (no late failure)', () => {
  const accepted: string[] = [];
  for (const cidr of Object.values(badCidrs)) {
    try {
      loadConfig({ GEO_TRUSTED_CIDRS: cidr });
      accepted.push(cidr);
    } catch { /* refused at load: fine */ }
  }
  for (const cidr of ['10.0.0.0/8', '192.168.0.0/16', 'fd00::/8', '::1/128', '0.0.0.0/0', '::/0', ...accepted]) {
    const c = loadConfig({ GEO_TRUSTED_CIDRS: cidr });
    assert.doesNotThrow(() => createGeoClassifier(c, { lookup: () => null }), `loadConfig accepted ${cidr} but the classifier refuses it`);
  }
});

// NONCE_TTL_SECS against REPLAY_WINDOW_SECS: a signed ingest passes the window for
// 2 × REPLAY_WINDOW_SECS (from ts - window to ts + window), so a nonce kept for less could be
// replayed once it expired (the retention cases in ingest.test.ts): such a TTL is refused.
const retentionCases: Record<string, [env: Env, variable: string | undefined]> = {
  'defaults (600 ≥ 2 × 300) accepted': [{}, undefined],
  'NONCE_TTL_SECS=900 with the default window accepted': [{ NONCE_TTL_SECS: '900' }, undefined],
  'NONCE_TTL_SECS=60 with REPLAY_WINDOW_SECS=300 refused': [{ NONCE_TTL_SECS: '60' }, 'NONCE_TTL_SECS'],
  'REPLAY_WINDOW_SECS=400 with NONCE_TTL_SECS=600 refused': [{ REPLAY_WINDOW_SECS: '400' }, 'NONCE_TTL_SECS'],
};

for (const [name, [env, variable]] of Object.entries(retentionCases)) {
  test(`config nonce retention – ${name}`, () => {
    if (variable === undefined) assert.doesNotThrow(() => loadConfig(env));
    else assertConfigError(() => loadConfig(env), variable);
  });
}

test('config – ConfigError is an Error with name ConfigError and the offending value quoted', () => {
  try {
    loadConfig({ RPS_PER_IP: 'lots' });
    assert.fail('expected a ConfigError');
  } catch (err) {
    assert.ok(err instanceof Error);
    assert.ok(err instanceof ConfigError);
    assert.equal(err.name, 'ConfigError');
    assert.match(err.message, /"lots"/);
  }
});

test('config warnings – the defaults hold the largest valid order: no warning', () => {
  assert.deepEqual(configWarnings(loadConfig({})), []);
});

test('config warnings – ORDER_MAX_BYTES below the largest valid order is named, with the size that fits', () => {
  const c = loadConfig({ ORDER_MAX_BYTES: '4096', ORDER_PAYLOAD_MAX_BYTES: '32768' });
  const [warning, ...rest] = configWarnings(c);
  assert.equal(rest.length, 0);
  assert.match(warning ?? '', /^ORDER_MAX_BYTES=4096 is below the largest valid order/);
  // 32768 bytes → 43692 base64 characters, plus the envelope around them.
  const fits = Number(/Raise ORDER_MAX_BYTES to (\d+)/.exec(warning ?? '')?.[1]);
  assert.ok(fits > 43_692 && fits < 43_692 + 300, String(fits));
  assert.deepEqual(configWarnings(loadConfig({ ORDER_MAX_BYTES: String(fits), ORDER_PAYLOAD_MAX_BYTES: '32768' })), []);
  assert.equal(configWarnings(loadConfig({ ORDER_MAX_BYTES: String(fits - 1), ORDER_PAYLOAD_MAX_BYTES: '32768' })).length, 1);
});
