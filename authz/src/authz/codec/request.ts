/**
 * CheckRequest wire bytes → AuthzInput, decoding only what a decision needs.
 *
 * grpc-js hands us the raw message; instead of materialising the whole AttributeContext
 * (every header, peer, metadata, TLS session…) we walk the protobuf wire format with
 * protobufjs' Reader and keep: source address, method, path, the handful of headers the
 * policies read, and the raw body. Everything else is skipped without decoding.
 *
 * Field numbers (envoy/service/auth/v3/{external_auth,attribute_context}.proto,
 * envoy/config/core/v3/{address,base}.proto):
 *   CheckRequest.attributes = 1
 *   AttributeContext.source = 1 (Peer), request = 4 (Request), context_extensions = 10 (map<string,string>)
 *   Peer.address = 1 (Address) → Address.socket_address = 1 → SocketAddress.address = 2
 *   Request.http = 2 (HttpRequest)
 *   HttpRequest.method = 2, headers = 3 (map<string,string>), path = 4, body = 11,
 *              raw_body = 12, header_map = 13 (HeaderMap.headers = 1 → HeaderValue key=1 value=2 raw_value=3)
 */
import protobuf from 'protobufjs/minimal.js';
import { CONTEXT_EXTENSION, GLOBAL_LIMIT_IN_CHECK, HEADER, HEADER_PHASE } from '../../common/contract.ts';
import { isRouteKind, UNKNOWN_ROUTE, type CheckRoute } from '../../common/routes.ts';
import type { GeoResult } from '../stages/geo.ts';

const { Reader } = protobuf;
type ProtoReader = protobuf.Reader;

/** What the policy stages see. Plain data; no proto types leak past this module. */
export interface AuthzInput {
  method: string;
  /** Path without the query string. */
  path: string;
  /** The client address: `x-edge-client-ip` (set by Envoy) or else the TCP peer. */
  clientIp: string;
  /** Only the headers a policy reads (lower-case names as Envoy sends them). */
  timestamp: string | undefined;
  nonce: string | undefined;
  signature: string | undefined;
  requestId: string | undefined;
  /**
   * The `traceparent` header as sent, or with traces on the Check span's context (authz/tracing.ts):
   * for the decision log's traceId only; never trusted for anything.
   */
  traceparent?: string;
  /** Raw body bytes (`raw_body`, pack_as_bytes) or, failing that, the UTF-8 `body` string's bytes. */
  body: Buffer | undefined;
  /**
   * True when `body` is the exact bytes Envoy buffered (`raw_body`): offsets into it are offsets
   * into the body Envoy forwards. Not so for the `body` string, which Envoy sanitizes to UTF-8.
   */
  bodyExact?: boolean;
  /**
   * True when Envoy sent only the first max_request_bytes of a longer body (it adds
   * `x-envoy-auth-partial-body: true` itself and drops any client copy of that header): the body
   * is over the route's limit and must be answered 413, never judged truncated.
   */
  partialBody?: boolean;
  /**
   * `headers` when Envoy's route config asks for the header phase of an ingest or an order
   * (context_extensions `phase: headers`, set by those routes' first ext_authz filter, which
   * sends no body): only what the headers decide. Never set by a client.
   */
  phase: typeof HEADER_PHASE | undefined;
  /**
   * The route Envoy matched (context_extensions `route`, set on every route that asks authz):
   * its RouteKind, or UNKNOWN_ROUTE for a value the registry does not know (denied by the
   * pipeline, never classified); undefined only in a hand-made Check without that extension,
   * which is then classified by method and path.
   */
  route: CheckRoute | undefined;
  /**
   * True when Envoy's route asks this Check to take the global rate limit's bucket
   * (context_extensions `rate_limit: global`; authz/src/ratelimit/check-limit.ts). Never set by a client.
   */
  globalLimit?: boolean;
  /**
   * Filled while deciding, for the decision log (authz/decision-log.ts), never by the decoder:
   * the geo classification the pipeline enforced (a shared object; undefined when geo did not
   * run: sealed, the geoblock route).
   */
  geo?: GeoResult | undefined;
  /** Filled while deciding: the version of the geo policy in force for this Check (the decision log's `policy`). */
  policy?: string | undefined;
}

/** The header Envoy's ext_authz adds to a Check that carries a body: `true` when the body was cut at max_request_bytes. */
export const PARTIAL_BODY_HEADER = 'x-envoy-auth-partial-body';

const WANTED = new Set<string>([HEADER.clientIp, HEADER.timestamp, HEADER.nonce, HEADER.signature, HEADER.requestId, HEADER.traceparent, PARTIAL_BODY_HEADER]);

interface Scratch {
  sourceAddress: string;
  clientIpHeader: string | undefined;
  bodyText: string | undefined;
}

function setHeader(input: AuthzInput, s: Scratch, key: string, value: string): void {
  switch (key) {
    case HEADER.clientIp: s.clientIpHeader = value; break;
    case HEADER.timestamp: input.timestamp = value; break;
    case HEADER.nonce: input.nonce = value; break;
    case HEADER.signature: input.signature = value; break;
    case HEADER.requestId: input.requestId = value; break;
    case HEADER.traceparent: input.traceparent = value; break;
    case PARTIAL_BODY_HEADER: if (value === 'true') input.partialBody = true; break;
  }
}

function readSubmessage(r: ProtoReader, fn: (end: number) => void): void {
  const len = r.uint32();
  const end = r.pos + len;
  if (end > r.len) throw new RangeError('truncated submessage');
  fn(end);
  r.pos = end;
}

