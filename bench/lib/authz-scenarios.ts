/**
 * The authz benchmark's inputs, shared by the orchestrator (bench/authz.ts), the server
 * child (bench/authz-server.ts) and the in-process decision-logic loop:
 *   (a) a geo-only GET shaped as Envoy sends it (~14 headers, x-edge-client-ip set),
 *   (b) a signed ingest (valid HMAC, valid Ed25519 envelope, one-time nonce),
 *   (c) an order for the bench market, which the service's market store holds (marketIngestBody).
 * CheckRequests are encoded with the real protos (testkit/check-request.ts).
 */
import { randomBytes } from 'node:crypto';
import { PATHS } from '../../authz/src/common/contract.ts';
import { ingestMac } from '../../authz/src/common/crypto/ingest-signer.ts';
import { HmacSha256Key } from '../../authz/src/common/crypto/hmac.ts';
import { encodeCheckRequest } from '../../testkit/check-request.ts';
import { ingestBody, marketDoc, type FeedKey } from '../../testkit/feed.ts';
import { frameGrpc } from './grpc-wire.ts';

/** Has a record in the default GeoIP database (GB): close-only under BENCH_POLICY_ENV, not blocked. */
export const CLIENT_IP = '81.2.69.160';

/**
 * Server settings for the bench. GEO_TRUSTED_CIDRS is set empty so the default loopback
 * exemption does not apply and every Check really looks the address up. Jurisdiction tiers as
 * a venue configures them (docs/api.md "Jurisdiction tiers"): the client's country is close-only,
 * so the order scenario's allow carries x-edge-access/x-edge-jurisdiction; the region rules are
 * there (the default database has no subdivisions, so none matches). A shadow policy is configured
 * beside them, and bench/authz.ts adds ANONYMIZER_DB (anonymizerDbForBench): the issue-18 policy
 * surface all on, as a venue would run it.
 */
export const BENCH_POLICY_ENV = {
  BLOCKED_COUNTRIES: 'KP,IR,CU,SY',
  BLOCKED_REGIONS: 'UA-43,UA-14,UA-09',
  CLOSE_ONLY_COUNTRIES: 'GB,PL,SG,TH,TW',
  CLOSE_ONLY_REGIONS: 'CA-ON',
  // A shadow policy being tried (one more close-only country): every Check is classified by both,
  // from the one lookup; for the bench's client (GB) they agree, as for most clients during a roll-out.
  SHADOW_CLOSE_ONLY_COUNTRIES: 'GB,PL,SG,TH,TW,FR',
  GEO_TRUSTED_CIDRS: '',
  LOG_LEVEL: 'info',
} as const;

/** The one market the order scenario trades and the ingest scenario updates. */
export const MARKET_ID = 'bench-market-0001';

/**
 * The market's signed ingest body at `seq` (active, sizes 5–100,000), as the feed sends it:
 * seq 1 is ingested into the service's market store before any Check, (b) sends seq 2.
 */
export function marketIngestBody(feed: FeedKey, seq: number): Buffer {
  return ingestBody(marketDoc(MARKET_ID, seq), feed);
}

/** The gRPC method path Envoy POSTs to. */
export const CHECK_PATH = '/envoy.service.auth.v3.Authorization/Check';

/** Headers Envoy forwards for a browser-ish GET after its header_mutation filter ran. */
const GET_HEADERS = {
  'user-agent': 'Mozilla/5.0 (X11; Linux x86_64) Chrome/126.0',
  accept: 'application/json',
  'accept-encoding': 'gzip, deflate, br',
  'accept-language': 'en-GB,en;q=0.9',
  'x-forwarded-for': CLIENT_IP,
  'x-envoy-external-address': CLIENT_IP,
  'x-edge-client-ip': CLIENT_IP,
};

/** (a) GET /v1/markets?… from an allowed address: geo is the only check. */
export function geoGetRequest(): Buffer {
  return encodeCheckRequest({ method: 'GET', path: '/v1/markets?active=true&limit=50', headers: GET_HEADERS });
}

/** (c) An order for MARKET_ID, deadline an hour ahead, within size limits. */
export function orderRequest(nowSecs: number): Buffer {
  const body = Buffer.from(JSON.stringify({
    marketId: MARKET_ID,
    deadline: nowSecs + 3600,
    size: '25.5',
    payload: Buffer.from('{"side":"buy","price":"0.52","outcome":"Yes"}').toString('base64'),
  }));
  return encodeCheckRequest({
    method: 'POST', path: PATHS.orders, body,
    headers: { 'user-agent': 'venue-sdk/2.3', 'x-forwarded-for': CLIENT_IP, 'x-edge-client-ip': CLIENT_IP },
  });
}

/**
 * (b) Signed ingests, each with its own nonce. One template CheckRequest is encoded with
 * placeholder nonce and signature of the final lengths; each request is a copy with the
 * nonce and its HMAC patched in place (same lengths, so no protobuf length changes).
 * The Ed25519 envelope is the same in all of them: the server still verifies it every time.
 */
export function ingestRequestFactory(hmacKey: Buffer, feed: FeedKey, nowSecs: number, opts: { framed?: boolean } = {}): (count: number) => Buffer[] {
  const body = marketIngestBody(feed, 2);
  const key = new HmacSha256Key(hmacKey);
  const ts = String(nowSecs);
  const NONCE_PH = 'f'.repeat(32);
  const SIG_PH = 'e'.repeat(64);
  const message = encodeCheckRequest({
    method: 'POST', path: PATHS.ingest, body,
    headers: {
      'user-agent': 'feed-producer/1.0', 'x-forwarded-for': CLIENT_IP, 'x-edge-client-ip': CLIENT_IP,
      'x-edge-timestamp': ts, 'x-edge-nonce': NONCE_PH, 'x-edge-signature': `v1=${SIG_PH}`,
    },
  });
  // Framed: the 5-byte gRPC prefix is part of the template, ready for a load generator.
  const template = opts.framed === true ? frameGrpc(message) : message;
  const nonceAt = template.indexOf(NONCE_PH);
  const sigAt = template.indexOf(SIG_PH);
  if (nonceAt === -1 || sigAt === -1 || template.indexOf(NONCE_PH, nonceAt + 1) !== -1) throw new Error('ingest template: placeholder not unique');
  // Unique across processes and runs: a random prefix plus a counter.
  const prefix = randomBytes(8).toString('hex');
  let counter = 0;
  return (count) => {
    const out: Buffer[] = new Array<Buffer>(count);
    for (let i = 0; i < count; i++) {
      const nonce = prefix + (counter++).toString(16).padStart(16, '0');
      const mac = ingestMac(key, ts, nonce, body).toString('hex');
      const req = Buffer.from(template);
      req.write(nonce, nonceAt, 'latin1');
      req.write(mac, sigAt, 'latin1');
      out[i] = req;
    }
    return out;
  };
}

/** One row of the server's edge_authz_decisions_total counter (its 'stats' IPC call). */
export interface DecisionCount {
  readonly route: string;
  readonly outcome: string;
  readonly code: string;
  readonly value: number;
}

/**
 * An anonymizer database for the bench (the test fixture's GeoIP2 Anonymous IP layout, built with
 * mmdb-writer): the bench's client has no record in it, like most clients, so each order and
 * ingest Check pays one lookup that finds nothing.
 */
export { anonymizerFixtures as anonymizerDbForBench } from '../../testkit/anonymizer-fixtures.ts';
