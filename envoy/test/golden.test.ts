/**
 * The golden files (envoy/golden/, envoy/golden.ts): each shipped profile's committed Envoy
 * configuration is what the renderer makes now, and every one of them passes the real
 * `envoy --mode validate` with the files it names in place (the development PKI npm start
 * generates, the client certificate and CA as compose and the pod mount them).
 *
 *   scripts/node --test envoy/test/golden.test.ts
 */
import assert from 'node:assert/strict';
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { after, test } from 'node:test';
import { ensureDevPki } from '../../scripts/dev/certs.ts';
import { ensureEdgeServerCert } from '../../scripts/dev/edge-server-cert.ts';
import { MOUNTS } from '../../deploy/k8s/render.ts';
import { validateEnvoyThroughMounts } from '../../deploy/test/support.ts';
import { committedGolden, GOLDEN_DIR, goldenDrift, goldenText, npmStartEnv, PROFILES, renderGolden, renderNpmStart, RUN_DIR, writeGolden } from '../golden.ts';
import { tempDir } from './helpers.ts';

const work = tempDir('edge-golden-');
after(() => work.cleanup());
const fresh = renderGolden();

/** Where a stale file first differs from the fresh render, with a few lines of each around it. */
function diffHint(path: string): string {
  const old = readFileSync(join(GOLDEN_DIR, path), 'utf8').split('\n');
  const now = (fresh[path] ?? '').split('\n');
  let i = 0;
  while (i < old.length && i < now.length && old[i] === now[i]) i++;
  const around = (lines: string[]): string => lines.slice(Math.max(0, i - 2), i + 3).map((l, k) => `    ${Math.max(0, i - 2) + k + 1}: ${l}`).join('\n');
  return `envoy/golden/${path} first differs at line ${i + 1}:\n  committed:\n${around(old)}\n  rendered now:\n${around(now)}`;
}

test('golden files – every shipped profile\'s committed Envoy config is what the renderer makes now (else: npm run render:golden, review the diff)', () => {
  const { stale, missing, extra } = goldenDrift(fresh);
  const hint = [
    ...stale.map(diffHint),
    ...missing.map((p) => `envoy/golden/${p}: missing`),
    ...extra.map((p) => `envoy/golden/${p}: no profile renders it`),
  ];
  assert.ok(hint.length === 0, `${hint.join('\n')}\nrun: npm run render:golden, then review: git diff envoy/golden/`);
  assert.deepEqual(new Set(committedGolden().map((p) => p.split('/')[0])), new Set(Object.keys(PROFILES)), 'every profile has its golden files');
});

test('golden files – the check fails on a change: a changed line is stale (with where), a new file missing, a dropped one extra', () => {
  const dir = join(work.dir, 'golden-copy');
  writeGolden(fresh, dir);
  assert.deepEqual(goldenDrift(fresh, dir), { stale: [], missing: [], extra: [] });
  const [first, second] = Object.keys(fresh).sort();
  assert.ok(first !== undefined && second !== undefined);
  const changed = { ...fresh, [first]: fresh[first]!.replace('port_value:', 'port_value: 1') };
  delete changed[second];
  changed['npm-start/new.yaml'] = 'x: 1\n';
  assert.deepEqual(goldenDrift(changed, dir), { stale: [first], missing: ['npm-start/new.yaml'], extra: [second] });
});

test('golden files – the profiles differ where their settings do (global rate limit on/off/service, TLS, PROXY protocol) and nowhere carry this machine\'s paths', () => {
  const bootstrap = (p: string): string => fresh[`${p}/envoy.yaml`] ?? '';
  // On by default with Redis: taken in the Check (routes marked), no ratelimit filter; off: not marked.
  assert.match(bootstrap('npm-start'), /rate_limit: global\n/);
  assert.doesNotMatch(bootstrap('npm-start'), /envoy\.filters\.http\.ratelimit\b/);
  assert.doesNotMatch(bootstrap('rate-limit-local'), /rate_limit: global\n/);
  assert.match(bootstrap('rate-limit-service'), /envoy\.filters\.http\.ratelimit\b/);
  assert.match(bootstrap('tls'), /DownstreamTlsContext/);
  assert.ok(fresh['tls/sds-server-cert.yaml'] !== undefined);
  assert.doesNotMatch(bootstrap('npm-start'), /DownstreamTlsContext/);
  assert.match(bootstrap('tls-client-cert'), /require_client_certificate: true/);
  assert.doesNotMatch(bootstrap('tls'), /require_client_certificate: true/);
  assert.match(bootstrap('proxy-protocol'), /envoy\.filters\.listener\.proxy_protocol/);
  assert.doesNotMatch(bootstrap('npm-start'), /proxy_protocol/);
  const header = goldenText('tls', 'envoy.yaml', '');
  assert.match(header, /npm run render:golden/);
  for (const [path, text] of Object.entries(fresh)) {
    for (const local of [process.cwd(), work.dir, process.env['HOME'] ?? '/nonexistent-home']) {
      assert.ok(!text.includes(local), `${path} carries ${local}`);
    }
  }
});

