/**
 * Starts the real authz core (gRPC on 127.0.0.1:0) with real Redis for nonces, and a
 * real grpc-js client that sends CheckRequests encoded exactly like Envoy's.
 */
import * as grpc from '@grpc/grpc-js';
import { randomBytes } from 'node:crypto';
import { Writable } from 'node:stream';
import { loadPackageDefinition, SERVICE_NAMES } from '../../proto/index.ts';
import { createAuthzCore, type AuthzCore } from '../src/authz/core.ts';
import { loadConfig, type Env } from '../src/common/config.ts';
import { loadCredentials } from '../src/common/credentials.ts';
import { RedisNonceStore, MemoryNonceStore } from '../src/common/adapters/nonce-store.ts';
import { createRedis } from '../src/common/adapters/redis.ts';
import { createLogger } from '../src/common/log.ts';
import { createMetrics } from '../src/common/metrics.ts';
import type { AnonymizerLookup, Clock, GeoLookup, MarketLookup, NonceStore } from '../src/common/ports.ts';
import { RedisBuckets } from '../src/ratelimit/bucket.ts';
import { rateLimitService } from '../src/ratelimit/service.ts';
import { createCheckLimiter } from '../src/ratelimit/check-limit.ts';
import { readTokenFile } from '../src/common/token.ts';
import { checkRequestObject, decodeCheckResponse, outcomeOf, type CheckSpec } from '../../testkit/check-request.ts';
import { newFeedKey, type FeedKey } from '../../testkit/feed.ts';
import type { Redis } from 'ioredis';

export const REDIS_URL = process.env['TEST_REDIS_URL'] ?? 'redis://127.0.0.1:6379/0';

export interface Fixture {
  core: AuthzCore;
  port: number;
  client: grpc.Client;
  feed: FeedKey;
  /** The feed private key's 32-byte seed (hex), for tools that sign as the feed does. */
  feedSeedHex: string;
  hmacKey: Buffer;
  redis: Redis | undefined;
  logs: string[];
  check(spec: CheckSpec): Promise<{ status: number; error?: string; body?: Record<string, unknown>; raw: ReturnType<typeof decodeCheckResponse> }>;
  close(): Promise<void>;
}

export async function startFixture(opts: {
  env?: Env; geo?: GeoLookup; anonymizer?: AnonymizerLookup; markets: MarketLookup; clock?: Clock; nonces?: 'redis' | 'memory' | NonceStore; redisUrl?: string;
}): Promise<Fixture> {
  const feed = newFeedKey();
  const hmacKey = randomBytes(32);
  const env: Env = {
    EDGE_INGEST_HMAC: `hex:${hmacKey.toString('hex')}`,
    EDGE_FEED_ED25519_PUBLIC_KEY: feed.publicHex,
    ...opts.env,
  };
  const config = loadConfig(env);
  const credentials = loadCredentials(env);
  const logs: string[] = [];
  const sink = new Writable({ write(chunk, _enc, cb) { logs.push(String(chunk)); cb(); } });
  const logger = createLogger('debug', sink);
  const metrics = createMetrics({ geoipBuildEpochSecs: () => 0, defaultMetrics: false });
  let redis: Redis | undefined;
  let nonces: NonceStore;
  if (opts.nonces === undefined || opts.nonces === 'redis') {
    redis = createRedis(opts.redisUrl ?? REDIS_URL);
    await new Promise<void>((resolve, reject) => {
      redis!.once('ready', () => resolve());
      redis!.once('error', reject);
    });
    nonces = new RedisNonceStore(redis);
  } else if (opts.nonces === 'memory') {
    nonces = new MemoryNonceStore();
  } else {
    nonces = opts.nonces;
  }
  const geo: GeoLookup = opts.geo ?? { lookup: () => ({ country: 'CH', regions: [] }) };
  const buckets = redis === undefined ? undefined : new RedisBuckets(redis, config);
  const core = createAuthzCore({
    config, credentials, geo, nonces, markets: opts.markets, ...(opts.anonymizer === undefined ? {} : { anonymizer: opts.anonymizer }),
    clock: opts.clock ?? { nowSecs: () => Math.floor(Date.now() / 1000), nowMs: () => Date.now() },
    logger, metrics,
    // As app.ts wires it: the global rate limit's service beside Check (its buckets on the Redis, if
    // any), only with RATELIMIT_SERVICE_TOKEN_FILE (and so RATELIMIT_SERVICE_ADDRESS) in `env`.
    grpcServices: config.rateLimitTokenFile === undefined ? [] : [rateLimitService({
      buckets, limits: config, metrics, logger, token: readTokenFile('RATELIMIT_SERVICE_TOKEN_FILE', config.rateLimitTokenFile),
    })],
    // and the bucket taken in Check when this service is the global limiter (REDIS_URL in `env`).
    ...(buckets !== undefined && config.rateLimitScope === 'global' && config.rateLimitService === undefined
      ? { globalLimit: createCheckLimiter({ buckets, limits: config, metrics, logger }) } : {}),
  });
  const port = await core.grpc.listen('127.0.0.1', 0);
  core.grpc.setServing(true);
  const pd = loadPackageDefinition();
  const Ctor = grpc.loadPackageDefinition(pd)['envoy'] as unknown as Record<string, Record<string, Record<string, Record<string, grpc.ServiceClientConstructor>>>>;
  const AuthorizationClient = Ctor['service']!['auth']!['v3']!['Authorization']!;
  const client = new AuthorizationClient(`127.0.0.1:${port}`, grpc.credentials.createInsecure());
  void SERVICE_NAMES;
  return {
    core, port, client, feed, hmacKey, redis, logs,
    feedSeedHex: Buffer.from(feed.privateKey.export({ format: 'jwk' }).d ?? '', 'base64url').toString('hex'),
    check(spec) {
      return new Promise((resolve, reject) => {
        (client as unknown as { Check: (req: object, cb: (err: grpc.ServiceError | null, res: object) => void) => void })
          .Check(checkRequestObject(spec), (err, res) => {
            if (err) return reject(err);
            // Re-encode/decode through the real response type to see exactly what Envoy sees.
            const raw = res as ReturnType<typeof decodeCheckResponse>;
            resolve({ ...outcomeOf(raw), raw });
          });
      });
    },
    async close() {
      client.close();
      await core.grpc.close(100);
      if (redis !== undefined) redis.disconnect();
    },
  };
}
