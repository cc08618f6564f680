/**
 * MaxMind GeoIP2 Anonymous IP database (ANONYMIZER_DB) behind the AnonymizerLookup port.
 *
 * The licensed layout: one record per network with boolean flags `is_anonymous`,
 * `is_anonymous_vpn`, `is_hosting_provider`, `is_public_proxy`, `is_tor_exit_node`,
 * `is_residential_proxy` (absent means false); GeoIP Anonymous Plus has the same flags beside
 * fields of its own. A record becomes a bit set of those flags, derived once per distinct record.
 * Before a file serves, at start and on every reload, its `database_type` and every record's
 * flags are checked (anonymizerCheck); a refused replacement keeps the old database
 * (adapters/mmdb-file.ts).
 */
import { ANONYMIZER_FLAGS, type AnonymizerLookup } from '../ports.ts';
import { DatabaseRefused, WatchedMmdb, type MmdbCheck, type MmdbEvents } from './mmdb-file.ts';
import { walkRecords } from './mmdb-records.ts';

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

/** The `database_type` values ANONYMIZER_DB accepts (the names MaxMind's readers check). */
export const ANONYMIZER_DATABASE_TYPES: readonly string[] = Object.freeze(['GeoIP2-Anonymous-IP', 'GeoIP-Anonymous-Plus']);

/**
 * The ANONYMIZER_DB check. The `database_type` must be an anonymizer one: any other database
 * (a City database, say) has none of the flags, so every VPN would pass. Then every distinct
 * record is read (the whole search tree is walked; an Anonymous IP database holds a few dozen
 * distinct records): each flag present must be a boolean, as lookups count only `true` (a
 * database writing 1 for true would flag nothing), and at least one record must set one (a
 * file that flags nobody is not an anonymizer list).
 */
export function anonymizerCheck(setting: string): MmdbCheck {
  return function* check({ reader, buf }) {
    const type = String(reader.metadata.databaseType);
    const got = `database_type ${JSON.stringify(type)}`;
    if (!ANONYMIZER_DATABASE_TYPES.includes(type)) {
      throw new DatabaseRefused(setting, `a GeoIP2 Anonymous IP or GeoIP Anonymous Plus database (database_type ${ANONYMIZER_DATABASE_TYPES.join(' or ')})`, got);
    }
    let records = 0;
    let flagged = 0;
    yield* walkRecords(reader, buf, ({ data, network }) => {
      records++;
      if (typeof data !== 'object' || data === null || Array.isArray(data)) {
        throw new DatabaseRefused(setting, 'records that are maps of anonymizer flags', `${got} with a ${typeof data} record for ${network()}`);
      }
      const rec = data as Record<string, unknown>;
      for (const flag of ANONYMIZER_FLAGS) {
        const v = rec[flag];
        if (v !== undefined && typeof v !== 'boolean') {
          throw new DatabaseRefused(setting, 'anonymizer flags stored as booleans (true/false)', `${got} with ${flag} = ${typeof v === 'bigint' ? String(v) : JSON.stringify(v)} (${typeof v}) for ${network()}`);
        }
      }
      if (recordBits(rec) !== 0) flagged++;
      return false;
    });
    if (flagged === 0) throw new DatabaseRefused(setting, 'a database that flags at least one network', `${got} whose ${records} records set no flag`);
  };
}

export interface AnonymizerDatabaseOptions extends MmdbEvents {
  /** The setting naming the file, for refusals (default ANONYMIZER_DB). */
  readonly setting?: string;
}

/** The anonymizer database (ANONYMIZER_DB): checked, then polled and swapped in on change by WatchedMmdb. */
export class AnonymizerDatabase extends WatchedMmdb implements AnonymizerLookup {
  readonly #bits = new WeakMap<object, number>();

  constructor(path: string, opts: AnonymizerDatabaseOptions = {}) {
    super(path, opts, anonymizerCheck(opts.setting ?? 'ANONYMIZER_DB'));
  }

  flags(ip: string): number {
    return this.derived(ip, this.#bits, recordBits) ?? 0;
  }
}
