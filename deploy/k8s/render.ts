/**
 * Renders the generated parts of the Kubernetes manifests from ONE settings object per
 * environment, so Envoy's config and the TS service's environment cannot drift apart:
 *
 *   base/generated.yaml                      ConfigMaps edge-settings (both containers' environment,
 *                                            envFrom) and edge-envoy (envoy.yaml + SDS file, rendered
 *                                            by envoy/render.ts from the same settings)
 *   base/generated-rollout.yaml              a Deployment patch: the pod template annotation
 *                                            edge.trading/config-sha256, so a settings change rolls the pods
 *   overlays/production/generated.yaml       the same three, rendered from the production settings
 *                                            (a strategic-merge patch replacing the base's)
 *   overlays/production/generated-networkpolicy.yaml
 *                                            a JSON patch of the NetworkPolicy: Envoy's port admitted
 *                                            only from PRODUCTION_EDGE_SOURCES (the load balancer)
 *
 *   scripts/node deploy/k8s/render.ts           # (npm run render:k8s) rewrite the files
 *   scripts/node deploy/k8s/render.ts --check   # exit 1 if a committed file is stale
 *
 * Change a setting HERE (K8S_ENV / PRODUCTION_ENV), never in the generated files or by patching
 * edge-settings in an overlay: the Envoy config would not follow.
 */
