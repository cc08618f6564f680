/**
 * Development secrets for `docker compose` (deploy/docker-compose.yml), never committed:
 *
 *   scripts/node deploy/compose-setup.ts                       # once, before `docker compose up`
 *   scripts/node deploy/compose-setup.ts --rotate-client-cert  # issue + publish a new client certificate
 *   options: --out <dir> (default: deploy/)
 *
 * Writes, under <out>:
 *   .secrets/ingest_hmac, ingest_hmac_previous (empty: no rotation in progress),
 *            feed_public_keys, feed_private_key (the signing client's; mounted nowhere)
 *   .secrets/pki/  dev PKI: backend CA + server certificate for the service name `backend`,
 *                  client CA, and the edge's client certificate in the Kubernetes ..data layout
 *                  (client/tls.crt → ..data/tls.crt) so rotation is an atomic symlink swap
 *   .secrets/admin_token  the admin token (POST /admin/seal); added to an existing .secrets too
 *   .state/        the TS service's writable directory (0700): the seal marker AUTHZ_SEAL_FILE, kept
 *                  across container restarts (docs/operations.md "Seal and unseal")
 *   .geoip/country.mmdb  the packaged default country database (development only; replace by rename)
 *   .env           EDGE_UID/EDGE_GID: the user every container runs as
 *
 * Compose mounts file secrets as bind mounts, so the host file's owner and mode are what the
 * container sees (compose's `uid`/`mode` apply to Swarm only). Files are therefore 0400 and owned
 * by the user the containers run as: the invoking user, or uid/gid 1000 when run as root (this
 * script then writes everything as 1000, so later rotations keep the same owner).
 */
import { generateKeyPairSync, randomBytes } from 'node:crypto';
import { chmodSync, chownSync, existsSync, mkdirSync, readdirSync, readFileSync, statSync, writeFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { parseArgs } from 'node:util';
import { fileURLToPath } from 'node:url';
import { DEFAULT_GEOIP_DB } from '../authz/src/common/config.ts';
import { generateDevPki, issue, publishClientCert } from '../scripts/dev/certs.ts';

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
  adminToken: '.secrets/admin_token',
  state: '.state',
  geoipDir: '.geoip',
  geoipDb: '.geoip/country.mmdb',
  env: '.env',
} as const;

/** Who the containers run as: the invoking user, or the image's user when invoked as root. */
export function containerIds(uid: number, gid: number): { uid: number; gid: number } {
  return uid === 0 ? { uid: IMAGE_UID, gid: IMAGE_UID } : { uid, gid };
}

/**
 * The first directory on the way to `dir` (itself included) that `ids` cannot search (x), or
 * undefined. Directories that do not exist yet are created by root, with the default mode. Mode
 * bits as the kernel applies them to a process whose only group is `ids.gid` (the user this
 * script continues as); POSIX ACLs are not read. Checked before anything is written, so a
 * directory only root can enter fails with a message instead of EACCES half way through.
 */
export function unsearchableDir(dir: string, ids: { uid: number; gid: number }): string | undefined {
  if (ids.uid === 0) return undefined;
  const chain: string[] = [];
  for (let d = resolve(dir); ; d = dirname(d)) {
    chain.unshift(d);
    if (dirname(d) === d) break;
  }
  for (const d of chain) {
    const st = statSync(d, { throwIfNoEntry: false });
    if (st === undefined) return undefined;
    const shift = st.uid === ids.uid ? 6 : st.gid === ids.gid ? 3 : 0;
    if (((st.mode >> shift) & 0o1) === 0) return d;
  }
  return undefined;
}

/** As root, continue as the containers' user so every file written is theirs. */
function becomeContainerUser(ids: { uid: number; gid: number }): void {
  if (process.getuid?.() === 0 && ids.uid !== 0) {
    process.setgroups?.([ids.gid]);
    process.setgid?.(ids.gid);
    process.setuid?.(ids.uid);
  }
}

/** 0400 files (0600 for the CA serial files openssl rewrites), 0700 directories. */
function restrict(dir: string): void {
  chmodSync(dir, 0o700);
  for (const f of readdirSync(dir)) {
    const p = join(dir, f);
    const st = statSync(p, { throwIfNoEntry: false });
    if (st === undefined) continue;
    if (st.isDirectory()) restrict(p);
    else chmodSync(p, f.endsWith('.srl') ? 0o600 : 0o400);
  }
}

/** A refusal with a message for the operator (printed without a stack trace). */
export class SetupError extends Error {
  override readonly name = 'SetupError';
}

/**
 * The admin token (0400) and the state directory (0700), owned by the containers' user: written
 * when missing, also into a .secrets an earlier version of this script made.
 */
