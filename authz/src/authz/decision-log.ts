/**
 * The decision log: one JSON line per ext_authz decision (docs/operations.md "Decision log"),
 * found by the `requestId` the client quotes (the `x-request-id` it received, also in every error
 * body and in Envoy's access log as `request_id`).
 *
 * What a line holds, and deliberately not: the client's address class (`ipv4`, `ipv6`, `trusted`
 * or `invalid`) and, for an IPv6 address judged as the IPv4 it embeds, the form (`embedded`),
 * never the address itself (Envoy's access log line with the same request id has
 * it, for whoever may see it); the country and tier the geo stage decided; for an ingest the
 * 12-hex `nonceTag`, never the nonce, signature, timestamp, body or any key; never an order's
 * payload.
 *
 * And what the decision was made with: the GeoIP database's build time (`geoipBuilt`), the geo
 * policy's version (`policy`: GEO_POLICY_FILE's `version`, or `env-…` for the settings) and the
 * W3C trace id of the request (`traceId`, from a well-formed
 * `traceparent` only; the parent span id and flags are not logged): with traces on
 * (OTEL_EXPORTER_OTLP_ENDPOINT) the context Envoy sent in the Check's gRPC metadata, which
 * authz/tracing.ts puts in AuthzInput.traceparent (the trace Envoy started); without, the
 * request's header.
 */
import type { LogDecisions } from '../common/config.ts';
import { nonceTag } from '../common/log.ts';
import type { AuthzInput } from './codec/request.ts';
import type { Decision } from './decision.ts';
import type { RouteLabel } from './pipeline.ts';
import { embeddedIpv4, normalizeIp, type EmbeddedForm } from '../common/ip.ts';

/** The reason of an anonymizer rule's denial (core.ts). */
export const ANONYMIZER_REASON = 'restricted_jurisdiction:anonymizer';

/** The message of every decision line (`jq 'select(.msg == "decision")'`). */
export const DECISION_MSG = 'decision';

export type ClientClass = 'ipv4' | 'ipv6' | 'trusted' | 'invalid';

export interface DecisionLine {
  readonly requestId: string | null;
  readonly route: RouteLabel;
  readonly outcome: 'allow' | 'deny';
  /** `ok` for an allow, else the error code of the body. */
  readonly code: string;
  readonly status: number;
  /** The code and, for invalid_order, the field (`invalid_order:size`); denials only. */
  readonly reason?: string;
  readonly client: ClientClass;
  /**
   * An IPv6 client address that embeds an IPv4 and was judged as it (common/ip.ts): the form,
   * `6to4`, `nat64`, `nat64-local`, `siit` or `teredo` (never the address); absent otherwise.
   */
  readonly embedded?: EmbeddedForm;
  /** ISO country of the client's GeoIP record; null when not looked up or none. */
  readonly country: string | null;
  /** The region whose rule applied, else the record's first subdivision; null when none. */
  readonly region: string | null;
  /** The jurisdiction tier geo decided (`full`, `close-only`, `blocked`); null when geo did not run. */
  readonly tier: string | null;
  /** The geo verdict (edge_geo_verdicts_total's label); null when geo did not run. */
  readonly geo: string | null;
  /**
   * With a shadow policy (SHADOW_*): the tier it would have given (`full`, `close-only`,
   * `blocked`), whether or not it agrees with `tier`; absent without one, or where geo did not run.
   */
  readonly shadow?: string;
  /** Check received → decided, in milliseconds (µs precision). */
  readonly latencyMs: number;
  /** The loaded GEOIP_DB's build time (its metadata's build_epoch, ISO 8601 UTC); null when unknown. */
  readonly geoipBuilt: string | null;
  /** The version of the geo policy in force for this Check (GEO_POLICY_FILE's `version`, or `env-…`); null only outside the core (unit tests). */
  readonly policy: string | null;
  /** The 32-hex trace id of a well-formed W3C `traceparent` request header; null without one. */
  readonly traceId: string | null;
  /** Ingest only: the first 12 hex characters of the nonce's SHA-256. */
  readonly nonceTag?: string;
  /** An anonymizer denial: the database's provider name for the address (GeoIP Anonymous Plus provider_name), when it has one. */
  readonly anonymizerProvider?: string;
}

