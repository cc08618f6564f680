/**
 * Geo stage (every route but /v1/geoblock): trusted CIDRs → database lookup → jurisdiction tier
 * (block / close-only / full, a region rule overriding its country's) → unknown-address policy.
 * Pure apart from the injected GeoLookup. docs/api.md "Jurisdiction tiers" is the contract.
 */
import type { Decision, Header } from '../decision.ts';
import type { GeoLookup, GeoRecord } from '../../common/ports.ts';
import { ACCESS_RANK, HEADER, JURISDICTION_NONE, type Access } from '../../common/contract.ts';
import type { GeoRegionUnknown, GeoUnknown } from '../../common/config/types.ts';
import { RE } from '../../common/rules.ts';
import { cidrMatcher, embeddedIpv4, normalizeIp } from '../../common/ip.ts';

/**
 * The tier rules a classification applies: the enforced policy's, or a shadow policy's. The
 * config's TierPolicy with the close-only tier and GEO_REGION_UNKNOWN optional (none; `strictest`).
 */
export interface TierRules {
  readonly blockedCountries: ReadonlySet<string>;
  readonly blockedRegions: ReadonlySet<string>;
  /** CLOSE_ONLY_COUNTRIES / CLOSE_ONLY_REGIONS (none when absent). */
  readonly closeOnlyCountries?: ReadonlySet<string>;
  readonly closeOnlyRegions?: ReadonlySet<string>;
  readonly geoUnknown: GeoUnknown;
  /** GEO_REGION_UNKNOWN (SHADOW_GEO_REGION_UNKNOWN for a shadow policy); `strictest` when absent. */
  readonly geoRegionUnknown?: GeoRegionUnknown | undefined;
}

/** The enforced tier rules with what only the enforced policy has. */
export interface GeoPolicy extends TierRules {
  readonly geoTrustedCidrs: readonly string[];
  /** A shadow policy's tiers (SHADOW_*): classified beside, never enforced. */
  readonly shadow?: TierRules | undefined;
  /**
   * The policy's version (GEO_POLICY_FILE's `version`, or `env-…` for the settings): every result
   * carries it, and an allowed order's headers carry it as x-edge-policy. Absent: neither does.
   */
  readonly version?: string | undefined;
}

/**
 * How an address was classified (the `verdict` label of edge_geo_verdicts_total; a fixed set).
 * `allowed` is full access; `*_region` means a region rule decided, `*_country` the country's.
 */
export type GeoVerdict =
  | 'trusted' | 'allowed'
  | 'blocked_country' | 'blocked_region'
  | 'close_only_country' | 'close_only_region'
  | 'unknown_blocked' | 'unknown_close_only' | 'unknown_allowed'
  | 'unknown_region';

/** One classification. Shared, frozen objects: the classifier never builds one per request. */
export interface GeoResult {
  readonly verdict: GeoVerdict;
  readonly access: Access;
  /**
   * The ISO country whose tier applied: where the client is, or the record's represented country
   * when its tier is stricter; null when there is none or the address was not looked up (trusted).
   */
  readonly country: string | null;
  /** The region whose rule applied, else the record's first subdivision (`CA-ON`), else null. */
  readonly region: string | null;
  /** x-edge-jurisdiction: the region whose rule applied, else the country, else JURISDICTION_NONE. */
  readonly jurisdiction: string;
  /**
   * The x-edge-access and x-edge-jurisdiction headers an allowed order carries to the backend;
   * empty when blocked. One array per (access, jurisdiction), shared.
   */
  readonly orderHeaders: readonly Header[];
  /** The version of the policy that classified it (GeoPolicy.version), when it has one. */
  readonly policy?: string;
  /** With a shadow policy configured: the same address under the shadow policy (never enforced). */
  readonly shadow?: GeoResult;
}

/** Re-exported: the one parser of client addresses is common/ip.ts. */
export { normalizeIp };

/** Most jurisdictions header arrays are kept for (~250 countries plus the regions databases name). */
const HEADER_CACHE_MAX = 4096;
const headerCache = new Map<string, readonly Header[]>();
const NO_HEADERS: readonly Header[] = [];

