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
import { Reader, type Response } from 'maxmind';
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

/** Days after its build at which a database sets off EdgeGeoipStale (deploy/prometheus/alerts.yaml: `> 45 * 86400`). */
export const GEOIP_STALE_DAYS = 45;

/** When the database at `path` was built (unix seconds, its metadata); undefined when it cannot be read (the service's own open says why). */
export function geoipBuildEpochSecs(path: string): number | undefined {
  try {
    const epoch = new Reader<Response>(readFileSync(path)).metadata.buildEpoch as unknown;
    return epoch instanceof Date ? Math.floor(epoch.getTime() / 1000) : Number(epoch);
  } catch {
    return undefined;
  }
}

/**
 * The warning to log once at start when the database is already older than EdgeGeoipStale's
 * threshold, or undefined: that alert fires within the hour, and without this line nothing says
 * why on a fresh install (the default database is months old, and its publisher no longer updates
 * it on npm).
 */
export function staleGeoipWarning(geoipDb: string, buildEpochSecs: number | undefined, nowMs = Date.now()): string | undefined {
  if (buildEpochSecs === undefined || !Number.isFinite(buildEpochSecs)) return undefined;
  const ageSecs = Math.floor(nowMs / 1000) - buildEpochSecs;
  if (ageSecs <= GEOIP_STALE_DAYS * 86_400) return undefined;
  const built = new Date(buildEpochSecs * 1000).toISOString().slice(0, 10);
  return `the GeoIP database was built on ${built}, ${Math.floor(ageSecs / 86_400)} days ago: the EdgeGeoipStale alert `
    + `(older than ${GEOIP_STALE_DAYS} days, deploy/prometheus/alerts.yaml) fires for it within the hour. `
    + (isDefaultGeoipDb(geoipDb)
      ? 'It is the default database, which its publisher no longer updates on npm: expected in development; '
        + 'in production set GEOIP_DB to a maintained database (docs/operations.md, "Updating the GeoIP database").'
      : 'Replace it with a current one (docs/operations.md, "Updating the GeoIP database").');
}
