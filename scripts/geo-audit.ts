/**
 * geo:audit (docs/operations.md "Show us how addresses in X are treated"): for each address in a
 * list, the tier it gets, its jurisdiction, the rule that decided and the database that decided,
 * under the policy in force: GEO_POLICY_FILE, else the settings, read from the same environment
 * the service reads.
 *
 *   npm run geo:audit -- [--json] FILE      (FILE: one address a line, `#` comments; `-` is stdin)
 *
 * Nothing here classifies: the settings are loaded by loadConfig, the databases opened and checked
 * by the service's own adapters, and the policy compiled by authz/geo-policy.ts compilePolicy, the
 * function every worker uses; each answer is its /v1/geoblock classifier's (the anonymizer rule
 * folded in). So the audit and the live decisions cannot drift. The deciding database is found by
 * asking the same compiled policy over each database alone: the one whose answer is the combined
 * answer (the primary on a tie, as the service combines them).
 *
 * A line that is not an address is reported on stderr with its number and skipped; the exit status
 * is 0 unless the settings, the policy or a database are refused (one line on stderr, status 2).
 */
import { readFileSync } from 'node:fs';
import { resolve } from 'node:path';
import { Writable } from 'node:stream';
import { parseArgs } from 'node:util';
import { compilePolicy, initialPolicy, type CompiledPolicy, type LivePolicyDeps } from '../authz/src/authz/geo-policy.ts';
import type { GeoResult } from '../authz/src/authz/stages/geo.ts';
import { AnonymizerDatabase } from '../authz/src/common/adapters/anonymizer.ts';
import { GeoDatabase, regionRuleOf } from '../authz/src/common/adapters/geoip.ts';
import { loadConfig, type Config } from '../authz/src/common/config.ts';
import { policyRegionRule } from '../authz/src/common/geo-policy-file.ts';
import { embeddedIpv4, normalizeIp } from '../authz/src/common/ip.ts';
import { createLogger } from '../authz/src/common/log.ts';
import { createMetrics } from '../authz/src/common/metrics.ts';

/** What decided an address's tier. */
export type AuditRule = 'trusted' | 'country' | 'region' | 'unknown' | 'unknown_region' | 'anonymizer';

/** One audited address (a CSV row, a JSON array element). */
export interface AuditRow {
  readonly address: string;
  readonly tier: GeoResult['access'];
  readonly jurisdiction: string;
  readonly country: string | null;
  readonly region: string | null;
  readonly verdict: GeoResult['verdict'];
  readonly rule: AuditRule;
  /** The translation form of an IPv6 address that embeds an IPv4 (6to4, nat64, siit, teredo), else null. */
  readonly embedded: string | null;
  /** The address looked up: the embedded IPv4, else the address itself. */
  readonly lookedUp: string;
  /** primary (GEOIP_DB) | secondary (GEOIP_DB_SECONDARY) | none (trusted: not looked up). */
  readonly database: 'primary' | 'secondary' | 'none';
  /** The deciding database's build date (its metadata), ISO 8601 UTC; null when none decided. */
  readonly databaseBuilt: string | null;
  readonly policy: string;
}

export const CSV_COLUMNS = ['address', 'tier', 'jurisdiction', 'country', 'region', 'verdict', 'rule', 'embedded', 'looked_up', 'database', 'database_built', 'policy'] as const;

function ruleOf(r: GeoResult): AuditRule {
  switch (r.verdict) {
    case 'trusted': return 'trusted';
    case 'allowed': case 'blocked_country': case 'close_only_country': return 'country';
    case 'blocked_region': case 'close_only_region': return 'region';
    case 'unknown_region': return 'unknown_region';
    case 'unknown_allowed': case 'unknown_blocked': case 'unknown_close_only': return 'unknown';
  }
}

const same = (a: GeoResult, b: GeoResult): boolean =>
  a.access === b.access && a.verdict === b.verdict && a.country === b.country && a.region === b.region && a.jurisdiction === b.jurisdiction;

const isoDate = (epochSecs: number): string | null => (epochSecs > 0 ? new Date(epochSecs * 1000).toISOString() : null);

export interface Auditor {
  readonly version: string;
  readonly source: string;
  readonly databases: Readonly<Record<string, { path: string; type: string; built: string | null }>>;
  /** One address's row; undefined when the text is not an address. */
  audit(text: string): AuditRow | undefined;
}

