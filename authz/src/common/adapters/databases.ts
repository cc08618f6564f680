/**
 * The database files a configuration names (GEOIP_DB, ANONYMIZER_DB), checked as the service
 * checks them when it starts (adapters/geoip.ts, adapters/anonymizer.ts), for a launcher that
 * refuses bad settings before it starts anything (scripts/start.ts).
 */
import { ConfigError, type Config } from '../config.ts';
import { AnonymizerDatabase } from './anonymizer.ts';
import { GeoDatabase, regionRuleOf } from './geoip.ts';
import { parseContext, policyRegionRule, readPolicyFile } from '../geo-policy-file.ts';

/**
 * Opens, checks and closes each database `config` names. Throws a ConfigError naming the setting:
 * the check's refusal (the wrong kind of database), or a file that cannot be read as one.
 */
export function checkDatabases(config: Pick<Config, 'geoipDb' | 'anonymizer' | 'blockedRegions' | 'closeOnlyRegions' | 'shadow'> & { readonly geoipDbSecondary?: string | undefined; readonly geoPolicyFile?: string | undefined }): void {
  const open = (setting: string, path: string, make: () => { close(): void }): void => {
    try {
      make().close();
    } catch (err) {
      if (err instanceof ConfigError) throw err;
      throw new ConfigError(setting, 'a readable MaxMind DB (.mmdb) file', `${path}: ${err instanceof Error ? err.message : String(err)}`);
    }
  };
  // GEO_POLICY_FILE: the file's region rules (a bad file is refused here, one line naming the key).
  const regionRule = config.geoPolicyFile === undefined ? regionRuleOf(config) : policyRegionRule(readPolicyFile(config.geoPolicyFile, parseContext(config)).doc);
  open('GEOIP_DB', config.geoipDb, () => new GeoDatabase(config.geoipDb, { regionRule }));
  const secondary = config.geoipDbSecondary;
  if (secondary !== undefined) open('GEOIP_DB_SECONDARY', secondary, () => new GeoDatabase(secondary, { regionRule, setting: 'GEOIP_DB_SECONDARY' }));
  const anonymizer = config.anonymizer;
  if (anonymizer !== undefined) open('ANONYMIZER_DB', anonymizer.db, () => new AnonymizerDatabase(anonymizer.db, { minConfidence: anonymizer.minConfidence }));
}
