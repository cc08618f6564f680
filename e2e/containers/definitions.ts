/**
 * The e2e stack as container definitions: pure data built by one function, so the wiring
 * (images, user, env, ports, mounts, network aliases, readiness) is unit-tested without an
 * engine (definitions.test.ts) and e2e/containers/stack.ts only executes it.
 *
 * Same topology and settings style as deploy/docker-compose.yml: Envoy, the service image built
 * from deploy/Dockerfile reading its secrets from 0400 files (*_FILE), Redis with AOF. The demo
 * order backend runs in the test process on the host (reached from the containers as HOST_ALIAS,
 * the network's gateway), so scenarios can read what it received exactly as with the local driver.
 */
import { basename, dirname } from 'node:path';
import { IMAGES } from '../lib/images.ts';

/** The built service image (this project's own name; never an official one). */
export const SERVICE_IMAGE = 'edge-trading-proxy:e2e';
/** The order backend on the host, as the containers resolve it (an extra hosts entry). */
export const HOST_ALIAS = 'order-backend.host.internal';

/** Which images to run; the defaults are the official pinned ones deploy/ names. */
export interface ContainerImages {
  readonly envoy: string;
  readonly redis: string;
}

export const DEFAULT_IMAGES: ContainerImages = { envoy: IMAGES.envoy.official, redis: IMAGES.redis.official };

export const PORTS = { edge: 8080, grpc: 9191, market: 8081, admin: 9464, envoyAdmin: 9901, redis: 6379 } as const;

/** Where the containers see the files the driver generates. */
export const PATHS = {
  envoyConfig: '/etc/envoy',
  pki: '/etc/edge/pki',
  secrets: '/run/secrets',
  /** The GeoIP database's directory (a directory mount, so a file renamed over it is seen and reloaded). */
  geoipDir: '/var/lib/geoip',
} as const;

/** File names in the secrets directory (written 0400 by the driver). */
export const SECRET_FILES = { hmac: 'ingest_hmac', feedPublicKeys: 'feed_public_keys', adminToken: 'admin_token' } as const;
/** Where the TS service keeps a seal through the admin port (AUTHZ_SEAL_FILE): the container's own /tmp, kept across its restarts. */
export const CONTAINER_SEAL_FILE = '/tmp/edge-sealed';

export interface ContainerDef {
  readonly name: 'redis' | 'authz' | 'envoy';
  readonly image: string;
  /** uid:gid, or undefined for the image's own user. */
  readonly user: string | undefined;
  readonly env: Readonly<Record<string, string>>;
  readonly command?: readonly string[];
  readonly exposedPorts: readonly number[];
  /** [host path, container path], read-only. */
  readonly binds: readonly (readonly [string, string])[];
  readonly alias: string;
  /** What "ready" means: a log line, or an HTTP 200 on a container port. */
  /** What "ready" means: a log line, or one of `statuses` for an HTTP GET on a container port. */
  readonly wait: { readonly kind: 'log'; readonly text: string } | { readonly kind: 'http'; readonly port: number; readonly path: string; readonly statuses: readonly number[] };
}

export interface ContainerStackInput {
  /** Dev PKI directory (scripts/dev/certs.ts layout: client/ is the ..data directory). */
  readonly pkiDir: string;
  /** Where the driver wrote Envoy's bootstrap (envoy.yaml) and SDS file. */
  readonly envoyConfigDir: string;
  /** Holds SECRET_FILES (0400, owned by `uid`). */
  readonly secretsDir: string;
  readonly backendPort: number;
  /** The uid/gid that owns the generated files; the containers run as it. */
  readonly uid: number;
  readonly gid: number;
  readonly geoipDb?: string;
  readonly env?: Readonly<Record<string, string>>;
  /** Default DEFAULT_IMAGES. */
  readonly images?: ContainerImages;
}

/**
 * Requests from the test process reach Envoy from the Docker network's gateway (a private
 * address with no GeoIP record). The local driver's clients come from 127.0.0.1, which is
 * trusted by default; trust the private ranges here so the same scenarios see the same geo
 * behaviour (scenario client addresses come from X-Forwarded-For documentation ranges).
 */
export const CONTAINER_TRUSTED_CIDRS = '127.0.0.0/8,::1/128,10.0.0.0/8,172.16.0.0/12,192.168.0.0/16';

/** The settings both the TS service and the Envoy renderer get (container paths). */
export function stackEnv(input: ContainerStackInput): Record<string, string> {
  return {
    EDGE_PORT: String(PORTS.edge),
    AUTHZ_GRPC_PORT: String(PORTS.grpc),
    MARKET_PORT: String(PORTS.market),
    AUTHZ_ADMIN_PORT: String(PORTS.admin),
    ENVOY_ADMIN_PORT: String(PORTS.envoyAdmin),
    AUTHZ_ADDRESS: 'authz',
    MARKET_ADDRESS: 'authz',
    AUTHZ_BIND_ADDRESS: '0.0.0.0',
    REDIS_URL: `redis://redis:${PORTS.redis}/0`,
    ORDER_BACKEND_URL: `https://${HOST_ALIAS}:${input.backendPort}`,
    ORDER_BACKEND_SAN: 'localhost',
    ORDER_BACKEND_CA_FILE: `${PATHS.pki}/backend-ca.crt`,
    EDGE_CLIENT_CERT_FILE: `${PATHS.pki}/client/tls.crt`,
    EDGE_CLIENT_KEY_FILE: `${PATHS.pki}/client/tls.key`,
    GEO_TRUSTED_CIDRS: CONTAINER_TRUSTED_CIDRS,
    ...(input.geoipDb === undefined ? {} : { GEOIP_DB: `${PATHS.geoipDir}/${basename(input.geoipDb)}` }),
    LOG_LEVEL: 'info',
    SHUTDOWN_GRACE_MS: '200',
    // A scenario's ingest listener (INGEST_PORT) must be reachable from the host through the published port.
    ...(input.env?.['INGEST_PORT'] === undefined ? {} : { INGEST_BIND_ADDRESS: '0.0.0.0' }),
    ...input.env,
  };
}

