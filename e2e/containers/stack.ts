/**
 * E2E_DRIVER=containers: the same stack as e2e/lib/stack.ts on containers via testcontainers
 * (Envoy, the service image built from deploy/Dockerfile, Redis), with the same Stack interface
 * so the same scenario files run on it. Needs a Docker engine (scripts/container-engine.sh).
 *
 * Made to run where no image registry can be reached:
 * - images: e2e/lib/images.ts (an image that is present is never pulled; the local stand-ins of
 *   `npm run images` when the official ones are absent);
 * - the service image is built by the real `docker build -f deploy/Dockerfile` (BuildKit CLI);
 * - no helper containers: testcontainers' reaper (Ryuk) is off and this driver removes what it
 *   started itself (stop(), and at start any container or network a dead test process left, by
 *   label); the host's order backend is reached through the network's gateway address instead
 *   of testcontainers' SSH port-forwarding container;
 * - every wait is bounded (startup timeouts, the build's timeout).
 *
 * What differs from local processes, and how the interface is kept:
 * - the admin ports listen on the containers' loopback (seal is loopback-only): `authzAdmin`
 *   and `envoyAdmin` are small proxies on the host that run each request inside the container;
 * - `logs()` are the containers' stdout/stderr; `pids()` are the host pids of the containers' main
 *   processes (`docker inspect`), so RSS, descriptor and no-process-left checks read /proc alike.
 */
import { execFile, spawnSync } from 'node:child_process';
import { generateKeyPairSync, randomBytes } from 'node:crypto';
import { chmodSync, mkdirSync, rmSync, writeFileSync } from 'node:fs';
import { createServer, type Server } from 'node:http';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { GenericContainer, Network, Wait, type StartedNetwork, type StartedTestContainer } from 'testcontainers';
import { loadConfig } from '../../authz/src/common/config.ts';
import { renderEnvoy } from '../../envoy/render.ts';
import { freePort, type PrivateRedis } from '../../testkit/redis-server.ts';
import { ROOT } from '../../deploy/paths.ts';
import { generateDevPki } from '../../scripts/dev/certs.ts';
import { createOrderBackend } from '../../scripts/dev/order-backend.ts';
import { dockerCli, dockerEngine, imageFor } from '../lib/images.ts';
import type { Stack, StackOptions } from '../lib/stack.ts';
import { containerDefinitions, HOST_ALIAS, loopbackRequestCommand, parseLoopbackResponse, PATHS, PORTS, SECRET_FILES, SERVICE_IMAGE, stackEnv, type ContainerDef, type ContainerStackInput, type LoopbackTool } from './definitions.ts';
import { tempDir } from '../../testkit/temp-dir.ts';

// The reaper is a container image of its own (testcontainers/ryuk), which cannot be pulled here.
process.env['TESTCONTAINERS_RYUK_DISABLED'] = 'true';

/** Marks what this driver starts; the value is the test process's pid. */
const OWNER_LABEL = 'edge-trading-proxy.e2e.pid';
const STARTUP_TIMEOUT_MS = 90_000;
const BUILD_TIMEOUT_MS = 10 * 60_000;
const run = promisify(execFile);

/**
 * Removes the containers of test processes that are gone (a crashed run), then the networks
 * testcontainers made that nothing uses any more.
 */
function removeOrphans(): void {
  const docker = dockerCli();
  const alive = (pid: string): boolean => { try { process.kill(Number(pid), 0); return true; } catch { return false; } };
  const out = spawnSync(docker, ['ps', '-a', '--filter', `label=${OWNER_LABEL}`, '--format', `{{.ID}} {{.Label "${OWNER_LABEL}"}}`], { encoding: 'utf8', timeout: 30_000 }).stdout ?? '';
  const dead = out.split('\n').map((l) => l.trim().split(' ')).filter(([id, pid]) => id !== undefined && id !== '' && !alive(pid ?? '')).map(([id]) => id!);
  if (dead.length > 0) spawnSync(docker, ['rm', '-f', '-v', ...dead], { stdio: 'ignore', timeout: 60_000 });
  spawnSync(docker, ['network', 'prune', '-f', '--filter', 'label=org.testcontainers=true'], { stdio: 'ignore', timeout: 60_000 });
}

