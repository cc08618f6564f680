/**
 * The names the project reads as settings, in one place (config.ts KNOWN_SETTINGS, recorded from
 * loadConfig plus the secrets and the development ones), agree with what the code reads and with
 * README "Settings"; variables that look like settings but are none are reported with the
 * nearest setting, and refused with STRICT_SETTINGS=1.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { checkSettingNames, ConfigError, KNOWN_SETTINGS, SETTING_PREFIXES, unknownSettings } from '../src/common/config.ts';
import { backendSettings, settingsRead } from '../../deploy/test/support.ts';

const readme = readFileSync(fileURLToPath(new URL('../../README.md', import.meta.url)), 'utf8');
const settingsSection = readme.slice(readme.indexOf('\n## Settings'), readme.indexOf('\n## Errors'));

test('KNOWN_SETTINGS holds every name loadConfig, loadCredentials and the demo backend read', () => {
  for (const name of [...settingsRead(), ...backendSettings()]) assert.ok(KNOWN_SETTINGS.has(name), name);
});

test('README "Settings" documents exactly KNOWN_SETTINGS, and names the prefixes SETTING_PREFIXES derives', () => {
  const documented = new Set([...settingsSection.matchAll(/`([A-Z][A-Z0-9_]*[A-Z0-9])`/g)].map((m) => m[1]!));
  for (const name of KNOWN_SETTINGS) assert.ok(documented.has(name), `${name} is read but not documented`);
  // Every name in a table's first column is a setting (the service's runtime flags are set, not read).
  const firstColumn = [...settingsSection.matchAll(/^\| ([^|]+) \|/gm)].flatMap((m) => [...m[1]!.matchAll(/`([A-Z][A-Z0-9_]+)`/g)].map((n) => n[1]!));
  assert.ok(firstColumn.length > 40);
  for (const name of firstColumn) assert.ok(KNOWN_SETTINGS.has(name), `${name} is documented but nothing reads it`);
  const prefixes = /prefixes\s*\(([^)]*)\)/.exec(settingsSection.replace(/\s+/g, ' '))?.[1] ?? '';
  assert.deepEqual([...prefixes.matchAll(/`([A-Z]+_)`/g)].map((m) => m[1]).sort(), [...SETTING_PREFIXES].sort());
});

test('unknownSettings: prefixed names that are no setting, and near misses of a setting, each with the nearest setting', () => {
  const env = {
    RATE_LIMIT_RPS: '-1', EGDE_PORT: '1', LOGLEVEL: 'debug', GEOIP_DATABASE: 'x', REDIS_PASSWORD: 'x',
    // Not ours: other programs' variables, lowercase names, the service's runtime flags.
    PATH: '/bin', HOME: '/root', NODE_ENV: 'production', NODE_OPTIONS: '', NODE_PATH: '', MALLOC_ARENA_MAX: '2', npm_config_cache: 'x',
    TERM: 'xterm', EDITOR: 'vi', LANG: 'C', EDGE_PORT: '8080', DEV_RUN_DIR: '/tmp', EDGE_INGEST_HMAC_FILE: '/x', BACKEND_PORT: '1',
  };
  assert.deepEqual(unknownSettings(env).map((u) => [u.name, u.nearest]), [
    ['EGDE_PORT', 'EDGE_PORT'], ['GEOIP_DATABASE', 'GEOIP_DB'], ['LOGLEVEL', 'LOG_LEVEL'], ['RATE_LIMIT_RPS', 'RATE_LIMIT_SCOPE'], ['REDIS_PASSWORD', 'REDIS_URL'],
  ]);
  assert.equal(unknownSettings({ RATE_LIMIT_RPS: '-1' })[0]?.message, 'RATE_LIMIT_RPS is not a setting (did you mean RATE_LIMIT_SCOPE?)');
  assert.deepEqual(unknownSettings({ ...process.env, ...Object.fromEntries([...KNOWN_SETTINGS].map((k) => [k, 'x'])) })
    .filter((u) => process.env[u.name] === undefined), [], 'no known setting is reported');
});

test('checkSettingNames: warnings by default; STRICT_SETTINGS=1 refuses them naming the first; STRICT_SETTINGS must be 0 or 1', () => {
  assert.deepEqual(checkSettingNames({ RATE_LIMIT_RPS: '-1' }).map((u) => u.name), ['RATE_LIMIT_RPS']);
  assert.deepEqual(checkSettingNames({ STRICT_SETTINGS: '1', EDGE_PORT: '1' }), []);
  assert.throws(() => checkSettingNames({ STRICT_SETTINGS: '1', RATE_LIMIT_RPS: '-1', EGDE_PORT: '1' }), (err: unknown) => {
    assert.ok(err instanceof ConfigError);
    assert.equal(err.variable, 'EGDE_PORT');
    assert.equal(err.message, 'EGDE_PORT: expected a known setting (STRICT_SETTINGS=1 refuses unknown ones); did you mean EDGE_PORT? (also not settings: RATE_LIMIT_RPS)');
    return true;
  });
  assert.throws(() => checkSettingNames({ STRICT_SETTINGS: 'yes' }), /STRICT_SETTINGS: expected 1 or 0, got "yes"/);
});