export function containerDefinitions(input: ContainerStackInput): ContainerDef[] {
  const env = stackEnv(input);
  const user = `${input.uid}:${input.gid}`;
  const images = input.images ?? DEFAULT_IMAGES;
  return [
    {
      name: 'redis', image: images.redis, user: undefined, env: {},
      // Durable like production (docs/operations.md "Redis durability").
      command: ['redis-server', '--save', '', '--appendonly', 'yes', '--appendfsync', 'always'],
      exposedPorts: [PORTS.redis], binds: [], alias: 'redis', wait: { kind: 'log', text: 'Ready to accept connections' },
    },
    {
      name: 'authz', image: SERVICE_IMAGE, user,
      env: {
        ...env,
        EDGE_INGEST_HMAC_FILE: `${PATHS.secrets}/${SECRET_FILES.hmac}`,
        EDGE_FEED_ED25519_PUBLIC_KEY_FILE: `${PATHS.secrets}/${SECRET_FILES.feedPublicKeys}`,
        AUTHZ_ADMIN_TOKEN_FILE: `${PATHS.secrets}/${SECRET_FILES.adminToken}`,
        AUTHZ_SEAL_FILE: CONTAINER_SEAL_FILE,
      },
      exposedPorts: [PORTS.grpc, PORTS.market, PORTS.admin],
      binds: [[input.secretsDir, PATHS.secrets], ...(input.geoipDb === undefined ? [] : [[dirname(input.geoipDb), PATHS.geoipDir] as const])],
      alias: 'authz', wait: { kind: 'http', port: PORTS.market, path: '/healthz', statuses: [200] },
    },
    {
      // Runs as the files' owner; ENVOY_UID tells the image's entrypoint not to switch to its
      // own `envoy` user when that owner is root.
      name: 'envoy', image: images.envoy, user, env: { ENVOY_UID: String(input.uid) },
      command: ['envoy', '-c', `${PATHS.envoyConfig}/envoy.yaml`, '--disable-hot-restart', '--log-level', 'warning'],
      exposedPorts: [PORTS.edge, ...(env['INGEST_PORT'] === undefined ? [] : [Number(env['INGEST_PORT'])])],
      // Directories, not files: a client certificate rotated on the host (..data swap) reaches Envoy.
      binds: [[input.envoyConfigDir, PATHS.envoyConfig], [input.pkiDir, PATHS.pki]],
      // Through Envoy and authz: 200, or 451 when the settings leave the test client's address
      // (the network gateway) untrusted and without a GeoIP record, as the local driver accepts.
      alias: 'envoy', wait: { kind: 'http', port: PORTS.edge, path: '/healthz', statuses: [200, 451] },
    },
  ];
}

/**
 * How the driver reaches a port that listens on a container's loopback only (the admin ports:
 * /admin/seal answers loopback peers only; Envoy's admin is bound to 127.0.0.1): a command run
 * inside the container. `node` for the service image, `bash` for Envoy's (which has no curl).
 */
export type LoopbackTool = 'node' | 'bash';

export function loopbackRequestCommand(tool: LoopbackTool, port: number, method: string, path: string, authorization = ''): string[] {
  if (tool === 'node') {
    // The authorization header (POST /admin/seal's admin token) only when one is given.
    return ['node', '-e', 'fetch(`http://127.0.0.1:${process.argv[1]}${process.argv[2]}`,{method:process.argv[3],headers:process.argv[4]?{authorization:process.argv[4]}:{}}).then(async r=>process.stdout.write(r.status+"\\n"+await r.text()))', String(port), path, method, authorization];
  }
  // Envoy's admin answers HTTP/1.0 with 426: speak HTTP/1.1 and close.
  return ['bash', '-c', 'exec 3<>/dev/tcp/127.0.0.1/$0 && printf "%s %s HTTP/1.1\\r\\nHost: localhost\\r\\n%bContent-Length: 0\\r\\nConnection: close\\r\\n\\r\\n" "$2" "$1" "${3:+Authorization: $3\\r\\n}" >&3 && cat <&3', String(port), path, method, authorization];
}

/** The status and body from what loopbackRequestCommand printed. */
export function parseLoopbackResponse(tool: LoopbackTool, stdout: string): { status: number; body: string } {
  if (tool === 'node') {
    const i = stdout.indexOf('\n');
    return { status: Number(stdout.slice(0, i)), body: stdout.slice(i + 1) };
  }
  const split = stdout.indexOf('\r\n\r\n');
  const head = stdout.slice(0, split);
  let body = stdout.slice(split + 4);
  if (/^transfer-encoding:\s*chunked/im.test(head)) {
    let decoded = '';
    for (let i = 0; ;) {
      const eol = body.indexOf('\r\n', i);
      const size = parseInt(body.slice(i, eol), 16);
      if (!(size > 0)) break;
      decoded += body.slice(eol + 2, eol + 2 + size);
      i = eol + 2 + size + 2;
    }
    body = decoded;
  }
  return { status: Number(head.split(' ')[1]), body };
}
