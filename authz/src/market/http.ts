/**
 * The market HTTP service (MARKET_PORT, loopback by default). Envoy routes every non-order
 * request here after ext_authz allowed it:
 *   GET /  · GET /healthz · GET /v1/markets · GET /v1/quotes · GET /v1/geoblock · POST /internal/ingest/market
 * node:http (no framework: one handler per market route of the registry, common/routes.ts); queries validated with
 * ajv from the schemas in ./schemas.ts. Every error is error JSON.
 */
import type { KeyObject } from 'node:crypto';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import { Ajv } from 'ajv';
import { Counter, Gauge, type Registry } from 'prom-client';
import { BAD_REQUEST_MESSAGE_BY_STATUS, ERROR_MESSAGE, errorJson, ERROR_STATUS, type ErrorCode } from '../common/errors.ts';
import { verifyIngestBody } from '../common/feed/envelope.ts';
import type { Logger } from '../common/log.ts';
import { MARKETS_QUERY_SCHEMA, QUOTES_QUERY_SCHEMA, ROOT_BODY, type ListQuery } from './schemas.ts';
import { encodeCursor, STORE_OUTCOME_UNKNOWN_MESSAGE, StoreOutcomeUnknownError, writePageParts, type MarketStore, type PageBody } from './store.ts';
import { LIMIT, PATTERN, RE } from '../common/rules.ts';
import { allowHeader, API_ROUTES, serves, type MarketRouteId, type RouteSpec } from '../common/routes.ts';
import { MARKET_INGEST_OUTCOMES, MARKET_REQUEST_STATUSES, zeroSeries } from '../common/metrics.ts';
import type { GeoResult } from '../authz/stages/geo.ts';
import { clientAddress, geoblockBody } from './geoblock.ts';

export interface MarketServiceDeps {
  readonly store: MarketStore;
  readonly feedKeys: readonly KeyObject[];
  readonly ingestMaxBytes: number;
  readonly logger: Logger;
  readonly registry: Registry;
  readonly readiness: () => Record<string, boolean>;
  readonly isSealed: () => boolean;
  /** Classifies a client address for GET /v1/geoblock (the authz geo classifier); without it that path is 404. */
  readonly geoblock?: (clientIp: string) => GeoResult;
  readonly host: string;
  readonly port: number;
  /** MARKET_SOCKET: also (or, with `tcp: false`, only) listen on this Unix socket path (Envoy's market cluster). */
  readonly socket?: string;
  /** Listen on host:port (default true; false only with a socket). */
  readonly tcp?: boolean;
}

export interface MarketService {
  readonly server: Server;
  /** Resolves to the TCP port listened on (0 when only on a socket). */
  listen(): Promise<number>;
  close(): Promise<void>;
}

const JSON_TYPE = 'application/json';
/** Above Envoy's 60 KiB request-header limit plus what Envoy adds (forwarding headers, request id). */
export const MAX_HEADER_BYTES = 80 * 1024;
/** The metrics label of a path: a market route's path (MARKET_REQUEST_STATUSES), else `other` (never a client-chosen path). */
function routeLabel(path: string): string {
  return Object.hasOwn(MARKET_REQUEST_STATUSES, path) ? path : 'other';
}

class HttpError extends Error {
  readonly code: ErrorCode;
  constructor(code: ErrorCode, message?: string) {
    super(message ?? code);
    this.code = code;
  }
}

function send(res: ServerResponse, status: number, body: string, headers: Record<string, string> = {}): void {
  res.writeHead(status, { 'content-type': JSON_TYPE, 'content-length': Buffer.byteLength(body), ...headers });
  res.end(body);
}

/**
 * The request id of an error body: the `x-request-id` Envoy generated for the request (and
 * returns to the client), null when the request came without one (not through Envoy).
 */
function requestIdOf(req: IncomingMessage): string | null {
  const id = req.headers['x-request-id'];
  return typeof id === 'string' && id !== '' ? id : null;
}

