/**
 * The geo policy in force, swapped live (GEO_POLICY_FILE; docs/operations.md "The geo policy
 * file"). A policy document (common/geo-policy-file.ts) is compiled once into the classifiers the
 * pipeline and /v1/geoblock call and the anonymizer check; the pipeline reads `current` per
 * request, so a swap is one assignment and a request is decided wholly under one version.
 *
 * The file is polled every POLICY_POLL_MS like GEOIP_DB (adapters/mmdb-file.ts: a different
 * inode, size, mtime or ctime, so a rename-over, an in-place rewrite and Kubernetes' `..data`
 * symlink swap all count). A new file is parsed, validated in full (its keys, its codes, its
 * region rules against the GeoIP databases now serving) and compiled before the swap; any
 * refusal keeps the old policy, is counted in edge_geo_policy_reloads_total{result="refused"}
 * and logged once with its reason. Each worker process polls on its own.
 */
import { OneAtATime } from '../common/one-at-a-time.ts';
import { statSync, type Stats } from 'node:fs';
import type { Config } from '../common/config.ts';
import type { Logger } from '../common/log.ts';
import type { AuthzMetrics } from '../common/metrics.ts';
import type { AnonymizerLookup, GeoLookup } from '../common/ports.ts';
import { sameFile } from '../common/adapters/mmdb-file.ts';
import { policyMetrics } from '../common/geo-policy-metrics.ts';
import { flagBits } from '../common/adapters/anonymizer.ts';
import { parseContext, policyRegionRule, PolicyRefused, policyWarnings, readPolicyFile, settingsPolicy, type PolicyDocument } from '../common/geo-policy-file.ts';
import { createGeoClassifier, regionUnknownTiers, type GeoResult } from './stages/geo.ts';
import { createAnonymizerCheck, withAnonymizer, type AnonymizerCheck } from './stages/anonymizer.ts';
import { secondaryGeo } from './geo-secondary.ts';

/** How often the policy file is polled: a replaced file is in force in every worker within this plus its load (≪ 1 s). */
export const POLICY_POLL_MS = 250;

/** A policy compiled for the hot path: nothing in it parses or allocates per request beyond the classifier's own. */
export interface CompiledPolicy {
  readonly doc: PolicyDocument;
  readonly version: string;
  /** The pipeline's classifier (GEOIP_DB_SECONDARY's disagreements counted). */
  readonly classify: (rawIp: string) => GeoResult;
  /** /v1/geoblock's classifier: the anonymizer rule folded in (stages/anonymizer.ts withAnonymizer). */
  readonly geoblock: (rawIp: string) => GeoResult;
  /** The anonymizer rule under this policy; undefined without ANONYMIZER_DB. */
  readonly anonymizerBlocks: AnonymizerCheck | undefined;
  /** The policy's first region rule (for the GeoIP databases' check), undefined when none. */
  readonly regionRule: string | undefined;
}

/** A GeoIP database that can say whether it would serve a region rule (adapters/geoip.ts GeoDatabase). */
export type CheckableGeo = GeoLookup & { accepts?(regionRule: string | undefined, setting?: string): Promise<void> };

export interface LivePolicyDeps {
  readonly config: Config;
  readonly geo: CheckableGeo;
  readonly geoSecondary?: CheckableGeo | undefined;
  /** ANONYMIZER_DB's database, when configured. */
  readonly anonymizer?: AnonymizerLookup | undefined;
  readonly metrics: AuthzMetrics;
  readonly logger: Logger;
}

/** Compiles one document against the databases: the classifiers and the anonymizer check. */
export function compilePolicy(doc: PolicyDocument, deps: LivePolicyDeps): CompiledPolicy {
  const { config } = deps;
  const policy = { ...doc.tiers, shadow: doc.shadow, geoTrustedCidrs: config.geoTrustedCidrs, version: doc.version };
  const rules = doc.anonymizer ?? config.anonymizer;
  const anonymizerBlocks = deps.anonymizer === undefined || rules === undefined
    ? undefined
    : createAnonymizerCheck({ flagMask: flagBits(rules.flags), actions: rules.actions }, deps.anonymizer);
  const asConfig = { ...config, ...doc.tiers, shadow: doc.shadow };
  return Object.freeze({
    doc,
    version: doc.version,
    classify: createGeoClassifier(policy, deps.geo, secondaryGeo(asConfig, deps.geoSecondary, deps.metrics, deps.logger)),
    geoblock: withAnonymizer(createGeoClassifier(policy, deps.geo, { secondary: deps.geoSecondary }), anonymizerBlocks),
    anonymizerBlocks,
    regionRule: policyRegionRule(doc),
  });
}

/** The first policy: GEO_POLICY_FILE's (checked now; a bad one ends start-up), else the settings'. */
export function initialPolicy(config: Config): { doc: PolicyDocument; stat: Stats | undefined } {
  if (config.geoPolicyFile === undefined) return { doc: settingsPolicy(config), stat: undefined };
  return readPolicyFile(config.geoPolicyFile, parseContext(config));
}

