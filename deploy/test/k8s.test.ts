/**
 * deploy/k8s without a cluster:
 * - the generated ConfigMaps and rollout hashes equal a fresh render (no drift), and the
 *   ConfigMap's envoy.yaml is byte for byte what the renderer produces;
 * - `kustomize build` of the base and the production overlay (deploy/k8s/kustomize.ts, checked
 *   against the real kustomize when installed) validates against the Kubernetes schemas of the
 *   oldest supported (1.30) and the newest bundled version (1.37), strict;
 * - names, ports and paths agree with the service's settings and the Envoy config: every env
 *   name is a setting, every file setting resolves through the reading container's mounts to a
 *   Secret key / ConfigMap key / volume, container ports and probes use the configured ports,
 *   the NetworkPolicy admits only Envoy's port (and metrics from monitoring);
 * - the pod's Envoy config passes the real `envoy --mode validate` with the pod's volumes laid
 *   out as the kubelet does (ConfigMap files, the client certificate in the ..data layout);
 * - the shutdown sequence: Envoy drains before the TS service seals, all within the grace period.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync, spawn, spawnSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import YAML from 'yaml';
import { sentinelOptions } from '../../authz/src/adapters/redis.ts';
import { loadConfig } from '../../authz/src/config.ts';
import { envoyBinary } from '../../envoy/envoy-bin.ts';
import { renderEnvoy } from '../../envoy/render.ts';
import { freePort } from '../../authz/test/redis-server.ts';
import { generateDevPki } from '../../scripts/dev/certs.ts';
import { loadCompose } from '../compose.ts';
import { ROOT } from '../image.ts';
import { kustomizeBuild, podSpecs, readDocs, realKustomizeBuild, realKustomizeLibrary, type Resource } from '../k8s/kustomize.ts';
import { CONFIG_HASH_ANNOTATION, GENERATED, K8S_ENV, MOUNTS, PRODUCTION_ENV, renderManifests, SECRETS, SHUTDOWN } from '../k8s/render.ts';
import { kubernetesValidate, settingsRead, validateEnvoyThroughMounts } from './support.ts';

const K8S = join(ROOT, 'deploy/k8s');
const builds = { base: kustomizeBuild(join(K8S, 'base')), production: kustomizeBuild(join(K8S, 'overlays/production')) };
const SETTINGS = { base: K8S_ENV, production: PRODUCTION_ENV };

interface Container {
  name: string; image: string; args?: string[]; command?: string[];
  ports?: { name?: string; containerPort: number }[];
  env?: { name: string }[]; envFrom?: { configMapRef?: { name: string } }[];
  volumeMounts?: { name: string; mountPath: string; readOnly?: boolean }[];
  readinessProbe?: Record<string, unknown>; livenessProbe?: Record<string, unknown>;
  lifecycle?: { preStop?: { exec?: { command: string[] }; sleep?: { seconds: number } } };
  resources?: { requests?: Record<string, string>; limits?: Record<string, string> };
  securityContext?: Record<string, unknown>;
}
interface Volume { name: string; configMap?: { name: string }; secret?: { secretName: string; defaultMode?: number; items?: { key: string; path: string }[] }; persistentVolumeClaim?: { claimName: string }; emptyDir?: object }

const find = (rs: Resource[], kind: string, name?: string): Resource => {
  const r = rs.find((x) => x.kind === kind && (name === undefined || x.metadata.name === name));
  assert.ok(r !== undefined, `${kind}/${name ?? '*'} missing`);
  return r;
};
const pod = (rs: Resource[]): { containers: Container[]; volumes: Volume[]; [k: string]: unknown } => podSpecs(find(rs, 'Deployment', 'edge'))[0] as never;
const container = (rs: Resource[], name: string): Container => {
  const c = pod(rs).containers.find((x) => x.name === name);
  assert.ok(c !== undefined, name);
  return c;
};
const settingsOf = (rs: Resource[]): Record<string, string> => find(rs, 'ConfigMap', 'edge-settings')['data'] as Record<string, string>;

test('kubernetes – the generated files equal a fresh render; the ConfigMap carries exactly the renderer\'s envoy.yaml', () => {
  for (const [path, text] of Object.entries(renderManifests())) assert.equal(readFileSync(path, 'utf8'), text, `${path} is stale: npm run render:k8s`);
  const [, envoy] = readDocs(GENERATED.base);
  const rendered = renderEnvoy(loadConfig(K8S_ENV), { sdsPath: `${MOUNTS.envoyConfig}/sds-client-cert.yaml`, nodeId: 'edge-envoy' });
  assert.deepEqual((envoy as Resource)['data'], { 'envoy.yaml': rendered.bootstrap, 'sds-client-cert.yaml': rendered.sds });
});

test('kubernetes – base and production overlay build and validate against the Kubernetes 1.30 and 1.37 schemas (kubernetes-validate --strict)', () => {
  for (const [name, rs] of Object.entries(builds)) {
    assert.deepEqual(kubernetesValidate(rs, ['1.30.0', '1.37.0']), [], name);
    assert.deepEqual(rs.map((r) => `${r.kind}/${r.metadata.name}`).sort(), [
      'ConfigMap/edge-envoy', 'ConfigMap/edge-settings', 'CronJob/edge-geoip-update', 'Deployment/edge', 'HorizontalPodAutoscaler/edge',
      'NetworkPolicy/edge', 'PersistentVolumeClaim/edge-geoip', 'PodDisruptionBudget/edge', 'Service/edge',
    ]);
  }
});

/** Lists whose order Kubernetes ignores, sorted by their merge key, for comparing builds. */
function canonical(v: unknown, key = ''): unknown {
  if (Array.isArray(v)) {
    const items = v.map((x) => canonical(x));
    const by = ({ containers: 'name', volumes: 'name', volumeMounts: 'mountPath', env: 'name' } as Record<string, string>)[key];
    return by === undefined ? items : items.sort((a, b) => String((a as Record<string, unknown>)[by]).localeCompare(String((b as Record<string, unknown>)[by])));
  }
  if (v !== null && typeof v === 'object') return Object.fromEntries(Object.entries(v).map(([k, x]) => [k, canonical(x, k)]));
  return v;
}