/**
 * The same for a request Node's parser refused (no IncomingMessage): the header as it appears in
 * the bytes that failed to parse, if it is there and looks like an id Envoy generates; else null.
 */
export function requestIdInRaw(raw: unknown): string | null {
  if (!Buffer.isBuffer(raw)) return null;
  return /\r\nx-request-id:[ \t]*([A-Za-z0-9._-]{1,128})[ \t]*\r\n/i.exec(raw.toString('latin1'))?.[1] ?? null;
}

function sendError(res: ServerResponse, code: ErrorCode, message?: string, headers: Record<string, string> = {}): void {
  send(res, ERROR_STATUS[code], errorJson(code, message, undefined, requestIdOf(res.req)), { 'cache-control': 'no-store', ...headers });
}

/** Reads the body up to `max` bytes; throws HttpError(payload_too_large) beyond. */
function readBody(req: IncomingMessage, max: number): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    const declared = Number(req.headers['content-length'] ?? 0);
    if (declared > max) {
      req.resume();
      reject(new HttpError('payload_too_large'));
      return;
    }
    const chunks: Buffer[] = [];
    let size = 0;
    req.on('data', (c: Buffer) => {
      size += c.length;
      if (size > max) {
        req.destroy();
        reject(new HttpError('payload_too_large'));
      } else chunks.push(c);
    });
    req.on('end', () => resolve(Buffer.concat(chunks)));
    req.on('error', reject);
  });
}


/** Longest part of a client-chosen parameter name an error message repeats. */
export const SHOWN_NAME_MAX = 64;

/**
 * A client-chosen query parameter name as an error message shows it: at most SHOWN_NAME_MAX
 * characters (then `…`), quoted, with quotes, backslashes and control characters escaped, so
 * a client can neither make the answer large nor put a line break into a log that prints it.
 */
