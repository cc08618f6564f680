/**
 * The gRPC server on AUTHZ_GRPC_PORT: ext_authz Check, the services registered beside it (the
 * global rate limit's RateLimitService, authz/src/ratelimit/service.ts), grpc.health.v1 and
 * server reflection (so `grpcurl -plaintext host:port list|describe` works).
 *
 * Check is registered with its own (de)serializers: requests are decoded lean straight
 * into AuthzInput (authz/codec/request.ts) and responses are cached encodings of shared
 * Decision constants (authz/codec/response.ts), a denial with the request's id spliced into its
 * body. Reflection still describes the real protos.
 */
import * as grpc from '@grpc/grpc-js';
import type { MethodDefinition, ServiceDefinition } from '@grpc/proto-loader';
import { ReflectionService } from '@grpc/reflection';
import { HealthImplementation } from 'grpc-health-check';
import { loadPackageDefinition, PROTO_INCLUDE_DIRS, SERVICE_NAMES } from '../../../proto/index.ts';
import { reflectionPackage } from '../../../proto/reflection.ts';
import { protoPath as healthProtoPath } from 'grpc-health-check';
import { deny, type Decision } from './decision.ts';
import { decodeCheckRequest, type AuthzInput } from './codec/request.ts';
import { encodeDecision, type Serialize } from './codec/response.ts';
import type { GrpcServiceRegistration } from '../ratelimit/service.ts';
import type { CheckTracer } from './tracing.ts';

/**
 * The grpc.health.v1 service name a liveness probe asks: SERVING for as long as the process
 * answers at all, sealed or not (a sealed process is alive and must not be restarted in a loop:
 * it stays sealed, NOT_SERVING for '' and Check, until an operator unseals it; docs/operations.md).
 */
export const LIVENESS_SERVICE = 'edge.liveness';

/** The ext_authz .proto file (relative to PROTO_INCLUDE_DIRS), for reflection. */
const AUTHORIZATION_PROTO = 'envoy/service/auth/v3/external_auth.proto';

/** Any unexpected failure inside Check: deny 503, never an allow. */
export const INTERNAL_DENY = deny('service_unavailable', 'internal error; the request was not accepted');

export interface GrpcDeps {
  /** The decision for one request (pipeline.evaluate bound to its deps). */
  readonly evaluate: (input: AuthzInput) => Decision | Promise<Decision>;
  /** Observes each decision (metrics, logs). Must not throw. */
  readonly observe: (input: AuthzInput, d: Decision, startNs: bigint) => void;
  readonly onError: (where: string, err: unknown) => void;
  /**
   * Largest request body Envoy may send in a Check (the larger of ORDER_MAX_BYTES and
   * INGEST_MAX_BYTES); the receive limit is this plus room for headers and framing, so a body
   * Envoy accepted is never refused here (which would turn a 413-sized request into a 503).
   */
  readonly maxBodyBytes?: number;
  /** Services served beside Check on the same port (health and reflection cover them). */
  readonly services?: readonly GrpcServiceRegistration[];
  /** One span per Check (OTEL_EXPORTER_OTLP_ENDPOINT; authz/tracing.ts); undefined: no tracing. */
  readonly tracer?: CheckTracer | undefined;
}

export interface AuthzGrpcServer {
  readonly server: grpc.Server;
  readonly health: HealthImplementation;
  setServing(serving: boolean): void;
  listen(host: string, port: number): Promise<number>;
  /** Also listen on a Unix socket (AUTHZ_GRPC_SOCKET). */
  listenSocket(path: string): Promise<void>;
  /** Graceful: stops accepting, lets in-flight calls finish, forces after `graceMs`. */
  close(graceMs: number): Promise<void>;
}