test('kubernetes – the TypeScript kustomize build agrees with the real kustomize', { skip: realKustomizeLibrary() === undefined ? 'skipped: the real kustomize (PyPI pykustomize) is not installed in .venv; the TypeScript build was validated above' : false }, () => {
  for (const [name, dir] of [['base', 'base'], ['production', 'overlays/production']] as const) {
    const real = realKustomizeBuild(join(K8S, dir))!;
    const key = (r: Resource): string => `${r.kind}/${r.metadata.name}`;
    const mine = new Map(builds[name].map((r) => [key(r), r]));
    assert.deepEqual([...mine.keys()].sort(), real.map(key).sort(), name);
    for (const r of real) assert.deepEqual(canonical(mine.get(key(r))), canonical(r), `${name}: ${key(r)}`);
  }
});

test('kubernetes – production overlay: namespace, registry image, its own settings and rollout hash; overlays never patch the settings by hand', () => {
  const rs = builds.production;
  for (const r of rs) assert.equal(r.metadata.namespace, 'edge-production', `${r.kind}/${r.metadata.name}`);
  assert.equal(container(rs, 'authz').image, 'registry.example.com/edge-trading-proxy:1.0.0');
  assert.equal((podSpecs(find(rs, 'CronJob'))[0] as { containers: Container[] }).containers[0]!.image, 'registry.example.com/edge-trading-proxy:1.0.0');
  assert.deepEqual(settingsOf(rs), PRODUCTION_ENV);
  assert.deepEqual(settingsOf(builds.base), K8S_ENV);
  const hash = (b: Resource[]): string => (find(b, 'Deployment')['spec'] as { template: { metadata: { annotations: Record<string, string> } } }).template.metadata.annotations[CONFIG_HASH_ANNOTATION]!;
  assert.match(hash(rs), /^[0-9a-f]{64}$/);
  assert.notEqual(hash(rs), hash(builds.base), 'different settings, different pods');
  for (const f of ['deployment-patch.yaml', 'hpa-patch.yaml']) {
    for (const d of readDocs(join(K8S, 'overlays/production', f))) assert.notEqual(d.kind, 'ConfigMap', `${f} patches a generated ConfigMap`);
  }
});

