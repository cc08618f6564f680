/**
 * The stats listener (ENVOY_STATS_PORT): Prometheus reads Envoy's `/stats/prometheus` without
 * reaching Envoy's admin interface, which stays on loopback because it also serves
 * `/quitquitquit`, `/drain_listeners`, `/config_dump`, `/runtime_modify` and the rest.
 *
 *   listener 0.0.0.0:ENVOY_STATS_PORT (its own HCM: no rate limit, no ext_authz, no access log)
 *     GET /stats/prometheus (any query)  → cluster `envoy_admin` = 127.0.0.1:ENVOY_ADMIN_PORT
 *     anything else                      → 404 `not_found` JSON (Envoy's direct response)
 *
 * The path is matched after Envoy's normalisation (`/stats/./prometheus` and `//stats/prometheus`
 * are the same path; `/stats/prometheus/../../quitquitquit` is `/quitquitquit`, hence 404), and
 * escaped slashes are refused as on the client listeners. docs/envoy.md "Stats listener".
 */
import type { Config } from '../../authz/src/common/config.ts';
import { ERROR_STATUS } from '../../authz/src/common/errors.ts';
import { duration, socketAddress, typedExtension, type JsonObject } from './common.ts';
import { DOWNSTREAM_CONNECTION_OPTIONS, firstRequestDeadline, REQUEST_HYGIENE } from './listener.ts';
import { localReplyConfig } from './local-replies.ts';
import { CLUSTER, FILTER, STATS_LISTENER, STATS_PATH, TYPE_URL } from './names.ts';

/** The names of the stats listener's two routes. */
export const STATS_ROUTE = { prometheus: 'stats_prometheus', notFound: 'stats_not_found' } as const;

/** A scrape that takes longer than this is answered 504 (Prometheus' own scrape timeout is 10 s). */
const STATS_ROUTE_TIMEOUT_MS = 10_000;

/** The stats listener's HttpConnectionManager: the one route to the admin, 404 JSON for the rest. */
function statsConnectionManager(config: Config): JsonObject {
  return typedExtension(FILTER.hcm, TYPE_URL.hcm, {
    stat_prefix: STATS_LISTENER,
    codec_type: 'AUTO',
    ...REQUEST_HYGIENE,
    request_timeout: duration(STATS_ROUTE_TIMEOUT_MS),
    common_http_protocol_options: { ...DOWNSTREAM_CONNECTION_OPTIONS },
    // The same error JSON as the client listeners (404 not_found, 503 service_unavailable, …).
    local_reply_config: localReplyConfig(config),
    route_config: {
      name: STATS_LISTENER,
      virtual_hosts: [{
        name: STATS_LISTENER,
        domains: ['*'],
        routes: [
          {
            name: STATS_ROUTE.prometheus,
            match: { path: STATS_PATH, headers: [{ name: ':method', string_match: { exact: 'GET' } }] },
            route: { cluster: CLUSTER.envoyAdmin, timeout: duration(STATS_ROUTE_TIMEOUT_MS) },
          },
          // No body: the local-reply mappers write the 404 JSON.
          { name: STATS_ROUTE.notFound, match: { prefix: '/' }, direct_response: { status: ERROR_STATUS.not_found } },
        ],
      }],
    },
    http_filters: [typedExtension(FILTER.router, TYPE_URL.router, { suppress_envoy_headers: true })],
  });
}

/** The stats listener, or undefined without ENVOY_STATS_PORT. */
export function statsListener(config: Config): JsonObject | undefined {
  if (config.envoyStatsPort === undefined) return undefined;
  return {
    name: STATS_LISTENER,
    stat_prefix: STATS_LISTENER,
    address: socketAddress('0.0.0.0', config.envoyStatsPort),
    // Like the admin interface: scrapes go on while clients hold every connection the overload
    // manager's cap allows (the NetworkPolicy admits only the monitoring namespace to this port).
    ignore_global_conn_limit: true,
    per_connection_buffer_limit_bytes: 32_768,
    ...firstRequestDeadline(),
    filter_chains: [{ filters: [statsConnectionManager(config)] }],
  };
}

/** Envoy's own admin interface on loopback, the stats route's upstream; undefined without ENVOY_STATS_PORT. */
export function adminCluster(config: Config): JsonObject | undefined {
  if (config.envoyStatsPort === undefined) return undefined;
  return {
    name: CLUSTER.envoyAdmin,
    type: 'STATIC',
    connect_timeout: '1s',
    load_assignment: {
      cluster_name: CLUSTER.envoyAdmin,
      endpoints: [{ lb_endpoints: [{ endpoint: { address: socketAddress('127.0.0.1', config.envoyAdminPort) } }] }],
    },
  };
}