export function shownName(name: string): string {
  const cut = name.length > SHOWN_NAME_MAX ? `${name.slice(0, SHOWN_NAME_MAX)}…` : name;
  return JSON.stringify(cut).replace(/[\u007f-\u009f\u2028\u2029]/g, (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, '0')}`);
}

/** The invalid_query message for a list longer than LIMIT.queryIds (docs/api.md "Limits"). */
export const TOO_MANY_IDS = `conditionId names more than ${LIMIT.queryIds} ids; at most ${LIMIT.queryIds} per query`;

/** Whether the comma-separated `list` has more than `max` entries; stops at the (max + 1)th. */
export function idCountExceeds(list: string, max: number): boolean {
  let at = -1;
  for (let commas = 0; commas < max; commas++) {
    at = list.indexOf(',', at + 1);
    if (at === -1) return false;
  }
  return true;
}

export { encodeCursor };

export function decodeCursor(c: string): string | undefined {
  const id = Buffer.from(c, 'base64url').toString('utf8');
  return RE.conditionId.test(id) && encodeCursor(id) === c ? id : undefined;
}

/** A request target as the service reads it: the path, and the query's (name, value) pairs. */
export interface Target {
  readonly path: string;
  params(): Iterable<[string, string]>;
}

/** A path WHATWG URL parsing leaves as it is (no dot segments, escapes, backslashes or leading `//`). */
const PLAIN_PATH = /^\/(?!\/)[A-Za-z0-9_/-]*$/;
/** A query WHATWG URL parsing and URLSearchParams leave as they are (nothing to escape or decode). */
const PLAIN_QUERY = /^[A-Za-z0-9_.:,=&-]*$/;

/**
 * The request target, read as `new URL(target, base)` and its `searchParams` read it. Targets of
 * plain characters only (every valid market or quote query) are split directly: no URL object
 * and no decoding pass over a query of up to 60 KiB; anything else goes through URL.
 */
export function parseTarget(raw: string): Target {
  const q = raw.indexOf('?');
  const path = q === -1 ? raw : raw.slice(0, q);
  const query = q === -1 ? '' : raw.slice(q + 1);
  if (PLAIN_PATH.test(path) && PLAIN_QUERY.test(query)) {
    return {
      path,
      *params() {
        // As URLSearchParams: '&'-separated, empty sequences skipped, the name up to the first '='.
        for (const part of query.split('&')) {
          if (part === '') continue;
          const eq = part.indexOf('=');
          yield eq === -1 ? [part, ''] : [part.slice(0, eq), part.slice(eq + 1)];
        }
      },
    };
  }
  const url = new URL(raw, 'http://market.local');
  return { path: url.pathname, params: () => url.searchParams };
}

/**
 * Buffers that pages assembled per request (a `limit` over ~150: PageParts) are written from,
 * reused once the socket has taken the write. An 800 KB body allocated per response and dropped
 * cost a plain node:http server ~500–630 µs of CPU per response against ~300–370 µs from a reused
 * buffer and ~380–400 µs for the ~1,000 parts written corked one by one (loopback, 8 in flight,
 * 2026-11-27; docs/benchmarks.md "Costly requests"). At most BODY_POOL_BUFFERS are kept, none
 * larger than BODY_POOL_MAX_BYTES, and all are dropped after BODY_POOL_IDLE_MS unused.
 */
export const BODY_POOL_BUFFERS = 4;
export const BODY_POOL_MAX_BYTES = 2 * 1_048_576;
const BODY_POOL_IDLE_MS = 10_000;
/** Pool buffers are sized in steps of this, so pages of similar sizes share them. */
const BODY_POOL_STEP = 64 * 1024;

export class BodyBuffers {
  readonly #free: Buffer[] = [];
  #idle: NodeJS.Timeout | undefined;

  /** A buffer of at least `bytes` (pooled when one is free, else new). */
  take(bytes: number): Buffer {
    const free = this.#free;
    for (let i = free.length - 1; i >= 0; i--) {
      const b = free[i] as Buffer;
      if (b.length >= bytes) {
        free[i] = free[free.length - 1] as Buffer;
        free.pop();
        return b;
      }
    }
    return Buffer.allocUnsafeSlow(Math.ceil(bytes / BODY_POOL_STEP) * BODY_POOL_STEP);
  }

  /** Gives back a buffer nothing reads any more. */
  give(b: Buffer): void {
    if (b.length > BODY_POOL_MAX_BYTES) return;
    if (this.#free.length >= BODY_POOL_BUFFERS) {
      // Keep the largest: a smaller one is the likelier to be too short.
      let min = 0;
      for (let i = 1; i < this.#free.length; i++) if ((this.#free[i] as Buffer).length < (this.#free[min] as Buffer).length) min = i;
      if ((this.#free[min] as Buffer).length >= b.length) return;
      this.#free[min] = b;
    } else {
      this.#free.push(b);
    }
    if (this.#idle === undefined) {
      this.#idle = setTimeout(() => { this.#free.length = 0; this.#idle = undefined; }, BODY_POOL_IDLE_MS);
      this.#idle.unref();
    } else {
      this.#idle.refresh();
    }
  }

  /** Buffers held (for tests). */
  get size(): number {
    return this.#free.length;
  }
}

export function createMarketService(deps: MarketServiceDeps): MarketService {
  const bodyBuffers = new BodyBuffers();
  const ajv = new Ajv({ coerceTypes: true, allErrors: false, strict: true });
  const validateMarkets = ajv.compile<ListQuery>(MARKETS_QUERY_SCHEMA);
  const validateQuotes = ajv.compile<ListQuery>(QUOTES_QUERY_SCHEMA);
  const requests = new Counter({
    name: 'edge_market_requests_total', help: 'Market service responses by route and status',
    labelNames: ['route', 'status'] as const, registers: [deps.registry],
  });
  zeroSeries(requests, Object.entries(MARKET_REQUEST_STATUSES).flatMap(([route, statuses]) => statuses.map((s) => [route, String(s)])));
  // Collected at scrape time from the store's own counters; 0 for a store without a page cache
  // (the in-memory development store), so the series exists whatever the store.
  const store = deps.store;
  new Gauge({
    name: 'edge_market_page_cache_entries', help: 'Pages held by the in-process page cache (bounded by entries and bytes)',
    registers: [deps.registry], collect() { this.set(store.cachedPages?.entries ?? 0); },
  });
  new Gauge({
    name: 'edge_market_page_cache_bytes', help: 'Estimated bytes retained by the in-process page cache (its bound counts this)',
    registers: [deps.registry], collect() { this.set(store.cachedPages?.bytes ?? 0); },
  });
  const ingests = new Counter({
    name: 'edge_market_ingest_total', help: 'Ingest outcomes at the market service (stored, stale, store_error, outcome_unknown)',
    labelNames: ['outcome'] as const, registers: [deps.registry],
  });
  zeroSeries(ingests, MARKET_INGEST_OUTCOMES.map((o) => [o]));

  function parseQuery(target: Target, validate: typeof validateMarkets): { after?: string; limit: number; ids?: string[]; active?: boolean } {
    // No prototype: `__proto__`, `constructor`, … are parameter names like any other (unknown ones).
    const raw = Object.create(null) as Record<string, string>;
    for (const [k, v] of target.params()) {
      if (k in raw) throw new HttpError('invalid_query', `parameter ${shownName(k)} given twice`);
      raw[k] = v;
    }
    // Before anything else reads the list: more ids than the bound is refused whatever they are.
    if (raw['conditionId'] !== undefined && idCountExceeds(raw['conditionId'], LIMIT.queryIds)) throw new HttpError('invalid_query', TOO_MANY_IDS);
    // ajv's coercion would take `0x10`, `1e2`, `+5` or ` 5` as numbers: only plain decimals here.
    if (raw['limit'] !== undefined && !/^[0-9]+$/.test(raw['limit'])) {
      throw new HttpError('invalid_query', '/limit must be a decimal integer from 1 to 500');
    }
    if (!validate(raw)) {
      const e = validate.errors?.[0];
      const unknown = e?.params?.['additionalProperty'];
      if (typeof unknown === 'string') throw new HttpError('invalid_query', `unknown parameter ${shownName(unknown)}`);
      throw new HttpError('invalid_query', `${e?.instancePath || 'query'} ${e?.message ?? 'is invalid'}`);
    }
    const q = raw as unknown as ListQuery;
    let after: string | undefined;
    if (q.cursor !== undefined) {
      after = decodeCursor(q.cursor);
      if (after === undefined) throw new HttpError('invalid_query', 'cursor is not one this service issued');
    }
    const ids = q.conditionId === undefined ? undefined : q.conditionId.split(',');
    if (ids !== undefined && ids.some((id) => !RE.conditionId.test(id))) {
      throw new HttpError('invalid_query', `conditionId must be a comma-separated list of up to ${LIMIT.queryIds} ids matching ${PATTERN.conditionId}`);
    }
    return {
      limit: q.limit ?? 100,
      ...(after === undefined ? {} : { after }),
      ...(ids === undefined ? {} : { ids }),
      ...(q.active === undefined ? {} : { active: q.active === 'true' }),
    };
  }

  /** A page as rendered by the store (one Buffer, cached with its ETag), or 304 when the client has it. */
  function sendPage(req: IncomingMessage, res: ServerResponse, page: PageBody): void {
    const headers = { etag: page.etag, 'cache-control': 'public, max-age=1' };
    if (req.headers['if-none-match'] === page.etag) {
      res.writeHead(304, headers);
      res.end();
      return;
    }
    const parts = page.parts;
    if (parts === undefined) {
      res.writeHead(200, { 'content-type': JSON_TYPE, 'content-length': page.body.length, ...headers });
      res.end(page.body);
      return;
    }
    // A page assembled per request: its records copied into a reused buffer, given back once
    // the socket has taken the write (or failed it); never an allocation of the body's size.
    res.writeHead(200, { 'content-type': JSON_TYPE, 'content-length': parts.length, ...headers });
    const into = bodyBuffers.take(parts.length);
    res.end(writePageParts(parts, into), () => bodyBuffers.give(into));
  }

  /** A market route's answer; the request was routed to it by path and method. */
  type Handler = (req: IncomingMessage, res: ServerResponse, target: Target) => Promise<void> | void;
  /**
   * One handler per market route of the registry (routes.ts, upstream `market`): a route added
   * there without its handler here fails typecheck. No fallback: an unknown path is 404.
   */
  const handlers = {
    root: (_req, res) => send(res, 200, ROOT_BODY),
    healthz: (_req, res) => {
      const checks = deps.readiness();
      const ok = Object.values(checks).every(Boolean);
      send(res, ok ? 200 : 503, ok ? '{"status":"ok"}' : JSON.stringify({ status: 'unavailable', checks }), { 'cache-control': 'no-store' });
    },
    markets: async (req, res, target) => {
      const q = parseQuery(target, validateMarkets);
      sendPage(req, res, await deps.store.pageBody(q, 'markets'));
    },
    quotes: async (req, res, target) => {
      const q = parseQuery(target, validateQuotes);
      sendPage(req, res, await deps.store.pageBody(q, 'quotes'));
    },
    geoblock: (req, res, target) => {
      // It takes no parameters; like the other reads, an unknown one is refused.
      for (const [k] of target.params()) throw new HttpError('invalid_query', `unknown parameter ${shownName(k)}`);
      const ip = clientAddress(req);
      send(res, 200, geoblockBody(deps.geoblock!(ip), ip), { 'cache-control': 'no-store' });
    },
    ingest: async (req, res) => {
      // Envoy's ext_authz already verified HMAC, nonce and the envelope.
      const raw = await readBody(req, deps.ingestMaxBytes);
      // Defence in depth: the store never holds content the feed key did not sign.
      const v = verifyIngestBody(raw, deps.feedKeys);
      if (!v.ok) throw new HttpError(v.code, v.message);
      const { conditionId, envelope, document } = v;
      let result;
      try {
        result = await deps.store.put(document, envelope);
      } catch (err) {
        if (err instanceof StoreOutcomeUnknownError) {
          ingests.labels('outcome_unknown').inc();
          deps.logger.error({ err: String(err), conditionId }, 'market store did not confirm the write: outcome unknown');
          throw new HttpError('backend_timeout', STORE_OUTCOME_UNKNOWN_MESSAGE);
        }
        ingests.labels('store_error').inc();
        deps.logger.error({ err: String(err), conditionId }, 'market store unavailable: ingest not stored');
        throw new HttpError('service_unavailable', 'market store unavailable; nothing was stored');
      }
      ingests.labels(result).inc();
      if (result === 'stale') throw new HttpError('stale_document');
      deps.logger.info({ conditionId, seq: document.seq }, 'market stored');
      send(res, 200, JSON.stringify({ status: 'stored', conditionId, seq: document.seq }), { 'cache-control': 'no-store' });
    },
  } satisfies Record<MarketRouteId, Handler>;
  const routes: ReadonlyMap<string, { readonly route: RouteSpec; readonly handle: Handler }> = new Map(
    API_ROUTES.flatMap((r) => (r.upstream === 'market' ? [[r.path, { route: r, handle: handlers[r.id] as Handler }] as const] : [])),
  );

  async function handle(req: IncomingMessage, res: ServerResponse): Promise<string> {
    const target = parseTarget(req.url ?? '/');
    const path = target.path;
    const entry = routes.get(path);
    if (deps.isSealed()) {
      sendError(res, 'sealed');
      return routeLabel(path);
    }
    if (entry === undefined || (entry.route.kind === 'geoblock' && deps.geoblock === undefined)) throw new HttpError('not_found');
    if (!serves(entry.route, req.method ?? '')) {
      sendError(res, 'method_not_allowed', undefined, { allow: allowHeader(entry.route) });
      return path;
    }
    await entry.handle(req, res, target);
    return path;
  }

  // maxHeaderSize above Envoy's limit (max_request_headers_kb, 60 KiB, plus the headers Envoy
  // adds), so whatever Envoy lets through is parsed here too; Node's default is 16 KiB.
  const server = createServer({ keepAliveTimeout: 5000, maxHeaderSize: MAX_HEADER_BYTES }, (req, res) => {
    handle(req, res).then(
      (route) => requests.labels(route, String(res.statusCode)).inc(),
      (err: unknown) => {
        if (err instanceof HttpError) {
          if (!res.headersSent) sendError(res, err.code, err.message === err.code ? undefined : err.message);
        } else {
          // A store read failed (Redis down) or something unexpected: fail closed, never crash.
          deps.logger.error({ err: String(err), path: req.url?.split('?')[0] }, 'market request failed');
          if (!res.headersSent) sendError(res, 'service_unavailable', 'market store unavailable');
        }
        requests.labels(routeLabel(parseTarget(req.url ?? '/').path), String(res.statusCode)).inc();
      },
    );
  });
  // An `Expect` other than 100-continue: served like any request (RFC 9110 allows ignoring it;
  // Node's default is a 417 with no body). Envoy removes the header before it gets here anyway.
  server.on('checkExpectation', (req, res) => server.emit('request', req, res));
  server.on('clientError', (err: NodeJS.ErrnoException, socket) => {
    // Requests Node's parser refuses (an unknown method Envoy passed on over HTTP/2, headers over
    // maxHeaderSize, …): the same answers Envoy gives such requests itself, never a query error.
    if (!socket.writable) return;
    const [status, reason, message] = err.code === 'HPE_HEADER_OVERFLOW'
      ? [431, 'Request Header Fields Too Large', BAD_REQUEST_MESSAGE_BY_STATUS[431]]
      : err.code === 'ERR_HTTP_REQUEST_TIMEOUT'
        ? [408, 'Request Timeout', BAD_REQUEST_MESSAGE_BY_STATUS[408]]
        : [400, 'Bad Request', ERROR_MESSAGE.bad_request];
    socket.end(`HTTP/1.1 ${status} ${reason}\r\ncontent-type: application/json\r\nconnection: close\r\n\r\n${errorJson('bad_request', message, undefined, requestIdInRaw((err as { rawPacket?: unknown }).rawPacket))}`);
  });

  // A socket beside the TCP port: a second server handing every request to the first one's handlers.
  const tcp = deps.tcp ?? true;
  const servers = [server];
  let socketServer = server;
  if (deps.socket !== undefined && tcp) {
    socketServer = createServer({ keepAliveTimeout: 5000, maxHeaderSize: MAX_HEADER_BYTES });
    socketServer.on('request', (req, res) => server.emit('request', req, res));
    socketServer.on('checkExpectation', (req, res) => server.emit('request', req, res));
    socketServer.on('clientError', (err, socket) => server.emit('clientError', err, socket));
    servers.push(socketServer);
  }
  const listenOn = (srv: Server, ...args: [number, string] | [string]): Promise<void> => new Promise((resolve, reject) => {
    srv.once('error', reject);
    srv.listen(...args as [number, string], () => {
      srv.off('error', reject);
      resolve();
    });
  });

  return {
    server,
    async listen() {
      if (tcp) await listenOn(server, deps.port, deps.host);
      if (deps.socket !== undefined) await listenOn(socketServer, deps.socket);
      const a = server.address();
      return typeof a === 'object' && a !== null ? a.port : 0;
    },
    close() {
      return Promise.all(servers.map((srv) => new Promise<void>((resolve) => {
        srv.closeIdleConnections();
        srv.close(() => resolve());
        setTimeout(() => srv.closeAllConnections(), 1000).unref();
      }))).then(() => undefined);
    },
  };
}
