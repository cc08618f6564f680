/**
 * Credentials held in memory: the ingest HMAC keys and the feed public keys.
 *
 * Secret bytes live only in Buffers this module owns, so sealing can overwrite them with
 * zeros (docs/api.md "Seal"). JavaScript strings cannot be wiped, so the environment variables
 * that carried secrets are deleted from `process.env` once parsed (children inherit nothing).
 */
import { createHash, createPrivateKey, createPublicKey, type KeyObject } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { ConfigError, type Env } from './config.ts';
import { HmacSha256Key } from './crypto/hmac.ts';
import { decodeStrictBase64 } from './rules.ts';

export interface Credentials {
  /** HMAC keys, current first, then EDGE_INGEST_HMAC_PREVIOUS during a rotation. */
  readonly hmacKeys: readonly Buffer[];
  /** The same keys as precomputed HMAC pads (the hot path uses these). */
  readonly hmac: readonly HmacSha256Key[];
  /** Ed25519 public keys that may sign feed documents (rotation list). */
  readonly feedKeys: readonly KeyObject[];
  /** SHA-256 fingerprints (first 8 hex) of the feed keys, for logs. Never the key itself. */
  readonly feedKeyIds: readonly string[];
  /** Every secret buffer this process holds (for sealing and for the seal test). */
  readonly secretBuffers: readonly Buffer[];
  /** Overwrites every secret buffer with zeros. Idempotent. */
  zeroize(): void;
}

const HEX = /^(?:[0-9a-fA-F]{2})+$/;

/** The secret settings loadCredentials deletes from `process.env` once read. */
const SECRET_ENV = ['EDGE_INGEST_HMAC', 'EDGE_INGEST_HMAC_PREVIOUS', 'EDGE_FEED_ED25519_KEY'] as const;
/**
 * Parses an HMAC key setting: `hex:<hex>` → hex-decoded, `base64:<b64>` → base64-decoded,
 * anything else → its UTF-8 bytes. Under 32 bytes → ConfigError (docs/api.md "POST /internal/ingest/market").
 */
export function parseHmacKey(name: string, value: string): Buffer {
  let key: Buffer | undefined;
  if (value.startsWith('hex:')) {
    const hex = value.slice(4);
    key = HEX.test(hex) ? Buffer.from(hex, 'hex') : undefined;
    if (key === undefined) throw new ConfigError(name, 'hex:<even number of hex digits>');
  } else if (value.startsWith('base64:')) {
    key = decodeStrictBase64(value.slice(7));
    if (key === undefined) throw new ConfigError(name, 'base64:<standard padded base64>');
  } else {
    key = Buffer.from(value, 'utf8');
  }
  if (key.length < 32) {
    key.fill(0);
    throw new ConfigError(name, 'a key of at least 32 bytes after decoding');
  }
  // Own the bytes in a buffer that is not part of Node's shared pool, so zeroing is exact.
  const owned = Buffer.alloc(key.length);
  key.copy(owned);
  key.fill(0);
  return owned;
}

/** Decodes 32 or 64 bytes given as hex or standard base64; undefined when neither. */
function decodeKeyBytes(s: string): Buffer | undefined {
  if (HEX.test(s)) return Buffer.from(s, 'hex');
  return decodeStrictBase64(s);
}

/** Builds an Ed25519 public KeyObject from its 32 raw bytes. */
export function ed25519PublicKey(raw: Buffer): KeyObject {
  return createPublicKey({ key: { kty: 'OKP', crv: 'Ed25519', x: raw.toString('base64url') }, format: 'jwk' });
}

const PKCS8_ED25519_PREFIX = Buffer.from('302e020100300506032b657004220420', 'hex');

/**
 * Derives the public key from an Ed25519 private key given as a 32-byte seed or a 64-byte
 * secret key (seed ‖ public, tweetnacl's layout). Every private byte is zeroed before return.
 */
export function publicKeyFromPrivate(name: string, value: string): KeyObject {
  const bytes = decodeKeyBytes(value);
  if (bytes === undefined || (bytes.length !== 32 && bytes.length !== 64)) {
    bytes?.fill(0);
    throw new ConfigError(name, 'an Ed25519 private key: 32-byte seed or 64-byte secret key, hex or base64');
  }
  const der = Buffer.concat([PKCS8_ED25519_PREFIX, bytes.subarray(0, 32)]);
  try {
    const pub = createPublicKey(createPrivateKey({ key: der, format: 'der', type: 'pkcs8' }));
    if (bytes.length === 64) {
      const rawPub = Buffer.from(pub.export({ format: 'jwk' }).x ?? '', 'base64url');
      if (!rawPub.equals(bytes.subarray(32))) {
        throw new ConfigError(name, 'a 64-byte secret key whose last 32 bytes are its public key');
      }
    }
    return pub;
  } finally {
    der.fill(0);
    bytes.fill(0);
  }
}

