/**
 * GeoIP database (MaxMind format) behind the GeoLookup port.
 *
 * Reads both record layouts: MaxMind GeoIP2/GeoLite2 (`country.iso_code`, falling back to
 * `registered_country.iso_code` only when `country` is absent; `subdivisions[].iso_code`)
 * and ip-location-db (`country_code`). The file is polled and swapped in when it changes; a
 * corrupt replacement is refused and the old database keeps serving (adapters/mmdb-file.ts).
 */
import type { GeoLookup, GeoRecord } from '../ports.ts';
import { WatchedMmdb, type MmdbEvents } from './mmdb-file.ts';

interface RawRecord {
  country?: { iso_code?: string };
  registered_country?: { iso_code?: string };
  subdivisions?: { iso_code?: string }[];
  country_code?: string;
}

const NO_REGIONS: readonly string[] = Object.freeze([]);

/** Maps a raw database record to a GeoRecord. Exported for tests. */
export function toGeoRecord(raw: RawRecord): GeoRecord {
  const country = (raw.country?.iso_code ?? raw.registered_country?.iso_code ?? raw.country_code)?.toUpperCase();
  const subs = raw.subdivisions;
  const regions = country === undefined || subs === undefined || subs.length === 0
    ? NO_REGIONS
    : Object.freeze(subs.flatMap((s) => (s.iso_code === undefined ? [] : [`${country}-${s.iso_code.toUpperCase()}`])));
  return Object.freeze({ country, regions });
}

export type GeoDatabaseEvents = MmdbEvents;

/** The GeoIP database (GEOIP_DB): polled and swapped in on change by WatchedMmdb. */
export class GeoDatabase extends WatchedMmdb implements GeoLookup {
  readonly #records = new WeakMap<object, GeoRecord>();

  lookup(ip: string): GeoRecord | null {
    return this.derived(ip, this.#records, (raw) => toGeoRecord(raw as RawRecord)) ?? null;
  }
}
