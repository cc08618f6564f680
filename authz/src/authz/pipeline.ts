/**
 * The decision pipeline. Every request: client address → geo → the route's policy; the geoblock
 * route (GET/HEAD /v1/geoblock) skips geo: it is how a blocked client learns that it is blocked.
 * Stops at the first denial. Returns synchronously when no I/O is needed (geo-only reads,
 * orders whose market is cached), so the common path allocates no Promise.
 */
import { classify, type RouteKind } from '../common/contract.ts';
import { ALLOW, deny, type Decision } from './decision.ts';
import type { AuthzInput } from './codec/request.ts';
import { geoDecision, type GeoResult } from './stages/geo.ts';
import type { AnonymizerCheck } from './stages/anonymizer.ts';
import { checkIngestHeaders, ingestStage, type IngestDeps } from './stages/ingest.ts';
import { orderStage, type OrderDeps } from './stages/order.ts';

/** The metrics and decision-log label: the route, or the ingest's header phase. */
export type RouteLabel = RouteKind | 'ingest_headers';

/** The route of a Check: the one Envoy matched, else (a hand-made Check) by method and path. */
export function routeOf(input: AuthzInput): RouteKind {
  return input.route ?? classify(input.method, input.path);
}

/** The label a decision is counted and logged under. */
export function routeLabel(input: AuthzInput, route: RouteKind = routeOf(input)): RouteLabel {
  return route === 'ingest' && input.phase !== undefined ? 'ingest_headers' : route;
}

export interface PipelineDeps {
  readonly classifyGeo: (ip: string) => GeoResult;
  readonly geoDenial: Decision;
  readonly ingest: IngestDeps;
  readonly order: OrderDeps;
  readonly isSealed: () => boolean;
  /**
   * The anonymizer rule (ANONYMIZER_DB; stages/anonymizer.ts) and its denial (the geo notice's
   * body and headers, reason `restricted_jurisdiction:anonymizer`); absent without ANONYMIZER_DB.
   */
  readonly anonymizer?: { readonly blocks: AnonymizerCheck; readonly denial: Decision; readonly onDenied?: (route: RouteLabel) => void };
  /**
   * Called when the shadow policy (SHADOW_*) would decide a request's tier differently from the
   * enforced one; counted and logged by the caller (authz/shadow.ts). Never changes the decision.
   */
  readonly onShadowDisagreement?: (input: AuthzInput, enforced: GeoResult, shadow: GeoResult) => void;
}

export const SEALED = deny('sealed');

/** Evaluates one request. Never throws for client input; callers still guard (fail closed). */
export function evaluate(input: AuthzInput, deps: PipelineDeps): Decision | Promise<Decision> {
  // 0. Sealed: nothing is allowed any more.
  if (deps.isSealed()) return SEALED;
  const route = routeOf(input);
  // The geoblock answer (market service) is for every client; it changes nothing and has no body.
  // Envoy's route only matches GET/HEAD /v1/geoblock; the method and path are checked again here.
  if (route === 'geoblock' && classify(input.method, input.path) === 'geoblock') return ALLOW;
  // 1. Client address (computed by Envoy; see authz/codec/request.ts) → 2. geo, on every other route.
  const geo = deps.classifyGeo(input.clientIp);
  // The shadow policy, when configured (zero cost otherwise: no result has `shadow`). Once per
  // request: an ingest's header phase is skipped, its body phase counts.
  const shadow = geo.shadow;
  if (shadow !== undefined && shadow.access !== geo.access && input.phase === undefined) deps.onShadowDisagreement?.(input, geo, shadow);
  const geoDenied = geoDecision(geo, deps.geoDenial);
  if (geoDenied !== undefined) return geoDenied;
  // 2b. Anonymizers (VPN, proxy, Tor…), on the routes ANONYMIZER_POLICY blocks; trusted addresses are not looked up.
  const anon = deps.anonymizer;
  if (anon !== undefined && geo.verdict !== 'trusted' && anon.blocks(input.clientIp, route)) {
    anon.onDenied?.(routeLabel(input, route));
    return anon.denial;
  }
  // 3. The route's policy.
  switch (route) {
    case 'ingest':
      // The header phase (no body yet): only what the headers decide; the body phase that
      // follows runs the whole policy again, headers included.
      if (input.phase !== undefined) return checkIngestHeaders(input, deps.ingest.replayWindowSecs, deps.ingest.clock.nowSecs()) ?? ALLOW;
      return ingestStage(input, deps.ingest);
    case 'order':
      // An allowed order carries the client's tier and jurisdiction to the backend.
      return orderStage(input.body, deps.order, geo.orderHeaders);
    default:
      return ALLOW;
  }
}