function fingerprint(key: KeyObject): string {
  const raw = Buffer.from(key.export({ format: 'jwk' }).x ?? '', 'base64url');
  return createHash('sha256').update(raw).digest('hex').slice(0, 8);
}

/** Warnings produced while loading (logged by the caller). */
export interface CredentialWarnings {
  readonly warnings: string[];
}

/**
 * `NAME`, or else the contents of the file named by `NAME_FILE` (one trailing newline removed):
 * containers mount secrets as restricted-permission files (compose secrets, Kubernetes secret
 * volumes with defaultMode 0400) instead of putting them in the environment.
 */
export function secretSetting(env: Env, name: string): string | undefined {
  const direct = env[name];
  if (direct !== undefined && direct !== '') return direct;
  const file = env[`${name}_FILE`];
  if (file === undefined || file === '') return undefined;
  try {
    return readFileSync(file, 'utf8').replace(/\r?\n$/, '');
  } catch (err) {
    throw new ConfigError(`${name}_FILE`, 'a readable file', `${file}: ${(err as NodeJS.ErrnoException).code ?? String(err)}`);
  }
}

/**
 * Loads the credentials from the environment, validates them, deletes the secret
 * variables from `env` when it is `process.env`, and returns the owning object. (The process's
 * initial environment block, /proc/<pid>/environ, keeps what it was started with: secrets belong
 * in the `*_FILE` settings.)
 */
export function loadCredentials(env: Env = process.env, out: CredentialWarnings = { warnings: [] }): Credentials {
  const current = secretSetting(env, 'EDGE_INGEST_HMAC');
  if (current === undefined || current === '') {
    throw new ConfigError('EDGE_INGEST_HMAC', 'the ingest HMAC key (hex:…, base64:… or ≥ 32 bytes of text)');
  }
  const hmacKeys = [parseHmacKey('EDGE_INGEST_HMAC', current)];
  const previous = secretSetting(env, 'EDGE_INGEST_HMAC_PREVIOUS');
  if (previous !== undefined && previous !== '') hmacKeys.push(parseHmacKey('EDGE_INGEST_HMAC_PREVIOUS', previous));

  const feedKeys: KeyObject[] = [];
  const pubList = secretSetting(env, 'EDGE_FEED_ED25519_PUBLIC_KEY');
  if (pubList !== undefined && pubList.trim() !== '') {
    for (const item of pubList.split(',').map((s) => s.trim()).filter((s) => s !== '')) {
      const raw = decodeKeyBytes(item);
      if (raw === undefined || raw.length !== 32) {
        throw new ConfigError('EDGE_FEED_ED25519_PUBLIC_KEY', 'comma-separated 32-byte Ed25519 public keys (64 hex chars or base64)', item);
      }
      feedKeys.push(ed25519PublicKey(raw));
    }
  }
  const priv = secretSetting(env, 'EDGE_FEED_ED25519_KEY');
  if (priv !== undefined && priv.trim() !== '') {
    feedKeys.push(publicKeyFromPrivate('EDGE_FEED_ED25519_KEY', priv.trim()));
    out.warnings.push(
      'EDGE_FEED_ED25519_KEY holds a private key: only its public key is needed; the private bytes were zeroed. ' +
        'Set EDGE_FEED_ED25519_PUBLIC_KEY instead.',
    );
  }
  if (feedKeys.length === 0) {
    throw new ConfigError('EDGE_FEED_ED25519_PUBLIC_KEY', 'at least one feed public key (or EDGE_FEED_ED25519_KEY)');
  }
  if (env === process.env) {
    for (const name of SECRET_ENV) delete process.env[name];
  }
  const hmac = hmacKeys.map((k) => new HmacSha256Key(k));
  const secretBuffers = Object.freeze([...hmacKeys, ...hmac.flatMap((h) => h.buffers)]);
  return Object.freeze({
    hmacKeys: Object.freeze(hmacKeys),
    hmac: Object.freeze(hmac),
    feedKeys: Object.freeze(feedKeys),
    feedKeyIds: Object.freeze(feedKeys.map(fingerprint)),
    secretBuffers,
    zeroize(): void {
      for (const b of secretBuffers) b.fill(0);
    },
  });
}


/**
 * No credentials at all: what a process that starts sealed holds (AUTHZ_SEAL_FILE present; docs/api.md
 * "Seal"). No key file is read, and the secret variables are deleted from `process.env` as
 * loadCredentials would.
 */
export function noCredentials(): Credentials {
  for (const name of SECRET_ENV) delete process.env[name];
  return Object.freeze({
    hmacKeys: Object.freeze([]), hmac: Object.freeze([]), feedKeys: Object.freeze([]), feedKeyIds: Object.freeze([]),
    secretBuffers: Object.freeze([]),
    zeroize(): void { /* nothing held */ },
  });
}
