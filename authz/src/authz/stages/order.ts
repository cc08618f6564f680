/**
 * Order policy (docs/api.md "POST /v1/orders"): envelope fields → market → deadline → size.
 * The payload is validated as strict base64 without decoding it: an allowed order tells Envoy,
 * as dynamic metadata, where the payload's text lies in the body (or, when its JSON string has
 * escapes, hands over the text itself), and the order-body Lua filter (envoy/order-body-lua.ts)
 * decodes it into the request body after this Check.
 */
import { deny, type Decision, type Header } from '../decision.ts';
import { compareDecimal } from '../../common/feed/schema.ts';
import type { Clock, MarketLookup, MarketMeta } from '../../common/ports.ts';
import { LIMIT, RE, strictBase64Length } from '../../common/rules.ts';
import { jsonObjectScanner } from '../../common/json-scan.ts';
import { HEADER, ORDER_PAYLOAD_AT_METADATA_KEY, ORDER_PAYLOAD_METADATA_KEY } from '../../common/contract.ts';


export interface OrderDeps {
  readonly markets: MarketLookup;
  readonly clock: Clock;
  readonly orderMaxTtlSecs: number;
  readonly orderMaxSize: string | undefined;
  readonly orderPayloadMaxBytes: number;
  readonly onStoreError?: (err: unknown) => void;
}

export interface OrderEnvelope {
  readonly marketId: string;
  readonly deadline: number;
  readonly size: string;
  readonly payload: string;
  /**
   * Where the payload's base64 text lies in the body, `<start>:<length>` in bytes, when the body
   * is the exact bytes Envoy forwards and the JSON string has no escapes (its bytes are the
   * payload's text): the Lua filter then decodes it from the body, and the payload does not cross
   * back to Envoy in the Check's answer.
   */
  readonly payloadAt?: string;
}

const NO_GEO_HEADERS: readonly Header[] = [];
const BAD_JSON = deny('invalid_json');
const TOO_DEEP = deny('invalid_json', `body nests arrays and objects more than ${LIMIT.orderJsonDepth} levels deep`);
const F_MARKET = deny('invalid_order', 'marketId must be a market conditionId string', 'marketId');
const F_DEADLINE = deny('invalid_order', 'deadline must be an integer (unix seconds)', 'deadline');
const F_SIZE = deny('invalid_order', 'size must be a decimal string', 'size');
const F_PAYLOAD = deny('invalid_order', 'payload must be strict standard base64', 'payload');
const UNKNOWN = deny('unknown_market');
const CLOSED = deny('market_closed');
const EXPIRED = deny('deadline_expired');
const TOO_FAR = deny('deadline_too_far');
const SIZE_FORMAT = deny('invalid_size', 'size must be a positive decimal with at most 18 fractional digits');
const SIZE_MIN = deny('invalid_size', 'size is below the market minimum');
const SIZE_MAX = deny('invalid_size', 'size is above the market maximum');
const SIZE_CAP = deny('invalid_size', 'size is above ORDER_MAX_SIZE');
const STORE_DOWN = deny('service_unavailable', 'market store unavailable; the order was not accepted');

/**
 * The envelope read without building the body (common/json-scan.ts): the whole body is checked as
 * JSON, nesting past LIMIT.orderJsonDepth is refused as soon as it is reached, and only these four
 * members are decoded, so the cost is the body's length whatever it holds (docs/api.md "Limits").
 */
const scanOrder = jsonObjectScanner(['marketId', 'deadline', 'size', 'payload'], LIMIT.orderJsonDepth);

/**
 * Parses and shape-checks the envelope; returns it or a denial. `bodyExact`: `body` is the bytes
 * Envoy buffered and will forward (AuthzInput.bodyExact), so the payload may be handed over by
 * position (OrderEnvelope.payloadAt).
 */
