/**
 * The service image (deploy/Dockerfile) without a Docker engine:
 * - what it declares: current Node LTS pinned, production dependencies only, non-root numeric
 *   USER, HEALTHCHECK, SIGTERM, the entry point; every COPY source exists and passes the
 *   Dockerfile's .dockerignore allow-list;
 * - that it is complete: every module the image's commands load (service, renderer, demo
 *   backend) is in the image, and every package they import is a production dependency;
 * - that it runs: the image's WORKDIR is laid out on disk (copied files + production packages
 *   only) and the image's own commands run from it — the service starts, its HEALTHCHECK
 *   command passes, SIGTERM seals and exits 0, nothing is written inside the app directory.
 */
import { after, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { builtinModules } from 'node:module';
import { tmpdir } from 'node:os';
import { join, posix } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { loadConfig } from '../../authz/src/config.ts';
import { freePort } from '../../authz/test/redis-server.ts';
import { loadCompose } from '../compose.ts';
import { DOCKERFILE, imageFiles, parseDockerfile, productionPackages, ROOT, runtimeImports, stageImageTree } from '../image.ts';

const facts = parseDockerfile();
const NODE = join(ROOT, 'scripts/node');

test('Dockerfile – Node 24 LTS pinned to a patch release, multi-stage, production dependencies only, non-root, HEALTHCHECK, SIGTERM', () => {
  assert.match(facts.baseImage, /^node:24\.\d+\.\d+-[a-z]+-slim$/);
  const nodeVersion = spawnSync(NODE, ['--version'], { encoding: 'utf8' }).stdout.trim();
  assert.equal(facts.baseImage.split(/[:-]/)[1], nodeVersion.slice(1), 'the image runs the Node the tests run');
  assert.ok(facts.copies.some((c) => c.from === 'deps' && c.sources.includes('/app/node_modules')), 'node_modules come from the deps stage');
  assert.ok(facts.allRuns.some((r) => /npm ci --omit=dev --ignore-scripts/.test(r)));
  assert.match(facts.user ?? '', /^[1-9]\d*:[1-9]\d*$/, 'numeric non-root USER (Kubernetes can verify runAsNonRoot)');
  assert.deepEqual(facts.entrypoint, ['node', 'authz/src/main.ts']);
  assert.equal(facts.stopSignal, 'SIGTERM');
  assert.ok(facts.healthcheck !== undefined);
  const defaults = loadConfig({});
  assert.deepEqual(facts.expose, [defaults.authzGrpcPort, defaults.marketPort, defaults.authzAdminPort], 'EXPOSE the default ports');
});

test('Dockerfile – every COPY source exists and is re-included by the allow-list in deploy/Dockerfile.dockerignore', () => {
  const ignore = readFileSync(join(ROOT, `${DOCKERFILE}.dockerignore`), 'utf8').split('\n').map((l) => l.trim()).filter((l) => l !== '' && !l.startsWith('#'));
  assert.equal(ignore[0], '*', 'everything is excluded first');
  const allowed = ignore.filter((l) => l.startsWith('!')).map((l) => l.slice(1).replace(/\/$/, ''));
  for (const c of facts.copies.filter((x) => x.from === undefined)) {
    for (const src of c.sources) {
      assert.ok(existsSync(join(ROOT, src)), `COPY source missing: ${src}`);
      assert.ok(allowed.includes(src.replace(/\/$/, '')), `${src} is excluded from the build context`);
    }
  }
  for (const secret of ['node_modules', '.venv', 'deploy/.secrets', '.run', '.git']) assert.ok(!allowed.some((a) => secret.startsWith(a)), secret);
});

/** Every command the image is run with: its ENTRYPOINT, compose's entrypoints, the k8s CronJob. */
function imageEntryModules(): string[] {
  const compose = loadCompose();
  const fromCompose = Object.values(compose.services).filter((s) => s.image === compose.services['authz']?.image)
    .map((s) => s.entrypoint ?? [...facts.entrypoint]).map((e) => e[1]!);
  return [...new Set([facts.entrypoint[1]!, ...fromCompose])];
}

test('Dockerfile – every module the image\'s commands load is in the image; every package they import is a production dependency', () => {
  const inImage = new Map(imageFiles(facts).map(([src, dest]) => [posix.relative(facts.workdir, dest), src]));
  const prodDeps = new Set(Object.keys((JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8')) as { dependencies: Record<string, string> }).dependencies));
  const installed = new Set(productionPackages());
  const seen = new Set<string>();
  const queue = imageEntryModules();
  assert.ok(queue.includes('envoy/render-cli.ts') && queue.includes('scripts/dev/order-backend-main.ts'));
  while (queue.length > 0) {
    const mod = queue.pop()!;
    if (seen.has(mod)) continue;
    seen.add(mod);
    assert.ok(inImage.has(mod), `${mod} is loaded but not copied into the image`);
    for (const spec of runtimeImports(readFileSync(join(ROOT, inImage.get(mod)!), 'utf8'))) {
      if (spec.startsWith('.')) queue.push(posix.normalize(posix.join(posix.dirname(mod), spec)));
      else if (spec.startsWith('node:') || builtinModules.includes(spec)) continue;
      else {
        const pkg = spec.startsWith('@') ? spec.split('/').slice(0, 2).join('/') : spec.split('/')[0]!;
        assert.ok(prodDeps.has(pkg) && installed.has(pkg), `${mod} imports ${pkg}, not a production dependency`);
      }
    }
  }
  assert.ok(seen.size > 20, `walked ${seen.size} modules`);
});

// ─── The image's commands, run from its WORKDIR laid out on disk ───────────────────────────
const stage = mkdtempSync(join(tmpdir(), 'edge-image-'));
const app = stageImageTree(stage, facts);
const procs: ChildProcess[] = [];
after(() => {
  for (const p of procs) if (p.exitCode === null && p.signalCode === null) p.kill('SIGKILL');
  rmSync(stage, { recursive: true, force: true });
});

function listing(dir: string): string[] {
  return readdirSync(dir, { recursive: true, withFileTypes: true })
    .filter((d) => !join(d.parentPath, d.name).includes(`${app}/node_modules`))
    .map((d) => join(d.parentPath, d.name)).sort();
}

/** Runs an image command (`node …`) from the staged WORKDIR with the image's ENV plus `env`. */
function run(argv: readonly string[], env: Record<string, string>): ChildProcess {
  assert.equal(argv[0], 'node');
  const p = spawn(NODE, argv.slice(1), { cwd: app, env: { PATH: process.env['PATH'] ?? '', ...facts.env, ...env }, stdio: ['ignore', 'pipe', 'pipe'] });
  procs.push(p);
  return p;
}

test('image – the service starts from the image\'s files, passes its HEALTHCHECK, seals on SIGTERM and exits 0, writing nothing in /app', async () => {
  const before = listing(app);
  const secrets = mkdtempSync(join(tmpdir(), 'edge-image-secrets-'));
  writeFileSync(join(secrets, 'hmac'), `hex:${'5a'.repeat(32)}\n`, { mode: 0o400 });
  writeFileSync(join(secrets, 'feed'), `${'cd'.repeat(32)}\n`, { mode: 0o400 });
  const [grpc, market, admin] = await Promise.all([freePort(), freePort(), freePort()]);
  const env = {
    AUTHZ_BIND_ADDRESS: '127.0.0.1', AUTHZ_GRPC_PORT: String(grpc), MARKET_PORT: String(market), AUTHZ_ADMIN_PORT: String(admin),
    EDGE_INGEST_HMAC_FILE: join(secrets, 'hmac'), EDGE_FEED_ED25519_PUBLIC_KEY_FILE: join(secrets, 'feed'), SHUTDOWN_GRACE_MS: '100',
  };
  const svc = run(facts.entrypoint, env);
  let out = '';
  svc.stdout?.on('data', (d: Buffer) => (out += d.toString()));
  svc.stderr?.on('data', (d: Buffer) => (out += d.toString()));
  const health = facts.healthcheck!.command;
  let healthy = false;
  for (let i = 0; i < 100 && !healthy; i++) {
    const h = run(health, env);
    healthy = (await new Promise<number | null>((r) => h.once('exit', r))) === 0;
    if (!healthy) await sleep(100);
  }
  assert.ok(healthy, `HEALTHCHECK never passed:\n${out}`);
  const exited = new Promise<number | null>((r) => svc.once('exit', r));
  svc.kill('SIGTERM');
  assert.equal(await Promise.race([exited, sleep(5000).then(() => 'timeout')]), 0, out);
  assert.match(out, /seal/i);
  assert.ok(!out.includes('5a'.repeat(32)), 'the HMAC key is never logged');
  assert.deepEqual(listing(app), before, 'the service wrote into its read-only app directory');
  rmSync(secrets, { recursive: true, force: true });
});

test('image – the compose render one-shot and the demo backend run from the image\'s files', async () => {
  const compose = loadCompose();
  const render = compose.services['render']!;
  const out = mkdtempSync(join(tmpdir(), 'edge-image-render-'));
  const argv = render.entrypoint!.map((a) => (a === '/etc/envoy' ? out : a));
  const r = run(argv, render.environment ?? {});
  assert.equal(await new Promise<number | null>((res) => r.once('exit', res)), 0);
  assert.ok(statSync(join(out, 'envoy.yaml')).size > 1000 && existsSync(join(out, 'sds-client-cert.yaml')));
  rmSync(out, { recursive: true, force: true });

  const { generateDevPki } = await import('../../scripts/dev/certs.ts');
  const pki = generateDevPki(mkdtempSync(join(tmpdir(), 'edge-image-pki-')), 'backend');
  const port = await freePort();
  const backend = compose.services['backend']!;
  const b = run(backend.entrypoint!, { BACKEND_CERT_FILE: pki.backendCertFile, BACKEND_KEY_FILE: pki.backendKeyFile, BACKEND_CLIENT_CA_FILE: pki.clientCaFile, BACKEND_PORT: String(port), BACKEND_BIND_ADDRESS: '127.0.0.1' });
  let line = '';
  b.stdout?.on('data', (d: Buffer) => (line += d.toString()));
  for (let i = 0; i < 100 && !line.includes('listening'); i++) await sleep(50);
  assert.match(line, /demo order backend listening/);
  const exited = new Promise<number | null>((res) => b.once('exit', res));
  b.kill('SIGTERM');
  assert.equal(await exited, 0);
  rmSync(pki.dir, { recursive: true, force: true });
});
