/**
 * GeoIP database (MaxMind format) behind the GeoLookup port.
 *
 * Reads both record layouts: MaxMind GeoIP2/GeoLite2 (`country.iso_code`, falling back to
 * `registered_country.iso_code` only when `country` is absent; `represented_country.iso_code`;
 * `subdivisions[].iso_code`) and ip-location-db (`country_code`). docs/api.md "Which country a
 * record gives" says why. The file must be a country or city database (its `database_type`), and
 * one with subdivisions when a region rule is in force: checked before it serves, at start and on
 * every reload (a refused replacement keeps the old database: adapters/mmdb-file.ts).
 */
import type { GeoLookup, GeoRecord } from '../ports.ts';
import { DatabaseRefused, WatchedMmdb, type MmdbCheck, type MmdbEvents } from './mmdb-file.ts';
import { walkRecords } from './mmdb-records.ts';

interface RawRecord {
  country?: { iso_code?: unknown };
  registered_country?: { iso_code?: unknown };
  represented_country?: { iso_code?: unknown };
  subdivisions?: { iso_code?: unknown }[];
  country_code?: unknown;
}

const NO_REGIONS: readonly string[] = Object.freeze([]);

/** A code as the database holds it, upper-cased; undefined when it is not a string. */
const code = (v: unknown): string | undefined => (typeof v === 'string' ? v.toUpperCase() : undefined);

/**
 * Maps a raw database record to a GeoRecord. Exported for tests.
 *
 * Where the client is: `country`. `registered_country` (where the network's owner registered it)
 * only when the record has no `country` at all, MaxMind's way of saying it does not know the
 * location; a `country` without an iso_code is a location the record does not give, so no country
 * (GEO_UNKNOWN decides), never the registration's. `represented_country` (an overseas military
 * base, an embassy) is kept beside it: the classifier judges both and the stricter tier wins.
 */
export function toGeoRecord(raw: RawRecord): GeoRecord {
  const country = raw.country !== undefined ? code(raw.country.iso_code) : code(raw.registered_country?.iso_code) ?? code(raw.country_code);
  const represented = code(raw.represented_country?.iso_code);
  const subs = raw.subdivisions;
  const regions = country === undefined || !Array.isArray(subs) || subs.length === 0
    ? NO_REGIONS
    : Object.freeze(subs.flatMap((s) => {
      const sub = code(s.iso_code);
      return sub === undefined ? [] : [`${country}-${sub}`];
    }));
  return Object.freeze(represented === undefined ? { country, regions } : { country, regions, represented });
}

/**
 * The `database_type` values GEOIP_DB accepts: country and city layouts only, and whether the
 * kind can carry ISO 3166-2 subdivisions (`city`: its records are then checked for them). MaxMind
 * GeoIP2/GeoLite2 (the names its readers check), DB-IP's own MMDB downloads, and ip-location-db's
 * files (`country ipv4|ipv6|ipvAll`, as sapics/ip-location-to-mmdb writes them; its city layout
 * names states, not ISO codes, so it counts as a country layout here).
 */
export const GEO_DATABASE_TYPES: ReadonlyMap<string, 'country' | 'city'> = new Map([
  ...['GeoIP2-Country', 'GeoLite2-Country', 'GeoIP2-Country-Shield'].map((t) => [t, 'country'] as const),
  ...['GeoIP2-City', 'GeoLite2-City', 'GeoIP2-City-Shield', 'GeoIP2-Precision-City', 'GeoIP2-City-Africa', 'GeoIP2-City-Asia-Pacific',
    'GeoIP2-City-Europe', 'GeoIP2-City-North-America', 'GeoIP2-City-South-America'].map((t) => [t, 'city'] as const),
  ...['GeoIP2-Enterprise', 'GeoIP2-Enterprise-Shield', 'GeoIP2-Precision-Enterprise', 'GeoIP2-Precision-Enterprise-Shield'].map((t) => [t, 'city'] as const),
  ...['DBIP-Country-Lite', 'DBIP-Country'].map((t) => [t, 'country'] as const),
  ...['DBIP-City-Lite', 'DBIP-Location (compat=City)', 'DBIP-Location-ISP (compat=Enterprise)'].map((t) => [t, 'city'] as const),
  ...['country', 'city'].flatMap((k) => ['ipv4', 'ipv6', 'ipvAll'].map((v) => [`${k} ${v}`, 'country'] as const)),
]);

const GEO_EXPECTED = 'a country or city database (database_type of GeoIP2/GeoLite2 Country, City or Enterprise, '
  + 'DB-IP Country or City, or ip-location-db country or city; docs/api.md lists them)';

