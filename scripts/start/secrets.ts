/**
 * `npm start`'s development secrets: dev.env (the ingest HMAC key and the feed keys, generated
 * once, 0600), the admin and rate limit tokens, the refusal of stale ingest keys from a shell that
 * sourced dev.env before a rotation, and the secret files the TS service reads (never its
 * environment). Keys are named in messages by fingerprint only.
 */
import { createHash, generateKeyPairSync, randomBytes, timingSafeEqual } from 'node:crypto';
import { existsSync, mkdirSync, readFileSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { ConfigError, type Config } from '../../authz/src/common/config.ts';
import { parseHmacKey, secretSetting } from '../../authz/src/common/credentials.ts';
import { isBlank, type StartEnv } from './preflight.ts';

/** dev.env, read or about to be written. */
export interface DevSecrets {
  /** dev.env's settings. */
  readonly values: Record<string, string>;
  /** dev.env's text when there is none yet: written by createRunDir, once the start is not refused. */
  readonly fresh: string | undefined;
}

/** Development secrets: generated once into dev.env (mode 0600), reused across restarts. */
export function devSecrets(run: string): DevSecrets {
  const file = join(run, 'dev.env');
  let fresh: string | undefined;
  if (!existsSync(file)) {
    const { privateKey, publicKey } = generateKeyPairSync('ed25519');
    const seed = Buffer.from(privateKey.export({ format: 'jwk' }).d ?? '', 'base64url').toString('hex');
    const pub = Buffer.from(publicKey.export({ format: 'jwk' }).x ?? '', 'base64url').toString('hex');
    fresh = [
      `EDGE_INGEST_HMAC=hex:${randomBytes(32).toString('hex')}`,
      `EDGE_FEED_ED25519_PUBLIC_KEY=${pub}`,
      `# The feed's private key: used only by scripts/edge-client.ts to sign demo documents.`,
      `EDGE_FEED_ED25519_KEY=${seed}`,
    ].join('\n') + '\n';
  }
  const values = Object.fromEntries((fresh ?? readFileSync(file, 'utf8')).split('\n').filter((l) => /^[A-Z0-9_]+=/.test(l)).map((l) => {
    const i = l.indexOf('=');
    return [l.slice(0, i), l.slice(i + 1)];
  }));
  return { values, fresh };
}

/**
 * The run directory and a new dev.env, written only once nothing refuses the start (a refused
 * start, e.g. for ports in use, leaves no trace). An unusable DEV_RUN_DIR is a setting error.
 */
export function createRunDir(run: string, secrets: DevSecrets): void {
  try {
    mkdirSync(run, { recursive: true, mode: 0o700 });
    if (secrets.fresh !== undefined) {
      const file = join(run, 'dev.env');
      writeFileSync(`${file}.tmp`, secrets.fresh, { mode: 0o600 });
      renameSync(`${file}.tmp`, file);
    }
  } catch (err) {
    throw new ConfigError('DEV_RUN_DIR', 'a directory npm start can create and write', `${run}: ${(err as NodeJS.ErrnoException).code ?? String(err)}`);
  }
}

/** Names an ingest HMAC key in messages without revealing it: the first 8 hex digits of the SHA-256 of its bytes. */
export function fingerprint(name: string, value: string): string {
  const key = parseHmacKey(name, value);
  const hash = createHash('sha256').update(key).digest('hex').slice(0, 8);
  key.fill(0);
  return `sha256:${hash}`;
}

/** Whether setting `name`'s value `a` and dev.env's `b` are the same key (as bytes: hex:, base64: or text alike). */
function sameKey(name: string, a: string, b: string): boolean {
  const x = parseHmacKey(name, a);
  const y = parseHmacKey(name, b);
  const same = x.length === y.length && timingSafeEqual(x, y);
  x.fill(0);
  y.fill(0);
  return same;
}

/**
 * A shell that sourced dev.env (the banner's `set -a; . dev.env`) before a rotation still exports
 * the old key: a start from it would make the old key current again and rewrite dev.env to match,
 * and a feed already signing with the new key would get 401. So the environment's ingest keys may
 * differ from those dev.env holds (the keys the stack last ran with) only as the documented
 * rotation does (docs/operations.md "Ingest HMAC key"): a new EDGE_INGEST_HMAC with dev.env's
 * current key as EDGE_INGEST_HMAC_PREVIOUS (step 1), or the same EDGE_INGEST_HMAC with the
 * previous key emptied (step 3). Anything else is refused (exit 2) naming both keys by
 * fingerprint: a warning would scroll past while the stack starts, after dev.env was rewritten.
 * Returns that refusal, or undefined; `devEnvShown` is how messages name dev.env.
 */
export function staleKeysProblem(env: StartEnv, file: Record<string, string>, devEnvShown: string): string | undefined {
  const current = secretSetting(env, 'EDGE_INGEST_HMAC');
  const previous = secretSetting(env, 'EDGE_INGEST_HMAC_PREVIOUS');
  const fileCurrent = file['EDGE_INGEST_HMAC'];
  const filePrevious = file['EDGE_INGEST_HMAC_PREVIOUS'] ?? '';
  if (current === undefined || fileCurrent === undefined) return undefined; // dev.env's keys are used, or dev.env names none
  try {
    parseHmacKey('EDGE_INGEST_HMAC', fileCurrent);
    if (filePrevious !== '') parseHmacKey('EDGE_INGEST_HMAC_PREVIOUS', filePrevious);
  } catch {
    return undefined; // dev.env edited by hand into something that is not a key: the environment's keys replace it
  }
  const refresh = `a shell that sourced dev.env before a rotation keeps the old keys: refresh it (set -a; . ${devEnvShown}; set +a) `
    + 'or unset EDGE_INGEST_HMAC EDGE_INGEST_HMAC_PREVIOUS, then start again (docs/operations.md "Ingest HMAC key")';
  if (!sameKey('EDGE_INGEST_HMAC', current, fileCurrent)) {
    if (previous !== undefined && previous !== '' && sameKey('EDGE_INGEST_HMAC_PREVIOUS', previous, fileCurrent)) return undefined; // a rotation: step 1
    return `EDGE_INGEST_HMAC in your environment (${fingerprint('EDGE_INGEST_HMAC', current)}) is not the key this stack last ran with `
      + `(${fingerprint('EDGE_INGEST_HMAC', fileCurrent)}, in ${devEnvShown}), nor is that key your EDGE_INGEST_HMAC_PREVIOUS: `
      + `starting would stop accepting it (feeds signing with it would get 401); ${refresh}; to rotate, give it as EDGE_INGEST_HMAC_PREVIOUS`;
  }
  if (previous !== undefined && previous !== '' && (filePrevious === '' || !sameKey('EDGE_INGEST_HMAC_PREVIOUS', previous, filePrevious))) {
    return `EDGE_INGEST_HMAC_PREVIOUS in your environment (${fingerprint('EDGE_INGEST_HMAC_PREVIOUS', previous)}) is not the previous key `
      + `this stack last ran with (${filePrevious === '' ? 'none' : fingerprint('EDGE_INGEST_HMAC_PREVIOUS', filePrevious)}, in ${devEnvShown}): `
      + `starting would accept a retired key again; ${refresh}`;
  }
  return undefined;
}

/**
 * The admin token (POST /admin/seal): generated once into `defaultFile` (0600), reused across
 * restarts; a token file given in AUTHZ_ADMIN_TOKEN_FILE is used as it is.
 */
export function devAdminToken(env: StartEnv, defaultFile: string): void {
  if (env['AUTHZ_ADMIN_TOKEN_FILE'] !== defaultFile || existsSync(defaultFile)) return;
  writeFileSync(`${defaultFile}.tmp`, `${randomBytes(32).toString('hex')}\n`, { mode: 0o600 });
  renameSync(`${defaultFile}.tmp`, defaultFile);
}

/**
 * RATELIMIT_SERVICE_ADDRESS naming this stack's own TS service (loopback, AUTHZ_GRPC_PORT) without
 * RATELIMIT_SERVICE_TOKEN_FILE: the token Envoy sends it is generated into ratelimit-token (0600),
 * since the TS service serves RateLimitService only with one.
 */
export function devRateLimitToken(env: StartEnv, run: string, config: Config): void {
  const rl = config.rateLimitService;
  if (rl === undefined || !isBlank(env, 'RATELIMIT_SERVICE_TOKEN_FILE') || rl.port !== config.authzGrpcPort || !/^(127\.[0-9.]+|::1|localhost)$/.test(rl.host)) return;
  const file = join(run, 'ratelimit-token');
  if (!existsSync(file)) {
    writeFileSync(`${file}.tmp`, `${randomBytes(32).toString('hex')}\n`, { mode: 0o600 });
    renameSync(`${file}.tmp`, file);
  }
  env['RATELIMIT_SERVICE_TOKEN_FILE'] = file;
}

/**
 * dev.env holds the ingest HMAC keys the stack runs with, so the banner's `. dev.env` signs with
 * the current key: a key given in the environment (a rotation, docs/operations.md) replaces the
 * file's, an empty EDGE_INGEST_HMAC_PREVIOUS removes the previous one. Returns the line saying so
 * when dev.env changed (keys by fingerprint), else undefined.
 */
export function keepDevEnvCurrent(env: StartEnv, run: string, devEnvShown: string): string | undefined {
  const file = join(run, 'dev.env');
  const before = readFileSync(file, 'utf8');
  let lines = before.split('\n');
  for (const name of ['EDGE_INGEST_HMAC', 'EDGE_INGEST_HMAC_PREVIOUS']) {
    const value = secretSetting(env, name) ?? '';
    const at = lines.findIndex((l) => l.startsWith(`${name}=`));
    if (value === '') lines = lines.filter((l) => !l.startsWith(`${name}=`));
    else if (at >= 0) lines[at] = `${name}=${value}`;
    else lines.splice(name === 'EDGE_INGEST_HMAC' ? 0 : 1, 0, `${name}=${value}`);
  }
  const after = lines.join('\n');
  if (after === before) return undefined;
  writeFileSync(`${file}.tmp`, after, { mode: 0o600 });
  renameSync(`${file}.tmp`, file);
  const named = (name: string): string => {
    const value = secretSetting(env, name) ?? '';
    return `${name} ${value === '' ? 'none' : fingerprint(name, value)}`;
  };
  return `${devEnvShown} now holds the ingest HMAC key(s) this stack runs with (from your environment): `
    + `${named('EDGE_INGEST_HMAC')}, ${named('EDGE_INGEST_HMAC_PREVIOUS')}`;
}

/**
 * The TS service reads its secrets from files (the `*_FILE` settings, as in the deployments):
 * a value in its environment would stay readable in /proc/<pid>/environ for the life of the
 * process, sealed or not. Each secret setting that has a value (from the environment or
 * dev.env) is written to secrets/<name> under the run directory (0600, rewritten on every start,
 * so a key changed in the environment takes effect) and replaced by its `_FILE` setting.
 */
const FILE_SECRETS = ['EDGE_INGEST_HMAC', 'EDGE_INGEST_HMAC_PREVIOUS', 'EDGE_FEED_ED25519_KEY'] as const;
/** Moves the secrets of `env` into files under `run` (see FILE_SECRETS). */
export function secretsToFiles(env: StartEnv, run: string): void {
  mkdirSync(join(run, 'secrets'), { recursive: true, mode: 0o700 });
  for (const k of FILE_SECRETS) {
    const value = env[k];
    if (value === undefined || value === '') continue;
    const file = join(run, 'secrets', k.toLowerCase());
    rmSync(file, { force: true });
    writeFileSync(file, `${value}\n`, { mode: 0o600 });
    delete env[k];
    env[`${k}_FILE`] = file;
  }
}

/** Only the TS service needs these (as files, see FILE_SECRETS); Redis, the backend and Envoy start without them. */
const SECRET_ENV = new Set([
  'EDGE_INGEST_HMAC', 'EDGE_INGEST_HMAC_PREVIOUS', 'EDGE_FEED_ED25519_KEY',
  'EDGE_INGEST_HMAC_FILE', 'EDGE_INGEST_HMAC_PREVIOUS_FILE', 'EDGE_FEED_ED25519_KEY_FILE', 'REDIS_URL',
]);
/** `env` without the secret settings (and REDIS_URL): the environment of every child but the TS service. */
export const withoutSecrets = (env: StartEnv): NodeJS.ProcessEnv => Object.fromEntries(Object.entries(env).filter(([k]) => !SECRET_ENV.has(k)));
