/**
 * Proto loading: one options constant, one loader.
 *
 * Envoy's API protos are not copied into this repository. They are loaded from
 * `@grpc/grpc-js-xds`, which ships envoy-api, xds, googleapis and protoc-gen-validate
 * under `deps/`. The gRPC health proto comes from `grpc-health-check`.
 */
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import * as protoLoader from '@grpc/proto-loader';
import { protoPath as healthProtoPath } from 'grpc-health-check';

const require = createRequire(import.meta.url);
const xdsRoot = dirname(require.resolve('@grpc/grpc-js-xds/package.json'));

/** Include directories inside the package that ships Envoy's API protos. */
export const PROTO_INCLUDE_DIRS: readonly string[] = [
  join(xdsRoot, 'deps/envoy-api'),
  join(xdsRoot, 'deps/xds'),
  join(xdsRoot, 'deps/googleapis'),
  join(xdsRoot, 'deps/protoc-gen-validate'),
];

/**
 * The one set of proto-loader options. `npm run gen:types` passes the same flags to
 * proto-loader-gen-types (see package.json), so generated types match runtime objects.
 * - keepCase: field names as in the .proto (`raw_body`, `denied_response`), as Envoy docs name them.
 * - longs/enums as String would corrupt the 451 status (notes/envoy.md §3): enums stay numbers.
 */
export const PROTO_LOADER_OPTIONS = {
  keepCase: true,
  longs: String,
  enums: Number,
  defaults: false,
  oneofs: true,
  includeDirs: [...PROTO_INCLUDE_DIRS],
} as const satisfies protoLoader.Options;

/** Proto files this service implements (paths relative to PROTO_INCLUDE_DIRS). */
export const SERVICE_PROTOS = [
  'envoy/service/auth/v3/external_auth.proto',
  'envoy/service/ratelimit/v3/rls.proto',
] as const;

/** Fully qualified names of the services served on AUTHZ_GRPC_PORT. */
export const SERVICE_NAMES = {
  authorization: 'envoy.service.auth.v3.Authorization',
  rateLimit: 'envoy.service.ratelimit.v3.RateLimitService',
  health: 'grpc.health.v1.Health',
} as const;

let cached: protoLoader.PackageDefinition | undefined;

/** Loads (once) the package definition holding Authorization, RateLimitService and Health. */
export function loadPackageDefinition(): protoLoader.PackageDefinition {
  cached ??= protoLoader.loadSync([...SERVICE_PROTOS, healthProtoPath], PROTO_LOADER_OPTIONS);
  return cached;
}