/**
 * Records read at most when checking what a GeoIP database's records hold (a country; with a
 * region rule, a subdivision): a country or city database shows both in its first records, so
 * a file without them in this many has none worth serving.
 */
export const GEO_CHECK_RECORDS = 10_000;

/**
 * The GEOIP_DB check: a country or city `database_type`, records that give a country, and with a
 * region rule subdivisions (a country database has none, and neither may a city database whose
 * records lack ISO codes, e.g. DB-IP's): else no rule naming a region could ever match.
 */
export function geoCheck(setting: string, regionRuleNow: string | undefined | (() => string | undefined)): MmdbCheck {
  return function* check({ reader, buf }) {
    // The region rule as it is when the check runs (a live GEO_POLICY_FILE may have changed it).
    const regionRule = typeof regionRuleNow === 'function' ? regionRuleNow() : regionRuleNow;
    const type = String(reader.metadata.databaseType);
    const kind = GEO_DATABASE_TYPES.get(type);
    if (kind === undefined) throw new DatabaseRefused(setting, GEO_EXPECTED, `database_type ${JSON.stringify(type)}`);
    const needRegions = `a database with ISO 3166-2 subdivisions for ${regionRule ?? ''} (a City or Enterprise database)`;
    if (regionRule !== undefined && kind === 'country') {
      throw new DatabaseRefused(setting, needRegions, `database_type ${JSON.stringify(type)}, a country layout without subdivisions`);
    }
    let records = 0;
    let country = false;
    let regions = regionRule === undefined;
    yield* walkRecords(reader, buf, ({ data }) => {
      records++;
      const rec = typeof data === 'object' && data !== null ? toGeoRecord(data as RawRecord) : undefined;
      if (rec?.country !== undefined) country = true;
      if (rec !== undefined && rec.regions.length > 0) regions = true;
      return (country && regions) || records >= GEO_CHECK_RECORDS;
    });
    const first = records >= GEO_CHECK_RECORDS ? `its first ${records}` : `its ${records}`;
    if (!country) throw new DatabaseRefused(setting, `${GEO_EXPECTED} whose records give a country`, `database_type ${JSON.stringify(type)} with no country in ${first} records`);
    if (!regions) throw new DatabaseRefused(setting, needRegions, `database_type ${JSON.stringify(type)} with no subdivisions[].iso_code in ${first} records`);
  };
}

export interface GeoDatabaseOptions extends MmdbEvents {
  /** The setting naming the file, for refusals (default GEOIP_DB). */
  readonly setting?: string;
  /** The region rule in force (`BLOCKED_REGIONS=CA-ON`), if any: the database must carry subdivisions. */
  readonly regionRule?: string | undefined | (() => string | undefined);
}

/** The GeoIP database (GEOIP_DB): checked, then polled and swapped in on change by WatchedMmdb. */
export class GeoDatabase extends WatchedMmdb implements GeoLookup {
  readonly #records = new WeakMap<object, GeoRecord>();

  constructor(path: string, opts: GeoDatabaseOptions = {}) {
    super(path, opts, geoCheck(opts.setting ?? 'GEOIP_DB', opts.regionRule));
  }

  /**
   * Whether the database now serving could serve `regionRule` (a new GEO_POLICY_FILE's): runs
   * the same check as a reload, between requests; throws the refusal.
   */
  async accepts(regionRule: string | undefined, setting = 'GEOIP_DB'): Promise<void> {
    await this.checkCurrent(geoCheck(setting, regionRule));
  }

  lookup(ip: string): GeoRecord | null {
    return this.derived(ip, this.#records, (raw) => toGeoRecord(raw as RawRecord)) ?? null;
  }
}

/** The enforced or shadow settings a region rule can come from. */
interface RegionRules {
  readonly blockedRegions: ReadonlySet<string>;
  readonly closeOnlyRegions: ReadonlySet<string>;
  readonly shadow?: { readonly blockedRegions: ReadonlySet<string>; readonly closeOnlyRegions: ReadonlySet<string> } | undefined;
}

/** The first region rule in force (`BLOCKED_REGIONS=CA-ON,UA-43`), for GeoDatabaseOptions.regionRule; undefined when none is. */
export function regionRuleOf(rules: RegionRules): string | undefined {
  const named: [string, ReadonlySet<string> | undefined][] = [
    ['BLOCKED_REGIONS', rules.blockedRegions], ['CLOSE_ONLY_REGIONS', rules.closeOnlyRegions],
    ['SHADOW_BLOCKED_REGIONS', rules.shadow?.blockedRegions], ['SHADOW_CLOSE_ONLY_REGIONS', rules.shadow?.closeOnlyRegions],
  ];
  for (const [name, set] of named) if (set !== undefined && set.size > 0) return `${name}=${[...set].join(',')}`;
  return undefined;
}
