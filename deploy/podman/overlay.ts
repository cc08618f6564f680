/**
 * The production overlay made a podman pod: the kustomize overlay on it (OVERLAY_CHANGES, nothing
 * else), the resource types read from its render, and the render split for `podman kube play`.
 */
import { join, relative } from 'node:path';
import YAML from 'yaml';
import { SECRETS } from '../k8s/render.ts';
import { ROOT } from '../paths.ts';
import { kustomize, yamlDocs, type Resource } from '../lib/tools.ts';

export const PRODUCTION_OVERLAY = join(ROOT, 'deploy/k8s/overlays/production');

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
