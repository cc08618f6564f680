/**
 * Generates docs/openapi.yaml (OpenAPI 3.1) from the definitions the service itself uses, so the
 * contract cannot drift from the code:
 *   - the error table: ERROR_STATUS / ERROR_MESSAGE (authz/src/common/errors.ts) → the `Error` schema,
 *     one response per status whose `error` enum holds exactly the codes of that status;
 *   - the market document schema (authz/src/common/feed/schema.ts) → MarketDocument, and the decoded
 *     content of the ingest envelope's `d`;
 *   - the market service's query and response schemas (authz/src/market/schemas.ts) → the
 *     query parameters and 200 bodies of /v1/markets and /v1/quotes;
 *   - Envoy's own replies (envoy/render.ts: bad_request messages, the market-route timeout);
 *   - the defaults of the settings (authz/src/common/config.ts) → limits quoted in descriptions;
 *   - every pattern (ids, decimals, the ingest headers, strict base64): authz/src/common/rules.ts, the
 *     same strings the code compiles (a property test proves strictBase64Length agrees with the
 *     published strict-base64 pattern).
 *   - the paths: the route registry (authz/src/common/routes.ts: method, path, operationId, summary,
 *     tag), one operation per route, its text here (operationDetails, keyed by OperationId);
 * What exists only here: each operation's text, the OrderRequest envelope's shape
 * (its rules come from rules.ts; schemathesis checks the running edge against it) and the prose.
 *
 *   npm run openapi            # rewrite docs/openapi.yaml
 *   npm run openapi -- --check # exit 1 when the committed file is stale
 *
 * A drift test (authz/test/openapi.test.ts) fails when the committed file differs from a fresh
 * generation; the same test lints it with @redocly/cli. docs/api.md explains the design.
 */