for (const [name, rs] of Object.entries(builds) as [keyof typeof builds, Resource[]][]) {
  test(`kubernetes (${name}) – every environment name is a setting the service reads; the settings load; ports and probes match them`, () => {
    const read = settingsRead();
    const env = settingsOf(rs);
    assert.deepEqual(env, SETTINGS[name]);
    for (const k of Object.keys(env)) assert.ok(read.has(k), `edge-settings: ${k} is not a setting`);
    for (const c of pod(rs).containers) {
      for (const e of c.env ?? []) assert.ok(read.has(e.name), `${c.name}: ${e.name}`);
      assert.deepEqual(c.envFrom, [{ configMapRef: { name: 'edge-settings' } }], `${c.name} gets the settings`);
    }
    const config = loadConfig(env);
    const envoy = container(rs, 'envoy');
    const authz = container(rs, 'authz');
    assert.deepEqual(envoy.ports, [{ name: 'http', containerPort: config.edgePort }]);
    // The market port is not declared: it listens on loopback inside the pod (MARKET_BIND_ADDRESS).
    assert.deepEqual(authz.ports?.map((p) => p.containerPort), [config.authzGrpcPort, config.authzAdminPort]);
    assert.equal(config.marketBindAddress, '127.0.0.1');
    assert.deepEqual(authz.readinessProbe?.['grpc'], { port: config.authzGrpcPort });
    assert.deepEqual(authz.livenessProbe?.['grpc'], { port: config.authzGrpcPort });
    const deployment = find(rs, 'Deployment');
    const template = (deployment['spec'] as { template: { metadata: { annotations: Record<string, string>; labels: Record<string, string> } } }).template.metadata;
    assert.equal(template.annotations['prometheus.io/port'], String(config.authzAdminPort));
    // Envoy's admin port: the config's, and the one the probe and preStop scripts use (from the env).
    const boot = YAML.parse((find(rs, 'ConfigMap', 'edge-envoy')['data'] as Record<string, string>)['envoy.yaml']!) as {
      admin: { address: { socket_address: { address: string; port_value: number } } };
      static_resources: { listeners: { address: { socket_address: { port_value: number } } }[]; clusters: { name: string; load_assignment?: { endpoints: { lb_endpoints: { endpoint: { address: { socket_address: { address: string; port_value: number } } } }[] }[] } }[] };
    };
    assert.deepEqual(boot.admin.address.socket_address, { address: '127.0.0.1', port_value: config.envoyAdminPort });
    assert.equal(boot.static_resources.listeners[0]?.address.socket_address.port_value, config.edgePort);
    const endpoint = (c: string): unknown => boot.static_resources.clusters.find((x) => x.name === c)?.load_assignment?.endpoints[0]?.lb_endpoints[0]?.endpoint.address.socket_address;
    assert.deepEqual(endpoint('authz'), { address: '127.0.0.1', port_value: config.authzGrpcPort }, 'Envoy reaches authz over the pod\'s loopback');
    assert.deepEqual(endpoint('market'), { address: '127.0.0.1', port_value: config.marketPort });
    for (const script of [envoy.readinessProbe?.['exec'] as { command: string[] }, envoy.lifecycle?.preStop?.exec]) {
      assert.ok(script?.command.join(' ').includes('/dev/tcp/127.0.0.1/${ENVOY_ADMIN_PORT}'), JSON.stringify(script));
    }
    // Service → Envoy's named port; selectors match the pod.
    const labels = template.labels;
    const svc = find(rs, 'Service')['spec'] as { selector: Record<string, string>; ports: { targetPort: string }[] };
    assert.deepEqual(svc.ports.map((p) => p.targetPort), ['http']);
    for (const sel of [svc.selector, (find(rs, 'PodDisruptionBudget')['spec'] as { selector: { matchLabels: Record<string, string> } }).selector.matchLabels,
      (find(rs, 'NetworkPolicy')['spec'] as { podSelector: { matchLabels: Record<string, string> } }).podSelector.matchLabels]) {
      for (const [k, v] of Object.entries(sel)) assert.equal(labels[k], v);
    }
    assert.deepEqual((find(rs, 'HorizontalPodAutoscaler')['spec'] as { scaleTargetRef: unknown }).scaleTargetRef, { apiVersion: 'apps/v1', kind: 'Deployment', name: 'edge' });
  });

  test(`kubernetes (${name}) – NetworkPolicy: only Envoy's port from anywhere, metrics from monitoring only; egress to Redis/Sentinel, the backend port and DNS`, () => {
    const config = loadConfig(settingsOf(rs));
    const np = find(rs, 'NetworkPolicy')['spec'] as { policyTypes: string[]; ingress: { from?: unknown[]; ports: { port: number }[] }[]; egress: { ports: { port: number }[] }[] };
    assert.deepEqual(np.policyTypes, ['Ingress', 'Egress']);
    const open = np.ingress.filter((r) => r.from === undefined).flatMap((r) => r.ports.map((p) => p.port));
    assert.deepEqual(open, [config.edgePort]);
    const restricted = np.ingress.filter((r) => r.from !== undefined).flatMap((r) => r.ports.map((p) => p.port));
    assert.deepEqual(restricted, [config.authzAdminPort]);
    for (const p of [config.authzGrpcPort, config.marketPort]) assert.ok(!open.includes(p) && !restricted.includes(p), `port ${p} must not be admitted`);
    const egress = np.egress.flatMap((r) => r.ports.map((p) => p.port));
    const redisPorts = (sentinelOptions(config.redisUrl!).sentinels ?? []).map((s) => Number((s as { port: number }).port));
    assert.ok(redisPorts.length >= 3, 'Sentinel: three sentinels');
    for (const p of [...redisPorts, 6379, config.orderBackend!.port, 53]) assert.ok(egress.includes(p), `egress to port ${p}`);
  });

  test(`kubernetes (${name}) – every file setting resolves through its container's mounts to a Secret key, ConfigMap key or volume; secrets are 0400`, () => {
    const env = settingsOf(rs);
    const { volumes } = pod(rs);
    const secretKeys = new Map<string, readonly string[]>(Object.values(SECRETS).map((s) => [s.name, s.keys]));
    const provides = (c: string, path: string): string => {
      const mounts = [...(container(rs, c).volumeMounts ?? [])].sort((a, b) => b.mountPath.length - a.mountPath.length);
      const m = mounts.find((x) => path.startsWith(`${x.mountPath}/`));
      assert.ok(m !== undefined, `${c}: ${path} is not under a mount`);
      assert.equal(m.readOnly, true, `${c}: ${m.mountPath} read-only`);
      const v = volumes.find((x) => x.name === m.name)!;
      const file = path.slice(m.mountPath.length + 1);
      if (v.secret !== undefined) {
        const keys = secretKeys.get(v.secret.secretName);
        assert.ok(keys !== undefined, `${v.secret.secretName} is not a documented Secret`);
        assert.equal(v.secret.defaultMode, 0o400, `${v.name}: defaultMode 0400`);
        const key = v.secret.items === undefined ? file : v.secret.items.find((i) => i.path === file)?.key;
        assert.ok(key !== undefined && keys.includes(key), `${path}: key ${String(key)} of ${v.secret.secretName}`);
      } else if (v.configMap !== undefined) {
        assert.ok(file in (find(rs, 'ConfigMap', v.configMap.name)['data'] as object), `${path} in ConfigMap ${v.configMap.name}`);
      } else assert.ok(v.persistentVolumeClaim !== undefined, `${path}: ${v.name}`);
      return v.name;
    };
    for (const k of ['EDGE_INGEST_HMAC_FILE', 'EDGE_INGEST_HMAC_PREVIOUS_FILE', 'EDGE_FEED_ED25519_PUBLIC_KEY_FILE']) provides('authz', env[k]!);
    assert.equal(provides('authz', env['GEOIP_DB']!), 'geoip');
    for (const k of ['ORDER_BACKEND_CA_FILE', 'EDGE_CLIENT_CERT_FILE', 'EDGE_CLIENT_KEY_FILE']) provides('envoy', env[k]!);
    const configFile = container(rs, 'envoy').args![container(rs, 'envoy').args!.indexOf('-c') + 1]!;
    provides('envoy', configFile);
    for (const v of volumes) if (v.secret !== undefined) assert.ok(secretKeys.has(v.secret.secretName), v.secret.secretName);
    // The geoip PVC is the one the CronJob writes.
    const job = podSpecs(find(rs, 'CronJob'))[0] as { volumes: Volume[] };
    assert.equal(job.volumes[0]?.persistentVolumeClaim?.claimName, volumes.find((v) => v.name === 'geoip')?.persistentVolumeClaim?.claimName);
  });

  test(`kubernetes (${name}) – hardening: non-root, read-only root filesystems, no privilege escalation, capabilities dropped, resources set, images pinned`, () => {
    const version = /\/(\d+\.\d+\.\d+)\//.exec(execFileSync(envoyBinary(), ['--version']).toString())?.[1];
    assert.equal(container(rs, 'envoy').image, `envoyproxy/envoy:v${version}`, 'the Envoy the tests run');
    for (const workload of [find(rs, 'Deployment'), find(rs, 'CronJob')]) {
      const spec = podSpecs(workload)[0] as { securityContext: Record<string, unknown>; containers: Container[]; automountServiceAccountToken: boolean };
      assert.equal(spec.securityContext['runAsNonRoot'], true);
      assert.equal(spec.automountServiceAccountToken, false);
      for (const c of spec.containers) {
        assert.deepEqual(c.securityContext, { allowPrivilegeEscalation: false, readOnlyRootFilesystem: true, capabilities: { drop: ['ALL'] } }, c.name);
        assert.ok(c.resources?.requests !== undefined && c.resources.limits !== undefined, `${c.name}: requests and limits`);
        assert.match(c.image, /:[\w.-]+$/, `${c.name}: tagged image`);
      }
    }
  });
}