let built: Promise<void> | undefined;

/**
 * `docker build -f deploy/Dockerfile` from the repository root, once per test process (the
 * engine's layer cache makes a rebuild of unchanged sources a few seconds). The BuildKit CLI
 * honours deploy/Dockerfile.dockerignore, so the context is only what the image copies.
 */
export function buildServiceImage(): Promise<void> {
  built ??= run(dockerCli(), ['build', '-f', 'deploy/Dockerfile', '--build-arg', `NODE_IMAGE=${imageFor('node')}`, '-t', SERVICE_IMAGE, '.'], {
    cwd: ROOT, env: { ...process.env, DOCKER_BUILDKIT: '1' }, timeout: BUILD_TIMEOUT_MS, maxBuffer: 64 << 20,
  }).then(() => undefined, (err: unknown) => {
    built = undefined;
    throw new Error(`docker build -f deploy/Dockerfile failed: ${(err as { stderr?: string }).stderr?.slice(-3000) ?? String(err)}`);
  });
  return built;
}

function waitForStatuses(path: string, port: number, statuses: readonly number[]): ReturnType<typeof Wait.forHttp> {
  return Wait.forHttp(path, port).forStatusCodeMatching((status) => statuses.includes(status));
}

/** The gateway address of a Docker network: how its containers reach the host. */
function gatewayOf(network: StartedNetwork): string {
  const r = spawnSync(dockerCli(), ['network', 'inspect', network.getId(), '--format', '{{range .IPAM.Config}}{{.Gateway}} {{end}}'], { encoding: 'utf8', timeout: 30_000 });
  const gw = r.stdout?.trim().split(' ')[0];
  if (r.status !== 0 || gw === undefined || gw === '') throw new Error(`no gateway for network ${network.getName()}: ${r.stderr}`);
  return gw;
}

/** Runs one HTTP request inside a container against its loopback port. */
async function execRequest(c: StartedTestContainer, tool: LoopbackTool, port: number, method: string, path: string, authorization?: string): Promise<{ status: number; body: string }> {
  return parseLoopbackResponse(tool, (await c.exec([...loopbackRequestCommand(tool, port, method, path, authorization)])).stdout);
}

/** A host HTTP server forwarding every request into the container's loopback `port`. */
async function loopbackProxy(get: () => StartedTestContainer, tool: LoopbackTool, port: number): Promise<{ url: string; server: Server }> {
  const server = createServer((req, res) => {
    execRequest(get(), tool, port, req.method ?? 'GET', req.url ?? '/', req.headers.authorization)
      .then((r) => res.writeHead(r.status).end(r.body))
      .catch((err: unknown) => res.writeHead(502).end(String(err)));
  });
  const p = await freePort();
  await new Promise<void>((resolve) => server.listen(p, '127.0.0.1', resolve));
  return { url: `http://127.0.0.1:${p}`, server };
}

