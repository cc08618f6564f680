/**
 * The bootstrap: node, admin, overload manager, and the static listener and clusters.
 */
import type { Config } from '../../authz/src/common/config.ts';
import { clusters } from './clusters.ts';
import { socketAddress, typedExtension, type JsonObject, type RenderOptions } from './common.ts';
import { listener } from './listener.ts';
import { TYPE_URL } from './names.ts';

/**
 * The overload manager's cap on downstream connections (all listeners, this Envoy). Sized to the
 * shipped Envoy container (256 MiB, deploy/k8s): measured on 1.40, an idle HTTP/2 connection holds
 * ~35 KB of Envoy heap, an idle HTTP/1.1 one ~16 KB, one that has sent nothing ~12 KB (for at
 * most FIRST_REQUEST_TIMEOUT_MS); 5,000 of the costliest is ~175 MB, leaving room for Envoy itself
 * and requests in flight. Past it Envoy closes new connections at accept
 * (`listener.edge.downstream_global_cx_overflow`). Behind a balancer (XFF_NUM_TRUSTED_HOPS ≥
 * 1) the edge sees the balancer's few pooled connections, not the clients'.
 */
export const MAX_DOWNSTREAM_CONNECTIONS = 5_000;

/** The whole bootstrap as a plain object (what the YAML encodes). */
export function buildBootstrap(config: Config, opts: RenderOptions): JsonObject {
  return {
    // Path-based SDS refuses to start without a node id and cluster.
    node: { id: opts.nodeId ?? 'edge-envoy', cluster: 'edge-trading-proxy' },
    // Admin (loopback) stays reachable when clients hold every connection the cap allows: /ready
    // probes and /stats during a flood.
    admin: { address: socketAddress('127.0.0.1', config.envoyAdminPort), ignore_global_conn_limit: true },
    overload_manager: {
      resource_monitors: [typedExtension('envoy.resource_monitors.global_downstream_max_connections', TYPE_URL.connLimit, {
        max_active_downstream_connections: opts.maxDownstreamConnections ?? MAX_DOWNSTREAM_CONNECTIONS,
      })],
    },
    static_resources: {
      listeners: [listener(config, opts)],
      clusters: clusters(config, opts),
    },
  };
}
