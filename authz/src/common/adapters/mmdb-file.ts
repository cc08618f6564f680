/**
 * A MaxMind-format (.mmdb) file that is polled and swapped in when it changes on disk: the
 * machinery GEOIP_DB and ANONYMIZER_DB share. A replaced file is loaded into a new Reader, checked
 * like the first one (its kind: `MmdbCheck`) and swapped in atomically (in-flight lookups finish
 * on the old one); a corrupt or refused replacement is not swapped in, the old database keeps
 * serving, and the refusal is reported once.
 */
import { OneAtATime } from '../one-at-a-time.ts';
import { readFileSync, statSync, type Stats } from 'node:fs';
import { setImmediate as nextTurn } from 'node:timers/promises';
import { Reader, type Response } from 'maxmind';
import { ConfigError } from '../config.ts';

export interface MmdbEvents {
  onReload?: (ok: boolean, path: string, err?: unknown) => void;
}

/** A database as its check sees it. */
export interface OpenedMmdb {
  readonly reader: Reader<Response>;
  /** The whole file (what walkRecords reads the search tree from). */
  readonly buf: Buffer;
}

/**
 * What a kind of database must be before it serves (its database_type, what its records hold):
 * throws to refuse it. A generator: it yields between slices of its work, so a reload's check
 * runs between requests, while the first load runs it to the end at once (mmdb-records.ts).
 */
export type MmdbCheck = (db: OpenedMmdb) => Generator<void, void, void>;

/**
 * A database its setting's check refused: `SETTING: expected …, got database_type "…"…`. A
 * ConfigError, so start-up ends as for a bad value (one line naming the setting); on a reload it
 * is the logged reason the old database keeps serving.
 */
export class DatabaseRefused extends ConfigError {
  constructor(setting: string, expected: string, got: string) {
    super(setting, expected);
    this.name = 'DatabaseRefused';
    this.message = `${setting}: expected ${expected}, got ${got}`;
  }
}

/** Runs a check to its end at once (start-up: nothing is served yet). */
function checkNow(check: MmdbCheck, db: OpenedMmdb): void {
  for (const _ of check(db)) { /* no pause: start-up */ }
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
function openReader(path: string): { reader: Reader<Response>; buf: Buffer; stat: Stats } {
  // stat before read: if the file is replaced in between, the next poll sees a newer stat and reloads again.
  const stat = statSync(path);
  const buf = readFileSync(path);
  const reader = new Reader<Response>(buf, { cache: boundedCache(10_000) });
  // Exercise the search tree and data section for both families: a truncated or garbled
  // file usually passes the metadata check but fails here.
  reader.get('1.1.1.1');
  reader.get('2001:4860:4860::8888');
  return { reader, buf, stat };
}

/** Whether two stats are of the same file version (inode, size, mtime, ctime): what a watch compares. */
export function sameFile(a: Stats, b: Stats): boolean {
  return a.ino === b.ino && a.size === b.size && a.mtimeMs === b.mtimeMs && a.ctimeMs === b.ctimeMs;
}

/** The current Reader of one .mmdb path, reloaded on change. */
export class WatchedMmdb {
  #reader: Reader<Response>;
  #buf: Buffer;
  readonly #path: string;
  readonly #events: MmdbEvents;
  readonly #check: MmdbCheck | undefined;
  #timer: NodeJS.Timeout | undefined;
  /** stat of the file the current reader was loaded from (or of the last refused file). */
  #stat: Stats;
  /** The reload under way (reloads run one at a time); undefined when none is. */
  readonly #reloads = new OneAtATime();
  #closed = false;

  /** Loads and checks `path` now; throws when it is unusable or `check` refuses it (start-up fails). */
  constructor(path: string, events: MmdbEvents = {}, check?: MmdbCheck) {
    this.#path = path;
    this.#events = events;
    this.#check = check;
    const { reader, buf, stat } = openReader(path);
    if (check !== undefined) checkNow(check, { reader, buf });
    this.#reader = reader;
    this.#buf = buf;
    this.#stat = stat;
  }

  /** Runs `check` on the database now serving (between requests); throws its refusal. */
  protected async checkCurrent(check: MmdbCheck): Promise<void> {
    const db = { reader: this.#reader, buf: this.#buf };
    for (const _ of check(db)) await nextTurn();
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

  /**
   * Loads the file again and checks it (between requests: the check pauses at each slice); swaps
   * it in when it passes, else keeps the current database. Resolves with success. Reloads run one
   * at a time: a call during one waits for it, then loads the file as it is then.
   */
  reload(): Promise<boolean> {
    return this.#reloads.run(() => this.#reloadNow());
  }

  async #reloadNow(): Promise<boolean> {
    let stat: Stats | undefined;
    try {
      const opened = openReader(this.#path);
      stat = opened.stat;
      if (this.#check !== undefined) {
        for (const _ of this.#check(opened)) {
          await nextTurn();
          if (this.#closed) return false;
        }
      }
      this.#reader = opened.reader;
      this.#buf = opened.buf;
      this.#stat = opened.stat;
      this.#events.onReload?.(true, this.#path);
      return true;
    } catch (err) {
      // Remember the refused file so it is reported once, not on every poll.
      try {
        this.#stat = stat ?? statSync(this.#path);
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
      // One reload at a time: a file replaced during one is seen by the next poll after it.
      if (!this.#reloads.busy && !sameFile(cur, this.#stat)) void this.reload();
    }, intervalMs);
    this.#timer.unref();
  }

  close(): void {
    this.#closed = true;
    if (this.#timer !== undefined) clearInterval(this.#timer);
    this.#timer = undefined;
  }
}
