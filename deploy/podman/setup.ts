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
 *
 * This file lays out that directory (FILES, the secrets, setupPod, rotateClientCert) and is the
 * CLI; its parts: host.ts (hard limits, containers.conf, one podman call), network.ts (the
 * network and its subnet), kubelet-secrets.ts (the kubelet's secret volume layout), overlay.ts
 * (the overlay on the production overlay and the render split for podman). It uses no test helper:
 * kubectl kustomize comes from deploy/lib/tools.ts.
 */
import { generateKeyPairSync, randomBytes } from 'node:crypto';
import { lstatSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { parseArgs } from 'node:util';
import { generateDevPki, issue } from '../../scripts/dev/certs.ts';
import { ensureEdgeServerCert } from '../../scripts/dev/edge-server-cert.ts';
import { SECRETS } from '../k8s/render.ts';
import { kustomize, yamlDocs, type Resource } from '../lib/tools.ts';
import { podmanEnv, writeContainersConf, type HardLimits } from './host.ts';
import { ensureNetwork } from './network.ts';
import { publishKubeletDir } from './kubelet-secrets.ts';
import { findResource, overlayKustomization, productionDocs, secretVolumes, splitForPodman, type CronJob, type Workload } from './overlay.ts';

// The pod setup's parts, re-exported for its users (e2e/pod.test.ts, e2e/lib/pod.ts).
export { CONF_TEMPLATE, containersConf, hardLimits, PODMAN_NPROC_CAP, podmanEnv, writeContainersConf, type HardLimits } from './host.ts';
export { bridgeName, cidrsOverlap, ensureNetwork, freeSubnet, routedCidrs } from './network.ts';
export { publishKubeletDir } from './kubelet-secrets.ts';
export {
  findResource, OVERLAY_CHANGES, overlayKustomization, PRODUCTION_OVERLAY, productionDocs, secretVolumes, splitForPodman, splitImage,
  type Container, type CronJob, type OverlayInput, type PodSpec, type SplitManifests, type Volume, type Workload,
} from './overlay.ts';

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