export function createGrpcServer(deps: GrpcDeps): AuthzGrpcServer {
  const pd = loadPackageDefinition();
  const authzDef = pd[SERVICE_NAMES.authorization] as ServiceDefinition;
  const checkDef = authzDef['Check'] as MethodDefinition<object, object>;
  const serialize: Serialize = checkDef.responseSerialize as Serialize;

  const leanService = {
    Check: {
      ...checkDef,
      requestDeserialize: decodeCheckRequest,
      // An allow goes as its Decision (cached bytes); a denial is encoded in Check, with its request id.
      responseSerialize: (r: Decision | Buffer) => (Buffer.isBuffer(r) ? r : encodeDecision(r, serialize)),
    },
  } as unknown as grpc.ServiceDefinition;

  /** Runs the decision for `input` and hands it to `done`: any throw or rejection is INTERNAL_DENY. */
  const decide = (input: AuthzInput, done: (d: Decision) => void): void => {
    let result: Decision | Promise<Decision>;
    try {
      result = deps.evaluate(input);
    } catch (err) {
      deps.onError('check', err);
      done(INTERNAL_DENY);
      return;
    }
    if (result instanceof Promise) {
      result.then(done, (err: unknown) => {
        deps.onError('check', err);
        done(INTERNAL_DENY);
      });
    } else {
      done(result);
    }
  };
  const reply = (input: AuthzInput, d: Decision): Decision | Buffer => (d.allow ? d : encodeDecision(d, serialize, input.requestId));

  const check: grpc.handleUnaryCall<AuthzInput, Decision | Buffer> = (call, callback) => {
    const start = process.hrtime.bigint();
    const input = call.request;
    decide(input, (d) => {
      deps.observe(input, d, start);
      callback(null, reply(input, d));
    });
  };
  // With traces on (OTEL_EXPORTER_OTLP_ENDPOINT) a handler of its own, so the one without costs
  // nothing per Check: the span starts before the decision and ends with it (authz/tracing.ts).
  const tracer = deps.tracer;
  const tracedCheck: grpc.handleUnaryCall<AuthzInput, Decision | Buffer> | undefined = tracer === undefined ? undefined : (call, callback) => {
    const start = process.hrtime.bigint();
    const input = call.request;
    const span = tracer.start(call.metadata, input);
    decide(input, (d) => {
      deps.observe(input, d, start);
      callback(null, reply(input, d));
      // After the answer, and never able to hold it up or crash the process.
      try {
        span.end(input, d);
      } catch (err) {
        deps.onError('trace', err);
      }
    });
  };

  const server = new grpc.Server({
    'grpc.max_receive_message_length': Math.max(16 * 1_048_576, (deps.maxBodyBytes ?? 0) + 1_048_576),
    'grpc.keepalive_permit_without_calls': 1,
  });
  // Envoy resets (RST_STREAM) a Check stream whenever it gives up on it (client gone, deadline
  // passed). Node's HTTP/2 rapid-reset protection (CVE-2023-44487; default burst 1000, 33/s)
  // then closes the whole connection, failing every Check multiplexed on it (measured: ~1 % of
  // requests 503 at 2,500/s when every stream was reset). A burst of client disconnects can do
  // the same, and only Envoy connects to this port, so the limit is raised well above any
  // request rate. grpc-js has no option for it; its http2 server options object (a private
  // field) is extended before bind, and start-up fails if grpc-js no longer has that field,
  // rather than silently running with Node's limit.
  const h2opts = (server as unknown as { commonServerOptions?: Record<string, unknown> }).commonServerOptions;
  if (typeof h2opts !== 'object' || h2opts === null) {
    throw new Error('@grpc/grpc-js no longer has Server.commonServerOptions: the HTTP/2 stream-reset limit cannot be raised (see authz/grpc-server.ts)');
  }
  h2opts['streamResetBurst'] = 1_000_000;
  h2opts['streamResetRate'] = 1_000_000;
  server.addService(leanService, { Check: tracedCheck ?? check });
  const extra = deps.services ?? [];
  for (const svc of extra) server.addService(svc.definition, svc.implementation);
  const health = new HealthImplementation({
    [LIVENESS_SERVICE]: 'SERVING',
    '': 'NOT_SERVING',
    [SERVICE_NAMES.authorization]: 'NOT_SERVING',
    ...Object.fromEntries(extra.map((svc) => [svc.name, 'NOT_SERVING'])),
  });
  health.addToServer(server);
  // Descriptors per original .proto file with qualified names (see proto/reflection.ts), of the
  // services this server serves (a service not registered is not listed either).
  new ReflectionService(reflectionPackage([AUTHORIZATION_PROTO, ...extra.map((svc) => svc.proto), healthProtoPath], PROTO_INCLUDE_DIRS) as never).addToServer(server);

  return {
    server,
    health,
    setServing(serving) {
      const s = serving ? 'SERVING' : 'NOT_SERVING';
      for (const name of ['', SERVICE_NAMES.authorization]) health.setStatus(name, s);
      for (const svc of extra) health.setStatus(svc.name, serving && svc.available ? 'SERVING' : 'NOT_SERVING');
    },
    listen(host, port) {
      return new Promise((resolve, reject) => {
        const addr = host.includes(':') ? `[${host}]:${port}` : `${host}:${port}`;
        server.bindAsync(addr, grpc.ServerCredentials.createInsecure(), (err, bound) => (err ? reject(err) : resolve(bound)));
      });
    },
    listenSocket(path) {
      return new Promise((resolve, reject) => {
        server.bindAsync(`unix:${path}`, grpc.ServerCredentials.createInsecure(), (err) => (err ? reject(err) : resolve()));
      });
    },
    close(graceMs) {
      return new Promise((resolve) => {
        const timer = setTimeout(() => {
          server.forceShutdown();
          resolve();
        }, graceMs);
        timer.unref();
        server.tryShutdown(() => {
          clearTimeout(timer);
          resolve();
        });
      });
    },
  };
}
