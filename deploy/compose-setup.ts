/**
 * Development secrets for `docker-compose` (deploy/docker-compose.yml), never committed:
 *
 *   scripts/node deploy/compose-setup.ts                       # once, before `docker-compose up`
 *   scripts/node deploy/compose-setup.ts --rotate-client-cert  # issue + publish a new client certificate
 *   scripts/node deploy/compose-setup.ts --rotate-server-cert  # the same for the client port's server certificate
 *   options: --out <dir> (default: deploy/); --gid <n> (as root: the containers' group, default the
 *            first gid from 10001 no host group or user has)
 *
 * Writes, under <out>:
 *   .secrets/ingest_hmac, ingest_hmac_previous (empty: no rotation in progress),
 *            feed_public_keys, feed_private_key (the signing client's; mounted nowhere)
 *   .secrets/pki/  dev PKI: backend CA + server certificate for the service name `backend`,
 *                  client CA, and the edge's client certificate in the Kubernetes ..data layout
 *                  (client/tls.crt → ..data/tls.crt) so rotation is an atomic symlink swap
 *                  .secrets/pki/edge-ca.crt + edge-server/: the client listener's CA (what `curl --cacert`
 *                  is given) and its server certificate for localhost and 127.0.0.1, in the same ..data
 *                  layout (EDGE_TLS_CERT_FILE/EDGE_TLS_KEY_FILE; added to an existing .secrets too)
 *   .secrets/admin_token  the admin token (POST /admin/seal); added to an existing .secrets too
 *   .state/        the TS service's writable directory (0700): the seal marker AUTHZ_SEAL_FILE, kept
 *                  across container restarts (docs/operations.md "Seal and unseal")
 *   .geoip/country.mmdb  the packaged default country database (development only; replace by rename)
 *   .env           EDGE_UID/EDGE_GID: the user every container runs as
 *
 * Compose mounts file secrets as bind mounts, so the host file's owner and mode are what the
 * container sees (compose's `uid`/`mode` apply to Swarm only). Who may read them:
 *   - run as a user: that user owns everything (files 0400, directories 0700) and the containers
 *     run as that user (EDGE_UID/EDGE_GID = the invoking uid/gid);
 *   - run as root: root owns everything. What a container reads (the files docker-compose.yml
 *     mounts: MOUNTED) is 0440 with group EDGE_GID, a dedicated group that no host group or user
 *     has (the first free gid from 10001 in /etc/group and /etc/passwd, or --gid); the rest (the
 *     feed's private key, the CA keys) is 0400 root. The containers run as uid 1000 (the image's
 *     user, who owns nothing here) with EDGE_GID as their group, so they read their secrets
 *     through the group and a host account with uid 1000 reads none of them.
 *     The state directory is 0770 root:EDGE_GID.
 */
