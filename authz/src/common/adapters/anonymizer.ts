/**
 * MaxMind GeoIP2 Anonymous IP database (ANONYMIZER_DB) behind the AnonymizerLookup port.
 *
 * The licensed layout: one record per network with boolean flags `is_anonymous`,
 * `is_anonymous_vpn`, `is_hosting_provider`, `is_public_proxy`, `is_tor_exit_node`,
 * `is_residential_proxy` (absent means false); GeoIP Anonymous Plus has the same flags beside
 * fields of its own: `anonymizer_confidence` (1–99: how sure MaxMind is that the network is an
 * anonymizer) and `provider_name` (the VPN or proxy service). A record becomes a bit set of those
 * flags, derived once per distinct record; with ANONYMIZER_MIN_CONFIDENCE, a record whose
 * confidence is below it has none (a record without a confidence keeps its flags: fail closed).
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

/**
 * A raw record's flags as a bit set (only `true` counts); 0 when `minConfidence` is given and the
 * record's anonymizer_confidence is below it. Exported for tests.
 */
export function recordBits(raw: Readonly<Record<string, unknown>>, minConfidence?: number): number {
  if (minConfidence !== undefined && typeof raw['anonymizer_confidence'] === 'number' && raw['anonymizer_confidence'] < minConfidence) return 0;
  let bits = 0;
  for (let i = 0; i < ANONYMIZER_FLAGS.length; i++) if (raw[ANONYMIZER_FLAGS[i] as string] === true) bits |= 1 << i;
  return bits;
}

/** The `database_type` values ANONYMIZER_DB accepts (the names MaxMind's readers check). */
export const ANONYMIZER_DATABASE_TYPES: readonly string[] = Object.freeze(['GeoIP2-Anonymous-IP', 'GeoIP-Anonymous-Plus']);
const ANONYMIZER_PLUS_TYPE = 'GeoIP-Anonymous-Plus';

/** The longest provider_name logged (a database's string, cut so a bad one cannot flood a line). */
const PROVIDER_MAX = 64;

/**
 * The ANONYMIZER_DB check. The `database_type` must be an anonymizer one: any other database
 * (a City database, say) has none of the flags, so every VPN would pass. Then every distinct
 * record is read (the whole search tree is walked; an Anonymous IP database holds a few dozen
 * distinct records): each flag present must be a boolean, as lookups count only `true` (a
 * database writing 1 for true would flag nothing), and at least one record must set one (a
 * file that flags nobody is not an anonymizer list).
 */
export function anonymizerCheck(setting: string, minConfidence?: number): MmdbCheck {
  return function* check({ reader, buf }) {
    const type = String(reader.metadata.databaseType);
    const got = `database_type ${JSON.stringify(type)}`;
    if (!ANONYMIZER_DATABASE_TYPES.includes(type)) {
      throw new DatabaseRefused(setting, `a GeoIP2 Anonymous IP or GeoIP Anonymous Plus database (database_type ${ANONYMIZER_DATABASE_TYPES.join(' or ')})`, got);
    }
    // A confidence threshold over a database without confidences would silently count every flag.
    if (minConfidence !== undefined && type !== ANONYMIZER_PLUS_TYPE) {
      throw new DatabaseRefused(setting, `a GeoIP Anonymous Plus database (database_type ${ANONYMIZER_PLUS_TYPE}: ANONYMIZER_MIN_CONFIDENCE=${minConfidence} needs its anonymizer_confidence)`, got);
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
      const confidence = rec['anonymizer_confidence'];
      if (confidence !== undefined && !(typeof confidence === 'number' && Number.isInteger(confidence) && confidence >= 1 && confidence <= 99)) {
        throw new DatabaseRefused(setting, 'anonymizer_confidence an integer from 1 to 99', `${got} with anonymizer_confidence = ${typeof confidence === 'bigint' ? String(confidence) : JSON.stringify(confidence)} for ${network()}`);
      }
      const provider = rec['provider_name'];
      if (provider !== undefined && typeof provider !== 'string') {
        throw new DatabaseRefused(setting, 'provider_name a string', `${got} with provider_name of type ${typeof provider} for ${network()}`);
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
  /** ANONYMIZER_MIN_CONFIDENCE: the database must be Anonymous Plus; records below it count as unflagged. */
  readonly minConfidence?: number | undefined;
}

/** The anonymizer database (ANONYMIZER_DB): checked, then polled and swapped in on change by WatchedMmdb. */
export class AnonymizerDatabase extends WatchedMmdb implements AnonymizerLookup {
  readonly #bits = new WeakMap<object, number>();
  readonly #providers = new WeakMap<object, string | null>();
  readonly #bitsOf: (raw: Readonly<Record<string, unknown>>) => number;

  constructor(path: string, opts: AnonymizerDatabaseOptions = {}) {
    super(path, opts, anonymizerCheck(opts.setting ?? 'ANONYMIZER_DB', opts.minConfidence));
    const min = opts.minConfidence;
    this.#bitsOf = min === undefined ? (raw) => recordBits(raw) : (raw) => recordBits(raw, min);
  }

  flags(ip: string): number {
    return this.derived(ip, this.#bits, this.#bitsOf) ?? 0;
  }

  /** GeoIP Anonymous Plus's provider_name for the address (the decision log's), else undefined. */
  provider(ip: string): string | undefined {
    const p = this.derived(ip, this.#providers, (raw) => (typeof raw['provider_name'] === 'string' ? raw['provider_name'].slice(0, PROVIDER_MAX) : null));
    return p ?? undefined;
  }
}
