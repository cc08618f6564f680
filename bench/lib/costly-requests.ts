/**
 * The request classes of `npm run bench:costly` (issue 26 "Costly requests bounded"): an
 * ordinary read and order, and the costliest requests the limits allow (docs/api.md "Limits"),
 * each as h2load sends it: one method, one body or none, one URL or a list of distinct URLs
 * (so a query misses the page cache every time), and the answer every request must get.
 */
import { randomBytes } from 'node:crypto';
import { LIMIT } from '../../authz/src/common/rules.ts';
import { encodeCursor } from '../../authz/src/market/http.ts';

export interface RequestClass {
  readonly key: string;
  readonly label: string;
  /** The request's size as the table shows it. */
  readonly size: string;
  /** GET: the paths, requested in turn (distinct ones defeat the page cache); POST: one path. */
  readonly paths: readonly string[];
  readonly body?: Buffer;
  /** The status every answer must have, and the error code of a refusal. */
  readonly expect: { readonly status: number; readonly code?: string };
}

/** The longest id the pattern allows (`^[A-Za-z0-9_.:-]{1,128}$`), `tag` first. */
export function longestId(tag: string): string {
  return `${tag}-${'x'.repeat(128 - tag.length - 1)}`;
}

/** An order envelope without its closing brace (the deadline six hours ahead: longer than any run). */
function envelopeHead(marketId: string, payload: Buffer): string {
  const deadline = Math.floor(Date.now() / 1000) + 6 * 3600;
  return `{"marketId":${JSON.stringify(marketId)},"deadline":${deadline},"size":"10","payload":"${payload.toString('base64')}"`;
}

/** An order of exactly `bytes` bytes (or the most below it): `"x":[unit(0),unit(1),…]` after the envelope members. */
function filledOrder(marketId: string, payload: Buffer, bytes: number, unit: (i: number) => string, open = '"x":[', close = ']'): Buffer {
  const head = `${envelopeHead(marketId, payload)},${open}`;
  const parts: string[] = [];
  let len = head.length + close.length + 1;
  for (let i = 0; ; i++) {
    const u = unit(i);
    if (len + u.length + (i === 0 ? 0 : 1) > bytes) break;
    parts.push(u);
    len += u.length + (i === 0 ? 0 : 1);
  }
  const text = `${head}${parts.join(',')}${close}}`;
  if (Buffer.byteLength(text) > bytes) throw new Error(`order of ${Buffer.byteLength(text)} bytes, over ${bytes}`);
  return Buffer.from(text);
}

/** `levels` nested arrays around a 0. */
const nest = (levels: number): string => `${'['.repeat(levels)}0${']'.repeat(levels)}`;

export interface ClassInputs {
  /** The stored market every order trades and the ordinary read asks for (a longest id). */
  readonly market: string;
  /** The stored markets (longest ids; the market included): more than a page of the largest `limit`. */
  readonly known: readonly string[];
  /** The largest `limit` of a page (docs/api.md "Limits": 500). */
  readonly maxLimit: number;
  readonly orderMaxBytes: number;
  readonly payloadMaxBytes: number;
  /** Distinct URLs per query class: more than the page cache keeps, so every request misses it. */
  readonly distinctQueries: number;
}

