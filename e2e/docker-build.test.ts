/**
 * The service image, built by the real `docker build -f deploy/Dockerfile` (BuildKit, so
 * deploy/Dockerfile.dockerignore is the context's filter) and then run: what the Dockerfile
 * promises is checked on the image the engine made, not by reading the Dockerfile.
 *
 * Needs a Docker engine (.ci/run starts one: scripts/container-engine.sh); the base image is the
 * official node image when present, else the local stand-in of `npm run images`
 * (e2e/lib/images.ts). Without an engine every test here skips with one line saying why.
 */
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile, execFileSync } from 'node:child_process';
import { generateKeyPairSync, randomBytes } from 'node:crypto';
import { chmodSync, mkdirSync, readdirSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { promisify } from 'node:util';
import { loadConfig } from '../authz/src/common/config.ts';
import { SERVICE_RUNTIME_ENV } from '../authz/src/common/runtime-env.ts';
import { generateDevPki } from '../scripts/dev/certs.ts';
import { buildServiceImage } from './containers/stack.ts';
import { SERVICE_IMAGE } from './containers/definitions.ts';
import { containerSuite, dockerCli, dockerEngine, imageFor } from './lib/images.ts';
import { tempDir } from '../testkit/temp-dir.ts';

const engine = dockerEngine();
const skip = engine.ok ? undefined : `skipped: ${engine.why}`;
const run = promisify(execFile);
const docker = (args: readonly string[], timeout = 60_000): Promise<string> =>
  run(dockerCli(), [...args], { encoding: 'utf8', timeout, maxBuffer: 16 << 20 }).then((r) => r.stdout);
/** Containers this file starts, removed in `after` whatever happened. */
const started: string[] = [];
const LABEL = `edge-trading-proxy.e2e.pid=${process.pid}`;

interface ImageConfig {
  User: string; Entrypoint: string[]; StopSignal: string; Env: string[]; ExposedPorts: Record<string, unknown>;
  Healthcheck?: { Test: string[]; Interval: number; Timeout: number; StartPeriod: number; Retries: number };
}

async function containerState(id: string): Promise<{ Status: string; ExitCode: number; Health?: { Status: string } }> {
  return JSON.parse(await docker(['inspect', '--format', '{{json .State}}', id])) as { Status: string; ExitCode: number; Health?: { Status: string } };
}

async function until<T>(what: string, timeoutMs: number, probe: () => Promise<T | undefined>): Promise<T> {
  const end = Date.now() + timeoutMs;
  for (;;) {
    const v = await probe();
    if (v !== undefined) return v;
    if (Date.now() > end) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await sleep(250);
  }
}

containerSuite('docker build -f deploy/Dockerfile', skip, () => {
  let config: ImageConfig;
  let dir: string;
  before(async () => {
    await buildServiceImage();
    config = (JSON.parse(await docker(['image', 'inspect', SERVICE_IMAGE])) as { Config: ImageConfig }[])[0]!.Config;
    dir = tempDir('edge-docker-build-');
    chmodSync(dir, 0o755);
  }, { timeout: 11 * 60_000 });
  after(async () => {
    if (started.length > 0) await docker(['rm', '-f', '-v', ...started]).catch(() => undefined);
    if (dir !== undefined) rmSync(dir, { recursive: true, force: true });
  });

  test('image – non-root numeric user, the service as entrypoint, SIGTERM to stop, a health check, the default ports exposed', () => {
    assert.match(config.User, /^[1-9]\d*:[1-9]\d*$/);
    assert.deepEqual(config.Entrypoint, ['node', 'authz/src/main.js']);
    assert.equal(config.StopSignal, 'SIGTERM');
    assert.ok(config.Healthcheck !== undefined && config.Healthcheck.Test.join(' ').includes('/healthz'), JSON.stringify(config.Healthcheck));
    const d = loadConfig({});
    assert.deepEqual(Object.keys(config.ExposedPorts).sort(), [d.authzGrpcPort, d.marketPort, d.authzAdminPort].map((p) => `${p}/tcp`).sort());
  });

  test('image – runs with the service runtime settings (authz/src/common/runtime-env.ts) and NODE_ENV=production', () => {
    for (const [k, v] of Object.entries({ ...SERVICE_RUNTIME_ENV, NODE_ENV: 'production' })) assert.ok(config.Env.includes(`${k}=${v}`), `${k}=${v} in ${config.Env.join(' ')}`);
  });

  test('image – /app holds exactly what the Dockerfile copies, compiled JavaScript and no TypeScript, owned by root, production dependencies only, the Node the tests run', async () => {
    const ls = await docker(['run', '--rm', '--label', LABEL, '--entrypoint', 'sh', SERVICE_IMAGE, '-c',
      'ls -A /app; echo --; ls /app/node_modules /app/node_modules/@grpc; echo --; stat -c %u /app /app/authz/src; test -w /app && echo writable || echo read-only; echo --; node --version; echo --; '
      + 'find /app -path /app/node_modules -prune -o -type f -name "*.ts" -print; echo --; find /app -path /app/node_modules -prune -o -type f -name "*.js" -print | wc -l']);
    const [top, modules, owner, version, tsFiles, jsCount] = ls.split('--\n');
    assert.equal(tsFiles!.trim(), '', 'no .ts file outside node_modules: the image runs the compiled JavaScript');
    assert.ok(Number(jsCount!.trim()) >= 50, `${jsCount!.trim()} compiled .js files`);
    assert.deepEqual(top!.trim().split('\n').sort(), ['authz', 'envoy', 'node_modules', 'package.json', 'proto', 'scripts']);
    for (const dev of ['typescript', 'eslint', 'testcontainers', 'tweetnacl', 'fast-check']) assert.ok(!modules!.split(/\s/).includes(dev), `${dev} is a dev dependency`);
    for (const prod of ['ioredis', 'maxmind', 'grpc-js', 'grpc-js-xds']) assert.ok(modules!.split(/\s/).includes(prod), `${prod} installed`);
    assert.deepEqual(owner!.trim().split('\n'), ['0', '0', 'read-only']);
    assert.equal(version!.trim(), execFileSync(join(process.cwd(), 'scripts/node'), ['--version'], { encoding: 'utf8' }).trim());
  });

  test('image – the service runs read-only with its secrets as files: healthy, SIGTERM seals and exits 0, no secret in its log', { timeout: 120_000 }, async () => {
    const secrets = join(dir, 'secrets');
    mkdirSync(secrets, { mode: 0o755 });
    const hmac = randomBytes(32).toString('hex');
    const feed = generateKeyPairSync('ed25519').publicKey.export({ format: 'jwk' }).x!;
    writeFileSync(join(secrets, 'ingest_hmac'), `hex:${hmac}\n`, { mode: 0o444 });
    writeFileSync(join(secrets, 'feed_public_keys'), `${Buffer.from(feed, 'base64url').toString('hex')}\n`, { mode: 0o444 });
    const id = (await docker(['run', '-d', '--label', LABEL, '--read-only', '--tmpfs', '/tmp', '--cap-drop', 'ALL', '--security-opt', 'no-new-privileges:true',
      '-v', `${secrets}:/run/secrets:ro`, '-e', 'EDGE_INGEST_HMAC_FILE=/run/secrets/ingest_hmac', '-e', 'EDGE_FEED_ED25519_PUBLIC_KEY_FILE=/run/secrets/feed_public_keys',
      '-e', 'SHUTDOWN_GRACE_MS=500', '--health-interval', '1s', '--health-start-period', '1s', SERVICE_IMAGE])).trim();
    started.push(id);
    await until('the image health check to pass', 60_000, async () => ((await containerState(id)).Health?.Status === 'healthy' ? true : undefined));
    const t0 = Date.now();
    await docker(['stop', '--time', '10', id], 30_000);
    const state = await containerState(id);
    assert.equal(state.ExitCode, 0, `exit ${state.ExitCode}`);
    // Margin: docker stop's grace is 10 s, the service drains for SHUTDOWN_GRACE_MS=500: 9.5 s to spare.
    assert.ok(Date.now() - t0 < 10_000, `stopped after ${Date.now() - t0} ms, inside the 10 s grace`);
    const { stdout, stderr } = await run(dockerCli(), ['logs', id], { encoding: 'utf8' });
    assert.match(stdout + stderr, /sealed: credentials zeroed/);
    assert.ok(!(stdout + stderr).includes(hmac), 'the HMAC key is not in the log');
  });

  test('image – the compose renderer writes Envoy\'s config and the demo backend serves mTLS, both from the same image', { timeout: 120_000 }, async () => {
    const out = join(dir, 'envoy');
    mkdirSync(out, { mode: 0o777 });
    chmodSync(out, 0o777);
    // The compose `render` service's settings for the order backend (deploy/docker-compose.yml).
    const backendEnv = ['ORDER_BACKEND_URL=https://backend:8443', 'ORDER_BACKEND_CA_FILE=/etc/edge/backend-ca.crt',
      'EDGE_CLIENT_CERT_FILE=/etc/edge/client/tls.crt', 'EDGE_CLIENT_KEY_FILE=/etc/edge/client/tls.key'].flatMap((e) => ['-e', e]);
    await docker(['run', '--rm', '--label', LABEL, '--read-only', '--network', 'none', '-v', `${out}:/etc/envoy`, ...backendEnv, '--entrypoint', 'node', SERVICE_IMAGE,
      'envoy/render-cli.js', '/etc/envoy', '--sds-path', '/etc/envoy/sds-client-cert.yaml', '--node-id', 'edge-envoy']);
    assert.deepEqual(readdirSync(out).sort(), ['envoy.yaml', 'sds-client-cert.yaml']);
    assert.ok(statSync(join(out, 'envoy.yaml')).size > 1000);

    const pki = generateDevPki(join(dir, 'pki'));
    execFileSync('chmod', ['-R', 'a+rX', pki.dir]);
    const id = (await docker(['run', '-d', '--label', LABEL, '--read-only', '-v', `${pki.dir}:/pki:ro`, '--entrypoint', 'node',
      '-e', 'BACKEND_CERT_FILE=/pki/backend.crt', '-e', 'BACKEND_KEY_FILE=/pki/backend.key', '-e', 'BACKEND_CLIENT_CA_FILE=/pki/client-ca.crt',
      SERVICE_IMAGE, 'scripts/dev/order-backend-main.js'])).trim();
    started.push(id);
    await until('the backend to listen', 30_000, async () => ((await docker(['logs', id])).includes('demo order backend listening') ? true : undefined));
    await docker(['stop', '--time', '10', id], 30_000);
    assert.equal((await containerState(id)).ExitCode, 0);
  });

  test('image – its base is the Node image the tests pick (official, else the local stand-in)', async () => {
    const history = await docker(['image', 'inspect', '--format', '{{json .RootFS.Layers}}', imageFor('node')]);
    const ours = await docker(['image', 'inspect', '--format', '{{json .RootFS.Layers}}', SERVICE_IMAGE]);
    const base = JSON.parse(history) as string[];
    assert.deepEqual((JSON.parse(ours) as string[]).slice(0, base.length), base, 'the service image is built on that base');
  });
});
