/**
 * A MaxMind-format (.mmdb) file that is polled and swapped in when it changes on disk: the
 * machinery GEOIP_DB and ANONYMIZER_DB share. A replaced file is loaded into a new Reader and
 * swapped in atomically (in-flight lookups finish on the old one); a corrupt replacement is
 * refused, the old database keeps serving, and the refusal is reported once.
 */
import { readFileSync, statSync, type Stats } from 'node:fs';
import { Reader, type Response } from 'maxmind';

export interface MmdbEvents {
  onReload?: (ok: boolean, path: string, err?: unknown) => void;
}

/**
 * mmdb-lib caches decoded records by data offset. These databases have few distinct records
 * (hundreds for countries, a handful of flag sets for anonymizers), so a Map that is simply
 * cleared when full is enough, and it makes the same record object come back for every address
 * that shares it (what a WeakMap of derived values keys on).
 */
function boundedCache(max: number): { get(k: string | number): unknown; set(k: string | number, v: unknown): void } {
  const m = new Map<string | number, unknown>();
  return {
    get: (k) => m.get(k),
    set: (k, v) => {
      if (m.size >= max) m.clear();
      m.set(k, v);
    },
  };
}

/** Opens and validates a database file; throws when it is not a usable MaxMind DB. */
function openReader(path: string): { reader: Reader<Response>; stat: Stats } {
  // stat before read: if the file is replaced in between, the next poll sees a newer stat and reloads again.
  const stat = statSync(path);
  const buf = readFileSync(path);
  const reader = new Reader<Response>(buf, { cache: boundedCache(10_000) });
  // Exercise the search tree and data section for both families: a truncated or garbled
  // file usually passes the metadata check but fails here.
  reader.get('1.1.1.1');
  reader.get('2001:4860:4860::8888');
  return { reader, stat };
}

function sameFile(a: Stats, b: Stats): boolean {
  return a.ino === b.ino && a.size === b.size && a.mtimeMs === b.mtimeMs && a.ctimeMs === b.ctimeMs;
}

/** The current Reader of one .mmdb path, reloaded on change. */
export class WatchedMmdb {
  #reader: Reader<Response>;
  readonly #path: string;
  readonly #events: MmdbEvents;
  #timer: NodeJS.Timeout | undefined;
  /** stat of the file the current reader was loaded from (or of the last refused file). */
  #stat: Stats;

  constructor(path: string, events: MmdbEvents = {}) {
    this.#path = path;
    this.#events = events;
    const { reader, stat } = openReader(path);
    this.#reader = reader;
    this.#stat = stat;
  }

  /** The raw record for `ip`, or null (no record, or an IPv6 address in an IPv4-only tree). */
  get(ip: string): unknown {
    // An IPv4-only database has no answer for IPv6 (mmdb-lib would walk its first 32 bits).
    if (this.#reader.metadata.ipVersion === 4 && ip.includes(':')) return null;
    try {
      return this.#reader.get(ip);
    } catch {
      return null;
    }
  }

  /**
   * What `derive` makes of the record at `ip`, computed once per record object (mmdb-lib hands
   * out the same object for every address that shares a record) and kept in `cache`;
   * undefined when there is no record.
   */
  protected derived<T>(ip: string, cache: WeakMap<object, T>, derive: (raw: Record<string, unknown>) => T): T | undefined {
    const raw = this.get(ip);
    if (raw === null || typeof raw !== 'object') return undefined;
    let v = cache.get(raw);
    if (v === undefined) {
      v = derive(raw as Record<string, unknown>);
      cache.set(raw, v);
    }
    return v;
  }

  /** Unix seconds when the current database was built (its metadata). */
  get buildEpochSecs(): number {
    const epoch = this.#reader.metadata.buildEpoch as unknown;
    return epoch instanceof Date ? Math.floor(epoch.getTime() / 1000) : Number(epoch);
  }

  /** The current database's `database_type` metadata (e.g. GeoIP2-Anonymous-IP). */
  get databaseType(): string {
    return String(this.#reader.metadata.databaseType);
  }

  /** Tries to load the file now; keeps the current database on failure. Returns success. */
  reload(): boolean {
    try {
      const { reader, stat } = openReader(this.#path);
      this.#reader = reader;
      this.#stat = stat;
      this.#events.onReload?.(true, this.#path);
      return true;
    } catch (err) {
      // Remember the refused file so it is reported once, not on every poll.
      try {
        this.#stat = statSync(this.#path);
      } catch { /* missing: keep polling */ }
      this.#events.onReload?.(false, this.#path, err);
      return false;
    }
  }

  /**
   * Polls the file every `intervalMs`, comparing against the stat of the file that was
   * actually loaded; a different inode, size, mtime or ctime triggers reload(). Works for
   * atomic renames, in-place rewrites and Kubernetes `..data` symlink swaps.
   */
  watch(intervalMs: number): void {
    if (this.#timer !== undefined) return;
    this.#timer = setInterval(() => {
      let cur: Stats;
      try {
        cur = statSync(this.#path);
      } catch {
        return; // momentarily absent during a replace
      }
      if (!sameFile(cur, this.#stat)) this.reload();
    }, intervalMs);
    this.#timer.unref();
  }

  close(): void {
    if (this.#timer !== undefined) clearInterval(this.#timer);
    this.#timer = undefined;
  }
}
