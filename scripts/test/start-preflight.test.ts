/**
 * npm start's preflight (scripts/start/preflight.ts) on its own: every setting is checked before
 * anything starts, and the plan names each port the stack will listen on. The real loadConfig and
 * database check run; only whether a redis-server is installed is given.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { ConfigError } from '../../authz/src/common/config.ts';
import { checkSettings, devInt, type StartEnv } from '../start/preflight.ts';

const withRedis = (): boolean => true;
const withoutRedis = (): boolean => false;

/** The ConfigError `fn` throws: its variable and message. */
function refusal(fn: () => unknown): { variable: string; message: string } {
  try {
    fn();
  } catch (err) {
    assert.ok(err instanceof ConfigError, `a ConfigError, got ${String(err)}`);
    return { variable: err.variable, message: err.message };
  }
  assert.fail('no ConfigError thrown');
}

test('preflight – the defaults plan every port by its setting, a private redis-server and the demo backend', () => {
  const plan = checkSettings({}, () => assert.fail('no warning expected'), withRedis);
  assert.deepEqual(Object.fromEntries(plan.ports), {
    EDGE_PORT: 8080, AUTHZ_GRPC_PORT: 9191, MARKET_PORT: 8081, AUTHZ_ADMIN_PORT: 9464, ENVOY_ADMIN_PORT: 9901,
    DEV_REDIS_PORT: 6390, DEV_BACKEND_PORT: 8443,
  });
  assert.equal(plan.redisPort, 6390);
  assert.equal(plan.backendPort, 8443);
  // Checked as the TS service will see it: with the private redis-server's REDIS_URL.
  assert.equal(plan.config.redisUrl, 'redis://127.0.0.1:6390/0');
});

test('preflight – without redis-server, or with REDIS_URL, no private Redis is planned', () => {
  for (const [env, hasRedis] of [[{}, withoutRedis], [{ REDIS_URL: 'redis://127.0.0.1:1/0' }, withRedis]] as const) {
    const plan = checkSettings({ ...env }, () => undefined, hasRedis);
    assert.equal(plan.redisPort, undefined);
    assert.ok(!plan.ports.some(([name]) => name === 'DEV_REDIS_PORT'));
  }
});

test('preflight – ORDER_BACKEND_URL set, or DEV_BACKEND_PORT=0 (a free port), leaves the backend port out of the plan', () => {
  const external = checkSettings({
    ORDER_BACKEND_URL: 'https://backend:8443', ORDER_BACKEND_CA_FILE: 'a', EDGE_CLIENT_CERT_FILE: 'b', EDGE_CLIENT_KEY_FILE: 'c',
  }, () => undefined, withoutRedis);
  assert.equal(external.backendPort, undefined);
  const free = checkSettings({ DEV_BACKEND_PORT: '0' }, () => undefined, withoutRedis);
  assert.equal(free.backendPort, 0);
  for (const plan of [external, free]) assert.ok(!plan.ports.some(([name]) => name === 'DEV_BACKEND_PORT'));
});

const refused: Record<string, { env: StartEnv; variable: string; says: RegExp }> = {
  'port 0 (nobody would know the port)': { env: { EDGE_PORT: '0' }, variable: 'EDGE_PORT', says: /a port in \[1, 65535\] for npm start, got "0"/ },
  'two settings naming one port': { env: { AUTHZ_ADMIN_PORT: '8080' }, variable: 'AUTHZ_ADMIN_PORT', says: /a port other than EDGE_PORT's, got "8080"/ },
  'the private Redis on a service port': { env: { DEV_REDIS_PORT: '9901' }, variable: 'DEV_REDIS_PORT', says: /other than ENVOY_ADMIN_PORT's/ },
  'a development port that is no integer': { env: { DEV_BACKEND_PORT: '84a3' }, variable: 'DEV_BACKEND_PORT', says: /an integer in \[0, 65535\], got "84a3"/ },
  'a bad service setting (loadConfig)': { env: { AUTHZ_TIMEOUT_MS: 'abc' }, variable: 'AUTHZ_TIMEOUT_MS', says: /an integer/ },
  'an unknown setting with STRICT_SETTINGS=1': { env: { STRICT_SETTINGS: '1', EGDE_PORT: '1' }, variable: 'EGDE_PORT', says: /did you mean EDGE_PORT\?/ },
  // Checked here with the others: it used to be checked only after Redis and the backend had started and dev.env was written.
  'DEV_EDGE_TLS neither 1 nor 0': { env: { DEV_EDGE_TLS: 'yes' }, variable: 'DEV_EDGE_TLS', says: /^DEV_EDGE_TLS: expected 1 or 0, got "yes"$/ },
};
for (const [name, tc] of Object.entries(refused)) {
  test(`preflight – refused: ${name}`, () => {
    const r = refusal(() => checkSettings(tc.env, () => undefined, withRedis));
    assert.equal(r.variable, tc.variable);
    assert.match(r.message, tc.says);
  });
}

test('preflight – an unknown setting is one warning line and listed in the plan (not passed to the TS service)', () => {
  const lines: string[] = [];
  const plan = checkSettings({ EGDE_PORT: '9000' }, (l) => lines.push(l), withoutRedis);
  assert.deepEqual(lines, ['warning: EGDE_PORT is not a setting (did you mean EDGE_PORT?); it is ignored (STRICT_SETTINGS=1 makes this an error)']);
  assert.deepEqual(plan.unknown, ['EGDE_PORT']);
  assert.equal(plan.config.edgePort, 8080);
});

test('preflight – DEV_EDGE_TLS: 1 plans TLS on the client port; unset, blank or 0 does not', () => {
  for (const [value, tls] of [[undefined, false], [' ', false], ['0', false], ['1', true], [' 1 ', true]] as const) {
    const env: StartEnv = value === undefined ? {} : { DEV_EDGE_TLS: value };
    assert.equal(checkSettings(env, () => undefined, withoutRedis).devEdgeTls, tls, JSON.stringify(value));
  }
});

test('preflight – devInt: unset or blank is the default; in range is taken; anything else names the setting', () => {
  assert.equal(devInt({}, 'DEV_X', 7, 1, 10), 7);
  assert.equal(devInt({ DEV_X: '  ' }, 'DEV_X', 7, 1, 10), 7);
  assert.equal(devInt({ DEV_X: ' 10 ' }, 'DEV_X', 7, 1, 10), 10);
  for (const bad of ['0', '11', '-1', '1.5', '1e1']) {
    assert.equal(refusal(() => devInt({ DEV_X: bad }, 'DEV_X', 7, 1, 10)).message, `DEV_X: expected an integer in [1, 10], got "${bad}"`);
  }
});
