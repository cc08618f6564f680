/**
 * `npm start`: the whole local stack in the foreground.
 *
 *   Redis (a private redis-server when one is installed and REDIS_URL is unset; else the
 *   in-memory stores) · development certificates and keys (generated into .run/, never
 *   committed) · the demo mTLS order backend (unless ORDER_BACKEND_URL is set) · the TS
 *   service · Envoy. Every setting of the README is honoured. Ready when
 *   GET http://127.0.0.1:$EDGE_PORT/healthz answers 200. Ctrl-C (or SIGTERM) seals the
 *   service and stops everything.
 */
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { generateKeyPairSync, randomBytes } from 'node:crypto';
import { existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join, relative } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { fileURLToPath } from 'node:url';
import { loadConfig } from '../authz/src/config.ts';
import { envoyBinary } from '../envoy/envoy-bin.ts';
import { renderEnvoy } from '../envoy/render.ts';
import { generateDevPki } from './dev/certs.ts';
import { createOrderBackend } from './dev/order-backend.ts';

const ROOT = fileURLToPath(new URL('../', import.meta.url));
/** Where keys, certificates, Redis data and the rendered config go (DEV_RUN_DIR, default .run/). */
const RUN = process.env['DEV_RUN_DIR'] || join(ROOT, '.run');
/** How the banner names a file in RUN: relative (./…) below the working directory, else absolute; quoted. */
const shown = (file: string): string => {
  const rel = relative(process.cwd(), join(RUN, file));
  return `'${rel.startsWith('..') || rel.startsWith('/') ? join(RUN, file) : `./${rel}`}'`;
};
mkdirSync(RUN, { recursive: true, mode: 0o700 });
const env: Record<string, string | undefined> = { ...process.env };
const children: ChildProcess[] = [];
let backend: ReturnType<typeof createOrderBackend> | undefined;
const say = (msg: string): void => void process.stdout.write(`start: ${msg}\n`);

/** Development secrets: generated once into .run/dev.env (mode 0600), reused across restarts. */
function devSecrets(): Record<string, string> {
  const file = join(RUN, 'dev.env');
  if (!existsSync(file)) {
    const { privateKey, publicKey } = generateKeyPairSync('ed25519');
    const seed = Buffer.from(privateKey.export({ format: 'jwk' }).d ?? '', 'base64url').toString('hex');
    const pub = Buffer.from(publicKey.export({ format: 'jwk' }).x ?? '', 'base64url').toString('hex');
    writeFileSync(file, [
      `EDGE_INGEST_HMAC=hex:${randomBytes(32).toString('hex')}`,
      `EDGE_FEED_ED25519_PUBLIC_KEY=${pub}`,
      `# The feed's private key: used only by scripts/edge-client.ts to sign demo documents.`,
      `EDGE_FEED_ED25519_KEY=${seed}`,
    ].join('\n') + '\n', { mode: 0o600 });
  }
  return Object.fromEntries(readFileSync(file, 'utf8').split('\n').filter((l) => /^[A-Z0-9_]+=/.test(l)).map((l) => {
    const i = l.indexOf('=');
    return [l.slice(0, i), l.slice(i + 1)];
  }));
}

async function waitHttp(url: string, timeoutMs: number): Promise<boolean> {
  const end = Date.now() + timeoutMs;
  while (Date.now() < end) {
    try {
      if ((await fetch(url)).status === 200) return true;
    } catch { /* not yet */ }
    await sleep(100);
  }
  return false;
}

/** Only the TS service needs the keys; Redis and Envoy start without them in their environment. */
const SECRET_ENV = new Set(['EDGE_INGEST_HMAC', 'EDGE_INGEST_HMAC_PREVIOUS', 'EDGE_FEED_ED25519_KEY', 'REDIS_URL']);

function run(name: string, cmd: string, args: string[], extraEnv: Record<string, string | undefined>): ChildProcess {
  const base = name === 'authz' ? env : Object.fromEntries(Object.entries(env).filter(([k]) => !SECRET_ENV.has(k)));
  const p = spawn(cmd, args, { env: { ...base, ...extraEnv }, stdio: ['ignore', 'inherit', 'inherit'] });
  p.on('exit', (code, signal) => {
    if (!stopping) {
      say(`${name} exited (${code ?? signal}); stopping the stack`);
      void stop(1);
    }
  });
  children.push(p);
  return p;
}

