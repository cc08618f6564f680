/**
 * The authorization core: pipeline deps + gRPC server + seal, from injected ports.
 * No I/O of its own beyond the gRPC socket; main.ts/app.ts provide the adapters.
 */
import type { Config } from '../common/config.ts';
import type { Credentials } from '../common/credentials.ts';
import { geoDenial } from './decision.ts';
import type { AuthzInput } from './codec/request.ts';
import { createGrpcServer, type AuthzGrpcServer } from './grpc-server.ts';
import type { Logger } from '../common/log.ts';
import { ANONYMIZER_REASON, decisionLine, DECISION_MSG, isoSeconds, shouldLogDecision, type DecisionContext } from './decision-log.ts';
import { anonymizerKey } from './stages/anonymizer.ts';
import { ReplicaWaitError } from '../common/adapters/replica-wait.ts';
import type { AuthzMetrics } from '../common/metrics.ts';
import { evaluate, routeLabel, type PipelineDeps } from './pipeline.ts';
import type { AnonymizerLookup, Clock, GeoLookup, MarketLookup, NonceStore } from '../common/ports.ts';
import { createSealState, type SealState } from '../common/seal.ts';
import type { GeoResult } from './stages/geo.ts';
import { shadowHooks } from './shadow.ts';
import { LiveGeoPolicy } from './geo-policy.ts';
import type { GrpcServiceRegistration } from '../ratelimit/service.ts';
import { withGlobalLimit, type CheckLimiter } from '../ratelimit/check-limit.ts';
import type { Decision } from './decision.ts';
import { createPendingBodies } from './pending-bodies.ts';
import type { CheckTracer } from './tracing.ts';

export interface AuthzCoreDeps {
  readonly config: Config;
  readonly credentials: Credentials;
  readonly geo: GeoLookup;
  /** GEOIP_DB_SECONDARY's database, when configured: looked up beside `geo`, the stricter tier wins. */
  readonly geoSecondary?: GeoLookup | undefined;
  /** The anonymizer database, when config.anonymizer is set (ANONYMIZER_DB). */
  readonly anonymizer?: AnonymizerLookup;
  readonly nonces: NonceStore;
  readonly markets: MarketLookup;
  readonly clock: Clock;
  readonly logger: Logger;
  readonly metrics: AuthzMetrics;
  /** The process's seal state (shared with the market service); a fresh one when omitted. */
  readonly sealState?: SealState;
  /** Services the gRPC server serves beside Check (the global rate limit's RateLimitService). */
  readonly grpcServices?: readonly GrpcServiceRegistration[];
  /**
   * The global rate limit taken in Check (RATE_LIMIT_SCOPE=global, the TS service as the
   * limiter): asked first by the Checks Envoy marks (AuthzInput.globalLimit), before any stage.
   */
  readonly globalLimit?: CheckLimiter;
  /** The geo policy in force (GEO_POLICY_FILE, watched by the app); built from the settings when omitted. */
  readonly policy?: LiveGeoPolicy;
  /** One span per Check (OTEL_EXPORTER_OTLP_ENDPOINT; started by the app); undefined: no tracing. */
  readonly tracer?: CheckTracer | undefined;
}

export interface AuthzCore {
  readonly grpc: AuthzGrpcServer;
  readonly credentials: Credentials;
  readonly pipeline: PipelineDeps;
  readonly policy: LiveGeoPolicy;
  /** The Prometheus text of this core's registry. */
  metricsText(): Promise<string>;
  /**
   * Sets the seal state, zeroes every credential buffer, denies every Check with 503 sealed,
   * health → NOT_SERVING. True the first time; later calls do nothing and return false.
   */
  seal(reason: string): boolean;
}

