/**
 * The shipped Kubernetes manifests as a real pod (issue 21): deploy/k8s/overlays/production as
 * `kubectl kustomize` renders it, run by `podman kube play` (Debian's podman 4.3: one pod per
 * Deployment, an infra container holding the shared network namespace, ConfigMaps as environment
 * and files, the PVC as a named volume, the emptyDir, the securityContext), driven from outside
 * the way a client, the kubelet and an operator would.
 *
 * What is changed, and only by a kustomize overlay generated into the run's temp directory
 * (deploy/podman/setup.ts OVERLAY_CHANGES; the first test diffs the two renders and fails on
 * anything else):
 *   - nameSuffix -<run id> on every resource (podman reuses a named volume of the same name, stale);
 *   - the images: the service image built from deploy/Dockerfile and Envoy's (official or local
 *     stand-in, e2e/lib/images.ts), copied from the Docker engine into podman's store under the
 *     run's names;
 *   - REDIS_URL → a redis-server on the pod network's gateway, with one replica (REDIS_MIN_REPLICAS=1
 *     as shipped: every nonce and record waits for it; no Sentinel here);
 *   - BLOCKED_COUNTRIES=KP (production blocks none: a 451 for a country needs one);
 *   - hostAliases: orders.exchange.internal (ORDER_BACKEND_URL) → the gateway, where this process
 *     runs the order backend (scripts/dev/order-backend.ts) with test certificates for that name;
 *   - replicas: 1;
 *   - hostIP 127.0.0.1 + a free hostPort on each containerPort (podman 4.3 publishes every
 *     containerPort on the host, on all interfaces at the same number; a kubelet publishes none);
 *   - the three secret volumes → host directories of test-generated files in the kubelet layout
 *     (..data symlink swap; 0440, group fsGroup), which podman 4.3's secret volumes cannot carry.
 * Besides, the GeoIP PVC is seeded with the test database (authz/test/fixtures/make-mmdb.py:
 * 198.51.100.0/25 KP, 192.0.2.0/25 and 2001:db8:3::/48 CH) by `podman volume import` before the
 * Deployment starts. Everything else runs as shipped: securityContext (uid 1000, read-only root,
 * no capabilities, no-new-privileges, seccomp), ConfigMaps, mount paths, Envoy's arguments
 * (after the image's own entrypoint), bind addresses, probes' commands, grace period.
 *
 * Podman 4.3 does not act on probes (a liveness probe becomes a healthcheck driven by systemd
 * timers, absent here; readiness and gRPC probes are ignored), runs no preStop hook and does not
 * take terminationGracePeriodSeconds as the stop timeout: the tests ask the probes' questions
 * themselves and stop the pod with the manifest's grace period.
 *
 * The tests run in order on one pod; later ones change it (containers stopped and started, the
 * client certificate rotated, the GeoIP database replaced, the pod stopped, then removed). No
 * podman, not root, no Docker engine, or a podman that cannot start a container: the suite skips
 * with one line saying why.
 */