/** The same rules, whatever the version (a re-synced file that changed nothing). */
function sameRules(a: PolicyDocument, b: PolicyDocument): boolean {
  const strip = (d: PolicyDocument): string => settingsPolicy({ ...d.tiers, shadow: d.shadow, anonymizer: d.anonymizer === undefined ? undefined : { db: '', ...d.anonymizer } }).version;
  return strip(a) === strip(b);
}

/** The policy in force, and (with GEO_POLICY_FILE) its watch. */
export class LiveGeoPolicy {
  #current: CompiledPolicy;
  readonly #deps: LivePolicyDeps;
  readonly #metrics: ReturnType<typeof policyMetrics>;
  readonly #path: string | undefined;
  #stat: Stats | undefined;
  #timer: NodeJS.Timeout | undefined;
  readonly #reloads = new OneAtATime();

  constructor(deps: LivePolicyDeps, first: { doc: PolicyDocument; stat: Stats | undefined } = initialPolicy(deps.config)) {
    this.#deps = deps;
    this.#path = deps.config.geoPolicyFile;
    this.#stat = first.stat;
    this.#metrics = policyMetrics(deps.metrics.registry);
    this.#current = compilePolicy(first.doc, deps);
    this.#metrics.info.reset();
    this.#metrics.info.labels(first.doc.version).set(1);
  }

  /** The compiled policy now in force (read once per request). */
  get current(): CompiledPolicy {
    return this.#current;
  }

  /** The start-up log line's fields: the version, where it came from, and GEO_REGION_UNKNOWN's tiers. */
  describe(): Record<string, unknown> {
    const d = this.#current.doc;
    const tiers = regionUnknownTiers(d.tiers);
    return {
      version: d.version, source: d.source, blockedCountries: d.tiers.blockedCountries.size, blockedRegions: d.tiers.blockedRegions.size,
      closeOnlyCountries: d.tiers.closeOnlyCountries.size, closeOnlyRegions: d.tiers.closeOnlyRegions.size, shadow: d.shadow !== undefined,
      ...(Object.keys(tiers).length === 0 ? {} : { geoRegionUnknown: d.tiers.geoRegionUnknown, regionUnknownTiers: tiers }),
      ...(d.shadow === undefined || Object.keys(regionUnknownTiers(d.shadow)).length === 0 ? {} : { shadowRegionUnknownTiers: regionUnknownTiers(d.shadow) }),
    };
  }

  /**
   * Loads the file again, validates it in full and swaps it in; else keeps the policy in force.
   * Resolves with success. One at a time: a call during one waits for it.
   */
  reload(): Promise<boolean> {
    return this.#reloads.run(() => this.#reloadNow());
  }

  async #reloadNow(): Promise<boolean> {
    const path = this.#path;
    if (path === undefined) return false;
    const { logger } = this.#deps;
    const previous = this.#current.version;
    let stat: Stats | undefined;
    try {
      const read = readPolicyFile(path, parseContext(this.#deps.config));
      stat = read.stat;
      const doc = read.doc;
      if (doc.version === previous && !sameRules(doc, this.#current.doc)) {
        throw new PolicyRefused(path, 'version', `a new version for changed rules (the backend records the version each order was admitted under; ${previous} is in force with other rules)`, doc.version);
      }
      // The databases now serving must be able to serve the new region rules (a country database cannot).
      const rule = policyRegionRule(doc);
      await this.#deps.geo.accepts?.(rule);
      await this.#deps.geoSecondary?.accepts?.(rule, 'GEOIP_DB_SECONDARY');
      const compiled = compilePolicy(doc, this.#deps);
      this.#stat = stat;
      if (doc.version === previous) return true; // the same policy re-written: nothing to swap
      this.#current = compiled;
      this.#metrics.info.reset();
      this.#metrics.info.labels(doc.version).set(1);
      this.#metrics.reloads.labels('ok').inc();
      logger.info({ path, previous, ...this.describe() }, 'geo policy replaced: the new version is in force');
      for (const w of policyWarnings(doc)) logger.warn(w);
      return true;
    } catch (err) {
      // Remember the refused file so it is reported once, not on every poll.
      try {
        this.#stat = stat ?? statSync(path);
      } catch { /* missing: keep polling */ }
      this.#metrics.reloads.labels('refused').inc();
      logger.error({ path, version: previous, err: err instanceof Error ? err.message : String(err) },
        'geo policy replacement refused; the policy in force keeps serving');
      return false;
    }
  }

  /** Polls GEO_POLICY_FILE (nothing to do without one). */
  watch(intervalMs = POLICY_POLL_MS): void {
    const path = this.#path;
    if (path === undefined || this.#timer !== undefined) return;
    this.#timer = setInterval(() => {
      let cur: Stats;
      try {
        cur = statSync(path);
      } catch {
        return; // momentarily absent during a replace
      }
      if (!this.#reloads.busy && (this.#stat === undefined || !sameFile(cur, this.#stat))) void this.reload();
    }, intervalMs);
    this.#timer.unref();
  }

  close(): void {
    if (this.#timer !== undefined) clearInterval(this.#timer);
    this.#timer = undefined;
  }
}