let stopping = false;
async function stop(code = 0): Promise<void> {
  if (stopping) return;
  stopping = true;
  say('sealing and stopping…');
  // SIGTERM seals the TS service (credentials zeroed, Checks denied) and drains it; Envoy drains too.
  for (const p of [...children].reverse()) p.kill('SIGTERM');
  await Promise.race([Promise.all(children.map((p) => (p.exitCode !== null || p.signalCode !== null ? null : new Promise((r) => p.once('exit', r))))), sleep(10_000)]);
  for (const p of children) if (p.exitCode === null && p.signalCode === null) p.kill('SIGKILL');
  await backend?.close();
  say('stopped');
  process.exit(code);
}
process.on('SIGINT', () => void stop(0));
process.on('SIGTERM', () => void stop(0));

const secrets = devSecrets();
for (const [k, v] of Object.entries(secrets)) if (k !== 'EDGE_FEED_ED25519_KEY' && env[k] === undefined) env[k] = v;

// Redis: honour REDIS_URL; else a private redis-server when installed; else in-memory stores.
if (env['REDIS_URL'] === undefined) {
  const port = Number(env['DEV_REDIS_PORT'] ?? 6390);
  if (spawnSync('redis-server', ['--version']).status === 0) {
    mkdirSync(join(RUN, 'redis'), { recursive: true, mode: 0o700 });
    // --set-proc-title no: its command line keeps naming its data directory (ps, and the e2e test).
    run('redis', 'redis-server', ['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'yes', '--appendfsync', 'always', '--dir', join(RUN, 'redis'), '--set-proc-title', 'no'], {});
    env['REDIS_URL'] = `redis://127.0.0.1:${port}/0`;
    say(`redis-server on 127.0.0.1:${port}`);
    await sleep(300);
  } else {
    say('redis-server not found: the TS service will use its in-memory stores (development only)');
  }
}

// Order backend: honour ORDER_BACKEND_URL; else the demo mTLS backend with development certificates.
if (env['ORDER_BACKEND_URL'] === undefined) {
  const pki = generateDevPki(join(RUN, 'pki'));
  backend = createOrderBackend({ certFile: pki.backendCertFile, keyFile: pki.backendKeyFile, clientCaFile: pki.clientCaFile });
  const port = await backend.listen(Number(env['DEV_BACKEND_PORT'] ?? 8443));
  Object.assign(env, {
    ORDER_BACKEND_URL: `https://localhost:${port}`,
    ORDER_BACKEND_CA_FILE: pki.backendCaFile,
    EDGE_CLIENT_CERT_FILE: pki.clientCertFile,
    EDGE_CLIENT_KEY_FILE: pki.clientKeyFile,
  });
  say(`demo mTLS order backend on https://localhost:${port} (certificates in ${shown('pki')})`);
}

const config = loadConfig(env);
run('authz', join(ROOT, 'scripts', 'node'), [join(ROOT, 'authz/src/main.ts')], {});
if (!(await waitHttp(`http://127.0.0.1:${config.marketPort}/`, 20_000))) {
  say('the TS service did not come up');
  await stop(1);
}
const sdsPath = join(RUN, 'sds.yaml');
const rendered = renderEnvoy(config, { sdsPath });
for (const w of rendered.warnings) say(`envoy config warning: ${w}`);
writeFileSync(join(RUN, 'envoy.yaml'), rendered.bootstrap);
if (rendered.sds !== undefined) writeFileSync(sdsPath, rendered.sds);
run('envoy', envoyBinary(env), ['-c', join(RUN, 'envoy.yaml'), '--disable-hot-restart', '-l', 'warning'], {});
const edge = `http://127.0.0.1:${config.edgePort}`;
if (!(await waitHttp(`${edge}/healthz`, 30_000))) {
  say('Envoy did not become ready');
  await stop(1);
}
say(`READY  ${edge}/healthz → 200
  clients       ${edge}   (Envoy; per-IP rate limit ${config.rpsPerIp}/s burst ${config.rateBurst})
  authz gRPC    127.0.0.1:${config.authzGrpcPort}   (.venv/bin/grpcurl -plaintext 127.0.0.1:${config.authzGrpcPort} list)
  market        127.0.0.1:${config.marketPort}
  metrics       http://127.0.0.1:${config.authzAdminPort}/metrics
  envoy admin   http://127.0.0.1:${config.envoyAdminPort}
  try it:
    set -a; . ${shown('dev.env')}; set +a
    EDGE_PORT=${config.edgePort} scripts/node scripts/edge-client.ts demo-ingest 0xdemo
    curl -s ${edge}/v1/markets | head -c 300; echo
    head -c 64 /dev/urandom > /tmp/order.bin
    EDGE_PORT=${config.edgePort} scripts/node scripts/edge-client.ts order 0xdemo 10 /tmp/order.bin
  Ctrl-C seals and stops everything.`);
