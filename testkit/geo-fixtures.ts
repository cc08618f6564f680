/**
 * GeoIP test databases, generated at test time by fixtures/make-mmdb.py (PyPI mmdb_writer
 * in the project's .venv) into a fresh temporary directory. Nothing generated is ever
 * written into the repository; the directory is removed when the process exits.
 */
import { join } from 'node:path';
import { generateMmdbFixtures } from './mmdb-fixtures.ts';
import { tempDir } from './temp-dir.ts';

export interface GeoFixtures {
  /** The temporary directory holding every file below. */
  readonly dir: string;
  /** GeoIP2/GeoLite2 City layout (country, registered_country, subdivisions), IPv4 + IPv6. */
  readonly geoip2: string;
  /** Same layout, different answers (the "monthly update" for reload tests). */
  readonly geoip2Swapped: string;
  /** ip-location-db layout (country_code only), IPv4 + IPv6. */
  readonly iplocation: string;
  /** ip-location-db layout, IPv4-only search tree. */
  readonly iplocationV4: string;
  /** GeoLite2-Country type: country and registered_country, no subdivisions. */
  readonly country: string;
  /** DBIP-City-Lite type whose subdivisions have names, no iso_code. */
  readonly dbipCity: string;
  /** GeoIP2-City type whose records give no country. */
  readonly noCountry: string;
  /** geoip2.mmdb cut in half. */
  readonly corruptTruncated: string;
  /** Garbage tree and data with a valid-looking metadata section. */
  readonly corruptGarbage: string;
  /** What the script wrote: network → record, per file. */
  readonly layout: Readonly<Record<string, Readonly<Record<string, unknown>>>>;
}

let cached: GeoFixtures | undefined;

/** Generates the databases once per process and returns their paths. */
export function geoFixtures(): GeoFixtures {
  if (cached !== undefined) return cached;
  const { dir, out } = generateMmdbFixtures('make-mmdb.py', 'edge-geo-');
  const p = (name: string): string => join(dir, name);
  cached = Object.freeze({
    dir,
    geoip2: p('geoip2.mmdb'),
    geoip2Swapped: p('geoip2-swapped.mmdb'),
    iplocation: p('iplocation.mmdb'),
    iplocationV4: p('iplocation-v4.mmdb'),
    country: p('country.mmdb'),
    dbipCity: p('dbip-city.mmdb'),
    noCountry: p('no-country.mmdb'),
    corruptTruncated: p('corrupt-truncated.mmdb'),
    corruptGarbage: p('corrupt-garbage.mmdb'),
    layout: JSON.parse(out) as Record<string, Record<string, unknown>>,
  });
  return cached;
}

/** A fresh scratch directory for one test (removed at exit), e.g. for reload/rename tests. */
export function scratchDir(): string {
  return tempDir('edge-geo-scratch-');
}