function ensureAdminFiles(out: string, ids: { uid: number; gid: number }): void {
  const state = join(out, COMPOSE_FILES.state);
  mkdirSync(state, { recursive: true, mode: 0o700 });
  if (process.getuid?.() === 0) chownSync(state, ids.uid, ids.gid);
  const token = join(out, COMPOSE_FILES.adminToken);
  if (existsSync(token)) return;
  writeFileSync(token, `${randomBytes(32).toString('hex')}\n`, { mode: 0o400 });
  if (process.getuid?.() === 0) chownSync(token, ids.uid, ids.gid);
}

export function setup(out: string): string {
  const ids = containerIds(process.getuid?.() ?? IMAGE_UID, process.getgid?.() ?? IMAGE_UID);
  const secrets = join(out, '.secrets');
  if (existsSync(join(out, COMPOSE_FILES.ingestHmac))) {
    ensureAdminFiles(out, ids);
    return `${secrets} already exists (admin token and ${join(out, COMPOSE_FILES.state)} ensured); delete it to regenerate`;
  }
  const blocked = unsearchableDir(out, ids);
  if (blocked !== undefined) {
    throw new SetupError(
      `${blocked} is not searchable by ${ids.uid}:${ids.gid}, the user the containers run as: every directory down to ${out} `
      + 'must be, so that user can write the files and the containers can read them (compose bind-mounts them as they are). '
      + 'Choose another --out, or grant search permission (e.g. chmod o+x on that directory)',
    );
  }
  writeFileSync(join(out, COMPOSE_FILES.env), `# written by deploy/compose-setup.ts: the user the containers run as\nEDGE_UID=${ids.uid}\nEDGE_GID=${ids.gid}\n`);
  for (const d of [secrets, join(out, COMPOSE_FILES.geoipDir)]) {
    mkdirSync(d, { recursive: true, mode: 0o700 });
    if (process.getuid?.() === 0) chownSync(d, ids.uid, ids.gid);
  }
  ensureAdminFiles(out, ids);
  // Read what lives in the checkout before dropping privileges: the checkout may sit where the
  // container user cannot read (e.g. under /root).
  const geoipBytes = readFileSync(DEFAULT_GEOIP_DB);
  becomeContainerUser(ids);
  const { privateKey, publicKey } = generateKeyPairSync('ed25519');
  const hex = (b64url: string | undefined): string => Buffer.from(b64url ?? '', 'base64url').toString('hex');
  writeFileSync(join(out, COMPOSE_FILES.ingestHmac), `hex:${randomBytes(32).toString('hex')}\n`);
  writeFileSync(join(out, COMPOSE_FILES.ingestHmacPrevious), '');
  writeFileSync(join(out, COMPOSE_FILES.feedPublicKeys), `${hex(publicKey.export({ format: 'jwk' }).x)}\n`);
  writeFileSync(join(out, COMPOSE_FILES.feedPrivateKey), `${hex(privateKey.export({ format: 'jwk' }).d)}\n`);
  generateDevPki(join(out, COMPOSE_FILES.pki), 'backend');
  restrict(secrets);
  writeFileSync(join(out, COMPOSE_FILES.geoipDb), geoipBytes);
  chmodSync(join(out, COMPOSE_FILES.geoipDir), 0o755);
  chmodSync(join(out, COMPOSE_FILES.geoipDb), 0o444);
  return `wrote ${secrets}, ${join(out, COMPOSE_FILES.state)}, ${join(out, COMPOSE_FILES.geoipDir)} and ${join(out, COMPOSE_FILES.env)} (containers run as ${ids.uid}:${ids.gid})`;
}

/**
 * Issues a new client certificate from the dev client CA and publishes it the way a Kubernetes
 * secret volume does (new ..<stamp> directory, atomic rename of ..data): the running Envoy picks
 * it up through its SDS watched_directory, without a restart.
 */
export function rotateClientCert(out: string): string {
  const pki = join(out, COMPOSE_FILES.pki);
  if (!existsSync(join(pki, 'client-ca.key'))) throw new SetupError(`${pki}: run compose-setup.ts first`);
  const st = statSync(pki);
  becomeContainerUser({ uid: st.uid, gid: st.gid });
  const name = `client-${Date.now()}`;
  issue(pki, 'client-ca', name, 'edge-client', 'DNS:edge.internal', 'clientAuth');
  publishClientCert(join(out, COMPOSE_FILES.clientCertDir), readFileSync(join(pki, `${name}.crt`)), readFileSync(join(pki, `${name}.key`)));
  restrict(pki);
  return `published ${name} into ${join(out, COMPOSE_FILES.clientCertDir)}`;
}

if (import.meta.main) {
  const { values } = parseArgs({ options: { out: { type: 'string' }, 'rotate-client-cert': { type: 'boolean' } } });
  const out = resolve(values.out ?? fileURLToPath(new URL('./', import.meta.url)));
  try {
    process.stdout.write(`compose-setup: ${values['rotate-client-cert'] === true ? rotateClientCert(out) : setup(out)}\n`);
  } catch (err) {
    if (!(err instanceof SetupError)) throw err;
    process.stderr.write(`compose-setup: ${err.message}\n`);
    process.exitCode = 1;
  }
}
