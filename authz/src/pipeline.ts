/**
 * The decision pipeline. Every request: client address → geo → the route's policy.
 * Stops at the first denial. Returns synchronously when no I/O is needed (geo-only reads,
 * orders whose market is cached), so the common path allocates no Promise.
 */
import { ALLOW, deny, type Decision } from './decision.ts';
import type { AuthzInput } from './envoy/request.ts';
import { geoDecision, type GeoVerdict } from './stages/geo.ts';
import { ingestStage, type IngestDeps } from './stages/ingest.ts';
import { orderStage, type OrderDeps } from './stages/order.ts';

export type RouteKind = 'ingest' | 'order' | 'read';

export const INGEST_PATH = '/internal/ingest/market';
export const ORDER_PATH = '/v1/orders';

/**
 * Classifies by method and path (query already stripped; Envoy normalizes the path before
 * ext_authz, so `//internal/./ingest/market` arrives as `/internal/ingest/market`).
 * Anything that is not exactly an ingest or an order POST is a read: geo only. Envoy
 * routes those to the market service, which stores nothing outside its ingest route.
 */
export function classify(method: string, path: string): RouteKind {
  if (method === 'POST') {
    if (path === INGEST_PATH) return 'ingest';
    if (path === ORDER_PATH) return 'order';
  }
  return 'read';
}

export interface PipelineDeps {
  readonly classifyGeo: (ip: string) => GeoVerdict;
  readonly geoDenial: Decision;
  readonly ingest: IngestDeps;
  readonly order: OrderDeps;
  readonly isSealed: () => boolean;
}

export const SEALED = deny('sealed');

export interface Outcome {
  readonly route: RouteKind;
  readonly geo: GeoVerdict | 'skipped';
  readonly decision: Decision;
}

/** Evaluates one request. Never throws for client input; callers still guard (fail closed). */
export function evaluate(input: AuthzInput, deps: PipelineDeps): Decision | Promise<Decision> {
  // 0. Sealed: nothing is allowed any more.
  if (deps.isSealed()) return SEALED;
  // 1. Client address (computed by Envoy; see envoy/request.ts) → 2. geo, on every route.
  const verdict = deps.classifyGeo(input.clientIp);
  const geoDenied = geoDecision(verdict, deps.geoDenial);
  if (geoDenied !== undefined) return geoDenied;
  // 3. The route's policy.
  switch (classify(input.method, input.path)) {
    case 'ingest':
      return ingestStage(input, deps.ingest);
    case 'order':
      return orderStage(input.body, deps.order);
    default:
      return ALLOW;
  }
}
