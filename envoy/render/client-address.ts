/**
 * The client address every later filter trusts: header_mutation writes it, the XFF guard (RBAC)
 * rejects requests whose X-Forwarded-For Envoy could not use.
 */
import type { Config } from '../../authz/src/common/config.ts';
import { EDGE_SET_HEADERS } from '../../authz/src/common/contract.ts';
import { overwriteHeader, typedExtension, type JsonObject, type TypedExtension } from './common.ts';
import { CLIENT_IP_HEADER, CLIENT_PORT_HEADER, FILTER, TYPE_URL, XFF_POLICY } from './names.ts';

const V4_MAPPED_AS_V4 = `%CEL(request.headers['${CLIENT_IP_HEADER}'].startsWith('::ffff:') && request.headers['${CLIENT_IP_HEADER}'].contains('.') `
  + `? request.headers['${CLIENT_IP_HEADER}'].substring(7) : request.headers['${CLIENT_IP_HEADER}'])%`;

/**
 * Overwrites `x-edge-client-ip` with the address Envoy computed (XFF_NUM_TRUSTED_HOPS), so a
 * client can never choose the address geo and rate limiting see, writing an IPv4-mapped address
 * (`::ffff:a.b.c.d`: Envoy prints every mapped form that way) as its IPv4, so both forms are one
 * client; with trusted hops, records in `x-edge-client-port` the port Envoy gave that address (0
 * when it came from X-Forwarded-For, see xffGuardFilter); removes every client-sent `x-envoy-*`
 * header so nobody can ask the router for retries or longer timeouts; removes every client-sent
 * header only the edge sets (EDGE_SET_HEADERS: x-edge-access, x-edge-jurisdiction, …); removes `expect`: Envoy
 * has already answered `100-continue` itself, and any other expectation would reach the
 * upstream, where Node answers 417 with no body (after authz had already accepted, and for an
 * ingest recorded, the request).
 */
export function headerMutationFilter(config: Config): TypedExtension {
  const overwrite = (key: string, value: string): JsonObject => ({ append: overwriteHeader(key, value) });
  return typedExtension(FILTER.headerMutation, TYPE_URL.headerMutation, {
    mutations: {
      request_mutations: [
        { remove_on_match: { key_matcher: { prefix: 'x-envoy-' } } },
        { remove: 'expect' },
        // Headers only the edge sets (x-edge-access, x-edge-jurisdiction, the order's x-edge-*):
        // a client's copy never reaches authz, the market service or the order backend.
        ...EDGE_SET_HEADERS.map((h) => ({ remove: h })),
        overwrite(CLIENT_IP_HEADER, '%DOWNSTREAM_REMOTE_ADDRESS_WITHOUT_PORT%'),
        ...(config.xffNumTrustedHops > 0 ? [overwrite(CLIENT_PORT_HEADER, '%DOWNSTREAM_REMOTE_PORT%')] : []),
        overwrite(CLIENT_IP_HEADER, V4_MAPPED_AS_V4),
      ],
      formatters: [typedExtension('envoy.formatter.cel', TYPE_URL.celFormatter, { cel_config: { enable_string_functions: true } })],
    },
  });
}

/** RBAC's stats: `http.edge.rbac.client_address.policy.malformed_xff.denied` counts the 400s. */
export const XFF_RBAC_STAT_PREFIX = 'client_address.';

export function xffMessage(hops: number): string {
  return `X-Forwarded-For must hold a bare IP address as its entry ${hops} from the right (XFF_NUM_TRUSTED_HOPS); the client address cannot be decided`;
}

/**
 * The client address a malformed X-Forwarded-For cannot fake (CONTRACT §6). With
 * XFF_NUM_TRUSTED_HOPS = N ≥ 1, Envoy takes the N-th entry from the right; when that entry is
 * missing or not a bare IP address (`1.2.3.4:80`, `[::1]`, `unknown`, empty, a trailing comma) it
 * silently falls back to the TCP peer: the proxy, which may be in GEO_TRUSTED_CIDRS and whose one
 * rate-limit bucket every such client would share. Envoy tells the two apart itself: an address
 * taken from X-Forwarded-For carries port 0 (`%DOWNSTREAM_REMOTE_PORT%`), the peer its real
 * port. So a request that sent X-Forwarded-For (skip_xff_append keeps the header as the client
 * sent it) and was given a non-zero port was not judged by that header: RBAC denies it before
 * the rate limiter, and a local-reply mapper makes that 400 `bad_request`. An entry with a zone
 * id (`fe80::1%eth0`) parses, but is no bare address either: denied too.
 */
export function xffGuardFilter(): TypedExtension {
  return typedExtension(FILTER.xffGuard, TYPE_URL.rbac, {
    rules_stat_prefix: XFF_RBAC_STAT_PREFIX,
    track_per_rule_stats: true,
    rules: {
      action: 'DENY',
      policies: {
        [XFF_POLICY]: {
          permissions: [{ any: true }],
          principals: [
            { and_ids: { ids: [
              { header: { name: 'x-forwarded-for', present_match: true } },
              { not_id: { header: { name: CLIENT_PORT_HEADER, string_match: { exact: '0' } } } },
            ] } },
            { header: { name: CLIENT_IP_HEADER, string_match: { contains: '%' } } },
          ],
        },
      },
    },
  });
}
