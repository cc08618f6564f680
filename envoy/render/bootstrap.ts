/**
 * The bootstrap: node, admin, overload manager, and the static listeners and clusters (with
 * ENVOY_STATS_PORT, the stats listener and its admin cluster last: stats.ts).
 */
import { ENVOY_NON_HEAP_MB, type Config } from '../../authz/src/common/config.ts';
import { MAX_DOWNSTREAM_CONNECTIONS, MEMORY_ACTIONS } from './budget.ts';
import { clusters, rateLimitTokenSecrets } from './clusters.ts';
import { socketAddress, typedExtension, type JsonObject, type RenderOptions } from './common.ts';
import { ingestListener, listener } from './listener.ts';
import { TYPE_URL } from './names.ts';
import { adminCluster, statsListener } from './stats.ts';
import { tracingRuntime } from './tracing.ts';

// The connection cap and the memory actions' thresholds are part of Envoy's memory budget
// (budget.ts, with the descriptor cap and the container limit: one budget, tested).
export { MAX_DOWNSTREAM_CONNECTIONS, MEMORY_ACTIONS } from './budget.ts';
const MIB = 1_048_576;

/** The resource monitor the memory actions read: heap in use against ENVOY_MEMORY_LIMIT_MB minus ENVOY_NON_HEAP_MB. */
export const FIXED_HEAP_MONITOR = 'envoy.resource_monitors.fixed_heap';

/**
 * Streams are accounted for the bytes they buffer from 2^16 = 64 KiB up (Envoy's eight buckets:
 * 64 KiB … ≥ 8 MiB): an ingest or a full-size order body is tracked, so reset_high_memory_stream
 * can pick it; a read's few KiB are not.
 */
export const BUFFER_ACCOUNT_MIN_POWER_OF_TWO = 16;

/** The heap Envoy may use: the container's memory (ENVOY_MEMORY_LIMIT_MB) less what is not heap. */
export function maxHeapBytes(config: Config): number {
  return (config.envoyMemoryLimitMb - ENVOY_NON_HEAP_MB) * MIB;
}

/**
 * The overload manager: the cap on downstream connections, and memory actions against a fixed
 * heap bound, so that what clients make Envoy buffer ends in refused requests and reset streams,
 * never in the kernel's OOM kill of the container (docs/envoy.md "Bodies and memory").
 */
export function overloadManager(config: Config, opts: RenderOptions): JsonObject {
  const threshold = (value: number): JsonObject => ({ name: FIXED_HEAP_MONITOR, threshold: { value } });
  return {
    refresh_interval: '0.25s',
    resource_monitors: [
      typedExtension('envoy.resource_monitors.global_downstream_max_connections', TYPE_URL.connLimit, {
        max_active_downstream_connections: opts.maxDownstreamConnections ?? MAX_DOWNSTREAM_CONNECTIONS,
      }),
      typedExtension(FIXED_HEAP_MONITOR, TYPE_URL.fixedHeap, { max_heap_size_bytes: maxHeapBytes(config) }),
    ],
    actions: [
      { name: 'envoy.overload_actions.shrink_heap', triggers: [threshold(MEMORY_ACTIONS.shrinkHeap)] },
      {
        name: 'envoy.overload_actions.reset_high_memory_stream',
        triggers: [{
          name: FIXED_HEAP_MONITOR,
          scaled: { scaling_threshold: MEMORY_ACTIONS.resetStreams.scaling, saturation_threshold: MEMORY_ACTIONS.resetStreams.saturation },
        }],
      },
      { name: 'envoy.overload_actions.stop_accepting_requests', triggers: [threshold(MEMORY_ACTIONS.stopAccepting)] },
    ],
    buffer_factory_config: { minimum_account_to_track_power_of_two: BUFFER_ACCOUNT_MIN_POWER_OF_TWO },
  };
}

/** The whole bootstrap as a plain object (what the YAML encodes). */
export function buildBootstrap(config: Config, opts: RenderOptions): JsonObject {
  const ingest = ingestListener(config, opts);
  const stats = statsListener(config);
  const admin = adminCluster(config);
  const runtime = tracingRuntime(config);
  return {
    // Path-based SDS refuses to start without a node id and cluster.
    node: { id: opts.nodeId ?? 'edge-envoy', cluster: 'edge-trading-proxy' },
    // Admin (loopback) stays reachable when clients hold every connection the cap allows: /ready
    // probes and /stats during a flood.
    admin: { address: socketAddress('127.0.0.1', config.envoyAdminPort), ignore_global_conn_limit: true },
    overload_manager: overloadManager(config, opts),
    static_resources: {
      listeners: [listener(config, opts), ...(ingest === undefined ? [] : [ingest]), ...(stats === undefined ? [] : [stats])],
      clusters: [...clusters(config, opts), ...(admin === undefined ? [] : [admin])],
      ...(rateLimitTokenSecrets(config).length === 0 ? {} : { secrets: rateLimitTokenSecrets(config) }),
    },
    // OTEL_EXPORTER_OTLP_ENDPOINT only: the tracer's batch size (render/tracing.ts).
    ...(runtime === undefined ? {} : { layered_runtime: runtime }),
  };
}
