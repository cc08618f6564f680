/**
 * GEOIP_DB_SECONDARY (docs/api.md "Two databases"): where the two databases place an address in
 * different countries, the stricter tier has already been applied (stages/geo.ts stricterOfTwo);
 * this counts the disagreement by the pair of countries and logs it at debug.
 *
 * The label set is bounded whatever the databases hold: a country that a rule names (enforced or
 * shadow: a blocked or close-only country, or the country of a region rule) is its own label;
 * any other country is `other`; no country (no record, or none in it) is `none`. So at most
 * (k + 2)² series for a policy naming k countries, and the pairs that matter (a rule's country on
 * one side) are always told apart.
 */
import type { Config } from '../common/config.ts';
import { ACCESS_RANK } from '../common/contract.ts';
import type { Logger } from '../common/log.ts';
import type { AuthzMetrics } from '../common/metrics.ts';
import type { GeoResult, SecondaryOptions } from './stages/geo.ts';
import type { GeoLookup } from '../common/ports.ts';

/** The countries the policy's rules name (computed once at start). */
export function ruledCountries(config: Pick<Config, 'blockedCountries' | 'closeOnlyCountries' | 'blockedRegions' | 'closeOnlyRegions' | 'shadow'>): ReadonlySet<string> {
  const out = new Set<string>();
  for (const p of [config, ...(config.shadow === undefined ? [] : [config.shadow])]) {
    for (const c of [...p.blockedCountries, ...p.closeOnlyCountries]) out.add(c);
    for (const r of [...p.blockedRegions, ...p.closeOnlyRegions]) out.add(r.slice(0, r.indexOf('-')));
  }
  return out;
}

/** A country as a disagreement label: itself when a rule names it, else `other`; null → `none`. */
export function pairLabel(ruled: ReadonlySet<string>, country: string | null): string {
  return country === null ? 'none' : ruled.has(country) ? country : 'other';
}

/** The classifier options for GEOIP_DB_SECONDARY: the database and the disagreement hook. */
export function secondaryGeo(config: Config, secondary: GeoLookup | undefined, metrics: AuthzMetrics, logger: Logger): SecondaryOptions {
  if (secondary === undefined) return {};
  const ruled = ruledCountries(config);
  const debug = logger.isLevelEnabled('debug');
  return {
    secondary,
    onDisagreement(primary: GeoResult, second: GeoResult) {
      metrics.geoipDisagreement(pairLabel(ruled, primary.country), pairLabel(ruled, second.country));
      // Debug only, and never the address: the pair, each tier, and which one decided.
      if (debug) {
        logger.debug({ primary: primary.country, secondary: second.country, primaryTier: primary.access, secondaryTier: second.access,
          decidedBy: rankOf(second) > rankOf(primary) ? 'secondary' : 'primary' }, 'GeoIP databases disagree');
      }
    },
  };
}

const rankOf = (r: GeoResult): number => ACCESS_RANK[r.access];
