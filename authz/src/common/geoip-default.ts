/**
 * What the default GeoIP database is fit for. The default (GEOIP_DB unset) is the country
 * database shipped by the npm package @ip-location-db/geo-whois-asn-country-mmdb, chosen so a
 * fresh clone runs with no download and no licence key. Its own README (checked 2026-11-25,
 * version 2.3.2026061719) says the data published to npm "contains bugs resulting in incorrect
 * data" and that npm updates are deprecated; its package.json says CC0-1.0 while the README
 * credits the underlying RIR data to the NRO under CC BY 4.0. So: development and tests only.
 * A regulated venue points GEOIP_DB at a maintained, licensed database (MaxMind GeoIP2 Country
 * or City, or another vendor's MaxMind-format file) and replaces it on its vendor's schedule
 * (docs/operations.md "GeoIP updates").
 */
import { createHash } from 'node:crypto';
import { readFileSync, statSync } from 'node:fs';
import { DEFAULT_GEOIP_DB } from './config.ts';

export const DEFAULT_GEOIP_PRODUCTION_WARNING =
  'GEOIP_DB is the default database from the npm package @ip-location-db/geo-whois-asn-country-mmdb, '
  + 'whose publisher states its npm data contains errors and is no longer updated: fit for development and tests only. '
  + 'Set GEOIP_DB to a maintained, licensed database in production (docs/operations.md, "GeoIP updates").';

/** Whether `path` is the default database or a copy of it (same size, same SHA-256: compose-setup copies it). */
export function isDefaultGeoipDb(path: string): boolean {
  if (path === DEFAULT_GEOIP_DB) return true;
  try {
    if (statSync(path).size !== statSync(DEFAULT_GEOIP_DB).size) return false;
    const digest = (p: string): string => createHash('sha256').update(readFileSync(p)).digest('hex');
    return digest(path) === digest(DEFAULT_GEOIP_DB);
  } catch {
    return false;
  }
}

/**
 * The warning to log once at start, or undefined: only with NODE_ENV=production and the default
 * database (or a copy of it).
 */
export function defaultGeoipWarning(geoipDb: string, env: NodeJS.ProcessEnv = process.env): string | undefined {
  return env['NODE_ENV'] === 'production' && isDefaultGeoipDb(geoipDb) ? DEFAULT_GEOIP_PRODUCTION_WARNING : undefined;
}