import { after, before, test, type TestContext } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { createHash, createPrivateKey, randomBytes, X509Certificate, type KeyObject } from 'node:crypto';
import { existsSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import type { Server } from 'node:https';
import { setTimeout as sleep } from 'node:timers/promises';
import { join } from 'node:path';
import { DEFAULT_GEOIP_DB } from '../authz/src/common/config.ts';
import { parseHmacKey } from '../authz/src/common/credentials.ts';
import { geoFixtures } from '../authz/test/geo-fixtures.ts';
import { freePort } from '../authz/test/redis-server.ts';
import { ROOT } from '../deploy/paths.ts';
import { findResource, freeSubnet, OVERLAY_CHANGES, productionDocs, rotateClientCert, setupPod, type CronJob, type PodSetup, type Workload } from '../deploy/podman/setup.ts';
import { yamlDocs, type Resource } from '../deploy/test/tools.ts';
import { signedIngest } from '../scripts/edge-client.ts';
import { createOrderBackend, type Delivery, type OrderBackend } from '../scripts/dev/order-backend.ts';
import { buildServiceImage } from './containers/stack.ts';
import { SERVICE_IMAGE } from './containers/definitions.ts';
import { errorCode, ingest, KP_IP, orderBody, request, uniqueId, type Reply } from './lib/client.ts';
import { ok, run, until, type RunResult } from './lib/compose.ts';
import { containerSuite, dockerCli, imageFor } from './lib/images.ts';
import {
  containerLogs, containerState, copyImage, GatewayRedis, importFile, newPauseImages, PODMAN_BIN, podIp, podmanObjects,
  podmanWith, probePodman, tcpAccepts, type Podman, type PodmanObjects,
} from './lib/pod.ts';
import type { Stack } from './lib/stack.ts';
import { DRAIN_QUIET_MS } from '../authz/src/process.ts';
import { tempDir } from '../authz/test/temp-dir.ts';

const PROBE = probePodman();
const SKIP = PROBE.skip;

const GRPCURL = process.env['GRPCURL_BIN'] ?? join(ROOT, '.venv/bin/grpcurl');
/** The bound issue 15/21 set for a rotated client certificate to reach the backend. */
const ROTATION_BOUND_MS = 5000;
const PKCS8_ED25519_PREFIX = Buffer.from('302e020100300506032b657004220420', 'hex');

/** An allowed (CH) IPv4 client of its own in the fixture database: 192.0.2.<n>, n < 128. */
const chIp = (n: number): string => `192.0.2.${n}`;
/** In no range of the fixture database: GEO_UNKNOWN (default block) decides. */
const UNKNOWN_IP = '192.0.2.222';
/** A public address the packaged default database (the CronJob's) places in the US: unknown to the fixture. */
const PUBLIC_IP = '8.8.8.8';

interface Settings { readonly data: Record<string, string> }

containerSuite('pod', SKIP, () => {
  const runId = `e2e${process.pid.toString(36)}${randomBytes(2).toString('hex')}`;
  const images = { envoy: `localhost/edge-pod-${runId}/envoy:v1.40.0`, service: `localhost/edge-pod-${runId}/edge-trading-proxy:e2e` };
  let dir: string | undefined;
  let s: PodSetup | undefined;
  let podman: Podman = () => Promise.reject(new Error('podman is not set up yet'));
  let before0: PodmanObjects | undefined;
  let redis: GatewayRedis | undefined;
  let backend: OrderBackend | undefined;
  let stack: Stack;
  let setupFailed: unknown;
  let cleaned = false;
  const timings: string[] = [];
  /** Logs of containers removed before the end (the GeoIP update), for the secrets check. */
  const keptLogs: string[] = [];

  // Filled in `before` from the rendered manifests.
  let deployment: Workload;
  let settings: Settings;
  let ip = '';
  let edgeUrl = '';
  let ingestUrl = '';
  const ctr = (name: string): string => `${s?.pod ?? ''}-${name}`;

  /** Recent lines of every container of the run, for a failure message. */
  async function logTail(lines = 40): Promise<string> {
    if (s === undefined) return '';
    const names = ok(await podman(['ps', '-a', '--format', '{{.Names}}', '--filter', `name=${runId}`])).stdout.split('\n').filter((n) => n !== '' && !n.endsWith('-infra'));
    const out: string[] = [];
    for (const n of names) {
      const r = await podman(['logs', '--tail', String(lines), n]);
      out.push(`--- podman logs --tail ${lines} ${n} ---\n${r.stdout}${r.stderr}`);
    }
    return out.join('\n');
  }

  /** A test that, when it fails, carries the containers' recent logs in its error. */
  function step(name: string, timeoutMs: number, fn: (t: TestContext) => Promise<void>): void {
    test(`pod – ${name}`, { timeout: timeoutMs }, async (t) => {
      if (setupFailed !== undefined) throw new Error('the pod did not come up (see the before hook)', { cause: setupFailed });
      try {
        await fn(t);
      } catch (err) {
        const logs = await logTail().catch((e: unknown) => `(no logs: ${String(e)})`);
        throw new Error(`${(err as Error).message}\n${logs}`, { cause: err });
      }
    });
  }

  const container = (name: string): NonNullable<Workload['spec']['template']['spec']['containers'][number]> => {
    const c = deployment.spec.template.spec.containers.find((x) => x.name === name);
    if (c === undefined) throw new Error(`no container ${name} in the Deployment`);
    return c;
  };
  const envoyAdminPort = (): string => settings.data['ENVOY_ADMIN_PORT'] ?? '';

  /** A request to Envoy's admin interface from inside its container (it listens on loopback only). */
  async function envoyAdmin(method: string, path: string): Promise<string> {
    const req = `${method} ${path} HTTP/1.1\\r\\nHost: localhost\\r\\nContent-Length: 0\\r\\nConnection: close\\r\\n\\r\\n`;
    return ok(await podman(['exec', ctr('envoy'), '/bin/bash', '-c', `exec 3<>/dev/tcp/127.0.0.1/${envoyAdminPort()} && printf '${req}' >&3 && cat <&3`])).stdout;
  }
  async function envoyStats(filter: string): Promise<Map<string, number>> {
    return new Map([...(await envoyAdmin('GET', `/stats?filter=${filter}`)).matchAll(/^([\w.]+): (\d+)$/gm)].map((m) => [m[1] ?? '', Number(m[2])]));
  }

  /** The kubelet's questions, asked as the manifest words them. */
  async function readinessExec(): Promise<RunResult> {
    const cmd = (container('envoy').readinessProbe?.['exec'] as { command: string[] } | undefined)?.command;
    assert.ok(cmd !== undefined, 'Envoy has an exec readiness probe');
    return podman(['exec', ctr('envoy'), ...cmd], 15_000);
  }
  async function grpcHealth(probe: 'readinessProbe' | 'livenessProbe' = 'readinessProbe'): Promise<string> {
    const g = container('authz')[probe]?.['grpc'] as { port: number; service?: string } | undefined;
    assert.ok(g?.port !== undefined, `the TS service has a gRPC ${probe}`);
    const r = await run(GRPCURL, ['-plaintext', '-max-time', '2', ...(g.service === undefined ? [] : ['-d', JSON.stringify({ service: g.service })]), `${ip}:${g.port}`, 'grpc.health.v1.Health/Check'], { timeoutMs: 10_000 });
    if (r.status !== 0) return `error: ${(r.stderr || r.stdout).trim().split('\n')[0] ?? ''}`;
    return String((JSON.parse(r.stdout) as { status?: string }).status);
  }
  function livenessPort(): number {
    const envoy = container('envoy');
    const named = (envoy.livenessProbe?.['tcpSocket'] as { port: string | number } | undefined)?.port;
    const port = typeof named === 'number' ? named : envoy.ports?.find((p) => p.name === named)?.containerPort;
    assert.ok(port !== undefined, `the liveness probe's port ${String(named)} is a containerPort of Envoy`);
    return port;
  }

  async function order(marketId: string, payload: Buffer, ipAddr?: string): Promise<Reply> {
    return request(stack, 'POST', '/v1/orders', { body: orderBody(marketId, payload), headers: { 'content-type': 'application/json' }, ...(ipAddr === undefined ? {} : { ip: ipAddr }) });
  }
  const delivery = (requestId: string): Delivery | undefined => backend?.deliveries.find((d) => d.headers['x-request-id'] === requestId);

  async function reloadsOk(): Promise<number> {
    const text = await (await fetch(`http://${ip}:${settings.data['AUTHZ_ADMIN_PORT'] ?? ''}/metrics`, { signal: AbortSignal.timeout(5000) })).text();
    assert.match(text, /^# TYPE edge_geoip_reloads_total counter/m, 'the metrics endpoint answered');
    const m = /^edge_geoip_reloads_total\{result="ok"\} (\d+)/m.exec(text);
    return m === null ? 0 : Number(m[1]);
  }

  /** Removes everything of the run from podman (pods, containers, volumes, network, images), the services on the host, the temp dir. */
  async function cleanup(): Promise<string[]> {
    const problems: string[] = [];
    const tryRun = async (args: string[], timeoutMs = 90_000): Promise<void> => {
      const r = await podman(args, timeoutMs);
      if (r.status !== 0 && !/no such|not found|no pod|no volume|no container|image not known/i.test(r.stderr)) problems.push(`${r.cmd}: ${r.stderr.trim()}`);
    };
    await redis?.stop();
    redis = undefined;
    if (backend !== undefined) await backend.close();
    backend = undefined;
    if (s !== undefined) {
      const objects = await podmanObjects(podman);
      const pods = objects.pods.filter((n) => n.includes(runId));
      if (pods.length > 0) await tryRun(['pod', 'rm', '-f', '-t', '0', ...pods]);
      const ctrs = (await podmanObjects(podman)).containers.filter((n) => n.includes(runId));
      if (ctrs.length > 0) await tryRun(['rm', '-f', '-v', '-t', '0', ...ctrs]);
      const vols = objects.volumes.filter((n) => n.includes(runId));
      if (vols.length > 0) await tryRun(['volume', 'rm', '-f', ...vols]);
      if (objects.networks.includes(s.network)) await tryRun(['network', 'rm', '-f', s.network]);
      // host-local IPAM keeps its lease directory after `network rm`.
      rmSync(join('/var/lib/cni/networks', s.network), { recursive: true, force: true });
    }
    const ours = (await podmanObjects(podman)).images.filter((n) => n.includes(runId));
    if (ours.length > 0) await tryRun(['rmi', ...ours]);
    // The engine's tags of the copy, should a copy have stopped half way.
    await run(dockerCli(), ['rmi', images.envoy, images.service], { timeoutMs: 30_000 });
    for (const p of await newPauseImages(podman, PROBE.pauseBefore)) await tryRun(['rmi', p]);
    cleaned = true;
    return problems;
  }

  /** What of the run is still in podman (and on disk). */
  async function leftovers(): Promise<Record<string, string[]>> {
    const now = await podmanObjects(podman);
    const mine = (l: string[]): string[] => l.filter((n) => n.includes(runId));
    return {
      pods: mine(now.pods),
      containers: mine(now.containers),
      volumes: mine(now.volumes),
      secrets: now.secrets.filter((n) => !(before0?.secrets ?? []).includes(n)),
      networks: mine(now.networks),
      images: [...mine(now.images), ...await newPauseImages(podman, PROBE.pauseBefore)],
      dockerTags: ok(await run(dockerCli(), ['images', '--format', '{{.Repository}}:{{.Tag}}', '--filter', `reference=localhost/edge-pod-${runId}/*`], { timeoutMs: 30_000 })).stdout.split('\n').filter((l) => l !== ''),
      files: [s === undefined ? '' : join('/var/lib/cni/networks', s.network), ...(s === undefined ? [] : readdirSync(join(s.dir, 'cni')).filter((f) => f.endsWith('.conflist')).map((f) => join(s?.dir ?? '', 'cni', f)))].filter((p) => p !== '' && existsSync(p)),
    };
  }

  // Interrupted (Ctrl-C, a CI job's SIGTERM): remove the run's pods, volumes, network and images, bounded.
  const onSignal = (sig: NodeJS.Signals): void => {
    if (s !== undefined) {
      const sync = (args: string[]): void => { spawnSync(PODMAN_BIN, args, { env: s?.env, stdio: 'ignore', timeout: 60_000 }); };
      sync(['pod', 'rm', '-f', '-t', '0', s.pod, s.geoipUpdatePod]);
      sync(['volume', 'rm', '-f', ...s.pvcs, ...s.docs.filter((d) => d.kind === 'ConfigMap').map((d) => d.metadata.name)]);
      sync(['network', 'rm', '-f', s.network]);
      sync(['rmi', images.envoy, images.service]);
      rmSync(join('/var/lib/cni/networks', s.network), { recursive: true, force: true });
    }
    if (dir !== undefined) rmSync(dir, { recursive: true, force: true });
    process.exit(sig === 'SIGINT' ? 130 : 143);
  };

  before(async () => {
    try {
      const t0 = Date.now();
      for (const sig of ['SIGINT', 'SIGTERM'] as const) process.once(sig, onSignal);
      dir = tempDir('edge-pod-e2e-');
      const building = buildServiceImage();
      const [http, grpc, metrics, ingestPort, redisPort, replicaPort] = [await freePort(), await freePort(), await freePort(), await freePort(), await freePort(), await freePort()];
      s = setupPod({ out: dir, name: runId, envoyImage: images.envoy, serviceImage: images.service, redisPort, publish: { http, grpc, metrics, ingest: ingestPort }, blockedCountries: 'KP', subnet: freeSubnet() });
      podman = podmanWith(s.conf);
      // The run's network lives in its own CNI directory, so it is the only one listed there.
      before0 = await podmanObjects(podman);
      deployment = findResource<Workload>(s.docs, 'Deployment');
      const settingsName = container('authz').envFrom?.[0]?.configMapRef?.name ?? '';
      settings = findResource(s.docs, 'ConfigMap', settingsName) as Resource & Settings;
      edgeUrl = `http://127.0.0.1:${http}`;
      // The overlay serves ingest on Envoy's `ingest` port (INGEST_PORT): the feed's, never the clients'.
      ingestUrl = `http://127.0.0.1:${ingestPort}`;

      await building;
      await copyImage(podman, SERVICE_IMAGE, images.service);
      await copyImage(podman, imageFor('envoy'), images.envoy);
      timings.push(`images ${Date.now() - t0} ms`);

      ok(await podman(['kube', 'play', '--network', s.network, s.files.pvc], 120_000));
      for (const pvc of s.pvcs) await importFile(podman, pvc, 'country.mmdb', readFileSync(geoFixtures().geoip2));
      const played = ok(await podman(['kube', 'play', '--network', s.network, s.files.edge], 180_000));
      timings.push(`kube play ${played.ms} ms`);
      ip = await podIp(podman, s.pod, s.network);

      // Host services on the gateway, which exists now that the pod is attached.
      redis = new GatewayRedis(s.gateway, redisPort, replicaPort);
      await redis.start();
      const pki = s.pkiDir;
      backend = createOrderBackend({ certFile: join(pki, 'backend.crt'), keyFile: join(pki, 'backend.key'), clientCaFile: join(pki, 'client-ca.crt') });
      const backendPort = Number(new URL(settings.data['ORDER_BACKEND_URL'] ?? '').port);
      const server: Server = backend.server;
      await Promise.race([
        backend.listen(backendPort, s.gateway),
        new Promise((_, reject) => server.once('error', (e) => reject(new Error(`the order backend cannot listen on ${s?.gateway}:${backendPort} (ORDER_BACKEND_URL's port): ${e.message}`)))),
      ]);

      await until('GET /healthz 200 through the pod\'s published port', 120_000, async () => {
        const r = await fetch(`${edgeUrl}/healthz`, { headers: { 'x-forwarded-for': chIp(1) }, signal: AbortSignal.timeout(5000) });
        await r.arrayBuffer();
        return r.status === 200 ? true : undefined;
      }, 250);
      timings.push(`healthy ${Date.now() - t0} ms after the start of setup`);
      const hmacKey = parseHmacKey('ingest-hmac', s.ingestHmac);
      const feedPrivateKey: KeyObject = createPrivateKey({ key: Buffer.concat([PKCS8_ED25519_PREFIX, Buffer.from(s.feedPrivateKeyHex, 'hex')]), format: 'der', type: 'pkcs8' });
      stack = { edgeUrl, ingestUrl, hmacKey, feedPrivateKey } as unknown as Stack;
    } catch (err) {
      setupFailed = err;
      if (s !== undefined) process.stderr.write(`${await logTail(100).catch(() => '')}\n`);
      throw err;
    }
  }, { timeout: 15 * 60_000 });

  after(async () => {
    for (const sig of ['SIGINT', 'SIGTERM'] as const) process.off(sig, onSignal);
    try {
      if (s === undefined) return;
      if (!cleaned) {
        const problems = await cleanup();
        if (problems.length > 0) process.stderr.write(`pod cleanup: ${problems.join('\n')}\n`);
      }
      const left = await leftovers();
      if (Object.values(left).some((l) => l.length > 0)) throw new Error(`the pod run ${runId} left behind: ${JSON.stringify(left)}`);
    } finally {
      // The run's directory (containers.conf, the CNI directory, secrets, PKI) goes last: podman needs the conf until here.
      if (dir !== undefined) rmSync(dir, { recursive: true, force: true });
    }
  }, { timeout: 3 * 60_000 });

  step('the manifests played are the production overlay as kubectl kustomize renders it, changed only as the header lists', 60_000, async (t) => {
    t.diagnostic(timings.join(', '));
    const prod = productionDocs();
    const played = s!.docs;
    const diffs = resourceDiffs(prod, played, runId);
    const expected = [
      'ConfigMap/edge-settings data.BLOCKED_COUNTRIES',
      'ConfigMap/edge-settings data.REDIS_URL',
      'CronJob/edge-geoip-update spec.jobTemplate.spec.template.spec.containers[name=update].image',
      'Deployment/edge spec.replicas',
      'Deployment/edge spec.template.spec.containers[name=authz].image',
      'Deployment/edge spec.template.spec.containers[name=authz].ports[name=grpc].hostIP',
      'Deployment/edge spec.template.spec.containers[name=authz].ports[name=grpc].hostPort',
      'Deployment/edge spec.template.spec.containers[name=authz].ports[name=metrics].hostIP',
      'Deployment/edge spec.template.spec.containers[name=authz].ports[name=metrics].hostPort',
      'Deployment/edge spec.template.spec.containers[name=envoy].image',
      'Deployment/edge spec.template.spec.containers[name=envoy].ports[name=http].hostIP',
      'Deployment/edge spec.template.spec.containers[name=envoy].ports[name=http].hostPort',
      'Deployment/edge spec.template.spec.containers[name=envoy].ports[name=ingest].hostIP',
      'Deployment/edge spec.template.spec.containers[name=envoy].ports[name=ingest].hostPort',
      'Deployment/edge spec.template.spec.hostAliases',
      ...['admin-token', 'backend-ca', 'client-cert', 'edge-secrets'].flatMap((v) => [`Deployment/edge spec.template.spec.volumes[name=${v}].hostPath`, `Deployment/edge spec.template.spec.volumes[name=${v}].secret`]),
    ].sort();
    assert.deepEqual(diffs, expected, `differences from the production overlay (OVERLAY_CHANGES: ${OVERLAY_CHANGES.length} entries)`);
    // The values of those changes.
    assert.deepEqual([settings.data['REDIS_URL'], settings.data['BLOCKED_COUNTRIES']], [`redis://${s!.gateway}:${new URL(settings.data['REDIS_URL'] ?? '').port}/0`, 'KP']);
    const spec = deployment.spec.template.spec;
    assert.equal(deployment.spec.replicas, 1);
    assert.deepEqual(spec.hostAliases, [{ ip: s!.gateway, hostnames: [new URL(settings.data['ORDER_BACKEND_URL'] ?? '').hostname] }]);
    assert.deepEqual(spec.containers.map((c) => c.image).sort(), [images.envoy, images.service].sort());
    for (const v of spec.volumes ?? []) if (v.hostPath !== undefined) assert.ok(v.hostPath.path.startsWith(`${dir ?? '?'}/`), `${v.name}: a directory of the run`);
    for (const c of spec.containers) for (const p of c.ports ?? []) assert.equal(p.hostIP, '127.0.0.1', `${c.name}:${p.containerPort} published on loopback only`);
    // What kube play got is exactly that render, split in two (the PVC first).
    const split = [...yamlDocs(readFileSync(s!.files.pvc, 'utf8')), ...yamlDocs(readFileSync(s!.files.edge, 'utf8'))];
    assert.deepEqual(sortDocs(split), sortDocs(played));
  });

  step('podman runs it as shipped: one pod, both containers as uid 1000 with a read-only root, no capabilities, no-new-privileges, seccomp; Envoy\'s arguments after its image\'s entrypoint; ConfigMaps as environment and files; the mounts', 90_000, async () => {
    const pods = (await podmanObjects(podman)).pods.filter((n) => n.includes(runId));
    assert.deepEqual(pods, [s!.pod], 'one pod for the Deployment (replicas 1)');
    const pod = deployment.spec.template.spec;
    const uid = String(pod.securityContext?.runAsUser);
    const gid = String(pod.securityContext?.runAsGroup);
    assert.equal(uid, '1000');
    for (const c of pod.containers) {
      const name = ctr(c.name);
      const st = await containerState(podman, name);
      assert.equal(st.status, 'running', `${name} runs`);
      const status = ok(await podman(['exec', name, 'cat', '/proc/1/status'])).stdout;
      const field = (k: string): string => new RegExp(`^${k}:\\s+(.*)$`, 'm').exec(status)?.[1]?.trim() ?? '';
      assert.deepEqual(field('Uid').split(/\s+/), [uid, uid, uid, uid], `${c.name}: runs as ${uid}`);
      assert.deepEqual(field('Gid').split(/\s+/), [gid, gid, gid, gid], `${c.name}: group ${gid}`);
      for (const k of ['CapInh', 'CapPrm', 'CapEff', 'CapBnd', 'CapAmb']) assert.equal(field(k), '0000000000000000', `${c.name}: ${k} empty (drop: [ALL])`);
      assert.equal(field('NoNewPrivs'), '1', `${c.name}: allowPrivilegeEscalation: false`);
      assert.equal(field('Seccomp'), '2', `${c.name}: a seccomp filter (RuntimeDefault)`);
      const write = await podman(['exec', name, 'touch', '/edge-pod-write-probe']);
      assert.notEqual(write.status, 0, `${c.name}: the root filesystem is read-only`);
      assert.match(write.stderr, /Read-only file system/);
      // envFrom: every key of the settings ConfigMap, as rendered.
      const env = new Map(ok(await podman(['exec', name, 'printenv'])).stdout.split('\n').map((l) => [l.slice(0, l.indexOf('=')), l.slice(l.indexOf('=') + 1)]));
      for (const [k, v] of Object.entries(settings.data)) assert.equal(env.get(k), v, `${c.name}: ${k} from the ConfigMap`);
      // Every volumeMount at its path, read-only where the manifest says so.
      const mounts = ok(await podman(['exec', name, 'cat', '/proc/1/mounts'])).stdout.split('\n').map((l) => l.split(' '));
      for (const m of c.volumeMounts ?? []) {
        const line = mounts.find((f) => f[1] === m.mountPath);
        assert.ok(line !== undefined, `${c.name}: ${m.mountPath} is mounted`);
        assert.equal((line[3] ?? '').split(',').includes('ro'), m.readOnly === true, `${c.name}: ${m.mountPath} read-only: ${String(m.readOnly === true)}`);
      }
    }
    // Envoy: the image's entrypoint ran `envoy` with exactly the manifest's args.
    const cmdline = ok(await podman(['exec', ctr('envoy'), 'cat', '/proc/1/cmdline'])).stdout.split('\0').filter((a) => a !== '');
    assert.deepEqual(cmdline, ['envoy', ...(container('envoy').args ?? [])]);
    // The edge-envoy ConfigMap as files, byte for byte.
    const envoyCm = findResource(s!.docs, 'ConfigMap', (deployment.spec.template.spec.volumes ?? []).find((v) => v.configMap !== undefined)?.configMap?.name) as Resource & Settings;
    for (const [file, content] of Object.entries(envoyCm.data)) {
      assert.equal(ok(await podman(['exec', ctr('envoy'), 'cat', `/etc/envoy/${file}`])).stdout, content, `/etc/envoy/${file}`);
    }
    // Secret files as a kubelet with fsGroup leaves them: 0440, group 1000, through ..data.
    const stat = ok(await podman(['exec', ctr('authz'), 'stat', '-L', '-c', '%a %u %g', '/etc/edge/secrets/ingest-hmac', '/etc/edge/secrets/..data/feed-public-keys'])).stdout.trim().split('\n');
    assert.deepEqual(stat, ['440 0 1000', '440 0 1000']);
    // The TS service read its secrets from those files (the ingest test proves the key) and is up.
    assert.match(await containerLogs(podman, ctr('authz')), /"msg":"edge authz ready"/);
  });

  step('Envoy answers GET /healthz 200 {"status":"ok"} on the published port and on the pod\'s IP', 60_000, async () => {
    const r = await request(stack, 'GET', '/healthz');
    assert.equal(r.status, 200, r.text);
    assert.deepEqual(r.json(), { status: 'ok' });
    const direct = await fetch(`http://${ip}:${container('envoy').ports?.[0]?.containerPort ?? ''}/healthz`, { headers: { 'x-forwarded-for': chIp(2) }, signal: AbortSignal.timeout(5000) });
    assert.deepEqual([direct.status, await direct.json()], [200, { status: 'ok' }]);
  });

  step('a signed ingest is stored (200) and read back from /v1/markets; a wrong HMAC key is refused 401', 60_000, async () => {
    const id = uniqueId('0xpod');
    const stored = await ingest(stack, id, 7, { extraField: 'kept' });
    assert.equal(stored.status, 200, stored.text);
    assert.deepEqual(stored.json(), { status: 'stored', conditionId: id, seq: 7 });
    const m = await request(stack, 'GET', `/v1/markets?conditionId=${id}`);
    assert.equal(m.status, 200, m.text);
    const markets = m.json()['markets'] as Record<string, unknown>[];
    assert.deepEqual(markets.map((r) => [r['conditionId'], r['seq'], r['extraField']]), [[id, 7, 'kept']]);
    const envelope = markets[0]?.['envelope'] as { d: string; k: string };
    assert.equal((JSON.parse(Buffer.from(envelope.d, 'base64').toString('utf8')) as { conditionId: string }).conditionId, id);
    // Stored in the test Redis the ConfigMap points at.
    const seq = ok(await run('redis-cli', ['-h', s!.gateway, '-p', String(redis?.port), 'HGET', `edge:market:${id}`, 'seq'], { timeoutMs: 10_000 })).stdout.trim();
    assert.equal(seq, '7', 'redis-cli HGET on the test Redis');
    const forged = signedIngest(Buffer.from(JSON.stringify({ conditionId: `${id}-x`, seq: 1, question: 'q?', active: true, closed: false, outcomes: [], updatedAt: 1 })), `${id}-x`, randomBytes(32), stack.feedPrivateKey);
    const refused = await request(stack, 'POST', '/internal/ingest/market', { body: forged.body, headers: forged.headers, baseUrl: stack.ingestUrl });
    assert.deepEqual([refused.status, errorCode(refused)], [401, 'unauthorized']);
    // INGEST_PORT: the clients' port has no ingest route (404 before any body is read).
    const onPublic = await request(stack, 'POST', '/internal/ingest/market', { body: forged.body, headers: forged.headers });
    assert.deepEqual([onPublic.status, errorCode(onPublic)], [404, 'not_found']);
  });

  step('an order is delivered byte-exact over mTLS to the backend ORDER_BACKEND_URL names (hostAliases), with the client certificate from the pod\'s secret directory', 60_000, async () => {
    const market = uniqueId('0xorder');
    assert.equal((await ingest(stack, market, 1)).status, 200);
    const payload = Buffer.concat([Buffer.from(Array.from({ length: 256 }, (_, i) => i)), randomBytes(1000)]);
    const sha256 = createHash('sha256').update(payload).digest('hex');
    const r = await order(market, payload);
    assert.equal(r.status, 200, r.text);
    const answer = r.json();
    assert.deepEqual([answer['status'], answer['bytes'], answer['sha256']], ['accepted', payload.length, sha256], 'the backend\'s answer');
    const d = delivery(String(answer['requestId']));
    assert.ok(d !== undefined, 'the backend recorded the delivery');
    assert.deepEqual([d.method, d.path], ['POST', '/orders']);
    assert.ok(d.body.equals(payload), 'the backend received exactly the payload bytes');
    const served = new X509Certificate(readFileSync(join(s!.clientCertDir, 'tls.crt')));
    assert.equal(d.clientCertFingerprint, served.fingerprint256, 'the client certificate is the one in the pod\'s secret directory');
    assert.equal(d.clientCertSubject, 'edge-client-1');
  });

  step('behind one trusted X-Forwarded-For hop: a blocked country (KP) and an address the database does not know are refused 451; allowed ones pass', 60_000, async () => {
    const blocked = await request(stack, 'GET', '/v1/markets', { ip: KP_IP });
    assert.deepEqual([blocked.status, errorCode(blocked)], [451, 'restricted_jurisdiction'], blocked.text);
    assert.equal(blocked.headers.get('cache-control'), 'no-store');
    const unknown = await request(stack, 'GET', '/v1/markets', { ip: UNKNOWN_IP });
    assert.deepEqual([unknown.status, errorCode(unknown)], [451, 'restricted_jurisdiction'], `GEO_UNKNOWN blocks: ${unknown.text}`);
    const allowed = await request(stack, 'GET', '/v1/markets', { ip: chIp(3) });
    assert.equal(allowed.status, 200, allowed.text);
    const spoofed = await request(stack, 'GET', '/v1/markets', { ip: `${KP_IP}, ${chIp(4)}` });
    assert.equal(spoofed.status, 200, `the last entry (CH) decides: ${spoofed.text}`);
    const hidden = await request(stack, 'GET', '/v1/markets', { ip: `${chIp(5)}, ${KP_IP}` });
    assert.deepEqual([hidden.status, errorCode(hidden)], [451, 'restricted_jurisdiction'], `the last entry (KP) decides: ${hidden.text}`);
    // Without the header the TCP peer (the network gateway, in no database) decides: GEO_TRUSTED_CIDRS is empty in the pod.
    const bare = await fetch(`${edgeUrl}/v1/markets`, { signal: AbortSignal.timeout(5000) });
    assert.equal(bare.status, 451, await bare.text());
  });

  step('one client address past the burst (RATE_BURST) is refused 429 "too many requests"; another address is not', 60_000, async (t) => {
    const burst = Number(settings.data['RATE_BURST']);
    const rps = Number(settings.data['RPS_PER_IP']);
    assert.ok(burst > 0 && rps > 0, 'the ConfigMap sets the rate limit');
    const client = chIp(77);
    const n = burst * 2 + 20;
    const t0 = Date.now();
    const replies = await Promise.all(Array.from({ length: n }, () => request(stack, 'GET', '/', { ip: client })));
    const elapsedS = (Date.now() - t0) / 1000;
    const statuses = replies.map((r) => r.status);
    const passed = statuses.filter((x) => x === 200).length;
    const limited = replies.filter((r) => r.status === 429);
    t.diagnostic(`${passed} × 200, ${limited.length} × 429 in ${elapsedS.toFixed(2)} s (burst ${burst}, ${rps}/s)`);
    assert.deepEqual([...new Set(statuses)].sort(), [200, 429], `only 200 and 429: ${JSON.stringify(statuses)}`);
    assert.ok(passed >= burst, `the full burst passed (${passed})`);
    // Margin: the refill over the measured time rounded up to whole seconds, plus one second's refill.
    assert.ok(passed <= burst + (rps * Math.ceil(elapsedS + 1)), `no more than the burst and its refill passed (${passed} in ${elapsedS} s)`);
    for (const r of limited) assert.equal(errorCode(r), 'too many requests');
    const other = await request(stack, 'GET', '/', { ip: chIp(78) });
    assert.equal(other.status, 200, 'another address has its own bucket');
  });

  step('the probes, asked as the kubelet would: gRPC health SERVING on the pod IP, Envoy\'s readiness exec succeeds, the liveness port accepts; each fails when its container\'s process is stopped, and passes again after a start', 150_000, async (t) => {
    const port = livenessPort();
    assert.equal(await grpcHealth(), 'SERVING');
    assert.equal((await readinessExec()).status, 0, 'readiness exec: /ready says LIVE');
    assert.ok(await tcpAccepts(ip, port), `liveness: ${ip}:${port} accepts`);

    // The readiness command tells a draining Envoy from a live one (not only a stopped container).
    assert.match(await envoyAdmin('POST', '/healthcheck/fail'), /^HTTP\/1\.1 200/);
    const draining = await readinessExec();
    assert.notEqual(draining.status, 0, 'readiness fails while /ready says DRAINING');
    assert.match(await envoyAdmin('GET', '/ready'), /DRAINING/);
    assert.match(await envoyAdmin('POST', '/healthcheck/ok'), /^HTTP\/1\.1 200/);
    assert.equal((await readinessExec()).status, 0, 'ready again');

    // Envoy stopped: readiness and liveness fail; started again: both pass.
    const grace = String(deployment.spec.template.spec.terminationGracePeriodSeconds ?? 30);
    ok(await podman(['stop', '-t', grace, ctr('envoy')], 60_000));
    assert.equal((await containerState(podman, ctr('envoy'))).status, 'exited');
    const stoppedReady = await readinessExec();
    assert.notEqual(stoppedReady.status, 0, 'readiness fails with Envoy stopped');
    assert.equal(await tcpAccepts(ip, port), false, 'liveness: the port refuses with Envoy stopped');
    assert.equal(await grpcHealth(), 'SERVING', 'the TS service is not affected');
    ok(await podman(['start', ctr('envoy')], 60_000));
    await until('Envoy ready again', 30_000, async () => ((await readinessExec()).status === 0 ? true : undefined), 250);
    assert.ok(await tcpAccepts(ip, port), 'liveness accepts again');

    // The TS service stopped: sealed (NOT_SERVING) at once, then gone (the probe cannot connect).
    const stopping = podman(['stop', '-t', grace, ctr('authz')], 90_000);
    const sealed = await until('gRPC health NOT_SERVING (sealed on SIGTERM)', 15_000, async () => {
      const h = await grpcHealth();
      return h === 'SERVING' ? undefined : h;
    }, 100);
    ok(await stopping);
    const gone = await grpcHealth();
    t.diagnostic(`while stopping: ${sealed}; stopped: ${gone}`);
    assert.equal(sealed, 'NOT_SERVING', 'sealed before it exits');
    assert.match(gone, /^error: /, 'no answer once the process is gone');
    assert.equal((await containerState(podman, ctr('authz'))).exitCode, 0);
    const down = await request(stack, 'GET', '/healthz');
    assert.equal(down.status, 503, `Envoy fails closed without the TS service: ${down.text}`);
    ok(await podman(['start', ctr('authz')], 60_000));
    await until('gRPC health SERVING again', 60_000, async () => ((await grpcHealth()) === 'SERVING' ? true : undefined), 250);
    await until('GET /healthz 200 again', 60_000, async () => ((await request(stack, 'GET', '/healthz')).status === 200 ? true : undefined), 250);
  });

  /*
   * Envoy loads the rotated pair for NEW backend connections (SDS watched_directory); an open one
   * keeps its certificate until ORDER_BACKEND_MAX_CONN_SECS (300 in the manifest). So each round
   * sends more orders at once than Envoy has backend connections open: the extra ones need new
   * connections (as e2e/compose.test.ts does).
   */
  step(`a client certificate swapped the kubelet way in its directory reaches new backend connections within ${ROTATION_BOUND_MS / 1000} s`, 90_000, async (t) => {
    const market = uniqueId('0xrotate');
    assert.equal((await ingest(stack, market, 1)).status, 200);
    const warm = await order(market, randomBytes(32));
    assert.equal(warm.status, 200, warm.text);
    const oldCn = delivery(String(warm.json()['requestId']))?.clientCertSubject;
    assert.equal(oldCn, 'edge-client-1', 'the backend sees the current certificate before the rotation');
    const SDS_UPDATES = 'cluster.order_backend.client_ssl_socket_factory.ssl_context_update_by_sds';
    const ACTIVE = 'cluster.order_backend.upstream_cx_active';
    const updatesBefore = (await envoyStats('order_backend')).get(SDS_UPDATES);
    assert.ok(updatesBefore !== undefined, `Envoy reports ${SDS_UPDATES}`);

    const dataBefore = readFileSync(join(s!.clientCertDir, 'tls.crt'));
    const newCn = rotateClientCert(s!.dir);
    const rotatedAt = Date.now();
    assert.notDeepEqual(readFileSync(join(s!.clientCertDir, 'tls.crt')), dataBefore, 'the ..data swap published another certificate');

    let first: { at: number } | undefined;
    let sent = 0;
    let oldAfter = 0;
    while (first === undefined && Date.now() - rotatedAt <= ROTATION_BOUND_MS) {
      const active = (await envoyStats('order_backend')).get(ACTIVE) ?? 0;
      const at = Date.now();
      const round = await Promise.all(Array.from({ length: active + 4 }, () => order(market, randomBytes(32))));
      for (const r of round) {
        assert.equal(r.status, 200, `no order fails during the rotation: ${r.text}`);
        sent += 1;
        const subject = delivery(String(r.json()['requestId']))?.clientCertSubject;
        assert.ok(subject === oldCn || subject === newCn, `unexpected client certificate ${String(subject)}`);
        if (subject === oldCn) oldAfter += 1;
        if (subject === newCn && first === undefined) first = { at };
      }
    }
    const updatesAfter = (await envoyStats('order_backend')).get(SDS_UPDATES) ?? 0;
    t.diagnostic(`Envoy ${SDS_UPDATES} ${updatesBefore} → ${updatesAfter}; ${sent} orders after the rotation, ${oldAfter} still with ${String(oldCn)} (connections opened before it)`);
    assert.ok(first !== undefined, `none of the ${sent} orders sent within ${ROTATION_BOUND_MS} ms of the rotation reached the backend with ${newCn}`);
    const ms = first.at - rotatedAt;
    t.diagnostic(`first order presenting ${newCn} sent ${ms} ms after the swap`);
    // The bound itself, no margin added: Envoy reloads the pair 6–8 ms after the swap
    // (docs/envoy.md); the rest of the 5 s is for the first new backend connection.
    assert.ok(ms <= ROTATION_BOUND_MS, `${ms} ms`);
    assert.ok(updatesAfter > updatesBefore, 'Envoy reloaded the pair through SDS');
  });

  step('the GeoIP CronJob\'s container, run once as a pod on the same volume, installs the packaged default database; the service reloads it (verdicts and edge_geoip_reloads_total)', 120_000, async (t) => {
    const reloadsBefore = await reloadsOk();
    assert.equal((await request(stack, 'GET', '/', { ip: PUBLIC_IP })).status, 451, `before: ${PUBLIC_IP} is in no range of the test database`);
    assert.equal((await request(stack, 'GET', '/', { ip: chIp(20) })).status, 200, 'before: 192.0.2.0/25 is CH');
    const expected = createHash('sha256').update(readFileSync(DEFAULT_GEOIP_DB)).digest('hex');

    const played = ok(await podman(['kube', 'play', '--network', s!.network, s!.files.geoipUpdate], 120_000));
    const updateCtr = `${s!.geoipUpdatePod}-${findResource<CronJob>(s!.docs, 'CronJob').spec.jobTemplate.spec.template.spec.containers[0]?.name ?? ''}`;
    const exit = ok(await podman(['wait', updateCtr], 90_000)).stdout.trim();
    const updateState = await containerState(podman, updateCtr);
    keptLogs.push(await containerLogs(podman, updateCtr));
    assert.deepEqual([exit, updateState.exitCode], ['0', 0], 'the update container exited 0');
    ok(await podman(['pod', 'rm', '-f', '-t', '0', s!.geoipUpdatePod]));
    const installed = ok(await podman(['exec', ctr('authz'), 'sha256sum', '/var/lib/geoip/country.mmdb'])).stdout.split(' ')[0];
    assert.equal(installed, expected, 'the pod sees the database the image ships (its SHA-256)');
    const doneAt = Date.now();

    const reloadMs = Number(settings.data['GEOIP_RELOAD_INTERVAL_MS']);
    let i = 21;
    await until('the new database to decide', reloadMs + 20_000, async () => {
      i += 1;
      const pub = await request(stack, 'GET', '/', { ip: PUBLIC_IP });
      const ch = await request(stack, 'GET', '/', { ip: chIp(i) });
      return pub.status === 200 && ch.status === 451 ? true : undefined;
    }, 500);
    const reloadsAfter = await reloadsOk();
    t.diagnostic(`kube play ${played.ms} ms; new verdicts ${Date.now() - doneAt} ms after the job (GEOIP_RELOAD_INTERVAL_MS ${reloadMs}); reloads ok ${reloadsBefore} → ${reloadsAfter}`);
    assert.ok(reloadsAfter >= reloadsBefore + 1, `edge_geoip_reloads_total{result="ok"} ${reloadsBefore} → ${reloadsAfter}`);
  });

  /*
   * Issue 26: a seal through the admin port outlives the container's restart (what the kubelet does
   * under restartPolicy Always; podman may restart it itself, else the test does), the pod staying
   * up but not ready. Unsealed here by removing the marker and restarting the container, so the
   * later steps keep this pod; an operator deletes the pod instead (docs/operations.md).
   */
  step('a seal through the admin port: refused without the admin token (from Envoy\'s container, on the pod\'s loopback); with it the TS service exits 0 and, restarted, is sealed (no key read, NOT_SERVING, liveness SERVING) until the marker goes', 180_000, async (t) => {
    const adminPort = settings.data['AUTHZ_ADMIN_PORT'] ?? '';
    const tokenFile = settings.data['AUTHZ_ADMIN_TOKEN_FILE'] ?? '';
    const sealFile = settings.data['AUTHZ_SEAL_FILE'] ?? '';
    // Envoy's container shares the loopback but not the token: refused (bash, as its probes speak HTTP).
    const req = (auth: string): string => `POST /admin/seal HTTP/1.1\\r\\nHost: localhost\\r\\n${auth}Content-Length: 0\\r\\nConnection: close\\r\\n\\r\\n`;
    for (const auth of ['', `Authorization: Bearer ${'0'.repeat(64)}\\r\\n`]) {
      const out = ok(await podman(['exec', ctr('envoy'), '/bin/bash', '-c', `exec 3<>/dev/tcp/127.0.0.1/${adminPort} && printf '${req(auth)}' >&3 && cat <&3`])).stdout;
      assert.match(out, /^HTTP\/1\.1 401 /, out);
    }
    assert.equal(await grpcHealth(), 'SERVING', 'not sealed');
    assert.ok(!(await podman(['exec', ctr('envoy'), 'cat', tokenFile])).stdout.includes(s!.adminToken), 'Envoy cannot read the token');
    // The operator, with the token, from the TS service's own container.
    const before = await containerState(podman, ctr('authz'));
    const sealed = ok(await podman(['exec', ctr('authz'), 'node', '-e',
      `fetch('http://127.0.0.1:${adminPort}/admin/seal',{method:'POST',headers:{authorization:'Bearer '+require('fs').readFileSync(process.argv[1],'utf8').trim()}}).then(async r=>process.stdout.write(r.status+' '+await r.text()))`, tokenFile])).stdout;
    assert.equal(sealed, '202 {"status":"sealing","persistent":true}');
    // It exits 0; podman (restart policy always, from the pod) may start it again itself, else we do, as the kubelet would.
    const restarted = await until('the TS service to exit and be started again', 60_000, async () => {
      const st = await containerState(podman, ctr('authz'));
      if (st.status === 'running' && st.startedAt > before.startedAt) return 'by podman';
      if (st.status === 'exited') {
        assert.equal(st.exitCode, 0, 'exited 0 after the seal');
        ok(await podman(['start', ctr('authz')], 60_000));
        return 'by the test';
      }
      return undefined;
    }, 250);
    const health = await until('the restarted TS service to answer health', 60_000, async () => {
      const h = await grpcHealth();
      return h.startsWith('error') ? undefined : h;
    }, 250);
    assert.equal(health, 'NOT_SERVING', 'readiness: the pod leaves the Service');
    assert.equal(await grpcHealth('livenessProbe'), 'SERVING', 'liveness: it is not restarted in a loop');
    const down = await request(stack, 'GET', '/healthz');
    assert.deepEqual([down.status, errorCode(down)], [503, 'sealed']);
    assert.match(await containerLogs(podman, ctr('authz')), /SEALED: [^"]*is present, so this process starts sealed: no key was loaded/);
    await sleep(3000);
    assert.equal((await containerState(podman, ctr('authz'))).status, 'running', 'still up, sealed');
    t.diagnostic(`restarted ${restarted}; sealed after the restart`);

    // Unsealed: the marker removed, the container restarted.
    ok(await podman(['exec', ctr('authz'), 'node', '-e', 'require("fs").rmSync(process.argv[1])', sealFile]));
    const grace = String(deployment.spec.template.spec.terminationGracePeriodSeconds ?? 30);
    ok(await podman(['stop', '-t', grace, ctr('authz')], 90_000));
    ok(await podman(['start', ctr('authz')], 60_000));
    await until('gRPC health SERVING again', 60_000, async () => ((await grpcHealth()) === 'SERVING' ? true : undefined), 250);
    await until('GET /healthz 200 again', 60_000, async () => ((await request(stack, 'GET', '/healthz')).status === 200 ? true : undefined), 250);
  });

  step('podman pod stop with the manifest\'s grace period seals the TS service, which exits 0 in time; no secret is in any container\'s log', 120_000, async (t) => {
    const graceS = deployment.spec.template.spec.terminationGracePeriodSeconds ?? 0;
    const shutdownGraceMs = Number(settings.data['SHUTDOWN_GRACE_MS']);
    assert.ok(graceS > 0 && shutdownGraceMs > 0, `terminationGracePeriodSeconds ${graceS}, SHUTDOWN_GRACE_MS ${shutdownGraceMs}`);
    const t0 = Date.now();
    const stop = ok(await podman(['pod', 'stop', '-t', String(graceS), s!.pod], (graceS + 30) * 1000));
    const authz = await containerState(podman, ctr('authz'));
    const envoy = await containerState(podman, ctr('envoy'));
    assert.deepEqual([authz.status, authz.exitCode, authz.oomKilled], ['exited', 0, false], 'the TS service exited 0 on its own (137 would be the SIGKILL after the grace period)');
    assert.deepEqual([envoy.status, envoy.exitCode], ['exited', 0], 'Envoy exited 0');
    const lines = (await containerLogs(podman, ctr('authz'))).split('\n').filter((l) => l.startsWith('{')).map((l) => JSON.parse(l) as Record<string, unknown>);
    const last = <T>(xs: T[]): T | undefined => xs[xs.length - 1];
    const seal = last(lines.filter((l) => l['msg'] === 'sealing every worker' && l['reason'] === 'SIGTERM'));
    assert.ok(seal !== undefined, 'the TS service logged its seal on SIGTERM');
    const sealedAt = Date.parse(String(seal['time']));
    const workers = Number(settings.data['AUTHZ_WORKERS'] ?? 1);
    const sealedWorkers = lines.filter((l) => String(l['msg']).startsWith('sealed: credentials zeroed') && Date.parse(String(l['time'])) >= sealedAt);
    assert.equal(sealedWorkers.length, workers, `every worker (AUTHZ_WORKERS ${workers}) zeroed its credentials`);
    const stopMs = authz.finishedAt - t0;
    const drainMs = authz.finishedAt - sealedAt;
    t.diagnostic(`podman pod stop -t ${graceS}: ${stop.ms} ms; the TS service sealed ${sealedAt - t0} ms after the stop began, exited 0 ${drainMs} ms after the seal (SHUTDOWN_GRACE_MS ${shutdownGraceMs})`);
    assert.ok(stopMs < graceS * 1000, `exited ${stopMs} ms after the stop began: within terminationGracePeriodSeconds (${graceS} s)`);
    // Envoy drains first (the manifest's shutdown order), so nothing asks after the seal: the
    // drain ends after DRAIN_QUIET_MS of quiet, never later than SHUTDOWN_GRACE_MS, and is not skipped.
    // Margins: 100 ms under the quiet period (the seal's log time vs the container's exit time, two
    // clocks at ms resolution) and 1 s over SHUTDOWN_GRACE_MS for the process to exit once the drain ends.
    assert.ok(drainMs >= DRAIN_QUIET_MS - 100 && drainMs <= shutdownGraceMs + 1000, `drained ${drainMs} ms after the seal (quiet ${DRAIN_QUIET_MS} ms, SHUTDOWN_GRACE_MS ${shutdownGraceMs})`);

    const logs = [...keptLogs, await containerLogs(podman, ctr('authz')), await containerLogs(podman, ctr('envoy'))].join('\n');
    assert.match(logs, /edge authz ready/, 'the logs are there to search');
    assert.match(logs, /"route":"orders"[^\n]*"upstream_cluster":"order_backend"/, 'Envoy\'s access log lines are among them');
    const hmacText = s!.ingestHmac;
    const secrets: [string, string][] = [
      ['ingest-hmac file', hmacText],
      ['ingest-hmac hex', hmacText.replace(/^hex:/, '')],
      ['ingest-hmac base64', stack.hmacKey.toString('base64')],
      ['feed private key', s!.feedPrivateKeyHex],
      ['admin token', s!.adminToken],
    ];
    const keyFiles = readdirSync(s!.pkiDir).filter((f) => f.endsWith('.key'));
    assert.ok(keyFiles.some((f) => /^client-\d+\.key$/.test(f) && f !== 'client-1.key'), `the rotated client key is among ${keyFiles.join(', ')}`);
    for (const f of keyFiles) {
      const body = readFileSync(join(s!.pkiDir, f), 'utf8').split('\n').filter((l) => l !== '' && !l.startsWith('-----'));
      secrets.push([`${f} (PEM body)`, body.join('')]);
      for (const [n, l] of body.entries()) if (l.length >= 16) secrets.push([`${f} line ${n + 1}`, l]);
    }
    const found = secrets.filter(([, x]) => x.length >= 16 && logs.includes(x)).map(([what]) => what);
    assert.deepEqual(found, [], 'secrets found in the containers\' logs');
  });

  step('removed: no pod, container, volume, secret, network or image of the run is left in podman, and no file', 120_000, async () => {
    const objects = await podmanObjects(podman);
    assert.ok(objects.volumes.filter((v) => v.includes(runId)).length >= 2, `the PVC and the ConfigMap volume exist before removal: ${objects.volumes.join(', ')}`);
    const problems = await cleanup();
    assert.deepEqual(problems, [], 'cleanup commands');
    assert.deepEqual(await leftovers(), { pods: [], containers: [], volumes: [], secrets: [], networks: [], images: [], dockerTags: [], files: [] });
  });
});

// ─── Comparing two renders ────────────────────────────────────────────────────────────────

function sortDocs(docs: readonly Resource[]): Resource[] {
  const key = (r: Resource): string => `${r.kind}/${r.metadata.name}`;
  return [...docs].sort((a, b) => key(a).localeCompare(key(b)));
}

/**
 * The paths where `after` differs from `before` (resources by kind/name with `-<suffix>` taken
 * off every name the suffix was added to; list items by `name` or `containerPort`), sorted.
 */
function resourceDiffs(before: readonly Resource[], after: readonly Resource[], suffix: string): string[] {
  const names = new Set(before.map((r) => r.metadata.name));
  const unsuffix = (v: unknown): unknown => {
    if (typeof v === 'string') return v.endsWith(`-${suffix}`) && names.has(v.slice(0, -suffix.length - 1)) ? v.slice(0, -suffix.length - 1) : v;
    if (Array.isArray(v)) return v.map(unsuffix);
    if (v !== null && typeof v === 'object') return Object.fromEntries(Object.entries(v).map(([k, x]) => [k, unsuffix(x)]));
    return v;
  };
  const byKey = (rs: readonly unknown[]): Map<string, unknown> => new Map(rs.map((r) => [`${(r as Resource).kind}/${(r as Resource).metadata.name}`, r]));
  const a = byKey(before);
  const b = byKey(after.map(unsuffix));
  const out: string[] = [];
  for (const k of new Set([...a.keys(), ...b.keys()])) {
    if (!a.has(k) || !b.has(k)) { out.push(`${k} ${a.has(k) ? 'removed' : 'added'}`); continue; }
    diffValue(a.get(k), b.get(k), '', (p) => out.push(`${k} ${p.replace(/^\./, '')}`));
  }
  return out.sort();
}

function diffValue(x: unknown, y: unknown, path: string, report: (path: string) => void): void {
  if (Array.isArray(x) && Array.isArray(y)) {
    const keyOf = (e: unknown): string | undefined => {
      if (e === null || typeof e !== 'object') return undefined;
      const o = e as Record<string, unknown>;
      return typeof o['name'] === 'string' ? `name=${o['name']}` : typeof o['containerPort'] === 'number' ? `containerPort=${o['containerPort']}` : undefined;
    };
    const keyed = [...x, ...y].every((e) => keyOf(e) !== undefined);
    if (!keyed) {
      if (JSON.stringify(x) !== JSON.stringify(y)) report(path);
      return;
    }
    const mx = new Map(x.map((e) => [keyOf(e), e]));
    const my = new Map(y.map((e) => [keyOf(e), e]));
    for (const k of new Set([...mx.keys(), ...my.keys()])) diffValue(mx.get(k), my.get(k), `${path}[${k ?? ''}]`, report);
    return;
  }
  if (x !== null && y !== null && typeof x === 'object' && typeof y === 'object' && !Array.isArray(x) && !Array.isArray(y)) {
    const ox = x as Record<string, unknown>;
    const oy = y as Record<string, unknown>;
    for (const k of new Set([...Object.keys(ox), ...Object.keys(oy)])) diffValue(ox[k], oy[k], `${path}.${k}`, report);
    return;
  }
  if (JSON.stringify(x) !== JSON.stringify(y)) report(path);
}
