/**
 * MaxMind GeoIP2 Anonymous IP database (ANONYMIZER_DB) behind the AnonymizerLookup port.
 *
 * The licensed layout: one record per network with boolean flags `is_anonymous`,
 * `is_anonymous_vpn`, `is_hosting_provider`, `is_public_proxy`, `is_tor_exit_node`,
 * `is_residential_proxy` (absent means false). A record becomes a bit set of those flags,
 * derived once per distinct record. Reloaded on replace like GEOIP_DB (adapters/mmdb-file.ts).
 */
import { ANONYMIZER_FLAGS, type AnonymizerLookup } from '../ports.ts';
import { WatchedMmdb, type MmdbEvents } from './mmdb-file.ts';

/** The bit of each flag in a lookup's answer (bit i = ANONYMIZER_FLAGS[i]). */
export function flagBits(names: readonly string[]): number {
  let bits = 0;
  for (const name of names) {
    const i = (ANONYMIZER_FLAGS as readonly string[]).indexOf(name);
    if (i === -1) throw new Error(`not an anonymizer flag: ${name}`);
    bits |= 1 << i;
  }
  return bits;
}

/** A raw record's flags as a bit set (only `true` counts). Exported for tests. */
export function recordBits(raw: Readonly<Record<string, unknown>>): number {
  let bits = 0;
  for (let i = 0; i < ANONYMIZER_FLAGS.length; i++) if (raw[ANONYMIZER_FLAGS[i] as string] === true) bits |= 1 << i;
  return bits;
}

export class AnonymizerDatabase implements AnonymizerLookup {
  readonly #file: WatchedMmdb;
  readonly #derived = new WeakMap<object, number>();

  constructor(path: string, events: MmdbEvents = {}) {
    this.#file = new WatchedMmdb(path, events);
  }

  flags(ip: string): number {
    const raw = this.#file.get(ip);
    if (raw === null || typeof raw !== 'object') return 0;
    let bits = this.#derived.get(raw);
    if (bits === undefined) {
      bits = recordBits(raw as Record<string, unknown>);
      this.#derived.set(raw, bits);
    }
    return bits;
  }

  /** Unix seconds when the current database was built (its metadata). */
  get buildEpochSecs(): number {
    return this.#file.buildEpochSecs;
  }

  reload(): boolean {
    return this.#file.reload();
  }

  watch(intervalMs: number): void {
    this.#file.watch(intervalMs);
  }

  close(): void {
    this.#file.close();
  }
}
