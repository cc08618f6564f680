/**
 * The authorization core: pipeline deps + gRPC server + seal, from injected ports.
 * No I/O of its own beyond the gRPC socket; main.ts/app.ts provide the adapters.
 */
import type { Config } from './config.ts';
import type { Credentials } from './credentials.ts';
import { geoDenial } from './decision.ts';
import type { AuthzInput } from './envoy/request.ts';
import { createGrpcServer, type AuthzGrpcServer } from './grpc/server.ts';
import { nonceTag, type Logger } from './log.ts';
import type { AuthzMetrics } from './metrics.ts';
import { classify, evaluate, type PipelineDeps } from './pipeline.ts';
import type { Clock, GeoLookup, MarketLookup, NonceStore } from './ports.ts';
import { createGeoClassifier } from './stages/geo.ts';

export interface AuthzCoreDeps {
  readonly config: Config;
  readonly credentials: Credentials;
  readonly geo: GeoLookup;
  readonly nonces: NonceStore;
  readonly markets: MarketLookup;
  readonly clock: Clock;
  readonly logger: Logger;
  readonly metrics: AuthzMetrics;
}

export interface AuthzCore {
  readonly grpc: AuthzGrpcServer;
  readonly credentials: Credentials;
  readonly pipeline: PipelineDeps;
  isSealed(): boolean;
  /** The Prometheus text of this core's registry. */
  metricsText(): Promise<string>;
  /** Zeroes every credential buffer, denies every Check with 503 sealed, health → NOT_SERVING. */
  seal(reason: string): void;
}

export function createAuthzCore(deps: AuthzCoreDeps): AuthzCore {
  const { config, credentials, logger, metrics } = deps;
  let sealed = false;
  const classifyGeoRaw = createGeoClassifier(config, deps.geo);
  const pipeline: PipelineDeps = {
    classifyGeo: (ip) => {
      const v = classifyGeoRaw(ip);
      metrics.geoVerdict(v);
      return v;
    },
    geoDenial: geoDenial(config.geoNotice, config.geoBlockedByUrl),
    ingest: {
      hmacKeys: credentials.hmac,
      feedKeys: credentials.feedKeys,
      nonces: deps.nonces,
      clock: deps.clock,
      replayWindowSecs: config.replayWindowSecs,
      nonceTtlSecs: config.nonceTtlSecs,
      onStoreError: (err) => {
        metrics.redisError('nonce_set');
        logger.error({ err: String(err) }, 'nonce store unavailable: ingest denied 503');
      },
    },
    order: {
      markets: deps.markets,
      clock: deps.clock,
      orderMaxTtlSecs: config.orderMaxTtlSecs,
      orderMaxSize: config.orderMaxSize,
      orderPayloadMaxBytes: config.orderPayloadMaxBytes,
      onStoreError: (err) => {
        metrics.redisError('market_get');
        logger.error({ err: String(err) }, 'market store unavailable: order denied 503');
      },
    },
    isSealed: () => sealed,
  };

  const grpc = createGrpcServer({
    evaluate: (input: AuthzInput) => evaluate(input, pipeline),
    observe: (input, d, startNs) => {
      const route = classify(input.method, input.path);
      metrics.decision(route, d, Number(process.hrtime.bigint() - startNs) / 1e9);
      // Decision log: denials of signed routes at info; geo/read denials are counted, logged at debug.
      if (!d.allow && (route !== 'read' || logger.isLevelEnabled('debug'))) {
        logger[route === 'read' ? 'debug' : 'info'](
          { route, code: d.code, reason: d.reason, status: d.httpStatus, client: input.clientIp, requestId: input.requestId, nonce: nonceTag(input.nonce) },
          'denied',
        );
      }
    },
    onError: (where, err) => logger.error({ where, err: String(err) }, 'unexpected error: failed closed'),
    maxBodyBytes: Math.max(config.orderMaxBytes, config.ingestMaxBytes),
  });

  return {
    grpc,
    credentials,
    pipeline,
    isSealed: () => sealed,
    metricsText: () => metrics.registry.metrics(),
    seal(reason) {
      if (sealed) return;
      sealed = true;
      credentials.zeroize();
      grpc.setServing(false);
      metrics.setSealed(true);
      logger.warn({ reason }, 'sealed: credentials zeroed, every Check now denied 503 sealed');
    },
  };
}