import { createHash } from 'node:crypto';
import { readFileSync, writeFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import YAML from 'yaml';
import { loadConfig } from '../../authz/src/common/config.ts';
import { renderEnvoy, requiredEnvoyMemoryLimitMb, SERVER_SDS_FILE } from '../../envoy/render.ts';

/** Where the Deployment mounts things (base/deployment.yaml). */
export const MOUNTS = {
  envoyConfig: '/etc/envoy',
  clientCert: '/etc/edge/client',
  /** The client port's server certificate (Secret edge-server-cert; production overlay), in the envoy container only. */
  serverCert: '/etc/edge/server',
  backendCa: '/etc/edge/backend-ca',
  secrets: '/etc/edge/secrets',
  /** The admin token (Secret edge-admin), in the authz container only. */
  admin: '/etc/edge/admin',
  /** The seal volume (an emptyDir: it lives as long as the pod, across container restarts). */
  seal: '/var/lib/edge',
  geoip: '/var/lib/geoip',
  /** The Unix sockets between Envoy and the TS service (an emptyDir in memory, mounted in both containers). */
  sockets: '/run/edge',
} as const;

/**
 * The Secrets the pod mounts, created out of band (never committed; docs/deploy.md), and the
 * keys each must hold.
 */
export const SECRETS = {
  ingest: { name: 'edge-ingest', keys: ['ingest-hmac', 'ingest-hmac-previous', 'feed-public-keys'] },
  clientCert: { name: 'edge-client-cert', keys: ['tls.crt', 'tls.key'] },
  /** The client port's server certificate (kubernetes.io/tls; mounted by the production overlay: EDGE_TLS_*). */
  serverCert: { name: 'edge-server-cert', keys: ['tls.crt', 'tls.key'] },
  backendCa: { name: 'edge-backend-ca', keys: ['ca.crt'] },
  /** The admin token: POST /admin/seal needs it (docs/operations.md "Seal and unseal"). */
  admin: { name: 'edge-admin', keys: ['admin-token'] },
} as const;

/**
 * Pod shutdown, in order (base/deployment.yaml; a test checks the manifests agree):
 * 1. both preStop hooks start; endpoints are being removed from Services and load balancers;
 * 2. Envoy keeps serving for `endpointPropagationSecs`, then drains its listeners (connections
 *    told to close: HTTP/1 `connection: close`, HTTP/2 GOAWAY) for `envoyDrainSecs`, then gets
 *    SIGTERM and exits;
 * 3. the TS service keeps deciding until `authzPreStopSecs` (after Envoy is gone), then gets
 *    SIGTERM: it seals (credentials zeroed) and exits after SHUTDOWN_GRACE_MS;
 * 4. terminationGracePeriodSeconds covers all of it.
 */
export const SHUTDOWN = {
  endpointPropagationSecs: 5,
  envoyDrainSecs: 5,
  authzPreStopSecs: 12,
  terminationGracePeriodSeconds: 30,
} as const;

/** The base settings (non-secret). Secrets come from files: *_FILE under MOUNTS.secrets. */
export const K8S_ENV: Readonly<Record<string, string>> = {
  EDGE_PORT: '8080',
  // Ingest on Envoy's own `ingest` port (INGEST_PORT), which the NetworkPolicy admits from the feed
  // pipeline's pods only; the client port answers the ingest path 404 before reading a body
  // (docs/deploy.md "Ingest port"). Every address of the pod: the feed pipeline is another pod.
  INGEST_PORT: '8082',
  INGEST_BIND_ADDRESS: '0.0.0.0',
  // The envoy container's memory limit (base/deployment.yaml, 448Mi; a test checks they agree),
  // derived from Envoy's budget (envoy/render/budget.ts: every descriptor LRU full and every
  // connection open stay under the first memory action; docs/capacity.md): Envoy's overload
  // manager sheds load near it instead of being OOM-killed.
  ENVOY_MEMORY_LIMIT_MB: String(requiredEnvoyMemoryLimitMb()),
  AUTHZ_GRPC_PORT: '9191',
  AUTHZ_ADMIN_PORT: '9464',
  ENVOY_ADMIN_PORT: '9901',
  // Envoy's stats listener (envoy/render/stats.ts): GET /stats/prometheus only, forwarded to the
  // loopback admin; the NetworkPolicy admits it from Prometheus in the monitoring namespace only,
  // scraped by deploy/prometheus/scrape.yaml's job `edge-envoy` (container port `envoy-stats`).
  ENVOY_STATS_PORT: '9902',
  // Same pod: Envoy reaches the TS service over Unix domain sockets on the pod's `sockets` emptyDir
  // (measured faster than loopback TCP: docs/envoy.md "Unix domain sockets"). The market service
  // listens on its socket only (no TCP port at all: its ingest route trusts Envoy's HMAC and nonce
  // checks). The gRPC server also listens on AUTHZ_GRPC_PORT (set), on 0.0.0.0, for the kubelet's
  // gRPC probes, which cannot reach a socket. The NetworkPolicy admits only Envoy's port (and
  // metrics from the monitoring namespace), never the gRPC port, but it binds nothing from the
  // node itself, and not every CNI enforces it.
  AUTHZ_GRPC_SOCKET: `${MOUNTS.sockets}/authz.sock`,
  MARKET_SOCKET: `${MOUNTS.sockets}/market.sock`,
  AUTHZ_BIND_ADDRESS: '0.0.0.0',
  // Prometheus scrapes :9464/metrics; /admin/seal on that port answers loopback peers with the admin token only.
  ADMIN_BIND_ADDRESS: '0.0.0.0',
  // One trusted hop: the cloud L7 load balancer in front of the Service appends the client address.
  XFF_NUM_TRUSTED_HOPS: '1',
  RPS_PER_IP: '20',
  RATE_BURST: '40',
  // Sentinel: every replica follows the elected primary (docs/deploy.md "Redis").
  REDIS_URL: 'redis+sentinel://redis-sentinel-0.redis-sentinel:26379,redis-sentinel-1.redis-sentinel:26379,redis-sentinel-2.redis-sentinel:26379/edge',
  // Replication is asynchronous: a nonce or a record counts once a replica confirmed it, so a
  // failover cannot lose an acknowledged ingest (docs/operations.md "Failover"; Redis runs two replicas).
  REDIS_MIN_REPLICAS: '1',
  ORDER_BACKEND_URL: 'https://orders.exchange.internal:8443',
  ORDER_BACKEND_SAN: 'orders.exchange.internal',
  ORDER_BACKEND_CA_FILE: `${MOUNTS.backendCa}/ca.crt`,
  EDGE_CLIENT_CERT_FILE: `${MOUNTS.clientCert}/tls.crt`,
  EDGE_CLIENT_KEY_FILE: `${MOUNTS.clientCert}/tls.key`,
  ORDER_BACKEND_TIMEOUT_MS: '5000',
  ORDER_BACKEND_MAX_CONN_SECS: '300',
  GEOIP_DB: `${MOUNTS.geoip}/country.mmdb`,
  GEOIP_RELOAD_INTERVAL_MS: '10000',
  BLOCKED_COUNTRIES: '',
  // The close-only tier (docs/api.md "Jurisdiction tiers"): orders reach the backend marked close-only.
  CLOSE_ONLY_COUNTRIES: '',
  // Nothing is geo-trusted in the pod: no legitimate request reaches Envoy from loopback, and with
  // one trusted hop the address comes from X-Forwarded-For, where a client could write 127.0.0.1.
  GEO_TRUSTED_CIDRS: '',
  EDGE_INGEST_HMAC_FILE: `${MOUNTS.secrets}/ingest-hmac`,
  // Empty outside a key rotation (docs/operations.md).
  EDGE_INGEST_HMAC_PREVIOUS_FILE: `${MOUNTS.secrets}/ingest-hmac-previous`,
  EDGE_FEED_ED25519_PUBLIC_KEY_FILE: `${MOUNTS.secrets}/feed-public-keys`,
  // POST /admin/seal needs the token (the pod's other containers share its loopback, not the
  // Secret); a seal is kept on the seal volume: the restarted container comes back sealed until
  // the pod is deleted (docs/operations.md "Seal and unseal").
  AUTHZ_ADMIN_TOKEN_FILE: `${MOUNTS.admin}/admin-token`,
  AUTHZ_SEAL_FILE: `${MOUNTS.seal}/sealed`,
  AUTHZ_TIMEOUT_MS: '1000',
  SHUTDOWN_GRACE_MS: '10000',
  LOG_LEVEL: 'info',
};

/** The production overlay's settings: the base plus what differs there. */
export const PRODUCTION_ENV: Readonly<Record<string, string>> = {
  ...K8S_ENV,
  // Two worker processes per pod (the overlay gives the authz container 2 CPUs).
  AUTHZ_WORKERS: '2',
  // Envoy terminates TLS on its client port (TLS only there) with the Secret edge-server-cert
  // (overlays/production/deployment-patch.yaml mounts it; the kubelet's ..data swap of a renewed
  // Secret reaches Envoy's SDS watch, no restart). The L7 balancer in front re-encrypts to the pod
  // and still appends the client address (XFF_NUM_TRUSTED_HOPS 1); behind an L4 balancer set
  // EDGE_PROXY_PROTOCOL=required and XFF_NUM_TRUSTED_HOPS=0 instead (docs/deploy.md).
  EDGE_TLS_CERT_FILE: `${MOUNTS.serverCert}/tls.crt`,
  EDGE_TLS_KEY_FILE: `${MOUNTS.serverCert}/tls.key`,
};

/**
 * Who may reach Envoy's port in production: the load balancer in front of the Service, as
 * NetworkPolicyPeer objects (the NetworkPolicy's `from` of that port; docs/deploy.md
 * "NetworkPolicy"). The pod trusts one X-Forwarded-For hop, so any other source could write the
 * client address geo and the rate limit judge. Set it to your balancer: its proxy ranges
 * (`{ipBlock: {cidr: …}}`, e.g. 35.191.0.0/16 and 130.211.0.0/22 for Google's external Application
 * Load Balancer) or the ingress controller's pods (the default: ingress-nginx's, by its namespace
 * and pod labels), then `npm run render:k8s`.
 */
export const PRODUCTION_EDGE_SOURCES: readonly Record<string, unknown>[] = [
  {
    namespaceSelector: { matchLabels: { 'kubernetes.io/metadata.name': 'ingress-nginx' } },
    podSelector: { matchLabels: { 'app.kubernetes.io/name': 'ingress-nginx', 'app.kubernetes.io/component': 'controller' } },
  },
];

const DIR = new URL('./', import.meta.url);
export const GENERATED = {
  base: fileURLToPath(new URL('base/generated.yaml', DIR)),
  baseRollout: fileURLToPath(new URL('base/generated-rollout.yaml', DIR)),
  production: fileURLToPath(new URL('overlays/production/generated.yaml', DIR)),
  productionNetworkPolicy: fileURLToPath(new URL('overlays/production/generated-networkpolicy.yaml', DIR)),
} as const;

/**
 * The production NetworkPolicy patch (RFC 6902, applied by kustomize): a `from` for the ingress
 * rule of Envoy's port. The `test` op makes the build fail, rather than open another port to
 * those sources, should that rule no longer come first in base/networkpolicy.yaml.
 */
function edgeSourcesPatch(env: Readonly<Record<string, string>>): Record<string, unknown>[] {
  const { edgePort } = loadConfig(env);
  return [
    { op: 'test', path: '/spec/ingress/0/ports', value: [{ protocol: 'TCP', port: edgePort }] },
    { op: 'add', path: '/spec/ingress/0/from', value: PRODUCTION_EDGE_SOURCES },
  ];
}

/** The annotation whose change makes the Deployment roll when settings or Envoy's config change. */
export const CONFIG_HASH_ANNOTATION = 'edge.trading/config-sha256';

function configMaps(env: Readonly<Record<string, string>>): Record<string, unknown>[] {
  const config = loadConfig(env);
  const rendered = renderEnvoy(config, { sdsPath: `${MOUNTS.envoyConfig}/sds-client-cert.yaml`, nodeId: 'edge-envoy' });
  for (const w of rendered.warnings) throw new Error(`renderer warning for the Kubernetes settings: ${w}`);
  return [
    { apiVersion: 'v1', kind: 'ConfigMap', metadata: { name: 'edge-settings', labels: { app: 'edge' } }, data: { ...env } },
    {
      apiVersion: 'v1', kind: 'ConfigMap', metadata: { name: 'edge-envoy', labels: { app: 'edge' } },
      data: {
        'envoy.yaml': rendered.bootstrap, 'sds-client-cert.yaml': rendered.sds ?? '',
        // With EDGE_TLS_CERT_FILE in the settings: the server certificate's SDS file, beside the client one.
        ...(rendered.serverSds === undefined ? {} : { [SERVER_SDS_FILE]: rendered.serverSds }),
      },
    },
  ];
}

function rolloutPatch(maps: Record<string, unknown>[]): Record<string, unknown> {
  const hash = createHash('sha256').update(JSON.stringify(maps)).digest('hex');
  return {
    apiVersion: 'apps/v1', kind: 'Deployment', metadata: { name: 'edge' },
    spec: { template: { metadata: { annotations: { [CONFIG_HASH_ANNOTATION]: hash } } } },
  };
}

function yamlDocs(docs: Record<string, unknown>[], from: string): string {
  const head = `# GENERATED by deploy/k8s/render.ts from ${from} — do not edit; run: npm run render:k8s\n`;
  // Literal block scalars: envoy.yaml stays readable and round-trips byte for byte.
  return head + docs.map((d) => YAML.stringify(d, { blockQuote: 'literal', lineWidth: 0 })).join('---\n');
}

/** Every generated file's path and fresh content. */
export function renderManifests(): Record<string, string> {
  const base = configMaps(K8S_ENV);
  const production = configMaps(PRODUCTION_ENV);
  return {
    [GENERATED.base]: yamlDocs(base, 'K8S_ENV'),
    [GENERATED.baseRollout]: yamlDocs([rolloutPatch(base)], 'K8S_ENV'),
    [GENERATED.production]: yamlDocs([...production, rolloutPatch(production)], 'PRODUCTION_ENV'),
    [GENERATED.productionNetworkPolicy]: `# GENERATED by deploy/k8s/render.ts from PRODUCTION_EDGE_SOURCES — do not edit; run: npm run render:k8s\n${YAML.stringify(edgeSourcesPatch(PRODUCTION_ENV), { lineWidth: 0 })}`,
  };
}

if (import.meta.main) {
  const stale: string[] = [];
  for (const [path, text] of Object.entries(renderManifests())) {
    if (process.argv.includes('--check')) {
      if (readFileSync(path, 'utf8') !== text) stale.push(path);
    } else {
      writeFileSync(path, text);
      process.stdout.write(`wrote ${path}\n`);
    }
  }
  if (stale.length > 0) {
    process.stderr.write(`stale: ${stale.join(', ')}\nrun: npm run render:k8s\n`);
    process.exit(1);
  }
}
