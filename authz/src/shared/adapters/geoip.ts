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

export class GeoDatabase implements GeoLookup {
  readonly #file: WatchedMmdb;
  readonly #derived = new WeakMap<object, GeoRecord>();

  constructor(path: string, events: GeoDatabaseEvents = {}) {
    this.#file = new WatchedMmdb(path, events);
  }

  lookup(ip: string): GeoRecord | null {
    const raw = this.#file.get(ip) as RawRecord | null;
    if (raw === null || typeof raw !== 'object') return null;
    let rec = this.#derived.get(raw);
    if (rec === undefined) {
      rec = toGeoRecord(raw);
      this.#derived.set(raw, rec);
    }
    return rec;
  }

  /** Unix seconds when the current database was built (its metadata), for the age metric. */
  get buildEpochSecs(): number {
    return this.#file.buildEpochSecs;
  }

  /** Tries to load the file now; keeps the current database on failure. Returns success. */
  reload(): boolean {
    return this.#file.reload();
  }

  /** Polls the file every `intervalMs` and reloads it when it changed (WatchedMmdb.watch). */
  watch(intervalMs: number): void {
    this.#file.watch(intervalMs);
  }

  close(): void {
    this.#file.close();
  }
}
