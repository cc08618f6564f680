/**
 * E2E_DRIVER=containers: the same stack as e2e/lib/stack.ts on containers via testcontainers
 * (the official Envoy image, the service image built from deploy/Dockerfile, the Redis module),
 * with the same Stack interface so the same scenario files run on it. Needs a Docker engine.
 *
 * What differs from local processes, and how the interface is kept:
 * - the admin ports listen on the containers' loopback (seal is loopback-only): `authzAdmin`
 *   and `envoyAdmin` are small proxies on the host that run each request inside the container;
 * - `logs()` are the containers' stdout/stderr; `pids()` is empty (no host process is started;
 *   `stop()` removes every container).
 */
import { generateKeyPairSync, randomBytes } from 'node:crypto';
import { chmodSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { createServer, type Server } from 'node:http';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { RedisContainer } from '@testcontainers/redis';
import { GenericContainer, Network, TestContainers, Wait, type StartedNetwork, type StartedTestContainer } from 'testcontainers';
import { loadConfig } from '../../authz/src/config.ts';
import { renderEnvoy } from '../../envoy/render.ts';
import { freePort, type PrivateRedis } from '../../authz/test/redis-server.ts';
import { generateDevPki } from '../../scripts/dev/certs.ts';
import { createOrderBackend } from '../../scripts/dev/order-backend.ts';
import { stageBuildContext } from '../../deploy/image.ts';
import type { Stack, StackOptions } from '../lib/stack.ts';
import { containerDefinitions, loopbackRequestCommand, parseLoopbackResponse, PATHS, PORTS, SECRET_FILES, SERVICE_IMAGE, stackEnv, type ContainerDef, type ContainerStackInput, type LoopbackTool } from './definitions.ts';
import { dockerAvailable } from './docker.ts';

/** Runs one HTTP request inside a container against its loopback port. */
async function execRequest(c: StartedTestContainer, tool: LoopbackTool, port: number, method: string, path: string): Promise<{ status: number; body: string }> {
  return parseLoopbackResponse(tool, (await c.exec([...loopbackRequestCommand(tool, port, method, path)])).stdout);
}

/** A host HTTP server forwarding every request into the container's loopback `port`. */
async function loopbackProxy(get: () => StartedTestContainer, tool: LoopbackTool, port: number): Promise<{ url: string; server: Server }> {
  const server = createServer((req, res) => {
    execRequest(get(), tool, port, req.method ?? 'GET', req.url ?? '/')
      .then((r) => res.writeHead(r.status).end(r.body))
      .catch((err: unknown) => res.writeHead(502).end(String(err)));
  });
  const p = await freePort();
  await new Promise<void>((resolve) => server.listen(p, '127.0.0.1', resolve));
  return { url: `http://127.0.0.1:${p}`, server };
}

export async function startContainerStack(opts: StackOptions = {}): Promise<Stack> {
  const engine = await dockerAvailable();
  if (!engine.ok) throw new Error(`E2E_DRIVER=containers needs a container engine: ${engine.why}`);
  const dir = mkdtempSync(join(tmpdir(), 'edge-e2e-ct-'));
  chmodSync(dir, 0o755);
  const pki = generateDevPki(join(dir, 'pki'));
  const backendPort = await freePort();
  let backend = createOrderBackend({ certFile: pki.backendCertFile, keyFile: pki.backendKeyFile, clientCaFile: pki.clientCaFile });
  await backend.listen(backendPort, '0.0.0.0');
  await TestContainers.exposeHostPorts(backendPort);

  const hmacKey = randomBytes(32);
  const feed = generateKeyPairSync('ed25519');
  const secretsDir = join(dir, 'secrets');
  mkdirSync(secretsDir, { mode: 0o700 });
  writeFileSync(join(secretsDir, SECRET_FILES.hmac), `hex:${hmacKey.toString('hex')}\n`, { mode: 0o400 });
  writeFileSync(join(secretsDir, SECRET_FILES.feedPublicKeys), `${Buffer.from(feed.publicKey.export({ format: 'jwk' }).x ?? '', 'base64url').toString('hex')}\n`, { mode: 0o400 });
  const input: ContainerStackInput = {
    pkiDir: pki.dir, envoyConfigDir: join(dir, 'envoy'), secretsDir, backendPort,
    uid: process.getuid?.() ?? 1000, gid: process.getgid?.() ?? 1000,
    ...(opts.geoipDb === undefined ? {} : { geoipDb: opts.geoipDb }), ...(opts.env === undefined ? {} : { env: opts.env }),
  };
  const env = stackEnv(input);
  const rendered = renderEnvoy(loadConfig(env), { sdsPath: `${PATHS.envoyConfig}/sds-client-cert.yaml` });
  mkdirSync(input.envoyConfigDir, { recursive: true });
  writeFileSync(join(input.envoyConfigDir, 'envoy.yaml'), rendered.bootstrap);
  writeFileSync(join(input.envoyConfigDir, 'sds-client-cert.yaml'), rendered.sds ?? '');

  // Build from a context holding only what the Dockerfile copies (no node_modules, .venv, secrets).
  const context = stageBuildContext(join(dir, 'build-context'));
  await GenericContainer.fromDockerfile(context, 'deploy/Dockerfile').build(SERVICE_IMAGE, { deleteOnExit: false });

  const network: StartedNetwork = await new Network().start();
  const logs: string[] = [];
  const started = new Map<ContainerDef['name'], StartedTestContainer>();
  const start = async (def: ContainerDef): Promise<StartedTestContainer> => {
    const base = def.name === 'redis' ? new RedisContainer(def.image) : new GenericContainer(def.image);
    let c = base.withNetwork(network).withNetworkAliases(def.alias)
      .withEnvironment({ ...def.env }).withExposedPorts(...def.exposedPorts)
      .withBindMounts(def.binds.map(([source, target]) => ({ source, target, mode: 'ro' as const })))
      .withLogConsumer((stream) => stream.on('data', (line: Buffer | string) => logs.push(`[${def.name}] ${String(line)}`)));
    if (def.user !== undefined) c = c.withUser(def.user);
    if (def.command !== undefined) c = c.withCommand([...def.command]);
    c = c.withWaitStrategy(def.wait.kind === 'log' ? Wait.forLogMessage(def.wait.text) : Wait.forHttp(def.wait.path, def.wait.port).forStatusCode(200));
    const s = await c.start();
    started.set(def.name, s);
    return s;
  };
  for (const d of containerDefinitions(input)) await start(d);
  const get = (name: ContainerDef['name']) => (): StartedTestContainer => started.get(name)!;
  const envoy = get('envoy')();
  const authzAdmin = await loopbackProxy(get('authz'), 'node', PORTS.admin);
  const envoyAdmin = await loopbackProxy(get('envoy'), 'bash', PORTS.envoyAdmin);
  const redisC = get('redis');

  const stack: Stack = {
    dir, env, pki, hmacKey, feedPrivateKey: feed.privateKey, backend,
    edgeUrl: `http://${envoy.getHost()}:${envoy.getMappedPort(PORTS.edge)}`,
    envoyAdmin: envoyAdmin.url,
    authzAdmin: authzAdmin.url,
    redis: {
      get port() { return redisC().getMappedPort(PORTS.redis); },
      get url() { return `redis://${redisC().getHost()}:${redisC().getMappedPort(PORTS.redis)}/0`; },
      async stop() { await redisC().stop({ remove: false, timeout: 0 }); },
      async resume() { await redisC().restart(); },
    } as unknown as PrivateRedis,
    logs: () => logs.join(''),
    async killAuthz() { await get('authz')().stop({ remove: false, timeout: 0 }); },
    async startAuthz() { await get('authz')().restart(); },
    async swapBackend(kind) {
      await backend.close();
      if (kind === 'down') return;
      backend = createOrderBackend({ certFile: kind === 'rogue' ? pki.rogueCertFile : pki.backendCertFile, keyFile: kind === 'rogue' ? pki.rogueKeyFile : pki.backendKeyFile, clientCaFile: pki.clientCaFile });
      await backend.listen(backendPort, '0.0.0.0');
      stack.backend = backend;
    },
    pids: () => [],
    async stop() {
      for (const c of [...started.values()].reverse()) await c.stop();
      await network.stop();
      await backend.close();
      for (const p of [authzAdmin, envoyAdmin]) p.server.close();
      if (process.env['E2E_KEEP'] === undefined) rmSync(dir, { recursive: true, force: true });
    },
  };
  return stack;
}
