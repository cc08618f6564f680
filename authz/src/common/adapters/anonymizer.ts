/**
 * MaxMind GeoIP2 Anonymous IP database (ANONYMIZER_DB) behind the AnonymizerLookup port.
 *
 * The licensed layout: one record per network with boolean flags `is_anonymous`,
 * `is_anonymous_vpn`, `is_hosting_provider`, `is_public_proxy`, `is_tor_exit_node`,
 * `is_residential_proxy` (absent means false). A record becomes a bit set of those flags,
 * derived once per distinct record. Reloaded on replace like GEOIP_DB (adapters/mmdb-file.ts).
 */
import { ANONYMIZER_FLAGS, type AnonymizerLookup } from '../ports.ts';
import { WatchedMmdb } from './mmdb-file.ts';

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

/** The anonymizer database (ANONYMIZER_DB): polled and swapped in on change by WatchedMmdb. */
export class AnonymizerDatabase extends WatchedMmdb implements AnonymizerLookup {
  readonly #bits = new WeakMap<object, number>();

  flags(ip: string): number {
    return this.derived(ip, this.#bits, recordBits) ?? 0;
  }
}