test('kubernetes – shutdown: Envoy keeps serving while endpoints go, drains, exits; the TS service seals after it; all within the grace period', () => {
  const rs = builds.base;
  const spec = pod(rs) as unknown as { terminationGracePeriodSeconds: number };
  const envoy = container(rs, 'envoy');
  const authz = container(rs, 'authz');
  assert.equal(spec.terminationGracePeriodSeconds, SHUTDOWN.terminationGracePeriodSeconds);
  assert.equal(envoy.args![envoy.args!.indexOf('--drain-time-s') + 1], String(SHUTDOWN.envoyDrainSecs));
  const script = envoy.lifecycle!.preStop!.exec!.command.join(' ');
  assert.match(script, new RegExp(`^/bin/bash -c sleep ${SHUTDOWN.endpointPropagationSecs};.*drain_listeners\\?graceful.*; sleep ${SHUTDOWN.envoyDrainSecs}$`));
  const envoyDone = SHUTDOWN.endpointPropagationSecs + SHUTDOWN.envoyDrainSecs;
  assert.equal(authz.lifecycle?.preStop?.sleep?.seconds, SHUTDOWN.authzPreStopSecs);
  assert.ok(SHUTDOWN.authzPreStopSecs > envoyDone, 'the service seals only after Envoy stopped sending');
  const graceSecs = Number(K8S_ENV['SHUTDOWN_GRACE_MS']) / 1000;
  assert.ok(SHUTDOWN.terminationGracePeriodSeconds >= SHUTDOWN.authzPreStopSecs + graceSecs + 2, 'seal + drain finish before SIGKILL');
});