/** What the decisions are being made with, read when a line is written (core.ts). */
export interface DecisionContext {
  readonly geoipBuilt: string | null;
  /** ANONYMIZER_DB's provider name for a client address (asked only for an anonymizer denial). */
  readonly anonymizerProvider?: ((clientIp: string) => string | undefined) | undefined;
}
export const NO_DECISION_CONTEXT: DecisionContext = { geoipBuilt: null };

/** Unix seconds → `2026-06-17T08:00:00Z`; null when not a usable time. */
export function isoSeconds(epochSecs: number | undefined): string | null {
  if (epochSecs === undefined || !Number.isFinite(epochSecs) || epochSecs <= 0) return null;
  return new Date(Math.floor(epochSecs) * 1000).toISOString().replace('.000Z', 'Z');
}

const TRACEPARENT = /^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?$/;
/**
 * The trace id of a W3C Trace Context `traceparent` value, only when it is well-formed: version
 * `00` exactly 55 characters, a later version (not `ff`) at least that and a `-` after the flags;
 * lower-case hex; neither the trace id nor the parent id all zeros. Anything else: null (a
 * malformed header is not logged at all, so nothing a client sends reaches the line unchecked).
 */
export function traceIdOf(traceparent: string | undefined): string | null {
  if (traceparent === undefined || traceparent.length < 55 || traceparent.length > 512) return null;
  const m = TRACEPARENT.exec(traceparent);
  if (m === null) return null;
  const [, version, traceId, parentId, , rest] = m;
  if (version === 'ff' || (version === '00' && rest !== undefined)) return null;
  if (/^0+$/.test(traceId!) || /^0+$/.test(parentId!)) return null;
  return traceId!;
}

/** Whether a decision gets a line under LOG_DECISIONS (cheap: no allocation on the allow path). */
export function shouldLogDecision(setting: LogDecisions, d: Decision): boolean {
  return d.allow ? setting === 'all' : setting !== 'off';
}

function clientClass(input: AuthzInput): ClientClass {
  if (input.geo?.verdict === 'trusted') return 'trusted';
  const ip = normalizeIp(input.clientIp);
  return ip === '' ? 'invalid' : ip.includes(':') ? 'ipv6' : 'ipv4';
}

/** The line for one decision (built only when it is written; optional keys come last). */
export function decisionLine(input: AuthzInput, d: Decision, route: RouteLabel, seconds: number, context: DecisionContext = NO_DECISION_CONTEXT): DecisionLine {
  const geo = input.geo;
  const line: { -readonly [K in keyof DecisionLine]: DecisionLine[K] } = {
    requestId: input.requestId === undefined || input.requestId === '' ? null : input.requestId,
    route,
    outcome: d.allow ? 'allow' : 'deny',
    code: d.code,
    status: d.httpStatus,
    client: clientClass(input),
    country: geo === undefined ? null : geo.country,
    region: geo === undefined ? null : geo.region,
    tier: geo === undefined ? null : geo.access,
    geo: geo === undefined ? null : geo.verdict,
    latencyMs: Math.round(seconds * 1e6) / 1e3,
    geoipBuilt: context.geoipBuilt,
    policy: input.policy ?? null,
    traceId: traceIdOf(input.traceparent),
  };
  if (!d.allow) line.reason = d.reason;
  if (line.client === 'ipv6') {
    const e = embeddedIpv4(normalizeIp(input.clientIp));
    if (e !== undefined) line.embedded = e.form;
  }
  if (geo?.shadow !== undefined) line.shadow = geo.shadow.access;
  if (!d.allow && d.reason === ANONYMIZER_REASON && context.anonymizerProvider !== undefined) {
    const provider = context.anonymizerProvider(input.clientIp);
    if (provider !== undefined) line.anonymizerProvider = provider;
  }
  if (route === 'ingest' || route === 'ingest_headers') {
    const tag = nonceTag(input.nonce);
    if (tag !== undefined) line.nonceTag = tag;
  }
  return line;
}
