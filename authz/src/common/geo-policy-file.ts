/**
 * The geo policy as a document (GEO_POLICY_FILE, YAML or JSON; docs/operations.md "The geo policy
 * file"): the tiers by country and region, GEO_UNKNOWN, GEO_REGION_UNKNOWN, the shadow policy,
 * the anonymizer policy and a `version`. Each key is its setting's name in lower case
 * (`blocked_countries` is BLOCKED_COUNTRIES), so the environment settings are the same policy's
 * simple form; a policy given by settings gets the version `env-<12 hex of its SHA-256>`.
 *
 * parsePolicy validates a whole document before anything uses it: an unknown key, a malformed
 * code, a code in two tiers, a bad version is refused with one line naming the key, so a reload
 * never swaps in half a policy. Nothing here runs per request.
 */
import { createHash } from 'node:crypto';
import { readFileSync, statSync, type Stats } from 'node:fs';
import { parse as parseYaml } from 'yaml';
import { ANONYMIZER_ROUTES, ConfigError, type Config, type GeoRegionUnknown, type GeoUnknown, type TierPolicy } from './config.ts';
import { ANONYMIZER_FLAGS, type AnonymizerFlag } from './ports.ts';
import { RE } from './rules.ts';
import type { RouteKind } from './contract.ts';

/** A policy's version: what the backend records (x-edge-policy) and the metric's label. */
export const POLICY_VERSION = /^[A-Za-z0-9][A-Za-z0-9._:+-]{0,63}$/;

/** The largest policy file read (a policy names at most a few hundred codes). */
export const POLICY_MAX_BYTES = 1_048_576;

/** The anonymizer policy a document holds (the database itself stays ANONYMIZER_DB). */
export interface AnonymizerRules {
  readonly flags: readonly AnonymizerFlag[];
  readonly actions: Readonly<Record<RouteKind, 'block' | 'allow'>>;
}

/** One whole geo policy, validated. */
export interface PolicyDocument {
  readonly version: string;
  /** Where it came from: the file's path, or `settings`. */
  readonly source: string;
  readonly tiers: TierPolicy;
  readonly shadow: TierPolicy | undefined;
  /** undefined: the settings' (or default) anonymizer policy applies. */
  readonly anonymizer: AnonymizerRules | undefined;
}

/** A document refused: `GEO_POLICY_FILE: <path>: <key>: expected …, got …` (one line). */
export class PolicyRefused extends ConfigError {
  readonly key: string;
  constructor(source: string, key: string, expected: string, got?: unknown) {
    super('GEO_POLICY_FILE', expected);
    this.name = 'PolicyRefused';
    this.key = key;
    const shown = got === undefined ? '' : `, got ${JSON.stringify(got)?.slice(0, 120) ?? String(got)}`;
    this.message = `GEO_POLICY_FILE: ${source}: ${key}: expected ${expected}${shown}`;
  }
}

const TIER_KEYS = ['blocked_countries', 'blocked_regions', 'close_only_countries', 'close_only_regions', 'geo_unknown', 'geo_region_unknown'] as const;
const TOP_KEYS: readonly string[] = ['version', ...TIER_KEYS, 'shadow', 'anonymizer_flags', 'anonymizer_policy'];

type Doc = Record<string, unknown>;