test('golden files – npm start\'s profile names the files scripts/start.ts\'s own helpers make (development PKI, DEV_EDGE_TLS certificate)', () => {
  const run = join(work.dir, 'paths');
  const pki = ensureDevPki(join(run, 'pki'));
  const edge = ensureEdgeServerCert(join(run, 'pki'));
  const env = npmStartEnv(run, { DEV_EDGE_TLS: '1' });
  assert.equal(env['ORDER_BACKEND_CA_FILE'], pki.backendCaFile);
  assert.equal(env['EDGE_CLIENT_CERT_FILE'], pki.clientCertFile);
  assert.equal(env['EDGE_CLIENT_KEY_FILE'], pki.clientKeyFile);
  assert.equal(env['EDGE_TLS_CERT_FILE'], edge.certFile);
  assert.equal(env['EDGE_TLS_KEY_FILE'], edge.keyFile);
  // The run directory is the only machine-specific input: rendered under another, only it changes.
  const variants: Record<string, string>[] = [{}, { DEV_EDGE_TLS: '1' }, { RATELIMIT_SERVICE_ADDRESS: '127.0.0.1:9191' }];
  for (const settings of variants) {
    const here = renderNpmStart(settings, run);
    const golden = renderNpmStart(settings);
    assert.deepEqual(Object.keys(here), Object.keys(golden));
    for (const [f, text] of Object.entries(here)) assert.equal(text.replaceAll(run, RUN_DIR), golden[f]);
  }
});

test('golden files – every profile\'s committed files pass the real envoy --mode validate, with the certificates and token they name in place', () => {
  // npm start: the run directory as start.ts fills it (its own helpers), the golden files in it.
  const run = join(work.dir, 'run');
  const pki = ensureDevPki(join(run, 'pki'));
  const server = ensureEdgeServerCert(join(run, 'pki'));
  writeFileSync(join(run, 'ratelimit-token'), `${'ab'.repeat(32)}\n`, { mode: 0o600 });
  // The pod's backend-ca Secret volume holds ca.crt.
  const podCa = join(work.dir, 'pod-backend-ca');
  mkdirSync(podCa);
  writeFileSync(join(podCa, 'ca.crt'), readFileSync(pki.backendCaFile));
  const containers: Record<string, { dir: string; mounts: [string, string][] }> = {
    // Both serve TLS on the client port: the server certificate's directory (tls.crt, tls.key).
    compose: { dir: '/etc/envoy', mounts: [['/etc/edge/client', join(pki.dir, 'client')], ['/etc/edge/backend-ca.crt', pki.backendCaFile], ['/etc/edge/server', dirname(server.certFile)]] },
    'k8s-production': { dir: MOUNTS.envoyConfig, mounts: [[MOUNTS.clientCert, join(pki.dir, 'client')], [MOUNTS.backendCa, podCa], [MOUNTS.serverCert, dirname(server.certFile)]] },
  };
  for (const profile of Object.keys(PROFILES)) {
    const where = containers[profile] ?? { dir: RUN_DIR, mounts: [[RUN_DIR, run]] };
    const files = Object.fromEntries(committedGolden().filter((p) => p.startsWith(`${profile}/`))
      .map((p) => [join(where.dir, p.slice(profile.length + 1)), readFileSync(join(GOLDEN_DIR, p), 'utf8')]));
    assert.ok(files[join(where.dir, 'envoy.yaml')] !== undefined, `${profile}: no envoy.yaml`);
    try {
      validateEnvoyThroughMounts(files, join(where.dir, 'envoy.yaml'), where.mounts);
    } catch (err) {
      assert.fail(`${profile}: ${(err as Error).message}`);
    }
  }
});