import { generateKeyPairSync, randomBytes } from 'node:crypto';
import { chmodSync, chownSync, existsSync, lstatSync, mkdirSync, readdirSync, readFileSync, statSync, writeFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { parseArgs } from 'node:util';
import { fileURLToPath } from 'node:url';
import { DEFAULT_GEOIP_DB } from '../authz/src/common/config.ts';
import { generateDevPki, issue, publishClientCert } from '../scripts/dev/certs.ts';
import { ensureEdgeServerCert } from '../scripts/dev/edge-server-cert.ts';

/** The uid/gid the service image runs as (deploy/Dockerfile `USER 1000:1000`). */
export const IMAGE_UID = 1000;

/** Paths under <out>, as docker-compose.yml refers to them (relative to deploy/). */
export const COMPOSE_FILES = {
  ingestHmac: '.secrets/ingest_hmac',
  ingestHmacPrevious: '.secrets/ingest_hmac_previous',
  feedPublicKeys: '.secrets/feed_public_keys',
  feedPrivateKey: '.secrets/feed_private_key',
  pki: '.secrets/pki',
  backendCa: '.secrets/pki/backend-ca.crt',
  backendCert: '.secrets/pki/backend.crt',
  backendKey: '.secrets/pki/backend.key',
  clientCa: '.secrets/pki/client-ca.crt',
  clientCertDir: '.secrets/pki/client',
  /** The client listener's server certificate directory (..data layout; mounted whole, like clientCertDir). */
  edgeServerDir: '.secrets/pki/edge-server',
  /** The CA of that certificate: what a client trusts (`curl --cacert`); mounted nowhere. */
  edgeCa: '.secrets/pki/edge-ca.crt',
  adminToken: '.secrets/admin_token',
  state: '.state',
  geoipDir: '.geoip',
  geoipDb: '.geoip/country.mmdb',
  env: '.env',
} as const;

/** The first gid a dedicated containers' group gets when run as root (--gid chooses another). */
export const FIRST_DEDICATED_GID = 10001;

/** The gids /etc/group and /etc/passwd give to a host group or user. */
export function hostGids(group = readOptional('/etc/group'), passwd = readOptional('/etc/passwd')): Set<number> {
  const gids = new Set<number>();
  for (const l of group.split('\n')) if (/^[^#:]+:[^:]*:\d+:/.test(l)) gids.add(Number(l.split(':')[2]));
  for (const l of passwd.split('\n')) if (/^[^#:]+:[^:]*:\d+:\d+:/.test(l)) gids.add(Number(l.split(':')[3]));
  return gids;
}

function readOptional(path: string): string {
  try {
    return readFileSync(path, 'utf8');
  } catch {
    return '';
  }
}

/** The first gid from FIRST_DEDICATED_GID that no host group or user has. */
export function dedicatedGid(taken: ReadonlySet<number> = hostGids()): number {
  let gid = FIRST_DEDICATED_GID;
  while (taken.has(gid)) gid++;
  return gid;
}

/**
 * Who owns the files and who the containers run as. `group`: root owns the files and the
 * containers read theirs through the dedicated group `gid` (run as root); otherwise the invoking
 * user owns them and the containers run as that user.
 */
export interface Ownership { readonly uid: number; readonly gid: number; readonly group: boolean }

/** The ownership for an invoking uid/gid (`dedicated`: the group chosen when invoked as root). */
export function ownership(uid: number, gid: number, dedicated: () => number = () => dedicatedGid()): Ownership {
  return uid === 0 ? { uid: IMAGE_UID, gid: dedicated(), group: true } : { uid, gid, group: false };
}

/** What docker-compose.yml mounts into a container (read through the group when run as root). */
export const MOUNTED = [
  COMPOSE_FILES.ingestHmac, COMPOSE_FILES.ingestHmacPrevious, COMPOSE_FILES.feedPublicKeys, COMPOSE_FILES.adminToken,
  COMPOSE_FILES.backendCa, COMPOSE_FILES.backendCert, COMPOSE_FILES.backendKey, COMPOSE_FILES.clientCa,
] as const;

/** The directories docker-compose.yml mounts whole (..data layout, so a rotation on the host reaches Envoy). */
export const MOUNTED_DIRS = [COMPOSE_FILES.clientCertDir, COMPOSE_FILES.edgeServerDir] as const;

/**
 * Owner and mode of everything under .secrets: as a user 0400 files, 0700 directories (the
 * user's own); as root the MOUNTED files and the MOUNTED_DIRS (the client and the server
 * certificate directories) 0440/0750 root:gid, everything else 0400/0700 root. CA serial files
 * (openssl rewrites them) 0600.
 */
function restrict(out: string, o: Ownership): void {
  const secrets = join(out, '.secrets');
  const sharedDirs = MOUNTED_DIRS.map((d) => join(out, d));
  const mounted = new Set(MOUNTED.map((f) => join(out, f)));
  const walk = (dir: string): void => {
    const shared = o.group && sharedDirs.some((d) => dir === d || dir.startsWith(`${d}/`));
    set(dir, shared ? 0o750 : 0o700, shared);
    for (const f of readdirSync(dir)) {
      const p = join(dir, f);
      const st = lstatSync(p, { throwIfNoEntry: false });
      if (st === undefined || st.isSymbolicLink()) continue;
      if (st.isDirectory()) walk(p);
      else if (f.endsWith('.srl')) set(p, 0o600, false);
      else {
        const read = o.group && (shared || mounted.has(p));
        set(p, read ? 0o440 : 0o400, read);
      }
    }
  };
  const set = (p: string, mode: number, shared: boolean): void => {
    if (o.group) chownSync(p, 0, shared ? o.gid : 0);
    chmodSync(p, mode);
  };
  walk(secrets);
}

/** A refusal with a message for the operator (printed without a stack trace). */
export class SetupError extends Error {
  override readonly name = 'SetupError';
}

/**
 * The admin token and the state directory: written when missing, also into a .secrets an
 * earlier version of this script made. The state directory is the containers' user's (0700) or,
 * as root, root:gid 0770 (the TS service writes its seal marker there).
 */
function ensureAdminFiles(out: string, o: Ownership): void {
  const state = join(out, COMPOSE_FILES.state);
  mkdirSync(state, { recursive: true, mode: 0o700 });
  if (o.group) {
    chownSync(state, 0, o.gid);
    chmodSync(state, 0o770);
  }
  const token = join(out, COMPOSE_FILES.adminToken);
  if (existsSync(token)) return;
  writeFileSync(token, `${randomBytes(32).toString('hex')}\n`, { mode: 0o400 });
  if (o.group) {
    chownSync(token, 0, o.gid);
    chmodSync(token, 0o440);
  }
}

/** The ownership an existing <out> was written with (its .env), or undefined. */
function writtenOwnership(out: string): Ownership | undefined {
  const env = readOptional(join(out, COMPOSE_FILES.env));
  const uid = /^EDGE_UID=(\d+)$/m.exec(env)?.[1];
  const gid = /^EDGE_GID=(\d+)$/m.exec(env)?.[1];
  if (uid === undefined || gid === undefined) return undefined;
  const st = statSync(join(out, '.secrets'), { throwIfNoEntry: false });
  return { uid: Number(uid), gid: Number(gid), group: st?.uid === 0 };
}

export function setup(out: string, gid?: number): string {
  const invoker = { uid: process.getuid?.() ?? IMAGE_UID, gid: process.getgid?.() ?? IMAGE_UID };
  const secrets = join(out, '.secrets');
  if (existsSync(join(out, COMPOSE_FILES.ingestHmac))) {
    const o = writtenOwnership(out) ?? ownership(invoker.uid, invoker.gid, () => gid ?? dedicatedGid());
    ensureAdminFiles(out, o);
    // A .secrets from before TLS on the client port: its server certificate added.
    if (!existsSync(join(out, COMPOSE_FILES.edgeServerDir, 'tls.crt'))) {
      ensureEdgeServerCert(join(out, COMPOSE_FILES.pki));
      restrict(out, o);
    }
    return `${secrets} already exists (admin token, server certificate and ${join(out, COMPOSE_FILES.state)} ensured); delete it to regenerate`;
  }
  if (gid !== undefined && invoker.uid !== 0) throw new SetupError('--gid is for a run as root: as a user, the containers run as that user');
  const o = ownership(invoker.uid, invoker.gid, () => gid ?? dedicatedGid());
  if (o.group && hostGids().has(o.gid)) throw new SetupError(`--gid ${o.gid} is a host group's or user's: the containers' group must be one no host account has`);
  mkdirSync(out, { recursive: true });
  writeFileSync(join(out, COMPOSE_FILES.env), `# written by deploy/compose-setup.ts: the user and group the containers run as${o.group ? ' (the group is dedicated: it reads the secrets, which root owns)' : ''}\nEDGE_UID=${o.uid}\nEDGE_GID=${o.gid}\n`);
  for (const d of [secrets, join(out, COMPOSE_FILES.geoipDir)]) mkdirSync(d, { recursive: true, mode: 0o700 });
  ensureAdminFiles(out, o);
  const { privateKey, publicKey } = generateKeyPairSync('ed25519');
  const hex = (b64url: string | undefined): string => Buffer.from(b64url ?? '', 'base64url').toString('hex');
  writeFileSync(join(out, COMPOSE_FILES.ingestHmac), `hex:${randomBytes(32).toString('hex')}\n`, { mode: 0o400 });
  writeFileSync(join(out, COMPOSE_FILES.ingestHmacPrevious), '', { mode: 0o400 });
  writeFileSync(join(out, COMPOSE_FILES.feedPublicKeys), `${hex(publicKey.export({ format: 'jwk' }).x)}\n`, { mode: 0o400 });
  writeFileSync(join(out, COMPOSE_FILES.feedPrivateKey), `${hex(privateKey.export({ format: 'jwk' }).d)}\n`, { mode: 0o400 });
  generateDevPki(join(out, COMPOSE_FILES.pki), 'backend');
  // TLS on the client port: edge-ca.crt and edge-server/tls.{crt,key} for localhost and 127.0.0.1.
  ensureEdgeServerCert(join(out, COMPOSE_FILES.pki));
  restrict(out, o);
  writeFileSync(join(out, COMPOSE_FILES.geoipDb), readFileSync(DEFAULT_GEOIP_DB));
  chmodSync(join(out, COMPOSE_FILES.geoipDir), 0o755);
  chmodSync(join(out, COMPOSE_FILES.geoipDb), 0o444);
  const who = o.group ? `root, read by the containers (uid ${o.uid}) through the dedicated group ${o.gid}` : `${o.uid}:${o.gid}, the containers' user`;
  return `wrote ${secrets}, ${join(out, COMPOSE_FILES.state)}, ${join(out, COMPOSE_FILES.geoipDir)} and ${join(out, COMPOSE_FILES.env)} (secrets owned by ${who})`;
}

/**
 * Issues a new certificate from a dev CA and publishes it into a MOUNTED_DIRS directory the way a
 * Kubernetes secret volume does (new ..<stamp> directory, atomic rename of ..data): the running
 * Envoy picks it up through its SDS watched_directory, without a restart. The new directory has
 * its final owner and mode before the swap, so Envoy never sees a file it cannot read.
 */
function rotate(out: string, dir: string, caName: string, prefix: string, cn: string, sans: string, usage: 'serverAuth' | 'clientAuth'): string {
  const pki = join(out, COMPOSE_FILES.pki);
  if (!existsSync(join(pki, `${caName}.key`))) throw new SetupError(`${pki}: run compose-setup.ts first`);
  const o = writtenOwnership(out);
  if (o === undefined) throw new SetupError(`${join(out, COMPOSE_FILES.env)}: missing or without EDGE_UID/EDGE_GID; run compose-setup.ts again`);
  if (!o.group && process.getuid?.() !== o.uid) throw new SetupError(`run it as uid ${o.uid}, who owns ${pki}`);
  const name = `${prefix}-${Date.now()}`;
  issue(pki, caName, name, cn, sans, usage);
  publishClientCert(join(out, dir), readFileSync(join(pki, `${name}.crt`)), readFileSync(join(pki, `${name}.key`)), (d) => {
    if (!o.group) return;
    for (const f of readdirSync(d)) {
      chownSync(join(d, f), 0, o.gid);
      chmodSync(join(d, f), 0o440);
    }
    chownSync(d, 0, o.gid);
    chmodSync(d, 0o750);
  });
  restrict(out, o);
  return `published ${name} into ${join(out, dir)}`;
}

/** A new client certificate (the edge's, to the order backend) from the dev client CA. */
export function rotateClientCert(out: string): string {
  return rotate(out, COMPOSE_FILES.clientCertDir, 'client-ca', 'client', 'edge-client', 'DNS:edge.internal', 'clientAuth');
}

/** A new server certificate for the client port (localhost, 127.0.0.1) from the dev edge CA: clients keep their --cacert. */
export function rotateServerCert(out: string): string {
  return rotate(out, COMPOSE_FILES.edgeServerDir, 'edge-ca', 'edge-server', 'localhost', 'DNS:localhost,IP:127.0.0.1', 'serverAuth');
}

if (import.meta.main) {
  const { values } = parseArgs({ options: { out: { type: 'string' }, gid: { type: 'string' }, 'rotate-client-cert': { type: 'boolean' }, 'rotate-server-cert': { type: 'boolean' } } });
  const out = resolve(values.out ?? fileURLToPath(new URL('./', import.meta.url)));
  try {
    if (values.gid !== undefined && !/^[1-9]\d{0,9}$/.test(values.gid)) throw new SetupError(`--gid ${values.gid}: a positive number`);
    const done = values['rotate-client-cert'] === true ? rotateClientCert(out)
      : values['rotate-server-cert'] === true ? rotateServerCert(out)
        : setup(out, values.gid === undefined ? undefined : Number(values.gid));
    process.stdout.write(`compose-setup: ${done}\n`);
  } catch (err) {
    if (!(err instanceof SetupError)) throw err;
    process.stderr.write(`compose-setup: ${err.message}\n`);
    process.exitCode = 1;
  }
}