function readMapEntry(r: ProtoReader, end: number, input: AuthzInput, s: Scratch, valueField: number, rawField: number): void {
  let key = '';
  let value: string | undefined;
  let keyWanted = true;
  while (r.pos < end) {
    const tag = r.uint32();
    const field = tag >>> 3;
    if (field === 1 && (tag & 7) === 2) {
      key = r.string();
      keyWanted = WANTED.has(key);
    } else if ((field === valueField || field === rawField) && (tag & 7) === 2 && keyWanted) {
      // Map entries put the key first in practice; if not, we still decode the value.
      const v = field === rawField ? (r.bytes() as Buffer).toString('utf8') : r.string();
      if (value === undefined || v !== '') value = v;
    } else {
      r.skipType(tag & 7);
    }
  }
  if (value !== undefined && WANTED.has(key)) setHeader(input, s, key, value);
}

function readHttp(r: ProtoReader, end: number, input: AuthzInput, s: Scratch): void {
  while (r.pos < end) {
    const tag = r.uint32();
    switch (tag) {
      case (2 << 3) | 2: input.method = r.string(); break;
      case (3 << 3) | 2: readSubmessage(r, (e) => readMapEntry(r, e, input, s, 2, -1)); break;
      case (4 << 3) | 2: {
        const p = r.string();
        const q = p.indexOf('?');
        input.path = q === -1 ? p : p.slice(0, q);
        break;
      }
      case (11 << 3) | 2: s.bodyText = r.string(); break;
      case (12 << 3) | 2:
        input.body = r.bytes() as Buffer;
        input.bodyExact = true;
        break;
      case (13 << 3) | 2:
        readSubmessage(r, (e) => {
          while (r.pos < e) {
            const t = r.uint32();
            if (t === ((1 << 3) | 2)) readSubmessage(r, (e2) => readMapEntry(r, e2, input, s, 2, 3));
            else r.skipType(t & 7);
          }
        });
        break;
      default: r.skipType(tag & 7);
    }
  }
}

/** A context_extensions map entry: the route Envoy matched, the header phase, the global limit. */
function readContextExtension(r: ProtoReader, end: number, input: AuthzInput): void {
  let key = '';
  let value = '';
  while (r.pos < end) {
    const tag = r.uint32();
    if (tag === ((1 << 3) | 2)) key = r.string();
    else if (tag === ((2 << 3) | 2)) value = r.string();
    else r.skipType(tag & 7);
  }
  if (key === CONTEXT_EXTENSION.route) {
    // Fail closed: a route value this service does not know is kept as UNKNOWN_ROUTE (denied),
    // never dropped (which would classify the request by method and path: geo only for most).
    input.route = isRouteKind(value) ? value : UNKNOWN_ROUTE;
  } else if (key === CONTEXT_EXTENSION.phase && value === HEADER_PHASE) input.phase = HEADER_PHASE;
  else if (key === CONTEXT_EXTENSION.rateLimit && value === GLOBAL_LIMIT_IN_CHECK) input.globalLimit = true;
}

function readPeerAddress(r: ProtoReader, end: number, s: Scratch): void {
  while (r.pos < end) {
    const tag = r.uint32();
    if (tag === ((1 << 3) | 2)) {
      // Peer.address → Address
      readSubmessage(r, (e) => {
        while (r.pos < e) {
          const t = r.uint32();
          if (t === ((1 << 3) | 2)) {
            // Address.socket_address → SocketAddress.address (2)
            readSubmessage(r, (e2) => {
              while (r.pos < e2) {
                const t2 = r.uint32();
                if (t2 === ((2 << 3) | 2)) s.sourceAddress = r.string();
                else r.skipType(t2 & 7);
              }
            });
          } else r.skipType(t & 7);
        }
      });
    } else r.skipType(tag & 7);
  }
}

/**
 * Decodes a serialized CheckRequest. Throws on malformed wire data (grpc-js then answers
 * INTERNAL and Envoy applies `status_on_error`: fail closed).
 */
export function decodeCheckRequest(buf: Buffer): AuthzInput {
  const r = Reader.create(buf);
  const input: AuthzInput = {
    method: '', path: '', clientIp: '', timestamp: undefined, nonce: undefined,
    signature: undefined, requestId: undefined, body: undefined, phase: undefined, route: undefined,
  };
  const s: Scratch = { sourceAddress: '', clientIpHeader: undefined, bodyText: undefined };
  while (r.pos < r.len) {
    const tag = r.uint32();
    if (tag !== ((1 << 3) | 2)) { r.skipType(tag & 7); continue; }
    readSubmessage(r, (end) => {
      while (r.pos < end) {
        const t = r.uint32();
        if (t === ((1 << 3) | 2)) readSubmessage(r, (e) => readPeerAddress(r, e, s));
        else if (t === ((10 << 3) | 2)) readSubmessage(r, (e) => readContextExtension(r, e, input));
        else if (t === ((4 << 3) | 2)) {
          readSubmessage(r, (e) => {
            while (r.pos < e) {
              const t2 = r.uint32();
              if (t2 === ((2 << 3) | 2)) readSubmessage(r, (e2) => readHttp(r, e2, input, s));
              else r.skipType(t2 & 7);
            }
          });
        } else r.skipType(t & 7);
      }
    });
  }
  input.clientIp = s.clientIpHeader ?? s.sourceAddress;
  if (input.body === undefined && s.bodyText !== undefined && s.bodyText !== '') input.body = Buffer.from(s.bodyText, 'utf8');
  return input;
}