export async function startContainerStack(opts: StackOptions = {}): Promise<Stack> {
  if (opts.rateLimitServiceSelf === true) throw new Error('rateLimitServiceSelf: the containers driver does not run that deployment (local processes only)');
  const engine = dockerEngine();
  if (!engine.ok) throw new Error(`E2E_DRIVER=containers needs a container engine: ${engine.why}`);
  removeOrphans();
  const building = buildServiceImage();
  const dir = tempDir('edge-e2e-ct-');
  chmodSync(dir, 0o755);
  const pki = generateDevPki(join(dir, 'pki'));
  const backendPort = await freePort();
  let backend = createOrderBackend({ certFile: pki.backendCertFile, keyFile: pki.backendKeyFile, clientCaFile: pki.clientCaFile });
  // On every interface: the containers reach it through their network's gateway address.
  await backend.listen(backendPort, '0.0.0.0');

  const hmacKey = randomBytes(32);
  const feed = generateKeyPairSync('ed25519');
  const secretsDir = join(dir, 'secrets');
  mkdirSync(secretsDir, { mode: 0o700 });
  writeFileSync(join(secretsDir, SECRET_FILES.hmac), `hex:${hmacKey.toString('hex')}\n`, { mode: 0o400 });
  const adminToken = randomBytes(32).toString('hex');
  writeFileSync(join(secretsDir, SECRET_FILES.adminToken), `${adminToken}\n`, { mode: 0o400 });
  writeFileSync(join(secretsDir, SECRET_FILES.feedPublicKeys), `${Buffer.from(feed.publicKey.export({ format: 'jwk' }).x ?? '', 'base64url').toString('hex')}\n`, { mode: 0o400 });
  const input: ContainerStackInput = {
    pkiDir: pki.dir, envoyConfigDir: join(dir, 'envoy'), secretsDir, backendPort,
    uid: process.getuid?.() ?? 1000, gid: process.getgid?.() ?? 1000,
    images: { envoy: imageFor('envoy'), redis: imageFor('redis') },
    ...(opts.geoipDb === undefined ? {} : { geoipDb: opts.geoipDb }), ...(opts.env === undefined ? {} : { env: opts.env }),
  };
  const env = stackEnv(input);
  const rendered = renderEnvoy(loadConfig(env), { sdsPath: `${PATHS.envoyConfig}/sds-client-cert.yaml` });
  mkdirSync(input.envoyConfigDir, { recursive: true });
  writeFileSync(join(input.envoyConfigDir, 'envoy.yaml'), rendered.bootstrap);
  writeFileSync(join(input.envoyConfigDir, 'sds-client-cert.yaml'), rendered.sds ?? '');
  await building.catch(async (err: unknown) => {
    await backend.close();
    rmSync(dir, { recursive: true, force: true });
    throw err;
  });

  const network: StartedNetwork = await new Network().start();
  const gateway = gatewayOf(network);
  const labels = { [OWNER_LABEL]: String(process.pid) };
  const logs: string[] = [];
  const started = new Map<ContainerDef['name'], StartedTestContainer>();
  const start = async (def: ContainerDef): Promise<StartedTestContainer> => {
    let c = new GenericContainer(def.image).withNetwork(network).withNetworkAliases(def.alias)
      .withLabels(labels).withExtraHosts([{ host: HOST_ALIAS, ipAddress: gateway }]).withStartupTimeout(STARTUP_TIMEOUT_MS)
      .withEnvironment({ ...def.env }).withExposedPorts(...def.exposedPorts)
      .withBindMounts(def.binds.map(([source, target]) => ({ source, target, mode: 'ro' as const })))
      .withLogConsumer((stream) => stream.on('data', (line: Buffer | string) => logs.push(`[${def.name}] ${String(line)}`)));
    if (def.user !== undefined) c = c.withUser(def.user);
    if (def.command !== undefined) c = c.withCommand([...def.command]);
    c = c.withWaitStrategy(def.wait.kind === 'log' ? Wait.forLogMessage(def.wait.text) : waitForStatuses(def.wait.path, def.wait.port, def.wait.statuses));
    const s = await c.start();
    started.set(def.name, s);
    return s;
  };
  try {
    for (const d of containerDefinitions(input)) await start(d);
  } catch (err) {
    // A stack that fails to come up removes what it started, and says why with the logs.
    for (const c of [...started.values()].reverse()) await c.stop({ timeout: 0 }).catch(() => undefined);
    await network.stop().catch(() => undefined);
    await backend.close();
    rmSync(dir, { recursive: true, force: true });
    throw new Error(`${String(err)}; container logs:\n${logs.join('').slice(-3000)}`, { cause: err });
  }
  const get = (name: ContainerDef['name']) => (): StartedTestContainer => started.get(name)!;
  const envoy = get('envoy')();
  const authzAdmin = await loopbackProxy(get('authz'), 'node', PORTS.admin);
  const envoyAdmin = await loopbackProxy(get('envoy'), 'bash', PORTS.envoyAdmin);
  const redisC = get('redis');

  const stack: Stack = {
    dir, env, pki, hmacKey, feedPrivateKey: feed.privateKey, backend,
    edgeUrl: `http://${envoy.getHost()}:${envoy.getMappedPort(PORTS.edge)}`,
    ingestUrl: `http://${envoy.getHost()}:${envoy.getMappedPort(env['INGEST_PORT'] === undefined ? PORTS.edge : Number(env['INGEST_PORT']))}`,
    envoyAdmin: envoyAdmin.url,
    authzAdmin: authzAdmin.url,
    adminToken,
    get authzGrpc() { return `${get('authz')().getHost()}:${get('authz')().getMappedPort(PORTS.grpc)}`; },
    redis: {
      get port() { return redisC().getMappedPort(PORTS.redis); },
      get url() { return `redis://${redisC().getHost()}:${redisC().getMappedPort(PORTS.redis)}/0`; },
      async stop() { await redisC().stop({ remove: false, timeout: 0 }); },
      async resume() { await redisC().restart(); },
    } as unknown as PrivateRedis,
    logs: () => logs.join(''),
    async killAuthz() { await get('authz')().stop({ remove: false, timeout: 0 }); },
    // Back when its market port answers, as the local driver's startAuthz waits (the container's
    // mapped ports and address may have changed: testcontainers re-inspects on restart).
    async startAuthz() {
      const c = get('authz')();
      await c.restart();
      const end = Date.now() + STARTUP_TIMEOUT_MS;
      for (;;) {
        const ok = await fetch(`http://${c.getHost()}:${c.getMappedPort(PORTS.market)}/`).then((r) => r.status === 200, () => false);
        if (ok) return;
        if (Date.now() > end) throw new Error('authz did not answer after its restart');
        await new Promise((r) => setTimeout(r, 100));
      }
    },
    async swapBackend(kind) {
      await backend.close();
      if (kind === 'down') return;
      backend = createOrderBackend({ certFile: kind === 'rogue' ? pki.rogueCertFile : pki.backendCertFile, keyFile: kind === 'rogue' ? pki.rogueKeyFile : pki.backendKeyFile, clientCaFile: pki.clientCaFile });
      await backend.listen(backendPort, '0.0.0.0');
      stack.backend = backend;
    },
    // The host pids of Envoy's and the service's main processes (a container's processes are host
    // processes): the same order and meaning as the local driver's, 0 (stopped) left out.
    pids: () => {
      const ids = [get('envoy')().getId(), get('authz')().getId()];
      const r = spawnSync(dockerCli(), ['inspect', '--format', '{{.State.Pid}}', ...ids], { encoding: 'utf8', timeout: 30_000 });
      return (r.stdout ?? '').split('\n').map(Number).filter((pid) => pid > 0);
    },
    envoyPid: () => {
      const r = spawnSync(dockerCli(), ['inspect', '--format', '{{.State.Pid}}', get('envoy')().getId()], { encoding: 'utf8', timeout: 30_000 });
      const pid = Number((r.stdout ?? '').trim());
      return pid > 0 ? pid : undefined;
    },
    async stop() {
      // A container may have exited on its own (a sealed service exits after its grace): stopping
      // it then fails, so each stop is tried and every container removed by force afterwards.
      for (const c of [...started.values()].reverse()) await c.stop({ timeout: 10_000 }).catch(() => undefined);
      const ids = [...started.values()].map((c) => c.getId());
      spawnSync(dockerCli(), ['rm', '-f', '-v', ...ids], { stdio: 'ignore', timeout: 60_000 });
      await network.stop().catch(() => undefined);
      await backend.close();
      for (const p of [authzAdmin, envoyAdmin]) p.server.close();
      if (process.env['E2E_KEEP'] === undefined) rmSync(dir, { recursive: true, force: true });
    },
  };
  return stack;
}
