/**
 * Anonymous IP test databases, generated at test time by fixtures/make-anonymizer-mmdb.py (PyPI
 * mmdb_writer in the project's .venv) into a fresh temporary directory, removed at exit. The
 * licensed GeoIP2 Anonymous IP data cannot be shipped; these files have its layout.
 */
import { join } from 'node:path';
import { generateMmdbFixtures } from './mmdb-fixtures.ts';

export interface AnonymizerFixtures {
  readonly dir: string;
  /** 192.0.2.64/28 VPN, .80/28 hosting, .96/28 public proxy, .112/28 Tor exit, .48/28 residential proxy, .32/28 all flags false; 2001:db8:3:a000::/52 VPN, 2001:db8:3:b000::/52 Tor. */
  readonly anonymizer: string;
  /** After an update: 192.0.2.16/28 VPN and 192.0.2.112/28 Tor only. */
  readonly anonymizerSwapped: string;
  /** GeoIP-Anonymous-Plus type: 192.0.2.64/28 VPN, 192.0.2.48/28 residential proxy, with Anonymous Plus's own fields. */
  readonly anonymizerPlus: string;
  /** GeoIP-Anonymous-Plus type with anonymizer_confidence 0 (outside 1–99). */
  readonly anonymizerPlusBadConfidence: string;
  /** GeoIP-Anonymous-Plus type with provider_name an integer. */
  readonly anonymizerPlusBadProvider: string;
  /** Anonymous IP type with the flags written as integers 1/0. */
  readonly anonymizerInt: string;
  /** anonymizer.mmdb plus one record with integer flags at 2001:db8:ffff::/48 (the far end of the tree). */
  readonly anonymizerLateInt: string;
  /** Anonymous IP type whose records set no flag. */
  readonly anonymizerUnflagged: string;
  /** What the script wrote: network → record, per file. */
  readonly layout: Readonly<Record<string, Readonly<Record<string, Readonly<Record<string, boolean>>>>>>;
}

let cached: AnonymizerFixtures | undefined;

/** Generates the databases once per process and returns their paths. */
export function anonymizerFixtures(): AnonymizerFixtures {
  if (cached !== undefined) return cached;
  const { dir, out } = generateMmdbFixtures('make-anonymizer-mmdb.py', 'edge-anon-');
  cached = Object.freeze({
    dir,
    anonymizer: join(dir, 'anonymizer.mmdb'),
    anonymizerSwapped: join(dir, 'anonymizer-swapped.mmdb'),
    anonymizerPlus: join(dir, 'anonymizer-plus.mmdb'),
    anonymizerPlusBadConfidence: join(dir, 'anonymizer-plus-bad-confidence.mmdb'),
    anonymizerPlusBadProvider: join(dir, 'anonymizer-plus-bad-provider.mmdb'),
    anonymizerInt: join(dir, 'anonymizer-int.mmdb'),
    anonymizerLateInt: join(dir, 'anonymizer-late-int.mmdb'),
    anonymizerUnflagged: join(dir, 'anonymizer-unflagged.mmdb'),
    layout: JSON.parse(out) as AnonymizerFixtures['layout'],
  });
  return cached;
}