test('kubernetes – the pod\'s Envoy config is valid with the pod\'s volumes as the kubelet lays them out (real envoy --mode validate)', () => {
  for (const rs of Object.values(builds)) {
    const data = find(rs, 'ConfigMap', 'edge-envoy')['data'] as Record<string, string>;
    const root = mkdtempSync(join(tmpdir(), 'edge-k8s-pod-'));
    // Secret volumes: the client certificate in the kubelet's ..data layout, the backend CA.
    const pki = generateDevPki(join(root, 'pki'));
    const ca = join(root, 'backend-ca');
    mkdirSync(ca);
    writeFileSync(join(ca, 'ca.crt'), readFileSync(pki.backendCaFile));
    const files = Object.fromEntries(Object.entries(data).map(([k, v]) => [`${MOUNTS.envoyConfig}/${k}`, v]));
    const envoy = container(rs, 'envoy');
    validateEnvoyThroughMounts(files, envoy.args![envoy.args!.indexOf('-c') + 1]!, [
      [MOUNTS.clientCert, join(pki.dir, 'client')],
      [MOUNTS.backendCa, ca],
    ]);
    rmSync(root, { recursive: true, force: true });
  }
});

test('kubernetes + compose – Envoy\'s readiness, preStop drain and health-check scripts work against a real Envoy 1.40 with the manifests\' own arguments', async () => {
  const envoy = container(builds.base, 'envoy');
  const dir = mkdtempSync(join(tmpdir(), 'edge-k8s-live-'));
  const pki = generateDevPki(join(dir, 'pki'));
  const [edgePort, adminPort] = [await freePort(), await freePort()];
  const env = { ...K8S_ENV, EDGE_PORT: String(edgePort), ENVOY_ADMIN_PORT: String(adminPort), ORDER_BACKEND_CA_FILE: pki.backendCaFile, EDGE_CLIENT_CERT_FILE: pki.clientCertFile, EDGE_CLIENT_KEY_FILE: pki.clientKeyFile };
  const rendered = renderEnvoy(loadConfig(env), { sdsPath: join(dir, 'sds.yaml') });
  writeFileSync(join(dir, 'envoy.yaml'), rendered.bootstrap);
  writeFileSync(join(dir, 'sds.yaml'), rendered.sds ?? '');
  const script = (cmd: readonly string[], scriptEnv: Record<string, string>, prefix = ''): number | null => {
    const [bin, flag, body] = cmd;
    assert.deepEqual([bin, flag], ['/bin/bash', '-c']);
    return spawnSync(bin!, [flag!, prefix + body!], { env: { PATH: process.env['PATH'] ?? '', ...scriptEnv }, stdio: 'ignore', timeout: 5000 }).status;
  };
  const readiness = (envoy.readinessProbe!['exec'] as { command: string[] }).command;
  assert.notEqual(script(readiness, { ENVOY_ADMIN_PORT: String(adminPort) }), 0, 'not ready before Envoy runs');
  const args = envoy.args!.map((a, i, all) => (all[i - 1] === '-c' ? join(dir, 'envoy.yaml') : a));
  const proc = spawn(envoyBinary(), args, { stdio: 'ignore' });
  try {
    let ready = false;
    for (let i = 0; i < 100 && !ready; i++) {
      ready = script(readiness, { ENVOY_ADMIN_PORT: String(adminPort) }) === 0;
      if (!ready) await sleep(100);
    }
    assert.ok(ready, 'the readiness probe sees /ready LIVE');
    const composeCheck = loadCompose().services['envoy']!.healthcheck!.test;
    assert.equal(composeCheck[0], 'CMD');
    assert.equal(script(['/bin/bash', '-c', composeCheck[3]!.replace('/9901 ', `/${adminPort} `)], {}), 0, 'the compose health check sees LIVE');
    assert.notEqual((await fetch(`http://127.0.0.1:${edgePort}/`)).headers.get('connection'), 'close', 'not draining yet');
    // preStop, without its waits: the drain request must be accepted and take effect.
    assert.equal(script(envoy.lifecycle!.preStop!.exec!.command, { ENVOY_ADMIN_PORT: String(adminPort) }, 'sleep() { :; }; '), 0);
    assert.equal((await fetch(`http://127.0.0.1:${edgePort}/`)).headers.get('connection'), 'close', 'listeners are draining');
  } finally {
    proc.kill('SIGKILL');
    rmSync(dir, { recursive: true, force: true });
  }
});
