/**
 * Anonymizer stage (ANONYMIZER_DB, ANONYMIZER_FLAGS, ANONYMIZER_POLICY; docs/api.md
 * "Anonymizers"): after geo, an address the anonymizer database flags (a VPN, a public proxy, a
 * Tor exit, …) is refused on the routes whose policy says `block`, with the same uniform 451
 * notice as a blocked country, so the answer never tells a VPN from a jurisdiction. Trusted
 * addresses (GEO_TRUSTED_CIDRS) are not looked up. Without ANONYMIZER_DB there is no stage at all.
 */
import type { RouteKind } from '../../common/contract.ts';
import type { AnonymizerLookup } from '../../common/ports.ts';
import type { GeoResult } from './geo.ts';
import { embeddedIpv4, normalizeIp } from '../../common/ip.ts';

export type AnonymizerAction = 'block' | 'allow';

export interface AnonymizerPolicy {
  /** The flags that count (bit set, adapters/anonymizer.ts flagBits). */
  readonly flagMask: number;
  /** What a flagged address gets on each route. */
  readonly actions: Readonly<Record<RouteKind, AnonymizerAction>>;
}

/** Whether `rawIp` is refused on `route`: a route that allows anonymizers does no lookup. */
export type AnonymizerCheck = (rawIp: string, route: RouteKind) => boolean;

/** The address an anonymizer database is asked about: an embedded IPv4 (6to4, NAT64, SIIT, Teredo) as that IPv4, as geo does; '' when not an address. */
export function anonymizerKey(rawIp: string): string {
  const ip = normalizeIp(rawIp);
  return ip.includes(':') ? (embeddedIpv4(ip)?.ipv4 ?? ip) : ip;
}

/** Builds the check once at start-up. */
export function createAnonymizerCheck(policy: AnonymizerPolicy, db: AnonymizerLookup): AnonymizerCheck {
  const { flagMask, actions } = policy;
  return (rawIp, route) => {
    if (actions[route] !== 'block') return false;
    const key = anonymizerKey(rawIp);
    return key !== '' && (db.flags(key) & flagMask) !== 0;
  };
}

/**
 * GET /v1/geoblock's classification with the anonymizer rule folded in: an address the rule
 * refuses orders is answered `blocked` (country and region as the GeoIP database says), since
 * that is what a trader asks; the rule's other routes do not change the answer. Trusted and
 * already blocked addresses are left as they are. Without the rule, `classify` itself.
 */
export function withAnonymizer(classify: (rawIp: string) => GeoResult, blocks: AnonymizerCheck | undefined): (rawIp: string) => GeoResult {
  if (blocks === undefined) return classify;
  const asBlocked = new WeakMap<GeoResult, GeoResult>();
  return (rawIp) => {
    const geo = classify(rawIp);
    if (geo.verdict === 'trusted' || geo.access === 'blocked' || !blocks(rawIp, 'order')) return geo;
    let b = asBlocked.get(geo);
    if (b === undefined) {
      b = Object.freeze({ ...geo, access: 'blocked' as const, orderHeaders: [] });
      asBlocked.set(geo, b);
    }
    return b;
  };
}