export function createAuthzCore(deps: AuthzCoreDeps): AuthzCore {
  const { config, credentials, logger, metrics } = deps;
  const logDecisions = config.logDecisions;
  const sealState = deps.sealState ?? createSealState();
  // The policy in force: read once per Check, so a swap (GEO_POLICY_FILE replaced) is one assignment.
  const policy = deps.policy ?? new LiveGeoPolicy({ config, geo: deps.geo, geoSecondary: deps.geoSecondary, anonymizer: deps.anonymizer, metrics, logger });
  // The classification of the Check being evaluated, for its decision line. The pipeline calls
  // classifyGeo synchronously, before its first await, so right after evaluate() returns (a
  // Decision or a Promise) this holds that Check's result; undefined when geo did not run.
  let lastGeo: GeoResult | undefined;
  const pipeline: PipelineDeps = {
    classifyGeo: (ip) => {
      const v = policy.current.classify(ip);
      metrics.geoVerdict(v);
      lastGeo = v;
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
        if (err instanceof ReplicaWaitError) {
          metrics.redisError('nonce_replica_wait');
          logger.error({ err: String(err) }, 'nonce not confirmed by a replica: ingest denied 503');
          return;
        }
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
    isSealed: () => sealState.refuses(),
    // Ingest bodies Envoy may hold per client address between the header and the body phase.
    pendingBodies: createPendingBodies({ maxPerClient: config.ingestMaxPendingPerClient, ttlMs: config.requestBodyTimeoutMs, nowMs: () => deps.clock.nowMs() }),
    ...(config.anonymizer === undefined || deps.anonymizer === undefined ? {} : {
      anonymizer: {
        blocks: (ip, route) => policy.current.anonymizerBlocks?.(ip, route) === true,
        denial: geoDenial(config.geoNotice, config.geoBlockedByUrl, ANONYMIZER_REASON),
        onDenied: (route) => metrics.anonymizerDenied(route),
      },
    }),
    // SHADOW_*: a candidate geo policy, counted and logged where it disagrees (authz/shadow.ts).
    // With GEO_POLICY_FILE a shadow policy can come with any reload, so the hook is always there.
    ...shadowHooks(config.geoPolicyFile === undefined ? config : { shadow: true }, metrics, logger),
  };

  // What each decision line names it was made with: GEOIP_DB's build time (re-read per line, so a
  // reload shows at once; formatted once per database); the policy version is the input's (`decide`).
  let builtEpoch: number | undefined;
  let builtIso: string | null = null;
  // An anonymizer denial's line names the provider (GeoIP Anonymous Plus provider_name), looked up as the rule looked up the address.
  const anonDb = deps.anonymizer;
  const provider = anonDb?.provider === undefined ? undefined : (ip: string): string | undefined => {
    const key = anonymizerKey(ip);
    return key === '' ? undefined : anonDb.provider?.(key);
  };
  const decisionContext = (): DecisionContext => {
    const epoch = deps.geo.buildEpochSecs;
    if (epoch !== builtEpoch) {
      builtEpoch = epoch;
      builtIso = isoSeconds(epoch);
    }
    return provider === undefined ? { geoipBuilt: builtIso } : { geoipBuilt: builtIso, anonymizerProvider: provider };
  };

  const decide = (input: AuthzInput): Decision | Promise<Decision> => {
    lastGeo = undefined;
    input.policy = policy.current.version;
    const result = evaluate(input, pipeline);
    input.geo = lastGeo;
    return result;
  };
  const grpc = createGrpcServer({
    // The global bucket first, when this service is the global limiter (ratelimit/check-limit.ts).
    evaluate: deps.globalLimit === undefined ? decide : withGlobalLimit(deps.globalLimit, decide),
    observe: (input, d, startNs) => {
      const route = routeLabel(input);
      const seconds = Number(process.hrtime.bigint() - startNs) / 1e9;
      metrics.decision(route, d, seconds);
      // The decision log (LOG_DECISIONS; docs/operations.md "Decision log"): one info line per decision.
      if (shouldLogDecision(logDecisions, d)) logger.info(decisionLine(input, d, route, seconds, decisionContext()), DECISION_MSG);
    },
    onError: (where, err) => logger.error({ where, err: String(err) }, 'unexpected error: failed closed'),
    maxBodyBytes: Math.max(config.orderMaxBytes, config.ingestMaxBytes),
    ...(deps.grpcServices === undefined ? {} : { services: deps.grpcServices }),
    tracer: deps.tracer,
  });

  return {
    grpc,
    credentials,
    pipeline,
    policy,
    metricsText: () => metrics.registry.metrics(),
    seal(reason) {
      if (!sealState.set()) return false;
      credentials.zeroize();
      grpc.setServing(false);
      metrics.setSealed(true);
      logger.warn({ reason }, 'sealed: credentials zeroed, every Check now denied 503 sealed');
      return true;
    },
  };
}