/** Opens the databases and compiles the policy in force, exactly as the service does at start. */
export function createAuditor(config: Config): Auditor {
  const first = initialPolicy(config);
  // The databases' region check (adapters/geoip.ts), against the policy in force, as at start-up.
  const rule = config.geoPolicyFile === undefined ? regionRuleOf(config) : policyRegionRule(first.doc);
  const primary = new GeoDatabase(config.geoipDb, { regionRule: rule });
  const secondary = config.geoipDbSecondary === undefined ? undefined : new GeoDatabase(config.geoipDbSecondary, { regionRule: rule, setting: 'GEOIP_DB_SECONDARY' });
  const anonymizer = config.anonymizer === undefined ? undefined : new AnonymizerDatabase(config.anonymizer.db, { minConfidence: config.anonymizer.minConfidence });
  const quiet = new Writable({ write(_c, _e, cb) { cb(); } });
  const base = { config, anonymizer, metrics: createMetrics({ geoipBuildEpochSecs: () => 0, defaultMetrics: false }), logger: createLogger('silent', quiet) };
  const compile = (deps: Pick<LivePolicyDeps, 'geo' | 'geoSecondary'>): CompiledPolicy => compilePolicy(first.doc, { ...base, ...deps });
  const both = compile({ geo: primary, geoSecondary: secondary });
  const primaryOnly = secondary === undefined ? both : compile({ geo: primary });
  const secondaryOnly = secondary === undefined ? undefined : compile({ geo: secondary });
  const built = { primary: isoDate(primary.buildEpochSecs), secondary: secondary === undefined ? null : isoDate(secondary.buildEpochSecs) };
  const databases: Record<string, { path: string; type: string; built: string | null }> = {
    primary: { path: config.geoipDb, type: primary.databaseType, built: built.primary },
  };
  if (secondary !== undefined) databases['secondary'] = { path: config.geoipDbSecondary ?? '', type: secondary.databaseType, built: built.secondary };
  return {
    version: both.version,
    source: first.doc.source,
    databases,
    audit(text) {
      const ip = normalizeIp(text);
      if (ip === '') return undefined;
      const answer = both.geoblock(ip);
      const geo = both.classify(ip);
      const embedded = ip.includes(':') ? embeddedIpv4(ip) : undefined;
      let database: AuditRow['database'] = 'primary';
      if (geo.verdict === 'trusted') database = 'none';
      else if (secondaryOnly !== undefined && !same(primaryOnly.classify(ip), geo) && same(secondaryOnly.classify(ip), geo)) database = 'secondary';
      return {
        address: ip, tier: answer.access, jurisdiction: answer.jurisdiction, country: answer.country, region: answer.region, verdict: answer.verdict,
        rule: answer.access !== geo.access ? 'anonymizer' : ruleOf(answer),
        embedded: embedded === undefined || geo.verdict === 'trusted' ? null : embedded.form,
        lookedUp: embedded === undefined || geo.verdict === 'trusted' ? ip : embedded.ipv4,
        database, databaseBuilt: database === 'none' ? null : built[database],
        policy: both.version,
      };
    },
  };
}

function csvField(v: string | null): string {
  const s = v ?? '';
  return /[",\r\n]/.test(s) ? `"${s.replaceAll('"', '""')}"` : s;
}

export function csvRow(r: AuditRow): string {
  return [r.address, r.tier, r.jurisdiction, r.country, r.region, r.verdict, r.rule, r.embedded, r.lookedUp, r.database, r.databaseBuilt, r.policy].map(csvField).join(',');
}

function main(): number {
  const { values, positionals } = parseArgs({ allowPositionals: true, options: { json: { type: 'boolean', default: false } } });
  const file = positionals[0];
  if (file === undefined || positionals.length > 1) {
    process.stderr.write('usage: npm run geo:audit -- [--json] FILE   (one address a line; `#` comments; `-` reads stdin)\n');
    return 2;
  }
  let auditor: Auditor;
  let input: string;
  try {
    // `npm run` starts the script in the package's directory: a relative FILE is the caller's (INIT_CWD).
    input = readFileSync(file === '-' ? 0 : resolve(process.env['INIT_CWD'] ?? process.cwd(), file), 'utf8');
    auditor = createAuditor(loadConfig(process.env));
  } catch (err) {
    process.stderr.write(`geo:audit: ${err instanceof Error ? err.message : String(err)}\n`);
    return 2;
  }
  const rows: AuditRow[] = [];
  const errors: { line: number; text: string }[] = [];
  input.split(/\r?\n/).forEach((raw, i) => {
    const text = raw.replace(/#.*/, '').trim();
    if (text === '') return;
    const row = auditor.audit(text);
    if (row === undefined) {
      errors.push({ line: i + 1, text: text.slice(0, 100) });
      process.stderr.write(`geo:audit: ${file}:${i + 1}: not an IP address, skipped: ${JSON.stringify(text.slice(0, 100))}\n`);
    } else rows.push(row);
  });
  if (values.json) {
    process.stdout.write(`${JSON.stringify({ policy: auditor.version, source: auditor.source, databases: auditor.databases, addresses: rows, errors }, null, 1)}\n`);
  } else {
    process.stdout.write(`${CSV_COLUMNS.join(',')}\n${rows.map((r) => `${csvRow(r)}\n`).join('')}`);
  }
  process.stderr.write(`geo:audit: ${rows.length} addresses under policy ${auditor.version} (${auditor.source}); ${errors.length} skipped\n`);
  return 0;
}

if (process.argv[1] !== undefined && import.meta.filename === process.argv[1]) process.exitCode = main();