function orderHeaders(access: Access, jurisdiction: string, policy: string | undefined): readonly Header[] {
  if (access === 'blocked') return NO_HEADERS;
  const key = `${access}|${jurisdiction}|${policy ?? ''}`;
  let h = headerCache.get(key);
  if (h === undefined) {
    // Plain arrays, not frozen: serializing an order allow iterates them, and V8 iterates frozen
    // arrays markedly slower (measured: +2 µs per order). Shared, so never mutated.
    h = policy === undefined
      ? [[HEADER.access, access], [HEADER.jurisdiction, jurisdiction]]
      : [[HEADER.access, access], [HEADER.jurisdiction, jurisdiction], [HEADER.policy, policy]];
    // Bounded: a database names at most a few thousand jurisdictions; cleared, never grown past.
    if (headerCache.size >= HEADER_CACHE_MAX) headerCache.clear();
    headerCache.set(key, h);
  }
  return h;
}

/** A frozen GeoResult (built at start-up or once per database record, never per request). */
export function geoResult(verdict: GeoVerdict, access: Access, country: string | null, region: string | null, jurisdiction: string, policy?: string): GeoResult {
  const headers = orderHeaders(access, jurisdiction, policy);
  return Object.freeze(policy === undefined
    ? { verdict, access, country, region, jurisdiction, orderHeaders: headers }
    : { verdict, access, country, region, jurisdiction, orderHeaders: headers, policy });
}

/** A trusted address's classification (GEO_TRUSTED_CIDRS): full access, no jurisdiction determined. */
export const GEO_TRUSTED: GeoResult = geoResult('trusted', 'full', null, null, JURISDICTION_NONE);

const NO_CODES: ReadonlySet<string> = new Set<string>();

/** The results of one set of tier rules: for an unknown address, and for a country and its regions. */
interface TierResolver {
  readonly unknown: GeoResult;
  /** The tier of a located record (`regions` empty: no subdivision, GEO_REGION_UNKNOWN may apply). */
  resolve(country: string, regions: readonly string[]): GeoResult;
  /** The country's own tier, no region rule considered (a represented country). */
  countryTier(country: string): GeoResult;
}

/** The ISO 3166-1 country of an ISO 3166-2 code (`US-NV` → `US`). */
function countryOfRegion(region: string): string {
  return region.slice(0, region.indexOf('-'));
}

/**
 * For each country that has a region rule (enforced or, given a shadow policy's rules, shadow):
 * the tier its records without a subdivision get under GEO_REGION_UNKNOWN: `strictest`, the most
 * restrictive of its region rules' tiers and its own; `country`, its own. Logged at start.
 */
export function regionUnknownTiers(rules: TierRules): Record<string, Access> {
  const closeOnlyRegions = rules.closeOnlyRegions ?? NO_CODES;
  const own = (cc: string): Access => (rules.blockedCountries.has(cc) ? 'blocked' : (rules.closeOnlyCountries ?? NO_CODES).has(cc) ? 'close-only' : 'full');
  const strictest = (rules.geoRegionUnknown ?? 'strictest') === 'strictest';
  const regionTier = new Map<string, Access>();
  for (const r of closeOnlyRegions) regionTier.set(countryOfRegion(r), 'close-only');
  for (const r of rules.blockedRegions) regionTier.set(countryOfRegion(r), 'blocked');
  const out: Record<string, Access> = {};
  for (const [cc, tier] of [...regionTier].sort(([a], [b]) => (a < b ? -1 : 1))) {
    out[cc] = strictest && ACCESS_RANK[tier] > ACCESS_RANK[own(cc)] ? tier : own(cc);
  }
  return out;
}