import { POLICY_VERSION } from '../authz/src/common/geo-policy-file.ts';
import { readFileSync, writeFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import YAML from 'yaml';
import { DEFAULT_GEO_NOTICE, loadConfig } from '../authz/src/common/config.ts';
import { ERROR_MESSAGE, ERROR_STATUS, type ErrorCode } from '../authz/src/common/errors.ts';
import { MARKET_DOCUMENT_SCHEMA } from '../authz/src/common/feed/schema.ts';
import { API_ROUTES, KINDS, type OperationId, type RouteRegistry, type RouteSpec } from '../authz/src/common/routes.ts';
import { LIMIT, PATTERN } from '../authz/src/common/rules.ts';
import { ACCESS_RANK } from '../authz/src/common/contract.ts';
import { ENVELOPE_SCHEMA, MARKETS_QUERY_SCHEMA, MARKETS_RESPONSE_SCHEMA, QUOTE_SCHEMA, QUOTES_QUERY_SCHEMA, QUOTES_RESPONSE_SCHEMA, ROOT_BODY } from '../authz/src/market/schemas.ts';
import { BAD_REQUEST_MESSAGES, UPSTREAM_TIMEOUT_MESSAGE } from '../envoy/render.ts';
import { STORE_OUTCOME_UNKNOWN_MESSAGE } from '../authz/src/market/store.ts';

export const OPENAPI_FILE = fileURLToPath(new URL('../docs/openapi.yaml', import.meta.url));
const defaults = loadConfig({});

type Obj = Record<string, unknown>;

// ─── Small builders ───────────────────────────────────────────────────────────────────────

const schemaRef = (name: string): Obj => ({ $ref: `#/components/schemas/${name}` });
const headerRef = (name: string): Obj => ({ $ref: `#/components/headers/${name}` });
const responseRef = (name: string): Obj => ({ $ref: `#/components/responses/${name}` });
const json = (schema: Obj, extra: Obj = {}): Obj => ({ 'application/json': { schema, ...extra } });
const codesOf = (status: number): ErrorCode[] => (Object.keys(ERROR_STATUS) as ErrorCode[]).filter((c) => ERROR_STATUS[c] === status);

/** Headers (almost) every answer through Envoy carries. Envoy's codec-level rejections have neither. */
function commonHeaders(): Obj {
  return {
    'X-Request-Id': headerRef('RequestId'),
    'X-RateLimit-Limit': headerRef('RateLimitLimit'),
    'X-RateLimit-Remaining': headerRef('RateLimitRemaining'),
    'X-RateLimit-Reset': headerRef('RateLimitReset'),
  };
}

function describeCode(code: ErrorCode): string {
  if (code === 'restricted_jurisdiction') return `\`${code}\`: client country or region blocked; one uniform notice (GEO_NOTICE)`;
  if (code === 'bad_request') return `\`${code}\`: malformed HTTP rejected by Envoy before routing, or an unusable trusted \`X-Forwarded-For\` entry`;
  return `\`${code}\`: ${ERROR_MESSAGE[code]}`;
}

/**
 * An error response: the error body with `error` limited to `codes`. `bad_request` is
 * Envoy's own code and keeps Envoy's status (400, 408, 414, 431; and 403/426, described in the
 * API's introduction), so it may join any of those.
 */
function errorResponse(status: number, codes: readonly ErrorCode[], opts: { headers?: Obj; note?: string; cacheControl?: boolean } = {}): Obj {
  for (const c of codes) {
    if (ERROR_STATUS[c] !== status && c !== 'bad_request') throw new Error(`openapi: ${c} is ${ERROR_STATUS[c]}, not ${status}`);
  }
  const description = [opts.note, ...codes.map(describeCode)].filter((s) => s !== undefined).join('. ');
  return {
    description,
    headers: {
      ...(opts.cacheControl === false ? {} : { 'Cache-Control': headerRef('CacheControl') }),
      ...commonHeaders(),
      ...opts.headers,
    },
    content: json({ allOf: [schemaRef('Error'), { properties: { error: { enum: [...codes] } } }] }),
  };
}

/** Envoy's codec-level replies (before routing, before rate limiting): no rate-limit headers. */
function protocolError(status: number, note?: string): Obj {
  const message = badRequestMessage(status);
  return {
    description: `\`bad_request\` (Envoy): ${message}.${note === undefined ? '' : ` ${note}`}`,
    headers: { Connection: headerRef('ConnectionClose') },
    content: json({ allOf: [schemaRef('Error'), { properties: { error: { const: 'bad_request' }, message: { const: message } } }] }),
  };
}

const badRequestMessage = (status: number | undefined): string =>
  (BAD_REQUEST_MESSAGES.find(([s]) => s === status) ?? BAD_REQUEST_MESSAGES.at(-1)!)[1];

/** What every route can answer, whoever is asked: Envoy's protocol errors, limiter, geo, dependencies. */
function commonErrors(): Obj {
  return {
    '408': responseRef('RequestTimeout'),
    '414': responseRef('UriTooLong'),
    '429': responseRef('TooManyRequests'),
    '431': responseRef('HeadersTooLarge'),
    '451': responseRef('Restricted'),
    '503': responseRef('Unavailable'),
  };
}

const PARAM_TEXT: Readonly<Record<string, string>> = {
  conditionId: `Comma-separated conditionIds, each \`${PATTERN.conditionId}\`, at most ${LIMIT.queryIds} (more → 400 \`invalid_query\`). Unknown ids are simply absent from the page.`,
  active: 'Only markets whose `active` field has this value.',
  limit: 'Page size in markets (1..500, default 100). For quotes: the number of markets whose rows are returned.',
  cursor: 'The `nextCursor` of the previous page (opaque; only cursors this service issued are accepted).',
};

function readOperation(opId: OperationId, opts: { description: string; query: { properties: Obj }; ok: string; linkName: string }): Obj {
  const cacheHeaders = { ETag: { ...headerRef('ETag') }, 'Cache-Control': headerRef('CacheControl') };
  return {
    security: [],
    description: `${opts.description}\n\nHEAD is answered like GET without a body. Unknown, repeated or malformed query parameters, or more than ${LIMIT.queryIds} \`conditionId\` values, → 400 \`invalid_query\`.`,
    parameters: [
      ...Object.entries(opts.query.properties).map(([name, schema]) => ({
        name, in: 'query', required: false, schema, description: PARAM_TEXT[name] ?? name,
      })),
      {
        name: 'If-None-Match', in: 'header', required: false, schema: { type: 'string', maxLength: 256 },
        description: 'The ETag of a page already held: 304 when the page is unchanged.',
      },
    ],
    responses: {
      '200': {
        description: 'A page, ordered by conditionId.',
        headers: { ...cacheHeaders, ...commonHeaders() },
        content: json(schemaRef(opts.ok)),
        links: {
          [opts.linkName]: {
            operationId: opId,
            description: 'The next page (`nextCursor` is null on the last one).',
            parameters: { cursor: '$response.body#/nextCursor' },
          },
        },
      },
      '304': { description: 'Not modified: If-None-Match matched the page\'s ETag. No body.', headers: { ...cacheHeaders, ...commonHeaders() } },
      '400': errorResponse(400, ['invalid_query', 'bad_request']),
      '504': responseRef('UpstreamTimeout'),
      ...commonErrors(),
    },
  };
}

// ─── The operations, one per registry route ────────────────────────────────────────────────

/**
 * What the OpenAPI document says about each operation beyond its registry entry (routes.ts:
 * method, path, operationId, summary, tag): one per OperationId, so a route added to the
 * registry without its text here fails typecheck.
 */
function operationDetails(root: Record<string, string>): Record<OperationId, Obj> {
  return {
      getRoot: {
        security: [],
        responses: {
          '200': { description: 'Service, version and API.', headers: commonHeaders(), content: json(schemaRef('Root'), { example: root }) },
          '400': errorResponse(400, ['bad_request']),
          ...commonErrors(),
        },
      },
      getHealth: {
        security: [],
        description: 'Subject to rate limiting and geo like every route (the kubelet should probe Envoy\'s admin `/ready` instead).',
        responses: {
          '200': { description: 'Ready.', headers: { 'Cache-Control': headerRef('CacheControl'), ...commonHeaders() }, content: json(schemaRef('HealthOk')) },
          '400': errorResponse(400, ['bad_request']),
          ...commonErrors(),
          '503': {
            description: 'Not ready (`status: unavailable` with the failing checks), or, from Envoy/authz, `service_unavailable` / `sealed`.',
            headers: { 'Cache-Control': headerRef('CacheControl'), ...commonHeaders() },
            content: json({ oneOf: [schemaRef('HealthUnavailable'), { allOf: [schemaRef('Error'), { properties: { error: { enum: codesOf(503) } } }] }] }),
          },
        },
      },
      listMarkets: readOperation('listMarkets', {
        ok: 'MarketsPage', linkName: 'NextMarketsPage', query: MARKETS_QUERY_SCHEMA,
        description: 'Each market is the feed document exactly as signed (unknown fields kept) plus `envelope` {d, s, k}: '
          + 'verify it yourself with SHA-256(base64-decode(d)) and the feed\'s Ed25519 public key.',
      }),
      listQuotes: readOperation('listQuotes', {
        ok: 'QuotesPage', linkName: 'NextQuotesPage', query: QUOTES_QUERY_SCHEMA,
        description: 'A page holds every outcome row of up to `limit` markets, ordered by conditionId.',
      }),
      getGeoblock: {
        security: [],
        description: 'What the edge decides for the caller\'s client address (the one Envoy computed, as geo and the rate limit see it): '
          + '`blocked` (every route but this one answers 451), `close-only` (reads allowed; orders forwarded with `x-edge-access: close-only`, '
          + 'the backend accepts only orders that reduce a position) or `full`. **Answered for every client, blocked ones too** (geo does not '
          + 'apply to this route; the rate limit does). `country` is the database\'s ISO 3166-1 code, `region` the ISO 3166-2 region whose rule '
          + 'applied, else the database\'s first subdivision; both null when unknown or not looked up (an address in GEO_TRUSTED_CIDRS). '
          + '`region` is null with a `country` when the record names no subdivision; if that country has a region rule, the tier is the one '
          + 'GEO_REGION_UNKNOWN gives (default: the strictest of its region rules and its own). An IPv6 address that embeds an IPv4 (6to4, NAT64, '
          + 'SIIT, Teredo) is judged as that IPv4; `ip` is the address as received. '
          + 'Never cached. HEAD is answered like GET without a body; any query parameter → 400 `invalid_query`; another method → 405 '
          + '(after geo, like every other route).',
        responses: {
          '200': {
            description: 'The caller\'s tier.',
            headers: { 'Cache-Control': { description: 'Always `no-store`.', required: true, schema: { type: 'string', const: 'no-store' } }, ...commonHeaders() },
            content: json(schemaRef('Geoblock'), { example: { blocked: false, access: 'close-only', country: 'PL', region: null, ip: '203.0.113.7', policy: 'venue-2026-05-14' } }),
          },
          '400': errorResponse(400, ['invalid_query', 'bad_request']),
          '504': responseRef('UpstreamTimeout'),
          ...(({ '451': _, ...rest }) => rest)(commonErrors()),
        },
      },
      placeOrder: {
        security: [],
        description: 'The edge checks the envelope (market known, active and open; deadline; size; payload) and then forwards the '
          + 'base64-decoded `payload` byte-exact to the order backend (`POST /orders`, mTLS, `content-type: application/octet-stream`, '
          + 'with `x-edge-market-id`, `x-edge-deadline`, `x-edge-size`, `x-request-id`, and the client\'s tier: `x-edge-access: full|close-only` '
          + 'and `x-edge-jurisdiction` (see GET /v1/geoblock), and `x-edge-policy`: the version of the geo policy that admitted it; a client\'s own copies of these headers never reach the backend). **The backend\'s status and body come back '
          + 'unchanged** — their schema is the backend\'s, not the edge\'s. Orders are never retried by the edge; keep the '
          + '`X-Request-Id` of every answer (the backend can deduplicate on it).\n\n'
          + `Limits: body ≤ ORDER_MAX_BYTES (default ${defaults.orderMaxBytes}) → else 413; arrays and objects nested at most ${LIMIT.orderJsonDepth} levels deep, the envelope being level 1 → else 400 \`invalid_json\`; decoded payload 1..ORDER_PAYLOAD_MAX_BYTES `
          + `(default ${defaults.orderPayloadMaxBytes}); deadline ≤ now + ORDER_MAX_TTL_SECS (default ${defaults.orderMaxTtlSecs}).`,
        requestBody: { required: true, content: json(schemaRef('OrderRequest')) },
        responses: {
          '2XX': {
            description: 'Accepted by the edge: the order backend\'s answer, status and body passed through unchanged (any media type; the demo backend answers 200 JSON). '
              + 'A non-2xx answer of the backend is passed through unchanged as well.',
            headers: { 'X-Request-Id': headerRef('RequestId') },
            content: { '*/*': { schema: { description: 'The order backend\'s body, unchanged.' } } },
          },
          '400': errorResponse(400, ['invalid_json', 'invalid_order', 'bad_request'], { note: '`field` names the offending field on `invalid_order`' }),
          '404': errorResponse(404, ['unknown_market']),
          '409': errorResponse(409, ['market_closed']),
          '413': errorResponse(413, ['payload_too_large'], { cacheControl: false, headers: { Connection: headerRef('ConnectionClose') } }),
          '422': errorResponse(422, ['deadline_expired', 'deadline_too_far', 'invalid_size']),
          '502': errorResponse(502, ['backend_unavailable'], { cacheControl: false, note: 'The order did **not** reach the backend (connect or TLS failure); it may be resubmitted' }),
          '504': errorResponse(504, ['backend_timeout'], { cacheControl: false, note: 'The outcome is **unknown**: the backend may have received the order. Check with the venue before resubmitting; quote `X-Request-Id`' }),
          ...commonErrors(),
        },
      },
      ingestMarket: {
        description: 'Two signatures. **Request:** HMAC-SHA256 with `EDGE_INGEST_HMAC` over `<X-Edge-Timestamp>.<X-Edge-Nonce>.<raw body bytes>`, '
          + `sent as \`X-Edge-Signature: v1=<hex>\`; |now − timestamp| ≤ REPLAY_WINDOW_SECS (default ${defaults.replayWindowSecs}); each nonce is accepted once `
          + `within NONCE_TTL_SECS (default ${defaults.nonceTtlSecs}). **Content:** \`d\` is base64 of the market document, \`s\` the hex Ed25519 signature of `
          + 'SHA-256(document) by a feed key, `k` = `ed25519-sha256`.\n\n'
          + 'Order of checks: headers well-formed → window → HMAC → nonce recorded → envelope → Ed25519 → document schema → store (seq must grow). '
          + `200 only after the record is durably stored; any failure stores nothing. Body ≤ INGEST_MAX_BYTES (default ${defaults.ingestMaxBytes}).\n\n`
          + 'Served on INGEST_PORT when it is set (the client port then answers this path 404 before reading a body). The headers are decided before '
          + `the body is read; at most INGEST_MAX_PENDING_PER_CLIENT (default ${defaults.ingestMaxPendingPerClient}) ingests per address may be waiting for their `
          + `body (429 \`too many requests\` with Retry-After beyond), and the body must arrive within REQUEST_BODY_TIMEOUT_MS (default ${defaults.requestBodyTimeoutMs} ms; 408 beyond).`,
        security: [{ edgeSignature: [], edgeTimestamp: [], edgeNonce: [] }],
        parameters: [
          { name: 'X-Edge-Timestamp', in: 'header', required: true, schema: { type: 'string', pattern: PATTERN.timestamp }, description: 'Unix seconds (int64).' },
          { name: 'X-Edge-Nonce', in: 'header', required: true, schema: { type: 'string', pattern: PATTERN.nonce }, description: 'Unique per request.' },
          { name: 'X-Edge-Signature', in: 'header', required: true, schema: { type: 'string', pattern: PATTERN.signature }, description: '`v1=` + hex HMAC-SHA256.' },
        ],
        requestBody: { required: true, content: json(schemaRef('IngestRequest')) },
        responses: {
          '200': {
            description: 'Stored.',
            headers: { 'Cache-Control': headerRef('CacheControl'), ...commonHeaders() },
            content: json(schemaRef('IngestStored')),
            links: {
              ReadStoredMarket: { operationId: 'listMarkets', description: 'The stored market, with its envelope.', parameters: { conditionId: '$response.body#/conditionId' } },
              ReadStoredQuotes: { operationId: 'listQuotes', description: 'Its quote rows.', parameters: { conditionId: '$response.body#/conditionId' } },
              OrderOnStoredMarket: { operationId: 'placeOrder', description: 'An order on the stored market.', requestBody: { marketId: '$response.body#/conditionId' } },
            },
          },
          '400': errorResponse(400, ['invalid_json', 'invalid_envelope', 'bad_request']),
          '401': errorResponse(401, ['unauthorized', 'timestamp expired', 'ingest_replay', 'invalid_content_signature']),
          '404': errorResponse(404, ['not_found'], { note: 'On the client port (EDGE_PORT) when INGEST_PORT is set: ingest is served on that port alone' }),
          '409': errorResponse(409, ['stale_document']),
          '413': errorResponse(413, ['payload_too_large'], { cacheControl: false, headers: { Connection: headerRef('ConnectionClose') } }),
          '504': responseRef('UpstreamTimeout'),
          ...commonErrors(),
        },
      },
  };
}

/** The common answers of a route (protocol, limiter, dependencies; geo where its kind applies geo). */
function routeCommonErrors(route: RouteSpec): Obj {
  const { '451': restricted, ...rest } = commonErrors();
  return KINDS[route.kind].geo ? { ...rest, '451': restricted } : rest;
}

/**
 * The paths, from the route registry in its order. A route whose operation has no text in
 * operationDetails (only a registry a test extends) is described by its registry entry alone:
 * its summary, its tag and its errors.
 */
export function buildPaths(registry: RouteRegistry = API_ROUTES, root: Record<string, string> = JSON.parse(ROOT_BODY) as Record<string, string>): Obj {
  const details: Partial<Record<string, Obj>> = operationDetails(root);
  const paths: Obj = {};
  for (const route of registry) {
    const { operationId, summary, tag } = route.openapi;
    const detail = details[operationId] ?? {
      security: [],
      responses: { '200': { description: 'Success.', headers: commonHeaders() }, ...errorResponses(route.errors), ...routeCommonErrors(route) },
    };
    paths[route.path] = { [route.methods[0]!.toLowerCase()]: { operationId, summary, tags: [tag], ...detail } };
  }
  return paths;
}

/** One error response per status of `codes` (with bad_request on 400), by errorResponse. */
function errorResponses(codes: readonly ErrorCode[]): Obj {
  const byStatus = new Map<number, ErrorCode[]>();
  for (const c of codes) byStatus.set(ERROR_STATUS[c], [...(byStatus.get(ERROR_STATUS[c]) ?? []), c]);
  return Object.fromEntries([...byStatus].map(([status, cs]) => [String(status), errorResponse(status, status === 400 ? [...cs, 'bad_request'] : cs)]));
}

// ─── The document ─────────────────────────────────────────────────────────────────────────

const INFO_DESCRIPTION = `The edge of a prediction-market venue: Envoy terminates client traffic, applies a per-client-address
rate limit and jurisdiction (geo) blocking to **every** route, asks the TypeScript authorization service
about each request (ext_authz), forwards signed orders to the order backend over mutual TLS and serves
the market data ingested from the signed feed.

**Errors.** Every error, whoever produces it (authorization service, Envoy, market service), is
\`application/json\` \`{"error": "<code>", "message": "<text>", "requestId": "<X-Request-Id>"}\` (orders add \`field\`
on \`invalid_order\`, before \`requestId\`). \`requestId\` is the \`X-Request-Id\` of the same answer, to quote to support;
it is null only when the answer has no \`X-Request-Id\` (HTTP refused before the request had an id).
The codes are listed per status below and in the \`Error\` schema.

**Not in this list.** A path not listed answers 404 \`not_found\`; a listed path with another method
answers 405 \`method_not_allowed\` with \`Allow\`; HEAD on a GET route is answered like GET without a body.
Before any of that, Envoy may answer 400/408/414/431 \`bad_request\` (malformed HTTP; also 403 to an
\`Upgrade\` request and 426 to HTTP/1.0, with the same code), 429 (rate limit)
or 451 (blocked jurisdiction), and 503 when a dependency is down. The answers to unlisted paths and
methods are described under \`x-unlisted-routes\`.

**Client address.** The TCP peer, or with \`XFF_NUM_TRUSTED_HOPS\`=n the n-th address from the right of
\`X-Forwarded-For\`; an IPv4-mapped address (\`::ffff:a.b.c.d\`) is its IPv4. With n ≥ 1, a request that
sends \`X-Forwarded-For\` whose n-th entry from the right is missing or not a bare IP address (\`1.2.3.4:80\`,
\`[::1]\`, \`unknown\`, empty, a trailing comma, a zone id such as \`%0\`) is answered 400 \`bad_request\` naming
X-Forwarded-For, and takes a token from the TCP peer's rate-limit bucket (429 once it is empty); a request without \`X-Forwarded-For\` is judged by its TCP peer. Rate limit: token bucket per address, \`RATE_BURST\` (default ${defaults.rateBurst}) tokens,
refilled with \`RPS_PER_IP\` (default ${defaults.rpsPerIp}) per second (an IPv6 client is its /64); an IPv6 client also draws from its
/\`RATE_PREFIX_V6\` (default ${defaults.ratePrefixV6}) prefix's bucket, \`PREFIX_BURST\` (default ${defaults.prefixBurst}) tokens refilled with \`RPS_PER_PREFIX\`
(default ${defaults.rpsPerPrefix}) per second; answers carry \`X-RateLimit-*\` of the tighter bucket.

**Status pass-through.** \`POST /v1/orders\` returns the order backend's own status and body unchanged
when the edge accepted the order; every other answer on every route is described here.`;

export function buildOpenApi(registry: RouteRegistry = API_ROUTES): Obj {
  const marketDoc = { ...MARKET_DOCUMENT_SCHEMA } as Obj;
  delete marketDoc['$id'];
  const marketsItems = MARKETS_RESPONSE_SCHEMA.properties.markets.items as Obj;
  const root = JSON.parse(ROOT_BODY) as Record<string, string>;
  return {
    openapi: '3.1.0',
    info: {
      title: 'Edge Trading Proxy',
      version: '1.0.0',
      description: INFO_DESCRIPTION,
      license: { name: 'BUSL-1.1', identifier: 'BUSL-1.1' },
    },
    servers: [
      { url: `http://127.0.0.1:${defaults.edgePort}`, description: 'local stack (npm start); Envoy\'s client listener EDGE_PORT' },
      {
        url: `https://localhost:${defaults.edgePort}`,
        description: 'the same listener over TLS (EDGE_TLS_CERT_FILE/EDGE_TLS_KEY_FILE; npm start with DEV_EDGE_TLS=1): TLS 1.2/1.3, ALPN h2 or http/1.1; plaintext is then refused',
      },
    ],
    tags: [
      { name: 'public', description: 'Identification and readiness.' },
      { name: 'market data', description: 'Markets and quotes ingested from the signed feed.' },
      { name: 'orders', description: 'Signed orders forwarded to the order backend over mTLS.' },
      { name: 'ingest', description: 'The feed pipeline\'s signed writes.' },
    ],
    paths: buildPaths(registry, root),
    'x-unlisted-routes': {
      description: 'Answers to a path not listed above (404) or a listed path with a method it does not list (405, with `Allow`). '
        + 'The protocol, limiter, geo and dependency answers of every route apply as well. Validated by e2e/lib/openapi-validate.ts.',
      responses: {
        '400': errorResponse(400, ['bad_request']),
        '404': errorResponse(404, ['not_found']),
        '405': responseRef('MethodNotAllowed'),
        '413': errorResponse(413, ['payload_too_large'], { cacheControl: false }),
        ...commonErrors(),
      },
    },
    components: {
      securitySchemes: {
        edgeSignature: {
          type: 'apiKey', in: 'header', name: 'X-Edge-Signature',
          description: 'The ingest HMAC (docs/api.md "POST /internal/ingest/market"): `v1=` + hex HMAC-SHA256, keyed with EDGE_INGEST_HMAC (EDGE_INGEST_HMAC_PREVIOUS during a rotation), '
            + 'over `<X-Edge-Timestamp>.<X-Edge-Nonce>.<raw body>`. Used together with the two headers below.',
        },
        edgeTimestamp: { type: 'apiKey', in: 'header', name: 'X-Edge-Timestamp', description: 'Part of the ingest HMAC: Unix seconds, within REPLAY_WINDOW_SECS of the server clock.' },
        edgeNonce: { type: 'apiKey', in: 'header', name: 'X-Edge-Nonce', description: 'Part of the ingest HMAC: 16–128 hex characters, never reused within NONCE_TTL_SECS.' },
      },
      headers: {
        RequestId: { description: 'Generated by Envoy for every routed request (a client cannot choose it); sent to the order backend as `x-request-id`.', schema: { type: 'string', format: 'uuid' } },
        RateLimitLimit: { description: 'The size of the bucket described: the client address\'s (RATE_BURST) or its IPv6 prefix\'s (PREFIX_BURST).', schema: { type: 'string', pattern: '^[0-9]+$' } },
        RateLimitRemaining: { description: 'Tokens left in the bucket.', schema: { type: 'string', pattern: '^[0-9]+$' } },
        RateLimitReset: { description: 'Seconds until the next refill.', schema: { type: 'string', pattern: '^[0-9]+$' } },
        RetryAfter: {
          description: 'RFC 9110 §10.2.3, in seconds: until the bucket that refused has a token again, the same number as this answer\'s `X-RateLimit-Reset` (at least 1). '
            + 'On every 429 of the rate limit, whichever stage refused (each Envoy\'s own buckets: always 1, they refill at a whole number of tokens a second; the shared buckets); '
            + 'on the ingest 429 for too many bodies in flight, until one frees.',
          required: true,
          schema: { type: 'string', pattern: '^[1-9][0-9]*$' },
        },
        Link: { description: 'RFC 7725 `<GEO_BLOCKED_BY_URL>; rel="blocked-by"`, when that setting is set.', schema: { type: 'string', pattern: '^<[^>]+>; rel="blocked-by"$' } },
        ETag: { description: 'Weak validator of the page; send it back as If-None-Match.', required: true, schema: { type: 'string', pattern: '^W/"[A-Za-z0-9_-]+"$' } },
        CacheControl: { description: '`no-store` on health, ingest answers and errors of the service; `public, max-age=1` on market pages.', schema: { type: 'string' } },
        ConnectionClose: { description: 'Envoy closes the connection after this answer.', schema: { type: 'string' } },
      },
      responses: {
        RequestTimeout: protocolError(408),
        UriTooLong: protocolError(414),
        HeadersTooLarge: protocolError(431, 'The request line and headers together are over Envoy\'s request-header limit (`max_request_headers_kb`, 60 KiB by default): '
          + 'a URL counts against it, and a long one is answered with this 431. Over HTTP/2 Envoy resets the stream instead.'),
        TooManyRequests: {
          description: `\`too many requests\`: the client address's token bucket is empty (RATE_BURST, default ${defaults.rateBurst}; RPS_PER_IP, default ${defaults.rpsPerIp}/s), `
            + `or its IPv6 prefix's (PREFIX_BURST, default ${defaults.prefixBurst}; RPS_PER_PREFIX, default ${defaults.rpsPerPrefix}/s). `
            + 'Checked by Envoy before anything else; wait `Retry-After` (= `X-RateLimit-Reset`) seconds.',
          headers: {
            'Retry-After': headerRef('RetryAfter'),
            'X-RateLimit-Limit': { ...headerRef('RateLimitLimit') },
            'X-RateLimit-Remaining': { ...headerRef('RateLimitRemaining') },
            'X-RateLimit-Reset': { ...headerRef('RateLimitReset') },
            'X-Request-Id': headerRef('RequestId'),
          },
          content: json({ allOf: [schemaRef('Error'), { properties: { error: { const: 'too many requests' } } }] }),
        },
        Restricted: {
          description: '`restricted_jurisdiction`: the client\'s country or region is blocked (BLOCKED_COUNTRIES, BLOCKED_REGIONS, GEO_UNKNOWN). '
            + 'Every blocked client gets the byte-identical body with the one notice GEO_NOTICE, apart from its requestId; never cached.',
          headers: {
            'Cache-Control': { description: 'Always `no-store`.', required: true, schema: { type: 'string', const: 'no-store' } },
            Link: headerRef('Link'),
            ...commonHeaders(),
          },
          content: json(
            { allOf: [schemaRef('Error'), { properties: { error: { const: 'restricted_jurisdiction' } } }] },
            { example: { error: 'restricted_jurisdiction', message: DEFAULT_GEO_NOTICE, requestId: '0b8f1e2a-3c4d-4e5f-8a6b-7c8d9e0f1a2b' } },
          ),
        },
        Unavailable: {
          description: `${describeCode('service_unavailable')} (Redis, the authorization service or the market service down; fail closed). ${describeCode('sealed')}.`,
          headers: { 'Cache-Control': headerRef('CacheControl'), ...commonHeaders() },
          content: json({ allOf: [schemaRef('Error'), { properties: { error: { enum: codesOf(503) } } }] }),
        },
        UpstreamTimeout: {
          description: `\`backend_timeout\`: the market service did not answer in time ("${UPSTREAM_TIMEOUT_MESSAGE}"), or, on ingest, Redis died after the write went out and did not come back within 2 s ("${STORE_OUTCOME_UNKNOWN_MESSAGE}"). Either way an ingest may have been stored: re-send it with a new nonce; 409 \`stale_document\` then means it is.`,
          headers: commonHeaders(),
          content: json({ allOf: [schemaRef('Error'), { properties: { error: { const: 'backend_timeout' } } }] }),
        },
        MethodNotAllowed: {
          description: `${describeCode('method_not_allowed')}.`,
          headers: {
            Allow: { description: 'The methods the path supports (`GET, HEAD` or `POST`).', required: true, schema: { type: 'string', pattern: '^[A-Z]+(, [A-Z]+)*$' } },
            'Cache-Control': headerRef('CacheControl'),
            ...commonHeaders(),
          },
          content: json({ allOf: [schemaRef('Error'), { properties: { error: { const: 'method_not_allowed' } } }] }),
        },
      },
      schemas: {
        Error: {
          type: 'object', required: ['error', 'message', 'requestId'], additionalProperties: false,
          description: 'Every error body (docs/api.md "Errors"); keys in the order error, message, field, requestId.',
          properties: {
            error: { type: 'string', enum: Object.keys(ERROR_STATUS) },
            message: { type: 'string' },
            field: { type: 'string', enum: ['marketId', 'deadline', 'size', 'payload'], description: '`invalid_order` only: the offending field.' },
            requestId: {
              type: ['string', 'null'],
              description: 'The `X-Request-Id` of the same answer (generated by Envoy): quote it to support. '
                + 'null only when the answer has no `X-Request-Id` either (HTTP the edge refused before the request had an id).',
            },
          },
        },
        Root: {
          type: 'object', required: Object.keys(root), additionalProperties: false,
          properties: Object.fromEntries(Object.entries(root).map(([k, v]) => [k, { const: v }])),
        },
        Geoblock: {
          type: 'object', required: ['blocked', 'access', 'country', 'region', 'ip', 'policy'], additionalProperties: false,
          description: 'The caller\'s jurisdiction tier (docs/api.md "GET /v1/geoblock").',
          properties: {
            blocked: { type: 'boolean', description: 'true exactly when `access` is `blocked`.' },
            access: { type: 'string', enum: Object.keys(ACCESS_RANK) },
            country: { type: ['string', 'null'], pattern: PATTERN.country, description: 'ISO 3166-1 alpha-2; null when unknown or not looked up.' },
            region: { type: ['string', 'null'], pattern: PATTERN.region, description: 'ISO 3166-2 (`CA-QC`); null when the database names none.' },
            ip: { type: 'string', description: 'The client address the edge decided on (an IPv4-mapped address as its IPv4).' },
            policy: {
              type: 'string', pattern: POLICY_VERSION.source,
              description: 'The version of the geo policy that gave this answer: GEO_POLICY_FILE\'s `version`, or `env-` and 12 hex digits for a policy given by settings; '
                + 'the same value an admitted order carries to the backend as `x-edge-policy`.',
            },
          },
        },
        HealthOk: { type: 'object', required: ['status'], additionalProperties: false, properties: { status: { const: 'ok' } } },
        HealthUnavailable: {
          type: 'object', required: ['status', 'checks'], additionalProperties: false,
          properties: { status: { const: 'unavailable' }, checks: { type: 'object', description: 'Each readiness check and whether it passes.', additionalProperties: { type: 'boolean' } } },
        },
        MarketDocument: { ...marketDoc, description: 'The feed document (docs/api.md "Market data"). Unknown extra fields are kept and served.' },
        Envelope: { ...ENVELOPE_SCHEMA, description: 'The signed envelope as received: verify SHA-256(base64-decode(d)) with Ed25519.' },
        Market: {
          description: 'A stored market: the document as signed plus its envelope.',
          allOf: [schemaRef('MarketDocument'), { type: 'object', required: marketsItems['required'], properties: { envelope: schemaRef('Envelope') } }],
        },
        MarketsPage: {
          ...MARKETS_RESPONSE_SCHEMA, additionalProperties: false,
          properties: { markets: { type: 'array', items: schemaRef('Market') }, nextCursor: MARKETS_RESPONSE_SCHEMA.properties.nextCursor },
        },
        Quote: { ...QUOTE_SCHEMA, additionalProperties: false, description: 'One outcome of one market. `outcome` is the outcome\'s name; prices are null when the feed has none.' },
        QuotesPage: {
          ...QUOTES_RESPONSE_SCHEMA, additionalProperties: false,
          properties: { quotes: { type: 'array', items: schemaRef('Quote') }, nextCursor: QUOTES_RESPONSE_SCHEMA.properties.nextCursor },
        },
        OrderRequest: {
          type: 'object', required: ['marketId', 'deadline', 'size', 'payload'],
          description: 'The order envelope (docs/api.md "POST /v1/orders"). Unknown extra fields are ignored.',
          properties: {
            marketId: { type: 'string', pattern: PATTERN.conditionId, description: 'The market\'s conditionId; it must be known, active and not closed.' },
            deadline: {
              type: 'integer', minimum: -Number.MAX_SAFE_INTEGER, maximum: Number.MAX_SAFE_INTEGER,
              description: 'Unix seconds; now < deadline ≤ now + ORDER_MAX_TTL_SECS, else 422.',
            },
            size: {
              type: 'string', pattern: PATTERN.decimal,
              description: 'Positive decimal, at least the market\'s `minSize`, at most its `maxSize` and ORDER_MAX_SIZE; else 422 `invalid_size`.',
            },
            payload: {
              type: 'string', contentEncoding: 'base64', contentMediaType: 'application/octet-stream', pattern: PATTERN.strictBase64,
              maxLength: Math.ceil(defaults.orderPayloadMaxBytes / 3) * 4,
              description: 'The signed OrderRequest, strict canonical standard base64 (padded); decoded 1..ORDER_PAYLOAD_MAX_BYTES bytes, forwarded byte-exact.',
            },
          },
          examples: [{ marketId: '0x5f3a', deadline: 1763700300, size: '25.5', payload: 'c2lnbmVkIG9yZGVy' }],
        },
        IngestRequest: {
          type: 'object', required: ['conditionId', 'd', 's', 'k'],
          description: 'The ingest body (docs/api.md "POST /internal/ingest/market"): the envelope plus the market\'s conditionId. Unknown extra fields are ignored.',
          properties: {
            conditionId: { type: 'string', pattern: PATTERN.conditionId, description: 'Must equal the document\'s `conditionId`.' },
            d: {
              type: 'string', pattern: PATTERN.strictBase64, contentEncoding: 'base64', contentMediaType: 'application/json', contentSchema: schemaRef('MarketDocument'),
              description: 'Strict standard base64 of the UTF-8 JSON market document.',
            },
            s: ENVELOPE_SCHEMA.properties.s,
            k: ENVELOPE_SCHEMA.properties.k,
          },
        },
        IngestStored: {
          type: 'object', required: ['status', 'conditionId', 'seq'], additionalProperties: false,
          properties: {
            status: { const: 'stored' },
            conditionId: MARKET_DOCUMENT_SCHEMA.properties.conditionId,
            seq: MARKET_DOCUMENT_SCHEMA.properties.seq,
          },
        },
      },
    },
  };
}

export function renderOpenApi(): string {
  const header = '# GENERATED by scripts/openapi.ts from the service\'s own definitions. Do not edit; run: npm run openapi\n';
  return header + YAML.stringify(buildOpenApi(), { aliasDuplicateObjects: false, lineWidth: 0 });
}

if (import.meta.main) {
  const fresh = renderOpenApi();
  if (process.argv.includes('--check')) {
    if (readFileSync(OPENAPI_FILE, 'utf8') !== fresh) {
      process.stderr.write('docs/openapi.yaml is stale: run npm run openapi\n');
      process.exit(1);
    }
  } else {
    writeFileSync(OPENAPI_FILE, fresh);
    process.stdout.write(`wrote ${OPENAPI_FILE}\n`);
  }
}