export function parseOrder(body: Buffer | undefined, payloadMax: number, bodyExact = false): OrderEnvelope | Decision {
  if (body === undefined || body.length === 0) return BAD_JSON;
  const scan = scanOrder(body);
  if (!scan.ok) return scan.reason === 'depth' ? TOO_DEEP : BAD_JSON;
  const { marketId, deadline, size, payload } = scan.members;
  if (typeof marketId !== 'string' || !RE.conditionId.test(marketId)) return F_MARKET;
  if (typeof deadline !== 'number' || !Number.isSafeInteger(deadline)) return F_DEADLINE;
  if (typeof size !== 'string') return F_SIZE;
  if (typeof payload !== 'string') return F_PAYLOAD;
  const len = strictBase64Length(payload);
  if (len < 1) return F_PAYLOAD;
  if (len > payloadMax) return deny('invalid_order', `payload decodes to more than ${payloadMax} bytes`, 'payload');
  const at = scan.spans.payload;
  if (bodyExact && at !== undefined && !at.escaped) return { marketId, deadline, size, payload, payloadAt: `${at.start}:${at.end - at.start}` };
  return { marketId, deadline, size, payload };
}


/**
 * The allow for one order: the docs/api.md "POST /v1/orders" headers for the backend (set by Envoy on the
 * upstream request, overwriting any client value) and the payload for the Lua filter. Every
 * value was checked by parseOrder/checkOrder, so no client CR/LF/NUL reaches a header.
 * `geoHeaders`: x-edge-access and x-edge-jurisdiction of the client's tier (stages/geo.ts, built
 * at start-up from the settings and the database's codes).
 */
export function orderAllow(o: OrderEnvelope, geoHeaders: readonly Header[] = NO_GEO_HEADERS): Decision {
  const headers: Header[] = [
    ['content-type', 'application/octet-stream'],
    [HEADER.marketId, o.marketId],
    [HEADER.deadline, String(o.deadline)],
    [HEADER.size, o.size],
  ];
  for (let i = 0; i < geoHeaders.length; i++) headers.push(geoHeaders[i]!);
  const metadata: Record<string, string> = o.payloadAt === undefined ? { [ORDER_PAYLOAD_METADATA_KEY]: o.payload } : { [ORDER_PAYLOAD_AT_METADATA_KEY]: o.payloadAt };
  return { allow: true, code: 'ok', httpStatus: 200, reason: 'allowed', headers, body: '', metadata };
}

/** Checks the envelope against the market record and the clock. */
export function checkOrder(o: OrderEnvelope, m: MarketMeta | undefined, deps: OrderDeps, nowSecs: number, geoHeaders: readonly Header[] = NO_GEO_HEADERS): Decision {
  if (m === undefined) return UNKNOWN;
  if (!m.active || m.closed || (m.endTime !== undefined && m.endTime <= nowSecs)) return CLOSED;
  if (o.deadline <= nowSecs) return EXPIRED;
  if (o.deadline > nowSecs + deps.orderMaxTtlSecs) return TOO_FAR;
  if (!RE.decimal.test(o.size) || compareDecimal(o.size, '0') <= 0) return SIZE_FORMAT;
  if (m.minSize !== undefined && compareDecimal(o.size, m.minSize) < 0) return SIZE_MIN;
  if (m.maxSize !== undefined && compareDecimal(o.size, m.maxSize) > 0) return SIZE_MAX;
  if (deps.orderMaxSize !== undefined && compareDecimal(o.size, deps.orderMaxSize) > 0) return SIZE_CAP;
  return orderAllow(o, geoHeaders);
}

/** The whole order policy; synchronous when the market is in the cache. */
export function orderStage(body: Buffer | undefined, deps: OrderDeps, geoHeaders: readonly Header[] = NO_GEO_HEADERS, bodyExact = false): Decision | Promise<Decision> {
  const parsed = parseOrder(body, deps.orderPayloadMaxBytes, bodyExact);
  if ('allow' in parsed) return parsed;
  let market;
  try {
    market = deps.markets.get(parsed.marketId);
  } catch (err) {
    deps.onStoreError?.(err);
    return STORE_DOWN;
  }
  if (market instanceof Promise) {
    return market.then(
      (m) => checkOrder(parsed, m, deps, deps.clock.nowSecs(), geoHeaders),
      (err: unknown) => {
        deps.onStoreError?.(err);
        return STORE_DOWN;
      },
    );
  }
  return checkOrder(parsed, market, deps, deps.clock.nowSecs(), geoHeaders);
}
