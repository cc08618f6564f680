/**
 * The shipped Kubernetes manifests (deploy/k8s/overlays/production) as a pod under Podman 4.3
 * (`podman kube play`), on a machine without a cluster: docs/deploy.md §4 "Run the pod locally
 * with Podman" runs it by hand, e2e/pod.test.ts end to end. Rootful podman (run as root).
 *
 *   scripts/node deploy/podman/setup.ts --out .run/pod                        # once
 *   scripts/node deploy/podman/setup.ts --out .run/pod --rotate-client-cert   # a new client certificate, the kubelet way
 *   scripts/node deploy/podman/setup.ts --out <dir> --conf-only               # only <dir>/containers.conf (any user)
 *   options: --name <n>            every resource name gets the suffix -<n>, the network is edge-<n> (default: local)
 *            --envoy-image <ref>   Envoy's image in podman's store (default docker.io/local/envoy:v1.40.0)
 *            --service-image <ref> the service image in podman's store (default docker.io/library/edge-trading-proxy:1.0.0)
 *            --redis-port <p>      where the pod finds Redis on the network's gateway (default 16390)
 *            --redis-replica-port <p>  its replica's port on loopback, for pod.env (default: --redis-port + 1)
 *            --publish <a,b,c,d[,e]>  host ports (127.0.0.1) for the containerPorts http,grpc,metrics,ingest and,
 *                                  optionally, envoy-stats (default 18080,19191,19464,18082: `npm start` keeps
 *                                  8080, 9191 and 9464 on loopback; envoy-stats unpublished)
 *
 * Writes, under <out>:
 *   containers.conf     containers.conf.template with this machine's hard limits (podman reads it
 *                       through CONTAINERS_CONF; nothing under /etc changes)
 *   cni/, events.log    podman's network configurations and its event log (the conf points here)
 *   secrets/<secret>/   each Secret the Deployment mounts, laid out as a kubelet secret volume:
 *                       ..<timestamp>/<file> (0440, group fsGroup; directories 02755),
 *                       ..data → ..<timestamp>, <file> → ..data/<file>
 *   pki/                CAs and certificates: the order backend's for the ORDER_BACKEND_SAN name,
 *                       the edge's client certificate (the copy the pod reads is in secrets/), and
 *                       edge-ca.crt, the CA of the client port's server certificate (Secret
 *                       edge-server-cert, for localhost and 127.0.0.1): what `curl --cacert` is given
 *   feed_private_key    the signing client's Ed25519 key (hex seed; mounted nowhere)
 *   overlay/            the kustomize overlay on the production overlay (OVERLAY_CHANGES)
 *   rendered.yaml       `kubectl kustomize overlay/`, split for podman into:
 *   pvc.yaml            the PersistentVolumeClaim: played first (podman makes it a named volume,
 *                       which a second play of the same claim refuses as existing)
 *   edge.yaml           everything else (podman runs the Deployment and the ConfigMaps it uses,
 *                       and ignores the Service, HPA, PDB, NetworkPolicy and CronJob)
 *   geoip-update.yaml   the CronJob's job pod as a Pod (what `kubectl create job --from=cronjob/…` runs)
 *   pod.env             for the shell: CONTAINERS_CONF, POD_NETWORK, POD_GATEWAY, POD_NAME, the ports
 *                       (POD_REDIS_PORT, POD_REDIS_REPLICA_PORT, POD_EDGE_URL (https), POD_EDGE_CA,
 *                       POD_INGEST_URL, POD_GRPC_ADDRESS, POD_METRICS_URL), the CronJob's pod and container
 *                       (POD_GEOIP_UPDATE_POD, _CONTAINER) and the named volumes (POD_VOLUMES):
 *                       every name docs/deploy.md's walkthrough uses, for any --name and --publish
 * and creates the podman network edge-<name>. Its gateway is where the pod reaches the host: the
 * address exists while a pod is attached, so a service on the host binds it after `kube play`.
 */