function tierResolver(rules: TierRules, version?: string): TierResolver {
  const { blockedCountries, blockedRegions } = rules;
  const closeOnlyCountries = rules.closeOnlyCountries ?? NO_CODES;
  const closeOnlyRegions = rules.closeOnlyRegions ?? NO_CODES;
  const anyRegionRule = blockedRegions.size > 0 || closeOnlyRegions.size > 0;
  const result = (verdict: GeoVerdict, access: Access, country: string | null, region: string | null, jurisdiction: string): GeoResult =>
    geoResult(verdict, access, country, region, jurisdiction, version);
  const unknown = rules.geoUnknown === 'allow'
    ? result('unknown_allowed', 'full', null, null, JURISDICTION_NONE)
    : rules.geoUnknown === 'close-only'
      ? result('unknown_close_only', 'close-only', null, null, JURISDICTION_NONE)
      : result('unknown_blocked', 'blocked', null, null, JURISDICTION_NONE);
  const countryTier = (country: string, first: string | null): GeoResult => {
    if (blockedCountries.has(country)) return result('blocked_country', 'blocked', country, first, country);
    if (closeOnlyCountries.has(country)) return result('close_only_country', 'close-only', country, first, country);
    return result('allowed', 'full', country, first, country);
  };
  // Precomputed once: for each country that has a region rule, what a record of it without a
  // subdivision gets (GEO_REGION_UNKNOWN), counted as `unknown_region`, region null.
  const regionUnknown = new Map<string, GeoResult>();
  for (const [cc, access] of Object.entries(regionUnknownTiers(rules))) regionUnknown.set(cc, result('unknown_region', access, cc, null, cc));
  return {
    unknown,
    /** The tier of one record: a region rule (block before close-only) overrides the country's rule. */
    resolve(country, regions) {
      if (regions.length === 0) return regionUnknown.get(country) ?? countryTier(country, null);
      let blockedBy: string | undefined;
      let closeOnlyBy: string | undefined;
      if (anyRegionRule) {
        for (const r of regions) {
          if (blockedRegions.has(r)) {
            blockedBy = r;
            break;
          }
          if (closeOnlyBy === undefined && closeOnlyRegions.has(r)) closeOnlyBy = r;
        }
      }
      const first = regions[0] ?? null;
      if (blockedBy !== undefined) return result('blocked_region', 'blocked', country, blockedBy, blockedBy);
      if (closeOnlyBy !== undefined) return result('close_only_region', 'close-only', country, closeOnlyBy, closeOnlyBy);
      return countryTier(country, first);
    },
    countryTier: (country) => countryTier(country, null),
  };
}


/**
 * One database record under one set of tier rules (once per record). Where the client is
 * (`country`, its regions) is judged, and, when the record names a different represented country
 * (an overseas military base, an embassy: its users are under that country's rules too), so is
 * that country; the stricter tier wins, the location on a tie (docs/api.md "Which country a record
 * gives"). The codes become header values (x-edge-jurisdiction) and the geoblock answer's fields,
 * so only well-formed ISO codes count: a record whose country is not one is an address without a
 * country (the unknown tier), a malformed subdivision or represented country is ignored.
 */
function judge(tiers: TierResolver, rec: GeoRecord): GeoResult {
  const here = rec.country !== undefined && RE.country.test(rec.country)
    ? tiers.resolve(rec.country, rec.regions.filter((x) => RE.region.test(x)))
    : tiers.unknown;
  const rep = rec.represented;
  if (rep === undefined || rep === rec.country || !RE.country.test(rep)) return here;
  // The represented country's own tier: its users are under that country's rules, but they are
  // not in any of its regions, so GEO_REGION_UNKNOWN does not apply to it.
  const there = tiers.countryTier(rep);
  return ACCESS_RANK[there.access] > ACCESS_RANK[here.access] ? there : here;
}

/**
 * Builds the geo classifier once at start-up. Per request it normalizes the address, checks the
 * trusted CIDRs and looks the address up (an embedded IPv4's own address for the forms
 * common/ip.ts names); the tier of a database record is resolved once per
 * record object (the GeoDatabase hands out the same object for every address that shares a
 * record) and remembered in a WeakMap, so the common path is one lookup and one WeakMap hit.
 *
 * With `policy.shadow` (SHADOW_*), every result also carries `shadow`: the same address
 * classified by the shadow policy's tiers, resolved and cached together with the enforced one,
 * so a shadow policy costs no second lookup. Without it no result has `shadow`.
 *
 * With `opts.secondary` (GEOIP_DB_SECONDARY) the address is looked up in both databases, each
 * record resolved and cached the same way, and the stricter tier wins (stricterOfTwo); two
 * different countries are reported to `opts.onDisagreement`.
 */
