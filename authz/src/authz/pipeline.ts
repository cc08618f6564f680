/**
 * The decision pipeline. Every request: client address → geo → the route's policy; the geoblock
 * route (GET/HEAD /v1/geoblock) skips geo: it is how a blocked client learns that it is blocked.
 * Stops at the first denial. Returns synchronously when no I/O is needed (geo-only reads,
 * orders whose market is cached), so the common path allocates no Promise.
 *
 * Ingests and orders are asked twice: first their header phase (no body yet: Envoy has buffered
 * nothing), which decides geo, the anonymizer rule and, for an ingest, its signature headers and
 * the pending-body bound; then their body phase, the whole policy (geo again: it is synchronous).
 */
import { classify, KINDS, UNKNOWN_ROUTE, type CheckRoute, type HeaderPhaseLabel } from '../common/routes.ts';
import { ALLOW, deny, type Decision } from './decision.ts';
import type { AuthzInput } from './codec/request.ts';
import { geoDecision, type GeoResult } from './stages/geo.ts';
import type { AnonymizerCheck } from './stages/anonymizer.ts';
import { checkIngestHeaders, ingestStage, type IngestDeps } from './stages/ingest.ts';
import { orderStage, type OrderDeps } from './stages/order.ts';
import type { PendingBodies } from './pending-bodies.ts';

/**
 * The metrics and decision-log label: the route kind, the header phase of a kind with a body
 * (routes.ts KINDS), or UNKNOWN_ROUTE (a route value from Envoy the registry does not know).
 */
export type RouteLabel = CheckRoute | HeaderPhaseLabel;

/** The route of a Check: the one Envoy matched (or UNKNOWN_ROUTE), else (a hand-made Check) by method and path. */
export function routeOf(input: AuthzInput): CheckRoute {
  return input.route ?? classify(input.method, input.path);
}

/** The label a decision is counted and logged under. */
export function routeLabel(input: AuthzInput, route: CheckRoute = routeOf(input)): RouteLabel {
  if (input.phase === undefined || route === UNKNOWN_ROUTE) return route;
  return KINDS[route].headerLabel ?? route;
}

export interface PipelineDeps {
  readonly classifyGeo: (ip: string) => GeoResult;
  readonly geoDenial: Decision;
  readonly ingest: IngestDeps;
  readonly order: OrderDeps;
  readonly isSealed: () => boolean;
  /**
   * The bound on ingest bodies pending per client address (INGEST_MAX_PENDING_PER_CLIENT;
   * pending-bodies.ts); absent: unbounded (tests of other stages).
   */
  readonly pendingBodies?: PendingBodies;
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
/**
 * A route value from Envoy that the registry does not know: Envoy's route config and this service
 * disagree (a deploy mismatch). Denied and counted under route `unknown`, never geo-only allowed.
 */
export const UNKNOWN_ROUTE_DENIAL: Decision = {
  ...deny('service_unavailable', 'the edge\'s route configuration does not match the authorization service; the request was not accepted'),
  reason: 'service_unavailable:unknown_route',
};
/** A body Envoy cut at the route's limit (AuthzInput.partialBody): over INGEST_MAX_BYTES / ORDER_MAX_BYTES. */
const TOO_LARGE = deny('payload_too_large');

const PENDING_MESSAGE = 'too many ingest bodies in flight from this client address; retry when one has been answered';
const pendingDenials = new Map<number, Decision>();

/**
 * The 429 of the pending-body bound, with Retry-After: the whole seconds until the client's oldest
 * pending body expires (≥ 1). One Decision per value (at most REQUEST_BODY_TIMEOUT_MS / 1000 of them).
 */
export function pendingDenial(retryAfterMs: number): Decision {
  const secs = Math.max(1, Math.ceil(retryAfterMs / 1000));
  let d = pendingDenials.get(secs);
  if (d === undefined) {
    const base = deny('too many requests', PENDING_MESSAGE);
    d = { ...base, reason: 'too many requests:pending_bodies', headers: Object.freeze([...base.headers, ['retry-after', String(secs)] as const]), encoded: undefined };
    if (pendingDenials.size < 128) pendingDenials.set(secs, d);
  }
  return d;
}

/** The ingest's header phase, once its headers passed: a slot among its client's pending bodies, or 429. */
function admitBody(input: AuthzInput, pending: PendingBodies | undefined): Decision {
  const wait = pending?.admit(input.clientIp, input.requestId);
  return wait === undefined ? ALLOW : pendingDenial(wait);
}

/** Evaluates one request. Never throws for client input; callers still guard (fail closed). */
export function evaluate(input: AuthzInput, deps: PipelineDeps): Decision | Promise<Decision> {
  const route = routeOf(input);
  // Fail closed on a route this service does not know: no policy to run, so nothing is allowed.
  if (route === UNKNOWN_ROUTE) return UNKNOWN_ROUTE_DENIAL;
  // An ingest's body phase: its body is whole, no longer pending (whatever the decision).
  if (route === 'ingest' && input.phase === undefined) deps.pendingBodies?.release(input.requestId);
  // 0. Sealed: nothing is allowed any more.
  if (deps.isSealed()) return SEALED;
  // The geoblock answer (market service) is for every client; it changes nothing and has no body.
  // Envoy's route only matches GET/HEAD /v1/geoblock; the method and path are checked again here.
  if (!KINDS[route].geo && classify(input.method, input.path) === route) return ALLOW;
  // 1. Client address (computed by Envoy; see authz/codec/request.ts) → 2. geo, on every other route.
  const geo = deps.classifyGeo(input.clientIp);
  // The shadow policy, when configured (zero cost otherwise: no result has `shadow`). Once per
  // request: a header phase is skipped, the body phase counts.
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
      // The header phase (no body yet): only what the headers decide, then a slot among the
      // client's pending bodies; the body phase that follows runs the whole policy again,
      // headers included.
      if (input.phase !== undefined) return checkIngestHeaders(input, deps.ingest.replayWindowSecs, deps.ingest.clock.nowSecs()) ?? admitBody(input, deps.pendingBodies);
      if (input.partialBody === true) return TOO_LARGE;
      return ingestStage(input, deps.ingest);
    case 'order':
      // The header phase: geo and the anonymizer rule passed; the order itself is in the body.
      if (input.phase !== undefined) return ALLOW;
      if (input.partialBody === true) return TOO_LARGE;
      // An allowed order carries the client's tier and jurisdiction to the backend.
      return orderStage(input.body, deps.order, geo.orderHeaders, input.bodyExact === true);
    case 'read':
      // Geo (and the anonymizer rule) passed: a read is decided on the client address alone.
      return ALLOW;
    case 'geoblock':
      // Reached only when method or path do not match the geoblock route (checked above): judged
      // as a read, geo applied; the market service answers 405/404.
      return ALLOW;
    default: {
      // A new RouteKind without its policy here fails typecheck (`never`); at run time, deny.
      const unhandled: never = route;
      void unhandled;
      return UNKNOWN_ROUTE_DENIAL;
    }
  }
}