/** Every class, the ordinary read first (the yardstick of the others). */
export function requestClasses(c: ClassInputs): RequestClass[] {
  const maxPayload = randomBytes(c.payloadMaxBytes);
  const small = randomBytes(256);
  const order = (key: string, label: string, body: Buffer, expect: RequestClass['expect'] = { status: 200 }): RequestClass =>
    ({ key, label, size: `${body.length.toLocaleString('en')} B body`, paths: ['/v1/orders'], body, expect });
  const query = (key: string, label: string, paths: string[], expect: RequestClass['expect'] = { status: 200 }): RequestClass =>
    ({ key, label, size: `${Math.max(...paths.map((p) => p.length)).toLocaleString('en')} B URL`, paths, expect });
  /** `n` of `xs` picked at random: a different set (and page-cache key) almost every time. */
  const sample = (xs: readonly string[], n: number): string[] => {
    const a = [...xs];
    for (let i = 0; i < n; i++) {
      const j = i + (randomBytes(4).readUInt32LE() % (a.length - i));
      [a[i], a[j]] = [a[j]!, a[i]!];
    }
    return a.slice(0, n);
  };
  const sorted = [...c.known].sort();
  const ids = (list: readonly string[]): string => `/v1/markets?conditionId=${list.join(',')}`;
  const depth = LIMIT.orderJsonDepth;
  return [
    query('read', 'ordinary read: `GET /v1/markets?conditionId=<one>`', [ids([c.market])]),
    order('order', 'ordinary order (256-byte payload)', Buffer.from(`${envelopeHead(c.market, small)}}`)),
    order('flatPayload', `largest order, flat: ${c.payloadMaxBytes.toLocaleString('en')}-byte payload, then an array of zeros`,
      filledOrder(c.market, maxPayload, c.orderMaxBytes, () => '0')),
    order('flatZeros', 'largest order, flat: 256-byte payload, then ~32,000 zeros in one array',
      filledOrder(c.market, small, c.orderMaxBytes, () => '0')),
    order('flatNames', 'largest order, flat: ~7,000 distinct member names (the costliest for JSON.parse)',
      filledOrder(c.market, small, c.orderMaxBytes, (i) => `"k${i}":0`, '"x":{', '}')),
    order('deepPayload', `largest order at depth ${depth}: ${c.payloadMaxBytes.toLocaleString('en')}-byte payload, then ${depth}-level nests`,
      filledOrder(c.market, maxPayload, c.orderMaxBytes, () => nest(depth - 2))),
    order('deepNests', `largest order at depth ${depth}: 256-byte payload, then ${depth}-level nests throughout`,
      filledOrder(c.market, small, c.orderMaxBytes, () => nest(depth - 2))),
    order('tooDeep', `refused: ${Math.floor(c.orderMaxBytes / 2).toLocaleString('en')} \`[\` then as many \`]\` (was 3.7 ms)`,
      Buffer.from('['.repeat(Math.floor(c.orderMaxBytes / 2)) + ']'.repeat(Math.floor(c.orderMaxBytes / 2))), { status: 400, code: 'invalid_json' }),
    query('pageDefault', 'the default page: `GET /v1/markets` (100 markets, `limit`\'s default; a cache hit, as a popular page is)', ['/v1/markets']),
    query('idsUnknown', `largest query: ${LIMIT.queryIds} longest ids, none stored, new ones every request (a page-cache miss each)`,
      Array.from({ length: c.distinctQueries }, (_, q) => ids(Array.from({ length: LIMIT.queryIds }, (_, k) => longestId(`q${q}-${k}`))))),
    query('idsKnown', `largest query: ${LIMIT.queryIds} stored markets (longest ids), another set every request (a miss each, a ${LIMIT.queryIds}-market page)`,
      Array.from({ length: c.distinctQueries }, () => ids(sample(c.known, LIMIT.queryIds)))),
    query('pageMax', `largest page: \`limit=${c.maxLimit}\` after one of ${sorted.length - c.maxLimit} cursors (a miss nearly each, a ${c.maxLimit}-market page)`,
      Array.from({ length: c.distinctQueries }, (_, q) => `/v1/markets?limit=${c.maxLimit}&cursor=${encodeCursor(sorted[q % (sorted.length - c.maxLimit)]!)}`)),
    query('idsRefused', 'refused: 500 ids, ~100 characters each (a 50 KB URL under Envoy\'s 60 KiB)',
      [ids(Array.from({ length: 500 }, (_, k) => `r${k}-${'y'.repeat(96)}`))], { status: 400, code: 'invalid_query' }),
  ];
}
