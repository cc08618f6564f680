/**
 * The shadow geo policy's outcome (issue 18 point 3; docs/operations.md "Changing the geo
 * policy: shadow first"): SHADOW_* describe a candidate policy that stages/geo.ts classifies
 * beside the enforced one (same lookup, cached per record). It is never enforced; each request it
 * would have put in another tier is counted (edge_geo_shadow_disagreements_total{enforced,shadow})
 * and logged at info with its request id. No SHADOW_* setting: no hook, nothing done per request.
 */
import type { Config } from '../common/config.ts';
import type { Logger } from '../common/log.ts';
import type { AuthzMetrics } from '../common/metrics.ts';
import type { AuthzInput } from './codec/request.ts';
import { routeLabel, type PipelineDeps } from './pipeline.ts';
import type { GeoResult } from './stages/geo.ts';

/** The log line's message (what to grep for). */
export const SHADOW_MSG = 'shadow geo policy disagrees';

/** The disagreement hook for PipelineDeps, or nothing when no shadow policy is configured. */
export function shadowHooks(config: { readonly shadow: Config['shadow'] | true }, metrics: Pick<AuthzMetrics, 'shadowDisagreement'>, logger: Logger): Pick<PipelineDeps, 'onShadowDisagreement'> {
  if (config.shadow === undefined) return {};
  return {
    onShadowDisagreement(input: AuthzInput, enforced: GeoResult, shadow: GeoResult): void {
      metrics.shadowDisagreement(enforced.access, shadow.access);
      // The jurisdiction, not the address: the same fields as the decision log.
      logger.info({
        requestId: input.requestId ?? null,
        route: routeLabel(input),
        enforced: enforced.access,
        shadow: shadow.access,
        enforcedVerdict: enforced.verdict,
        shadowVerdict: shadow.verdict,
        country: enforced.country,
        region: enforced.region,
      }, SHADOW_MSG);
    },
  };
}
