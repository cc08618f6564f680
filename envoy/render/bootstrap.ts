/**
 * The bootstrap: node, admin, overload manager, and the static listener and clusters.
 */
import type { Config } from '../../authz/src/common/config.ts';
import { clusters, rateLimitTokenSecrets } from './clusters.ts';
import { socketAddress, typedExtension, type JsonObject, type RenderOptions } from './common.ts';
import { listener } from './listener.ts';
import { TYPE_URL } from './names.ts';

/** The whole bootstrap as a plain object (what the YAML encodes). */
export function buildBootstrap(config: Config, opts: RenderOptions): JsonObject {
  return {
    // Path-based SDS refuses to start without a node id and cluster.
    node: { id: opts.nodeId ?? 'edge-envoy', cluster: 'edge-trading-proxy' },
    admin: { address: socketAddress('127.0.0.1', config.envoyAdminPort) },
    overload_manager: {
      resource_monitors: [typedExtension('envoy.resource_monitors.global_downstream_max_connections', TYPE_URL.connLimit, {
        max_active_downstream_connections: opts.maxDownstreamConnections ?? 100_000,
      })],
    },
    static_resources: {
      listeners: [listener(config, opts)],
      clusters: clusters(config, opts),
      ...(rateLimitTokenSecrets(config).length === 0 ? {} : { secrets: rateLimitTokenSecrets(config) }),
    },
  };
}