import { spawnSync } from 'node:child_process';
import { createHash, generateKeyPairSync, randomBytes } from 'node:crypto';
import { chmodSync, chownSync, lstatSync, mkdirSync, readFileSync, readlinkSync, renameSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { join, relative, resolve } from 'node:path';
import { parseArgs } from 'node:util';
import YAML from 'yaml';
import { generateDevPki, issue } from '../../scripts/dev/certs.ts';
import { ensureEdgeServerCert } from '../../scripts/dev/edge-server-cert.ts';
import { SECRETS } from '../k8s/render.ts';
import { ROOT } from '../paths.ts';
import { kustomize, yamlDocs, type Resource } from '../test/tools.ts';

export const PRODUCTION_OVERLAY = join(ROOT, 'deploy/k8s/overlays/production');
export const CONF_TEMPLATE = join(ROOT, 'deploy/podman/containers.conf.template');
/** podman cannot raise a container's RLIMIT_NPROC above its own, which it lowers to this. */
export const PODMAN_NPROC_CAP = 32768;

/** Container ports published only when given a host port (`--publish`'s fifth value): Envoy's stats listener. */
const OPTIONAL_PORTS: readonly string[] = ['envoy-stats'];

/**
 * What the overlay changes of the production overlay, and why: nothing else differs (e2e/pod.test.ts
 * compares the two renders and fails on any other difference).
 */
export const OVERLAY_CHANGES = [
  'nameSuffix -<name> on every resource: podman reuses a named volume (the PVC, a ConfigMap volume) of the same name, stale, so runs never share one',
  'images: the service and Envoy images by their names in podman\'s store (no registry)',
  'edge-settings REDIS_URL: redis://<network gateway>:<port>/0, a Redis on the host with one replica (no Sentinel here); read by the TS service only, so the Envoy ConfigMap stays as rendered',
  'edge-settings BLOCKED_COUNTRIES only when asked (the test blocks KP: production blocks none, so no country could be refused 451 otherwise); read by the TS service only',
  'hostAliases: the ORDER_BACKEND_URL host → the network gateway (no cluster DNS), where a test backend listens with a certificate for that name from pki/',
  'replicas: 1 (podman creates `replicas` pods from one Deployment, each publishing the same host ports)',
  'every containerPort gets hostIP 127.0.0.1 and a hostPort: podman 4.3 publishes each containerPort on the host, on all interfaces at the same number, where a kubelet publishes none; pinned to loopback and to chosen ports (envoy-stats, when no host port is given for it, is left out of the pod spec instead: Envoy still listens on it inside the pod)',
  'secret volumes → hostPath directories holding generated files in the kubelet layout (..data symlink swap): podman 4.3\'s secret volumes have no ..data layout (no rotation), keep data base64-encoded in the file, drop stringData, ignore defaultMode, and crash `kube play` without an explicit optional:',
] as const;

export interface HardLimits { readonly nofile: number; readonly nproc: number }

/** This process's hard limits (ulimit -Hn / -Hu), from /proc/self/limits; "unlimited" is Infinity. */
export function hardLimits(text = readFileSync('/proc/self/limits', 'utf8')): HardLimits {
  const hard = (label: string): number => {
    const m = new RegExp(`^${label}\\s+(\\S+)\\s+(\\S+)`, 'm').exec(text);
    if (m === null) throw new Error(`/proc/self/limits has no "${label}" line`);
    return m[2] === 'unlimited' ? Infinity : Number(m[2]);
  };
  return { nofile: hard('Max open files'), nproc: hard('Max processes') };
}

/** containers.conf.template filled in: limits from the machine, directories of the run. */
export function containersConf(dir: string, limits: HardLimits = hardLimits()): string {
  const nofile = Number.isFinite(limits.nofile) ? limits.nofile : 1048576;
  const values: Record<string, string> = {
    NPROC: String(Math.min(limits.nproc, PODMAN_NPROC_CAP)),
    NOFILE: String(nofile),
    NETWORK_CONFIG_DIR: join(dir, 'cni'),
    EVENTS_LOGFILE: join(dir, 'events.log'),
  };
  return readFileSync(CONF_TEMPLATE, 'utf8').replace(/\{\{([A-Z_]+)\}\}/g, (_, name: string) => {
    const v = values[name];
    if (v === undefined) throw new Error(`${CONF_TEMPLATE}: unknown placeholder {{${name}}}`);
    return v;
  });
}

/** Writes <dir>/containers.conf (and the directories it names); returns its path. */
export function writeContainersConf(dir: string, limits?: HardLimits): string {
  mkdirSync(join(dir, 'cni'), { recursive: true, mode: 0o700 });
  const path = join(dir, 'containers.conf');
  writeFileSync(path, containersConf(dir, limits));
  return path;
}

/** This process's environment with CONTAINERS_CONF set: what every podman call runs with. */
export function podmanEnv(conf: string): NodeJS.ProcessEnv {
  return { ...process.env, CONTAINERS_CONF: conf };
}

function podmanSync(args: readonly string[], env: NodeJS.ProcessEnv, timeoutMs = 60_000): { status: number | null; stdout: string; stderr: string } {
  const r = spawnSync('podman', args, { encoding: 'utf8', env, timeout: timeoutMs, killSignal: 'SIGKILL' });
  if (r.error !== undefined) throw new Error(`podman ${args.join(' ')}: ${r.error.message}`);
  return { status: r.status, stdout: r.stdout, stderr: r.stderr };
}

function ipv4(ip: string): number {
  return ip.split('.').reduce((n, o) => (n * 256) + Number(o), 0);
}

/** Whether two IPv4 CIDRs overlap. */
export function cidrsOverlap(a: string, b: string): boolean {
  const range = (c: string): [number, number] => {
    const [ip = '0.0.0.0', len = '32'] = c.split('/');
    const size = 2 ** (32 - Number(len));
    const start = Math.floor(ipv4(ip) / size) * size;
    return [start, start + size - 1];
  };
  const [x0, x1] = range(a);
  const [y0, y1] = range(b);
  return x0 <= y1 && y0 <= x1;
}

/** The IPv4 destinations this host routes (/proc/net/route), default route excluded. */
export function routedCidrs(text = readFileSync('/proc/net/route', 'utf8')): string[] {
  const le = (hex: string): string => [6, 4, 2, 0].map((i) => parseInt(hex.slice(i, i + 2), 16)).join('.');
  return text.split('\n').slice(1).map((l) => l.trim().split(/\s+/)).filter((f) => f.length >= 8 && f[1] !== '00000000')
    .map((f) => `${le(f[1] ?? '')}/${le(f[7] ?? '').split('.').reduce((n, o) => n + [...Number(o).toString(2)].filter((b) => b === '1').length, 0)}`);
}

/**
 * A /24 in 10.91.0.0/16 that no route of this host covers, starting at a random one: podman picks
 * the lowest free subnet of its pools (10.89.0.0/24 first) by the networks it knows, and a run's
 * networks live in the run's own CNI directory, so two runs at once must not both take the first.
 */
export function freeSubnet(random = Math.random): string {
  const used = routedCidrs();
  const start = Math.floor(random() * 256);
  for (let i = 0; i < 256; i++) {
    const candidate = `10.91.${(start + i) % 256}.0/24`;
    if (!used.some((u) => cidrsOverlap(candidate, u))) return candidate;
  }
  throw new Error(`no free /24 in 10.91.0.0/16 (routed: ${used.join(', ')})`);
}

/** The bridge interface of network `name`: its own name, so no other network's can be the same. */
export function bridgeName(name: string): string {
  return `ep-${createHash('sha256').update(name).digest('hex').slice(0, 10)}`;
}

/**
 * Creates the podman network when missing (on `subnet`, else one podman picks) and returns its
 * IPv4 gateway. Its bridge interface gets a name of its own (bridgeName): podman 4.3 names a new
 * bridge cni-podman<N>, the first N that neither the networks in its configuration directory nor
 * the host's live interfaces use, so two runs with configuration directories of their own that
 * create networks before either has a pod attached would share cni-podman0, and removing one
 * network would take the other's bridge down. podman 4.3 has no --interface-name: the bridge
 * name is set in the network's CNI file (`configDir`/<name>.conflist) before any pod uses it.
 */
export function ensureNetwork(name: string, env: NodeJS.ProcessEnv, configDir: string, subnet?: string): string {
  if (podmanSync(['network', 'exists', name], env).status !== 0) {
    const r = podmanSync(['network', 'create', ...(subnet === undefined ? [] : ['--subnet', subnet]), name], env);
    if (r.status !== 0) throw new Error(`podman network create ${name} failed: ${r.stderr}`);
    const file = join(configDir, `${name}.conflist`);
    const conf = JSON.parse(readFileSync(file, 'utf8')) as { plugins: { type: string; bridge?: string }[] };
    const bridge = conf.plugins.find((p) => p.type === 'bridge');
    if (bridge === undefined) throw new Error(`${file}: no bridge plugin`);
    bridge.bridge = bridgeName(name);
    writeFileSync(file, `${JSON.stringify(conf, null, 2)}\n`);
  }
  const r = podmanSync(['network', 'inspect', name, '--format', '{{.NetworkInterface}} {{range .Subnets}}{{.Gateway}} {{end}}'], env);
  const [iface, ...gateways] = r.stdout.trim().split(/\s+/);
  const gateway = gateways.find((l) => /^\d+\.\d+\.\d+\.\d+$/.test(l));
  if (r.status !== 0 || gateway === undefined) throw new Error(`podman network inspect ${name}: no IPv4 gateway (${r.stderr}${r.stdout})`);
  if (iface !== bridgeName(name)) throw new Error(`podman network ${name}: bridge ${iface}, not ${bridgeName(name)}`);
  return gateway;
}

// ─── The kubelet's secret volume layout ───────────────────────────────────────────────────

function kubeletStamp(): string {
  const d = new Date();
  const p = (n: number): string => String(n).padStart(2, '0');
  return `..${d.getUTCFullYear()}_${p(d.getUTCMonth() + 1)}_${p(d.getUTCDate())}_${p(d.getUTCHours())}_${p(d.getUTCMinutes())}_${p(d.getUTCSeconds())}.${randomBytes(4).readUInt32BE(0)}`;
}

function present(path: string): boolean {
  return lstatSync(path, { throwIfNoEntry: false }) !== undefined;
}

/**
 * Publishes `files` into `dir` as the kubelet's AtomicWriter does for a secret volume, and with
 * the ownership its fsGroup handling gives them: the files in a new ..<timestamp> directory (0440,
 * group `gid`), ..data_tmp → that directory renamed over ..data (one atomic swap that a watcher
 * of `dir` sees, e.g. Envoy's SDS watched_directory), <file> → ..data/<file> links, the previous
 * ..<timestamp> directory removed.
 */
export function publishKubeletDir(dir: string, files: Readonly<Record<string, string | Buffer>>, gid: number): void {
  mkdirSync(dir, { recursive: true });
  const stamp = kubeletStamp();
  const target = join(dir, stamp);
  mkdirSync(target);
  for (const [name, content] of Object.entries(files)) {
    if (name.includes('/') || name.startsWith('..')) throw new Error(`not a secret file name: ${name}`);
    const p = join(target, name);
    writeFileSync(p, content, { mode: 0o600 });
    chownSync(p, process.getuid?.() ?? 0, gid);
    chmodSync(p, 0o440);
  }
  for (const d of [dir, target]) {
    chownSync(d, process.getuid?.() ?? 0, gid);
    chmodSync(d, 0o2755);
  }
  const tmp = join(dir, '..data_tmp');
  rmSync(tmp, { force: true });
  symlinkSync(stamp, tmp);
  const old = present(join(dir, '..data')) ? readlinkSync(join(dir, '..data')) : undefined;
  renameSync(tmp, join(dir, '..data'));
  for (const name of Object.keys(files)) {
    if (!present(join(dir, name))) symlinkSync(join('..data', name), join(dir, name));
  }
  if (old !== undefined && old !== stamp) rmSync(join(dir, old), { recursive: true, force: true });
}

// ─── The manifests ────────────────────────────────────────────────────────────────────────

export interface Container {
  name: string;
  image: string;
  args?: string[];
  command?: string[];
  ports?: { name?: string; containerPort: number; hostPort?: number; hostIP?: string }[];
  envFrom?: { configMapRef?: { name: string } }[];
  volumeMounts?: { name: string; mountPath: string; readOnly?: boolean }[];
  readinessProbe?: Record<string, unknown>;
  livenessProbe?: Record<string, unknown>;
  securityContext?: Record<string, unknown>;
}
export interface Volume {
  name: string;
  secret?: { secretName: string; defaultMode?: number; items?: { key: string; path: string }[] };
  configMap?: { name: string };
  persistentVolumeClaim?: { claimName: string; readOnly?: boolean };
  hostPath?: { path: string; type?: string };
  emptyDir?: Record<string, unknown>;
}
export interface PodSpec {
  containers: Container[];
  volumes?: Volume[];
  securityContext?: { runAsUser?: number; runAsGroup?: number; fsGroup?: number; runAsNonRoot?: boolean };
  terminationGracePeriodSeconds?: number;
  hostAliases?: { ip: string; hostnames: string[] }[];
  restartPolicy?: string;
}
export interface Workload extends Resource {
  spec: { replicas?: number; template: { metadata?: Record<string, unknown>; spec: PodSpec } };
}
export interface CronJob extends Resource {
  spec: { jobTemplate: { spec: { template: { metadata?: { labels?: Record<string, string> }; spec: PodSpec } } } };
}

/** The one resource of `kind` (and `name`, when given) in a rendered stream. */
export function findResource<T extends Resource>(docs: readonly Resource[], kind: string, name?: string): T {
  const found = docs.filter((d) => d.kind === kind && (name === undefined || d.metadata.name === name));
  if (found.length !== 1) throw new Error(`${found.length} ${kind} resources${name === undefined ? '' : ` named ${name}`} in the rendered manifests`);
  return found[0] as T;
}

/** `registry/name:tag` → kustomize's image name and tag (a digest is not split off). */
export function splitImage(ref: string): { name: string; tag: string | undefined } {
  const slash = ref.lastIndexOf('/');
  const colon = ref.lastIndexOf(':');
  return colon > slash ? { name: ref.slice(0, colon), tag: ref.slice(colon + 1) } : { name: ref, tag: undefined };
}

export interface OverlayInput {
  /** Suffix of every name (kustomize nameSuffix `-<name>`). */
  readonly name: string;
  /** Image references in podman's store. */
  readonly envoyImage: string;
  readonly serviceImage: string;
  /** The podman network's gateway: where the pod reaches Redis and the order backend. */
  readonly gateway: string;
  readonly redisPort: number;
  /** Host port (bound on 127.0.0.1) per containerPort name (OPTIONAL_PORTS may be left out: not published). */
  readonly publish: Readonly<Record<string, number>>;
  /** secretName → host directory in the kubelet layout. */
  readonly secretDirs: Readonly<Record<string, string>>;
  /** BLOCKED_COUNTRIES for the TS service; production's (none) when undefined. */
  readonly blockedCountries?: string;
}

/** The production overlay as `kubectl kustomize` renders it. */
export function productionDocs(): Resource[] {
  return yamlDocs(kustomize(PRODUCTION_OVERLAY));
}

/** The Deployment's secret volumes: name, Secret, and the file names it puts in the directory. */
export function secretVolumes(deployment: Workload): { volume: string; secretName: string; files: string[] }[] {
  return (deployment.spec.template.spec.volumes ?? []).filter((v) => v.secret !== undefined).map((v) => {
    const secretName = v.secret?.secretName ?? '';
    const known = Object.values(SECRETS).find((s) => s.name === secretName);
    if (known === undefined) throw new Error(`volume ${v.name}: Secret ${secretName} is not one deploy/k8s/render.ts SECRETS lists`);
    return { volume: v.name, secretName, files: v.secret?.items?.map((i) => i.path) ?? [...known.keys] };
  });
}

/** kustomization.yaml of the overlay in `overlayDir` (OVERLAY_CHANGES, nothing else). */
export function overlayKustomization(overlayDir: string, input: OverlayInput, production: readonly Resource[] = productionDocs()): string {
  const deployment = findResource<Workload>(production, 'Deployment');
  const containers = deployment.spec.template.spec.containers;
  const image = (name: string): string => {
    const c = containers.find((x) => x.name === name);
    if (c === undefined) throw new Error(`the Deployment has no container ${name}`);
    return splitImage(c.image).name;
  };
  const settingsName = containers.flatMap((c) => c.envFrom ?? []).map((e) => e.configMapRef?.name).find((n) => n !== undefined);
  if (settingsName === undefined) throw new Error('the Deployment\'s containers take no ConfigMap through envFrom');
  const settings = findResource(production, 'ConfigMap', settingsName) as Resource & { data: Record<string, string> };
  const backendUrl = settings.data['ORDER_BACKEND_URL'];
  if (backendUrl === undefined) throw new Error(`${settingsName} has no ORDER_BACKEND_URL`);
  const newImage = (ref: string): Record<string, string> => {
    const s = splitImage(ref);
    return { newName: s.name, ...(s.tag === undefined ? {} : { newTag: s.tag }) };
  };
  // A port in OPTIONAL_PORTS without a host port is left out of the pod spec, so podman publishes
  // nothing for it (the container still listens on it inside the pod).
  const ports = (c: Container): Record<string, unknown>[] => (c.ports ?? [])
    .filter((p) => !(OPTIONAL_PORTS.includes(p.name ?? '') && input.publish[p.name ?? ''] === undefined)).map((p) => {
    const hostPort = input.publish[p.name ?? ''];
    if (hostPort === undefined) throw new Error(`no host port given for containerPort ${p.name ?? p.containerPort} of ${c.name}`);
    return { containerPort: p.containerPort, hostIP: '127.0.0.1', hostPort };
  });
  const kustomization = {
    apiVersion: 'kustomize.config.k8s.io/v1beta1',
    kind: 'Kustomization',
    resources: [relative(overlayDir, PRODUCTION_OVERLAY)],
    nameSuffix: `-${input.name}`,
    images: [
      { name: image('authz'), ...newImage(input.serviceImage) },
      { name: image('envoy'), ...newImage(input.envoyImage) },
    ],
    patches: [
      {
        patch: YAML.stringify({
          apiVersion: 'v1', kind: 'ConfigMap', metadata: { name: settingsName },
          data: { REDIS_URL: `redis://${input.gateway}:${input.redisPort}/0`, ...(input.blockedCountries === undefined ? {} : { BLOCKED_COUNTRIES: input.blockedCountries }) },
        }),
      },
      {
        patch: YAML.stringify({
          apiVersion: 'apps/v1', kind: 'Deployment', metadata: { name: deployment.metadata.name },
          spec: {
            replicas: 1,
            template: {
              spec: {
                hostAliases: [{ ip: input.gateway, hostnames: [new URL(backendUrl).hostname] }],
                containers: containers.map((c) => ({ name: c.name, ports: ports(c) })),
                volumes: secretVolumes(deployment).map((v) => {
                  const path = input.secretDirs[v.secretName];
                  if (path === undefined) throw new Error(`no directory for Secret ${v.secretName}`);
                  return { name: v.volume, secret: null, hostPath: { path, type: 'Directory' } };
                }),
              },
            },
          },
        }),
      },
    ],
  };
  return `# Generated by deploy/podman/setup.ts: the production overlay as a podman pod (what changes and why: OVERLAY_CHANGES there).\n${YAML.stringify(kustomization, { lineWidth: 0 })}`;
}

export interface SplitManifests {
  /** The PersistentVolumeClaims (played first). */
  readonly pvc: string;
  /** Everything else. */
  readonly edge: string;
  /** The CronJob's job pod as a Pod named `<cronjob>-run`. */
  readonly geoipUpdate: string;
  readonly geoipUpdatePodName: string;
}

const stringify = (docs: readonly unknown[]): string => docs.map((d) => YAML.stringify(d, { lineWidth: 0, blockQuote: 'literal' })).join('---\n');

/** The rendered stream split for podman (see the header). */
export function splitForPodman(rendered: string): SplitManifests {
  const docs = yamlDocs(rendered);
  const cronJob = findResource<CronJob>(docs, 'CronJob');
  const template = cronJob.spec.jobTemplate.spec.template;
  const geoipUpdatePodName = `${cronJob.metadata.name}-run`;
  const pod = { apiVersion: 'v1', kind: 'Pod', metadata: { name: geoipUpdatePodName, labels: { ...template.metadata?.labels } }, spec: template.spec };
  return {
    pvc: stringify(docs.filter((d) => d.kind === 'PersistentVolumeClaim')),
    edge: stringify(docs.filter((d) => d.kind !== 'PersistentVolumeClaim')),
    geoipUpdate: stringify([pod]),
    geoipUpdatePodName,
  };
}

// ─── Everything in one directory ──────────────────────────────────────────────────────────

export const FILES = {
  conf: 'containers.conf',
  secrets: 'secrets',
  pki: 'pki',
  feedPrivateKey: 'feed_private_key',
  overlay: 'overlay',
  rendered: 'rendered.yaml',
  pvc: 'pvc.yaml',
  edge: 'edge.yaml',
  geoipUpdate: 'geoip-update.yaml',
  env: 'pod.env',
} as const;

export interface SetupOptions {
  readonly out: string;
  readonly name: string;
  readonly envoyImage: string;
  readonly serviceImage: string;
  readonly redisPort: number;
  /** The port of the Redis replica on the host's loopback (pod.env only; default redisPort + 1). */
  readonly redisReplicaPort?: number;
  readonly publish: Readonly<Record<string, number>>;
  readonly blockedCountries?: string;
  /** The network's subnet (default: podman picks one; see freeSubnet). */
  readonly subnet?: string;
  /** Limits for containers.conf (default: this process's hard limits). */
  readonly limits?: HardLimits;
}

export interface PodSetup {
  readonly dir: string;
  /** CONTAINERS_CONF. */
  readonly conf: string;
  readonly env: NodeJS.ProcessEnv;
  readonly network: string;
  readonly gateway: string;
  /** The rendered resources (after the overlay). */
  readonly docs: Resource[];
  /** Pod podman creates for the Deployment (`<deployment>-pod-0`), and its containers `<pod>-<container>`. */
  readonly pod: string;
  readonly pvcs: string[];
  readonly geoipUpdatePod: string;
  readonly secretDirs: Readonly<Record<string, string>>;
  /** The ingest HMAC key file's content and the feed private key (hex seed), for a signing client. */
  readonly ingestHmac: string;
  readonly feedPrivateKeyHex: string;
  /** The admin token (Secret edge-admin): POST /admin/seal. */
  readonly adminToken: string;
  /** The client CA (its key) and the directory the pod's client certificate is published in. */
  readonly pkiDir: string;
  /** The CA of the client port's server certificate (the production overlay serves TLS there). */
  readonly edgeCaFile: string;
  readonly clientCertDir: string;
  readonly backendHost: string;
  readonly files: { readonly [K in keyof typeof FILES]: string };
}

/** The fsGroup of the Deployment's pod (the group the kubelet gives secret files). */
export function fsGroup(deployment: Workload): number {
  const g = deployment.spec.template.spec.securityContext?.fsGroup;
  if (g === undefined) throw new Error('the Deployment sets no fsGroup');
  return g;
}

function writeSecrets(dir: string, deployment: Workload, backendSan: string): { secretDirs: Record<string, string>; ingestHmac: string; feedPrivateKeyHex: string; adminToken: string } {
  const gid = fsGroup(deployment);
  const pkiDir = join(dir, FILES.pki);
  const pki = generateDevPki(pkiDir, backendSan);
  const { privateKey, publicKey } = generateKeyPairSync('ed25519');
  const hex = (b64url: string | undefined): string => Buffer.from(b64url ?? '', 'base64url').toString('hex');
  const ingestHmac = `hex:${randomBytes(32).toString('hex')}`;
  const adminToken = randomBytes(32).toString('hex');
  const feedPrivateKeyHex = hex(privateKey.export({ format: 'jwk' }).d);
  // The client port's server certificate (production: EDGE_TLS_*), for localhost and 127.0.0.1.
  const server = ensureEdgeServerCert(pkiDir);
  writeFileSync(join(dir, FILES.feedPrivateKey), `${feedPrivateKeyHex}\n`, { mode: 0o600 });
  const content: Record<string, Record<string, string | Buffer>> = {
    [SECRETS.ingest.name]: { 'ingest-hmac': `${ingestHmac}\n`, 'ingest-hmac-previous': '', 'feed-public-keys': `${hex(publicKey.export({ format: 'jwk' }).x)}\n` },
    [SECRETS.clientCert.name]: { 'tls.crt': readFileSync(join(pkiDir, 'client-1.crt')), 'tls.key': readFileSync(join(pkiDir, 'client-1.key')) },
    [SECRETS.backendCa.name]: { 'ca.crt': readFileSync(pki.backendCaFile) },
    [SECRETS.serverCert.name]: { 'tls.crt': readFileSync(server.certFile), 'tls.key': readFileSync(server.keyFile) },
    [SECRETS.admin.name]: { 'admin-token': `${adminToken}\n` },
  };
  const secretDirs: Record<string, string> = {};
  for (const v of secretVolumes(deployment)) {
    const all = content[v.secretName] ?? {};
    const files: Record<string, string | Buffer> = {};
    for (const f of v.files) {
      const c = all[f];
      if (c === undefined) throw new Error(`Secret ${v.secretName}: no generated content for ${f}`);
      files[f] = c;
    }
    const d = join(dir, FILES.secrets, v.secretName);
    publishKubeletDir(d, files, gid);
    secretDirs[v.secretName] = d;
  }
  return { secretDirs, ingestHmac, feedPrivateKeyHex, adminToken };
}

/**
 * Everything for one pod in `opts.out` (see the header): containers.conf, the network, secrets,
 * PKI, the overlay and the rendered, split manifests. Creates the podman network; starts nothing.
 */
export function setupPod(opts: SetupOptions): PodSetup {
  const dir = resolve(opts.out);
  mkdirSync(dir, { recursive: true, mode: 0o700 });
  const files = Object.fromEntries(Object.entries(FILES).map(([k, v]) => [k, join(dir, v)])) as { [K in keyof typeof FILES]: string };
  const conf = writeContainersConf(dir, opts.limits);
  const env = podmanEnv(conf);
  const network = `edge-${opts.name}`;
  const gateway = ensureNetwork(network, env, join(dir, 'cni'), opts.subnet);

  const production = productionDocs();
  const prodDeployment = findResource<Workload>(production, 'Deployment');
  const prodSettings = production.find((d) => d.kind === 'ConfigMap' && typeof (d as { data?: Record<string, string> }).data?.['ORDER_BACKEND_URL'] === 'string') as (Resource & { data: Record<string, string> }) | undefined;
  const backendUrl = prodSettings?.data['ORDER_BACKEND_URL'];
  if (backendUrl === undefined) throw new Error('no ConfigMap with ORDER_BACKEND_URL in the production overlay');
  const backendHost = new URL(backendUrl).hostname;
  const secrets = writeSecrets(dir, prodDeployment, prodSettings?.data['ORDER_BACKEND_SAN'] ?? backendHost);

  mkdirSync(files.overlay, { recursive: true });
  writeFileSync(join(files.overlay, 'kustomization.yaml'), overlayKustomization(files.overlay, {
    name: opts.name, envoyImage: opts.envoyImage, serviceImage: opts.serviceImage, gateway, redisPort: opts.redisPort,
    publish: opts.publish, secretDirs: secrets.secretDirs, ...(opts.blockedCountries === undefined ? {} : { blockedCountries: opts.blockedCountries }),
  }, production));
  const rendered = kustomize(files.overlay);
  writeFileSync(files.rendered, rendered);
  const split = splitForPodman(rendered);
  writeFileSync(files.pvc, split.pvc);
  writeFileSync(files.edge, split.edge);
  writeFileSync(files.geoipUpdate, split.geoipUpdate);
  const docs = yamlDocs(rendered);
  const deployment = findResource<Workload>(docs, 'Deployment');
  const pod = `${deployment.metadata.name}-pod-0`;
  const cronJob = findResource<CronJob>(docs, 'CronJob');
  const updateContainer = `${split.geoipUpdatePodName}-${cronJob.spec.jobTemplate.spec.template.spec.containers[0]?.name ?? ''}`;
  // The named volumes podman makes: one per claim, one per ConfigMap the pod mounts as a volume.
  const volumes = [...docs.filter((d) => d.kind === 'PersistentVolumeClaim').map((d) => d.metadata.name),
    ...(deployment.spec.template.spec.volumes ?? []).flatMap((v) => (v.configMap === undefined ? [] : [v.configMap.name]))];
  writeFileSync(files.env, [
    `# written by deploy/podman/setup.ts: source it (. ${files.env})`,
    `export CONTAINERS_CONF=${conf}`,
    `POD_NETWORK=${network}`,
    `POD_GATEWAY=${gateway}`,
    `POD_NAME=${pod}`,
    `POD_REDIS_PORT=${opts.redisPort}`,
    `POD_REDIS_REPLICA_PORT=${opts.redisReplicaPort ?? opts.redisPort + 1}`,
    // The production overlay serves TLS on the client port: its certificate names 127.0.0.1.
    `POD_EDGE_URL=https://127.0.0.1:${opts.publish['http'] ?? ''}`,
    `POD_EDGE_CA=${join(files.pki, 'edge-ca.crt')}`,
    `POD_INGEST_URL=http://127.0.0.1:${opts.publish['ingest'] ?? ''}`,
    `POD_GRPC_ADDRESS=127.0.0.1:${opts.publish['grpc'] ?? ''}`,
    `POD_METRICS_URL=http://127.0.0.1:${opts.publish['metrics'] ?? ''}`,
    `POD_BACKEND_HOST=${backendHost}`,
    `POD_GEOIP_UPDATE_POD=${split.geoipUpdatePodName}`,
    `POD_GEOIP_UPDATE_CONTAINER=${updateContainer}`,
    `POD_VOLUMES="${volumes.join(' ')}"`,
    '',
  ].join('\n'));
  return {
    dir, conf, env, network, gateway, docs, pod,
    pvcs: docs.filter((d) => d.kind === 'PersistentVolumeClaim').map((d) => d.metadata.name),
    geoipUpdatePod: split.geoipUpdatePodName,
    secretDirs: secrets.secretDirs,
    ingestHmac: secrets.ingestHmac,
    feedPrivateKeyHex: secrets.feedPrivateKeyHex,
    adminToken: secrets.adminToken,
    pkiDir: join(dir, FILES.pki),
    edgeCaFile: join(dir, FILES.pki, 'edge-ca.crt'),
    clientCertDir: secrets.secretDirs[SECRETS.clientCert.name] ?? '',
    backendHost,
    files,
  };
}

/**
 * Issues a new client certificate from the client CA in <out>/pki and publishes it into the
 * client certificate's secret directory the way the kubelet updates a secret volume; returns its
 * subject CN. The running Envoy loads it for new backend connections (SDS watched_directory).
 */
export function rotateClientCert(out: string): string {
  const dir = resolve(out);
  const pkiDir = join(dir, FILES.pki);
  const clientDir = join(dir, FILES.secrets, SECRETS.clientCert.name);
  const name = `client-${Date.now()}`;
  const cn = `edge-client-${Date.now().toString(36)}`;
  issue(pkiDir, 'client-ca', name, cn, 'DNS:edge.internal', 'clientAuth');
  const gid = lstatSync(clientDir).gid;
  publishKubeletDir(clientDir, { 'tls.crt': readFileSync(join(pkiDir, `${name}.crt`)), 'tls.key': readFileSync(join(pkiDir, `${name}.key`)) }, gid);
  return cn;
}

if (import.meta.main) {
  const { values } = parseArgs({
    options: {
      out: { type: 'string' }, name: { type: 'string', default: 'local' },
      'envoy-image': { type: 'string', default: 'docker.io/local/envoy:v1.40.0' },
      'service-image': { type: 'string', default: 'docker.io/library/edge-trading-proxy:1.0.0' },
      'redis-port': { type: 'string', default: '16390' },
      'redis-replica-port': { type: 'string' },
      publish: { type: 'string', default: '18080,19191,19464,18082' },
      'rotate-client-cert': { type: 'boolean' },
      'conf-only': { type: 'boolean' },
    },
  });
  if (values.out === undefined) {
    process.stderr.write('usage: setup.ts --out <dir> [--name n] [--envoy-image ref] [--service-image ref] [--redis-port p] [--redis-replica-port p] [--publish http,grpc,metrics,ingest[,envoy-stats]] | --out <dir> --rotate-client-cert | --out <dir> --conf-only\n');
    process.exit(2);
  }
  if (values['conf-only'] === true) {
    mkdirSync(values.out, { recursive: true });
    process.stdout.write(`${writeContainersConf(resolve(values.out))}\n`);
    process.exit(0);
  }
  if (process.getuid?.() !== 0) {
    process.stderr.write('setup.ts: run it as root: the pod runs under rootful podman, and the secret files are given to the pod\'s fsGroup as a kubelet does\n');
    process.exit(1);
  }
  if (values['rotate-client-cert'] === true) {
    process.stdout.write(`setup: published a new client certificate (CN ${rotateClientCert(values.out)}) into ${join(resolve(values.out), FILES.secrets, SECRETS.clientCert.name)}\n`);
  } else {
    const [http, grpc, metrics, ingest, stats] = values.publish.split(',').map(Number);
    const s = setupPod({
      out: values.out, name: values.name, envoyImage: values['envoy-image'], serviceImage: values['service-image'],
      redisPort: Number(values['redis-port']), ...(values['redis-replica-port'] === undefined ? {} : { redisReplicaPort: Number(values['redis-replica-port']) }), publish: { http: http ?? 18080, grpc: grpc ?? 19191, metrics: metrics ?? 19464, ingest: ingest ?? 18082, ...(stats === undefined ? {} : { 'envoy-stats': stats }) },
    });
    process.stdout.write(`setup: wrote ${s.dir} (${Object.values(FILES).join(', ')}); network ${s.network}, gateway ${s.gateway}; the pod will be ${s.pod}\n`);
  }
}