export function createGeoClassifier(policy: GeoPolicy, geo: GeoLookup, opts: SecondaryOptions = {}): (rawIp: string) => GeoResult {
  const isTrusted = cidrMatcher(policy.geoTrustedCidrs);
  const version = policy.version;
  const enforced = tierResolver(policy, version);
  const shadow = policy.shadow === undefined ? undefined : tierResolver(policy.shadow, version);
  const trusted = version === undefined ? GEO_TRUSTED : geoResult('trusted', 'full', null, null, JURISDICTION_NONE, version);
  // Trusted addresses are trusted by both policies (there is no SHADOW_GEO_TRUSTED_CIDRS).
  const withShadow = (r: GeoResult, s: GeoResult): GeoResult => Object.freeze({ ...r, shadow: s });
  const TRUSTED = shadow === undefined ? trusted : withShadow(trusted, trusted);
  const UNKNOWN = shadow === undefined ? enforced.unknown : withShadow(enforced.unknown, shadow.unknown);
  const classify = shadow === undefined
    ? (rec: GeoRecord): GeoResult => judge(enforced, rec)
    : (rec: GeoRecord): GeoResult => withShadow(judge(enforced, rec), judge(shadow, rec));

  const byRecord = new WeakMap<GeoRecord, GeoResult>();
  const resultOf = (rec: GeoRecord | null): GeoResult => {
    if (rec === null || (rec.country === undefined && rec.represented === undefined)) return UNKNOWN;
    let r = byRecord.get(rec);
    if (r === undefined) {
      r = classify(rec);
      byRecord.set(rec, r);
    }
    return r;
  };
  const second = opts.secondary;
  const both = second === undefined ? undefined : stricterOfTwo(shadow !== undefined, opts.onDisagreement);
  return (rawIp: string): GeoResult => {
    const ip = normalizeIp(rawIp);
    if (ip === '') return UNKNOWN;
    const v6 = ip.includes(':');
    // Trust is for the address as received: an embedded IPv4 (which anyone routing through a
    // relay or translator can carry) never makes an address trusted.
    if (isTrusted(ip, v6 ? 6 : 4)) return TRUSTED;
    // An IPv6 address that embeds an IPv4 (6to4, NAT64, SIIT, Teredo: common/ip.ts) is the IPv4.
    const key = v6 ? (embeddedIpv4(ip)?.ipv4 ?? ip) : ip;
    const primary = resultOf(geo.lookup(key));
    if (second === undefined || both === undefined) return primary;
    return both(primary, resultOf(second.lookup(key)));
  };
}

/** GEOIP_DB_SECONDARY: a second database, and who hears of the two disagreeing. */
export interface SecondaryOptions {
  readonly secondary?: GeoLookup | undefined;
  /** Called when the two databases give different countries for an address (the enforced results, before combining). */
  readonly onDisagreement?: ((primary: GeoResult, secondary: GeoResult) => void) | undefined;
}

/**
 * The combination of the two databases' results for one address: the stricter tier wins (the
 * primary's on a tie), and so, independently, for the shadow policy's; a result without a
 * country (no record, GEO_UNKNOWN's tier) yields to the other database's. Results are shared objects,
 * so the common cases (the same result, or one whole result the stricter) build nothing; a mixed
 * one (the enforced tier from one database, the shadow's from the other) is built once per pair.
 */
function stricterOfTwo(hasShadow: boolean, onDisagreement: SecondaryOptions['onDisagreement']): (a: GeoResult, b: GeoResult) => GeoResult {
  const mixed = new WeakMap<GeoResult, WeakMap<GeoResult, GeoResult>>();
  const stricter = (a: GeoResult, b: GeoResult): GeoResult => (ACCESS_RANK[b.access] > ACCESS_RANK[a.access] ? b : a);
  return (a, b) => {
    if (a === b) return a;
    if (a.country !== b.country) onDisagreement?.(a, b);
    // An address one database has no country for is judged by the other: no record is no
    // location, not a disagreement about one (counted all the same); both without: GEO_UNKNOWN.
    if (b.country === null) return a;
    if (a.country === null) return b;
    const e = stricter(a, b);
    if (!hasShadow) return e;
    const s = stricter(a.shadow!, b.shadow!);
    if (s === e.shadow) return e;
    let m = mixed.get(a);
    if (m === undefined) mixed.set(a, (m = new WeakMap()));
    let r = m.get(b);
    if (r === undefined) m.set(b, (r = Object.freeze({ ...e, shadow: s })));
    return r;
  };
}

/** Maps a classification to the decision: undefined = continue to the route's policy. */
export function geoDecision(geo: GeoResult, denial: Decision): Decision | undefined {
  // Exhaustive: a new tier fails typecheck here instead of passing as allowed; a value outside
  // the type (never expected) is refused.
  switch (geo.access) {
    case 'blocked': return denial;
    case 'close-only':
    case 'full': return undefined;
    default: {
      const unknown: never = geo.access;
      void unknown;
      return denial;
    }
  }
}