function isMap(v: unknown): v is Doc {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

function codes(src: string, doc: Doc, key: string, re: RegExp, what: string): string[] | undefined {
  const v = doc[key];
  if (v === undefined || v === null) return undefined;
  if (!Array.isArray(v)) throw new PolicyRefused(src, key, `a list of ${what}`, v);
  const out: string[] = [];
  for (const c of v) {
    const up = typeof c === 'string' ? c.trim().toUpperCase() : '';
    if (!re.test(up)) throw new PolicyRefused(src, key, `a list of ${what}`, c);
    if (!out.includes(up)) out.push(up);
  }
  return out;
}

function choice<T extends string>(src: string, doc: Doc, key: string, allowed: readonly T[]): T | undefined {
  const v = doc[key];
  if (v === undefined || v === null) return undefined;
  const s = typeof v === 'string' ? v.trim().toLowerCase() : '';
  if (!(allowed as readonly string[]).includes(s)) throw new PolicyRefused(src, key, allowed.map((a) => `"${a}"`).join(' or '), v);
  return s as T;
}

/** The tier keys of `doc` (the top level, or `shadow`), each absent one taken from `base`. */
function tiers(src: string, doc: Doc, prefix: string, base: TierPolicy): TierPolicy {
  const k = (key: string): string => `${prefix}${key}`;
  const at = (key: string): Doc => ({ [k(key)]: doc[key] });
  const blockedCountries = codes(src, at('blocked_countries'), k('blocked_countries'), RE.country, 'ISO 3166-1 alpha-2 codes') ?? [...base.blockedCountries];
  const blockedRegions = codes(src, at('blocked_regions'), k('blocked_regions'), RE.region, 'ISO 3166-2 codes like CA-ON') ?? [...base.blockedRegions];
  const closeOnlyCountries = codes(src, at('close_only_countries'), k('close_only_countries'), RE.country, 'ISO 3166-1 alpha-2 codes') ?? [...base.closeOnlyCountries];
  const closeOnlyRegions = codes(src, at('close_only_regions'), k('close_only_regions'), RE.region, 'ISO 3166-2 codes like CA-ON') ?? [...base.closeOnlyRegions];
  for (const [name, closeOnly, blocked] of [['countries', closeOnlyCountries, blockedCountries], ['regions', closeOnlyRegions, blockedRegions]] as const) {
    const both = closeOnly.filter((c) => blocked.includes(c));
    if (both.length > 0) throw new PolicyRefused(src, k(`close_only_${name}`), `codes not also in ${k(`blocked_${name}`)} (each jurisdiction has one tier)`, both.join(','));
  }
  return Object.freeze({
    blockedCountries: new Set(blockedCountries),
    blockedRegions: new Set(blockedRegions),
    closeOnlyCountries: new Set(closeOnlyCountries),
    closeOnlyRegions: new Set(closeOnlyRegions),
    geoUnknown: choice<GeoUnknown>(src, at('geo_unknown'), k('geo_unknown'), ['block', 'close-only', 'allow']) ?? base.geoUnknown,
    geoRegionUnknown: choice<GeoRegionUnknown>(src, at('geo_region_unknown'), k('geo_region_unknown'), ['strictest', 'country']) ?? base.geoRegionUnknown,
  });
}

const NO_TIERS: TierPolicy = Object.freeze({
  blockedCountries: new Set<string>(), blockedRegions: new Set<string>(), closeOnlyCountries: new Set<string>(), closeOnlyRegions: new Set<string>(),
  geoUnknown: 'block', geoRegionUnknown: 'strictest',
});

function unknownKey(src: string, doc: Doc, allowed: readonly string[], prefix: string): void {
  for (const key of Object.keys(doc)) {
    if (!allowed.includes(key)) throw new PolicyRefused(src, `${prefix}${key}`, `one of the keys ${allowed.join(', ')} (docs/operations.md "The geo policy file")`);
  }
}

function anonymizerRules(src: string, doc: Doc, defaults: AnonymizerRules): AnonymizerRules | undefined {
  const flagsRaw = doc['anonymizer_flags'];
  const policyRaw = doc['anonymizer_policy'];
  if (flagsRaw === undefined && policyRaw === undefined) return undefined;
  let flags = defaults.flags;
  if (flagsRaw !== undefined) {
    if (!Array.isArray(flagsRaw) || flagsRaw.length === 0) throw new PolicyRefused(src, 'anonymizer_flags', `a list of ${ANONYMIZER_FLAGS.join(', ')}`, flagsRaw);
    const names = flagsRaw.map((f) => (typeof f === 'string' ? f.trim().toLowerCase() : ''));
    const bad = names.findIndex((f) => !(ANONYMIZER_FLAGS as readonly string[]).includes(f));
    if (bad !== -1) throw new PolicyRefused(src, 'anonymizer_flags', `a list of ${ANONYMIZER_FLAGS.join(', ')}`, flagsRaw[bad]);
    flags = [...new Set(names)] as AnonymizerFlag[];
  }
  const actions: Record<string, 'block' | 'allow'> = { ...defaults.actions };
  if (policyRaw !== undefined) {
    if (!isMap(policyRaw)) throw new PolicyRefused(src, 'anonymizer_policy', `a map of route (${ANONYMIZER_ROUTES.join(', ')}) to block or allow`, policyRaw);
    for (const [route, action] of Object.entries(policyRaw)) {
      if (!(ANONYMIZER_ROUTES as readonly string[]).includes(route)) throw new PolicyRefused(src, `anonymizer_policy.${route}`, `a route of ${ANONYMIZER_ROUTES.join(', ')}`);
      if (action !== 'block' && action !== 'allow') throw new PolicyRefused(src, `anonymizer_policy.${route}`, '"block" or "allow"', action);
      actions[route] = action;
    }
  }
  return Object.freeze({ flags: Object.freeze(flags), actions: Object.freeze({ ...actions, geoblock: 'allow' }) as AnonymizerRules['actions'] });
}

export interface ParseContext {
  /** ANONYMIZER_DB is set: the anonymizer keys have a database to apply to. */
  readonly anonymizerDb: boolean;
  /** The anonymizer policy's defaults (the keys a document leaves out). */
  readonly anonymizerDefaults: AnonymizerRules;
}

/**
 * Parses and validates one policy file's text. YAML (JSON is YAML; a `.json` file is read as
 * strict JSON). Throws PolicyRefused naming the first bad key.
 */
export function parsePolicy(text: string, source: string, ctx: ParseContext): PolicyDocument {
  let raw: unknown;
  try {
    raw = source.endsWith('.json') ? JSON.parse(text) : parseYaml(text, { uniqueKeys: true, maxAliasCount: 0 });
  } catch (err) {
    const why = (err instanceof Error ? err.message : String(err)).split('\n')[0] ?? '';
    throw new PolicyRefused(source, '(file)', `${source.endsWith('.json') ? 'JSON' : 'YAML'} (${why})`);
  }
  if (!isMap(raw)) throw new PolicyRefused(source, '(file)', 'a map of policy keys (version, blocked_countries, …)');
  unknownKey(source, raw, TOP_KEYS, '');
  const version = typeof raw['version'] === 'number' ? String(raw['version']) : raw['version'];
  if (typeof version !== 'string' || !POLICY_VERSION.test(version)) {
    throw new PolicyRefused(source, 'version', 'a version string of 1–64 letters, digits and . _ : + - (it is sent as a header and a metric label)', version);
  }
  const enforced = tiers(source, raw, '', NO_TIERS);
  let shadow: TierPolicy | undefined;
  if (raw['shadow'] !== undefined && raw['shadow'] !== null) {
    if (!isMap(raw['shadow'])) throw new PolicyRefused(source, 'shadow', 'a map of the tier keys a candidate policy changes', raw['shadow']);
    unknownKey(source, raw['shadow'], TIER_KEYS, 'shadow.');
    shadow = tiers(source, raw['shadow'], 'shadow.', enforced);
  }
  const anonymizer = anonymizerRules(source, raw, ctx.anonymizerDefaults);
  if (anonymizer !== undefined && !ctx.anonymizerDb) {
    throw new PolicyRefused(source, 'anonymizer_flags', 'no anonymizer keys without ANONYMIZER_DB (there is no anonymizer database to apply them to)');
  }
  return Object.freeze({ version, source, tiers: enforced, shadow, anonymizer });
}

/** A canonical JSON of a policy's rules (sorted codes), what the settings' version hashes. */
function canonical(doc: Pick<PolicyDocument, 'tiers' | 'shadow' | 'anonymizer'>): string {
  const t = (p: TierPolicy): unknown => ({
    blocked_countries: [...p.blockedCountries].sort(), blocked_regions: [...p.blockedRegions].sort(),
    close_only_countries: [...p.closeOnlyCountries].sort(), close_only_regions: [...p.closeOnlyRegions].sort(),
    geo_unknown: p.geoUnknown, geo_region_unknown: p.geoRegionUnknown,
  });
  return JSON.stringify({ ...(t(doc.tiers) as object), shadow: doc.shadow === undefined ? null : t(doc.shadow), anonymizer: doc.anonymizer ?? null });
}

/** The policy the settings give (no GEO_POLICY_FILE): version `env-` and 12 hex of its SHA-256. */
export function settingsPolicy(config: Pick<Config, 'blockedCountries' | 'blockedRegions' | 'closeOnlyCountries' | 'closeOnlyRegions' | 'geoUnknown' | 'geoRegionUnknown' | 'shadow' | 'anonymizer'>): PolicyDocument {
  const tiersOf: TierPolicy = {
    blockedCountries: config.blockedCountries, blockedRegions: config.blockedRegions, closeOnlyCountries: config.closeOnlyCountries,
    closeOnlyRegions: config.closeOnlyRegions, geoUnknown: config.geoUnknown, geoRegionUnknown: config.geoRegionUnknown,
  };
  const anonymizer = config.anonymizer === undefined ? undefined : { flags: config.anonymizer.flags, actions: config.anonymizer.actions };
  const body = { tiers: tiersOf, shadow: config.shadow, anonymizer };
  const version = `env-${createHash('sha256').update(canonical(body)).digest('hex').slice(0, 12)}`;
  return Object.freeze({ version, source: 'settings', ...body });
}

/**
 * What a valid policy may not have meant, said when it comes into force (as configWarnings says it
 * for the settings): a close-only region inside a blocked country gets close-only, not 451.
 */
export function policyWarnings(doc: Pick<PolicyDocument, 'tiers' | 'source'>): string[] {
  const out: string[] = [];
  for (const r of doc.tiers.closeOnlyRegions) {
    const cc = r.slice(0, r.indexOf('-'));
    if (doc.tiers.blockedCountries.has(cc)) {
      out.push(`${doc.source}: close_only_regions lists ${r} inside ${cc}, which blocked_countries blocks: clients located in ${r} get close-only `
        + `access, not 451 (a region rule overrides its country's). Remove ${r} from close_only_regions if ${cc} is to be blocked everywhere.`);
    }
  }
  return out;
}

/** The first region rule a policy holds (`blocked_regions=US-NV`), for the GeoIP database check. */
export function policyRegionRule(doc: Pick<PolicyDocument, 'tiers' | 'shadow'>): string | undefined {
  const named: [string, ReadonlySet<string> | undefined][] = [
    ['blocked_regions', doc.tiers.blockedRegions], ['close_only_regions', doc.tiers.closeOnlyRegions],
    ['shadow.blocked_regions', doc.shadow?.blockedRegions], ['shadow.close_only_regions', doc.shadow?.closeOnlyRegions],
  ];
  for (const [name, set] of named) if (set !== undefined && set.size > 0) return `${name}=${[...set].join(',')}`;
  return undefined;
}

/** The parse context of a configuration: whether ANONYMIZER_DB is set, and the anonymizer defaults. */
export function parseContext(config: Pick<Config, 'anonymizer'>): ParseContext {
  return {
    anonymizerDb: config.anonymizer !== undefined,
    anonymizerDefaults: config.anonymizer ?? { flags: [], actions: { order: 'block', ingest: 'block', read: 'allow', geoblock: 'allow' } },
  };
}

/** Reads and validates GEO_POLICY_FILE now (start-up); throws PolicyRefused (one line) or the read error as one. */
export function readPolicyFile(path: string, ctx: ParseContext): { doc: PolicyDocument; stat: Stats } {
  let stat: Stats;
  let text: string;
  try {
    // stat before read: a file replaced in between is seen as newer by the next poll.
    stat = statSync(path);
    if (stat.size > POLICY_MAX_BYTES) throw new PolicyRefused(path, '(file)', `at most ${POLICY_MAX_BYTES} bytes`, stat.size);
    text = readFileSync(path, 'utf8');
  } catch (err) {
    if (err instanceof PolicyRefused) throw err;
    throw new PolicyRefused(path, '(file)', 'a readable file', err instanceof Error ? err.message : String(err));
  }
  return { doc: parsePolicy(text, path, ctx), stat };
}

