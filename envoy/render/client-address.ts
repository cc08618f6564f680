/**
 * The client address every later filter trusts: header_mutation writes it, the XFF guard (RBAC)
 * rejects requests whose X-Forwarded-For Envoy could not use.
 */
import type { Config } from '../../authz/src/common/config.ts';
import { EDGE_SET_HEADERS } from '../../authz/src/common/contract.ts';
import { MAPPED_PREFIX } from '../../authz/src/common/ip.ts';
import { overwriteHeader, typedExtension, type JsonObject, type TypedExtension } from './common.ts';
import { CLIENT_IP_HEADER, CLIENT_PORT_HEADER, FILTER, TYPE_URL, XFF_POLICY } from './names.ts';

/**
 * x-edge-client-ip's IPv4-mapped address (`::ffff:a.b.c.d`, as Envoy prints every mapped form:
 * common/ip.ts MAPPED_PREFIX) as its IPv4, the rule common/ip.ts normalizeIp applies to the
 * addresses Envoy prints (tested together in authz/test/ip-module.test.ts).
 */
export const V4_MAPPED_AS_V4 = `%CEL(request.headers['${CLIENT_IP_HEADER}'].startsWith('${MAPPED_PREFIX}') && request.headers['${CLIENT_IP_HEADER}'].contains('.') `
  + `? request.headers['${CLIENT_IP_HEADER}'].substring(${MAPPED_PREFIX.length}) : request.headers['${CLIENT_IP_HEADER}'])%`;

/**
 * Overwrites `x-edge-client-ip` with the address Envoy computed (XFF_NUM_TRUSTED_HOPS), so a
 * client can never choose the address geo and rate limiting see, writing an IPv4-mapped address
 * (`::ffff:a.b.c.d`: Envoy prints every mapped form that way) as its IPv4, so both forms are one
 * client; with trusted hops, records in `x-edge-client-port` the port Envoy gave that address (0
 * when it came from X-Forwarded-For, see xffGuardFilter), and the TCP peer and its port instead
 * when the trusted entry carries a zone id (ifZoneId); removes every client-sent `x-envoy-*`
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
        ...(config.xffNumTrustedHops > 0 ? [
          overwrite(CLIENT_PORT_HEADER, '%DOWNSTREAM_REMOTE_PORT%'),
          // A trusted entry with a zone id is the TCP peer, with its port, as when Envoy cannot parse it.
          overwrite(TCP_PEER.ip, '%DOWNSTREAM_DIRECT_REMOTE_ADDRESS_WITHOUT_PORT%'),
          overwrite(TCP_PEER.port, '%DOWNSTREAM_DIRECT_REMOTE_PORT%'),
          overwrite(CLIENT_IP_HEADER, ifZoneId(config.xffNumTrustedHops, TCP_PEER.ip, CLIENT_IP_HEADER)),
          overwrite(CLIENT_PORT_HEADER, ifZoneId(config.xffNumTrustedHops, TCP_PEER.port, CLIENT_PORT_HEADER)),
          { remove: TCP_PEER.ip },
          { remove: TCP_PEER.port },
        ] : []),
        overwrite(CLIENT_IP_HEADER, V4_MAPPED_AS_V4),
      ],
      formatters: [typedExtension('envoy.formatter.cel', TYPE_URL.celFormatter, { cel_config: { enable_string_functions: true } })],
    },
  });
}

/**
 * Scratch headers inside header_mutation only: the TCP peer and its port, for ifZoneId's CEL
 * (which sees only Envoy's XFF-derived `source.*`). Written and removed by the same filter, so a
 * client-sent copy is overwritten and none reaches a later filter or an upstream.
 */
const TCP_PEER = { ip: 'x-edge-tcp-peer', port: 'x-edge-tcp-peer-port' } as const;

/**
 * `%CEL(…)%`: header `then` when the X-Forwarded-For entry `hops` from the right (the one Envoy
 * takes) holds a `%`, i.e. a zone id in any spelling (`%0`, `%25eth0`, `%eth0`, inside
 * brackets…); else header `otherwise`. Why: Envoy 1.40 parses `2001:db8::1%0` as `2001:db8::1`
 * (a zero scope id is dropped), so such a request would be judged, and charged to the rate
 * limit, as an address of the sender's choosing; as the TCP peer with its port it is what an
 * entry Envoy cannot parse is: the XFF guard refuses it, after the peer's bucket paid for it.
 * (An IPv6 peer's bucket is the /64 of Envoy's address, which here is the entry's: docs/envoy.md §2.)
 * The entry is found with split, not a regex: the RE2 program of `(?:,[^,]*){N}` outgrows CEL's
 * size limit from XFF_NUM_TRUSTED_HOPS = 9. `\x25` is CEL's escape for `%`, which would end the
 * formatter command.
 */
function ifZoneId(hops: number, then: string, otherwise: string): string {
  const xff = "request.headers['x-forwarded-for']";
  const entries = `${xff}.split(',')`;
  return `%CEL('x-forwarded-for' in request.headers && size(${entries}) >= ${hops} && ${entries}[size(${entries}) - ${hops}].contains('\\x25') `
    + `? request.headers['${then}'] : request.headers['${otherwise}'])%`;
}

/** RBAC's stats: `http.edge.rbac.client_address.policy.malformed_xff.denied` counts the 400s. */
export const XFF_RBAC_STAT_PREFIX = 'client_address.';

export function xffMessage(hops: number): string {
  return `X-Forwarded-For must hold a bare IP address as its entry ${hops} from the right (XFF_NUM_TRUSTED_HOPS); the client address cannot be decided`;
}

/**
 * The client address a malformed X-Forwarded-For cannot fake (docs/api.md "Client address, geo and rate limit"). With
 * XFF_NUM_TRUSTED_HOPS = N ≥ 1, Envoy takes the N-th entry from the right; when that entry is
 * missing or not a bare IP address (`1.2.3.4:80`, `[::1]`, `unknown`, empty, a trailing comma) it
 * silently falls back to the TCP peer: the proxy, which may be in GEO_TRUSTED_CIDRS and whose one
 * rate-limit bucket every such client would share. Envoy tells the two apart itself: an address
 * taken from X-Forwarded-For carries port 0 (`%DOWNSTREAM_REMOTE_PORT%`), the peer its real
 * port. So a request that sent X-Forwarded-For (skip_xff_append keeps the header as the client
 * sent it) and was given a non-zero port was not judged by that header: RBAC denies it, and a
 * local-reply mapper makes that 400 `bad_request`. An entry with a zone id (`fe80::1%eth0`,
 * `2001:db8::1%0`) may parse, but is no bare address either: header_mutation gives it the peer's
 * address and port (ifZoneId), so it is denied the same way. The guard runs after the local rate
 * limiter, so each refusal takes a token from the TCP peer's bucket (the address every such
 * request is judged by): a flood of malformed entries meets 429 after RATE_BURST, like any other.
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
          ],
        },
      },
    },
  });
}
