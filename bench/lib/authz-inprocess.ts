/**
 * The authz decision logic alone, in this process, on pre-encoded CheckRequests:
 * decodeCheckRequest → evaluate → encodeDecision, exactly what the Check handler runs
 * between grpc-js handing over the message bytes and taking the response bytes back.
 * Plus a breakdown of the parts (decoder, geo, HMAC, Ed25519, metrics…) to show where
 * the microseconds go.
 *
 * The core is built by createAuthzCore with the production adapters (real GeoDatabase,
 * metrics, pino, the in-memory market store holding the bench market, ingested through the
 * market service's write path), except the nonce store: in-memory here, so the loop measures
 * CPU, not a Redis round trip. The Redis nonce write is measured on its own (CPU per call, many in
 * flight, as the server does it).
 */
import { Writable } from 'node:stream';
import type { MethodDefinition } from '@grpc/proto-loader';
import { loadPackageDefinition, SERVICE_NAMES } from '../../proto/index.ts';
import { createAuthzCore } from '../../authz/src/authz/core.ts';
import { GeoDatabase } from '../../authz/src/common/adapters/geoip.ts';
import { AnonymizerDatabase } from '../../authz/src/common/adapters/anonymizer.ts';
import { MemoryNonceStore, RedisNonceStore } from '../../authz/src/common/adapters/nonce-store.ts';
import { createRedis } from '../../authz/src/common/adapters/redis.ts';
import { loadConfig, type Env } from '../../authz/src/common/config.ts';
import { loadCredentials } from '../../authz/src/common/credentials.ts';
import { ALLOW, type Decision } from '../../authz/src/authz/decision.ts';
import { decodeCheckRequest } from '../../authz/src/authz/codec/request.ts';
import { encodeDecision, toCheckResponse, type Serialize } from '../../authz/src/authz/codec/response.ts';
import { decisionLine, DECISION_MSG } from '../../authz/src/authz/decision-log.ts';
import { checkDocument, parseIngestBody, verifyEnvelopeSignature } from '../../authz/src/common/feed/envelope.ts';
import { createLogger } from '../../authz/src/common/log.ts';
import { createMetrics } from '../../authz/src/common/metrics.ts';
import { classify } from '../../authz/src/common/routes.ts';
import { evaluate } from '../../authz/src/authz/pipeline.ts';
import { systemClock, type GeoRecord } from '../../authz/src/common/ports.ts';
import { secondaryGeo } from '../../authz/src/authz/geo-secondary.ts';
import { createGeoClassifier, normalizeIp } from '../../authz/src/authz/stages/geo.ts';
import { checkIngestSignature } from '../../authz/src/authz/stages/ingest.ts';
import { orderStage } from '../../authz/src/authz/stages/order.ts';
import { MemoryMarketStore } from '../../authz/src/market/store.ts';
import { CLIENT_IP } from './authz-scenarios.ts';
import { checkResponseCode } from './grpc-wire.ts';
import { ingestInto } from './market-service.ts';
import { cpuPerCall, timeLoop } from './microbench.ts';

/** Pre-encoded CheckRequests and the server settings to build the core with. */
export interface InProcessInputs {
  readonly env: Env;
  readonly redisUrl: string;
  /** (a) and (c) CheckRequests (unframed). */
  readonly geoGet: Buffer;
  readonly order: Buffer;
  /** Makes `count` distinct signed ingest CheckRequests (unframed). */
  readonly ingests: (count: number) => Buffer[];
  /** The signed ingest body of the market (c) orders, stored before anything is timed. */
  readonly market: Buffer;
}

/** One measured line: what, and µs per call. */
export interface Row {
  readonly name: string;
  readonly us: number;
  readonly note?: string;
}

/** The per-scenario decision logic and the parts. */
export interface InProcessResult {
  /** decode + evaluate + encode per scenario. */
  readonly decision: { readonly a: Row; readonly b: Row; readonly c: Row };
  /** The parts, and the per-Check work around the decision. */
  readonly parts: readonly Row[];
}

const LOOP = { warmupMs: 150, batchMs: 60, reps: 7 } as const;
/** An x-request-id as Envoy generates it (a UUID), for the denial encoding parts. */
const REQUEST_ID = '0b8f1e2a-3c4d-4e5f-8a6b-7c8d9e0f1a2b';

/** Builds the core in this process and times the decision logic and its parts. */
export async function measureInProcess(inp: InProcessInputs, log: (m: string) => void): Promise<InProcessResult> {
  const config = loadConfig(inp.env);
  const credentials = loadCredentials(inp.env);
    const geo = new GeoDatabase(config.geoipDb);
  const anonymizer = config.anonymizer === undefined ? undefined : new AnonymizerDatabase(config.anonymizer.db);
  const metrics = createMetrics({ geoipBuildEpochSecs: () => geo.buildEpochSecs, defaultMetrics: false });
  const logger = createLogger('info', new Writable({ write: (_c, _e, cb) => cb() }));
  const markets = new MemoryMarketStore();
  await ingestInto(markets, credentials.feedKeys, inp.market);
  const core = createAuthzCore({
    config, credentials, geo, metrics, logger,
    nonces: new MemoryNonceStore(),
    markets,
    clock: systemClock,
    ...(anonymizer === undefined ? {} : { anonymizer }),
  });
  const checkDef = (loadPackageDefinition()[SERVICE_NAMES.authorization] as Record<string, MethodDefinition<object, object>>)['Check'];
  if (checkDef === undefined) throw new Error('Check method not found');
  const serialize = checkDef.responseSerialize as Serialize;
  const pipeline = core.pipeline;

  const decide = (buf: Buffer): Buffer | Promise<Buffer> => {
    const d = evaluate(decodeCheckRequest(buf), pipeline);
    return d instanceof Promise ? d.then((x) => encodeDecision(x, serialize)) : encodeDecision(d, serialize);
  };

  // Every scenario must be an allow, or the loop would time a denial.
  const N_INGEST = 12_000;
  const ingests = inp.ingests(N_INGEST + 1);
  const probe = ingests.pop() as Buffer;
  for (const [name, buf] of [['a', inp.geoGet], ['b', probe], ['c', inp.order]] as const) {
    const code = checkResponseCode(await decide(buf));
    if (code !== 0) throw new Error(`in-process (${name}) is not allowed (status ${code})`);
  }

  log('in-process: decision logic (decode + evaluate + encode)');
  const a = await timeLoop(() => decide(inp.geoGet), LOOP);
  const b = await timeLoop((i) => decide(ingests[i] as Buffer), { ...LOOP, batchMs: 150, maxCalls: N_INGEST });
  const c = await timeLoop(() => decide(inp.order), LOOP);

  log('in-process: parts');
  const inputA = decodeCheckRequest(inp.geoGet);
  const inputB = decodeCheckRequest(probe);
  const inputC = decodeCheckRequest(inp.order);
  const body = inputB.body as Buffer;
  const parsed = parseIngestBody(body);
  if (!parsed.ok) throw new Error('ingest body does not parse');
  const { document, signature, conditionId } = parsed.value;
  const nowSecs = systemClock.nowSecs();
  const fresh = (d: Decision): Decision => ({ ...d, encoded: undefined });
  const t = async (name: string, fn: (i: number) => unknown, note?: string): Promise<Row> =>
    ({ name, us: (await timeLoop(fn, LOOP)).usPerCall, ...(note === undefined ? {} : { note }) });

  // The shadow policy's price: the classifier built with and without it, over the same database.
  const noShadow = createGeoClassifier({ ...config, shadow: undefined }, geo);
  const withShadow = createGeoClassifier(config, geo);
  const geo2 = new GeoDatabase(config.geoipDb);
  const twoDbs = createGeoClassifier(config, geo, { secondary: geo2 });
  const other: GeoRecord = { country: 'KP', regions: [] };
  const disagreeing = createGeoClassifier(config, geo, secondaryGeo(config, { lookup: () => other }, metrics, logger));
  const [o1 = 0, o2 = 0, o3 = 0, o4 = 0] = CLIENT_IP.split('.').map(Number);
  const SIX_TO_FOUR = `2002:${((o1 << 8) | o2).toString(16)}:${((o3 << 8) | o4).toString(16)}::1`;
  // The decision logic of (a) with GEOIP_DB_SECONDARY, timed in alternation with one database.
  const core2 = createAuthzCore({
    config, credentials, geo, geoSecondary: geo2, metrics, logger, nonces: new MemoryNonceStore(), markets, clock: systemClock,
    ...(anonymizer === undefined ? {} : { anonymizer }),
  });
  const decide2 = (buf: Buffer): Buffer | Promise<Buffer> => {
    const d = evaluate(decodeCheckRequest(buf), core2.pipeline);
    return d instanceof Promise ? d.then((x) => encodeDecision(x, serialize)) : encodeDecision(d, serialize);
  };
  log('in-process: decision (a), one database and two, alternating');
  const alternating: Row[] = [];
  for (let round = 0; round < 3; round++) {
    alternating.push(await t(`decision (a), one database (round ${round + 1})`, () => decide(inp.geoGet)));
    alternating.push(await t(`decision (a) with GEOIP_DB_SECONDARY (round ${round + 1})`, () => decide2(inp.geoGet)));
  }
  const parts: Row[] = [
    await t(`decodeCheckRequest (a) — lean decoder, ${inp.geoGet.length} B`, () => decodeCheckRequest(inp.geoGet)),
    await t('proto-loader full decode (a) — what the floor does', () => checkDef.requestDeserialize(inp.geoGet)),
    await t(`decodeCheckRequest (b) — ingest, ${probe.length} B with raw_body`, () => decodeCheckRequest(probe)),
    await t('geo: normalizeIp', () => normalizeIp(CLIENT_IP)),
    await t('geo: GeoDatabase.lookup (maxmind)', () => geo.lookup(CLIENT_IP)),
    await t('geo: classifyGeo (normalize + trusted CIDRs + lookup + metric)', () => pipeline.classifyGeo(CLIENT_IP),
      config.shadow === undefined ? undefined : 'with the shadow policy (SHADOW_*), as configured'),
    await t('geo: the same classifier without a shadow policy (no SHADOW_* set), no metric', () => noShadow(CLIENT_IP)),
    await t('geo: the same classifier with the shadow policy, no metric', () => withShadow(CLIENT_IP)),
    // GEOIP_DB_SECONDARY's price (issue 30 point 5): a second reader of the same file (two lookups
    // that agree), and a stub that always disagrees (the stricter tier + the pair's counter).
    await t('geo: classifier with GEOIP_DB_SECONDARY (a second reader of the same file: two lookups, agreeing), no metric', () => twoDbs(CLIENT_IP)),
    await t('geo: classifier with a secondary that disagrees on every address (stricter tier + edge_geoip_disagreements_total)', () => disagreeing(CLIENT_IP)),
    await t('geo: classifier, the 6to4 form of the same address (embedded IPv4 parsed, common/ip.ts)', () => noShadow(SIX_TO_FOUR)),
    ...(anonymizer === undefined ? [] : [
      await t('anonymizer: AnonymizerDatabase.flags, an address with no record (maxmind)', () => anonymizer.flags(CLIENT_IP)),
      await t('anonymizer: the order route\'s check (normalize + lookup + flag mask)', () => pipeline.anonymizer?.blocks(CLIENT_IP, 'order')),
    ]),
    await t('evaluate (a) on a decoded input', () => evaluate(inputA, pipeline)),
    await t('encodeDecision (cached bytes)', () => encodeDecision(ALLOW, serialize)),
    await t('toCheckResponse + serialize (uncached)', () => encodeDecision(fresh(ALLOW), serialize)),
    await t('observe: classify + metrics.decision + hrtime', () => {
      const start = process.hrtime.bigint();
      metrics.decision(classify(inputA.method, inputA.path), ALLOW, Number(process.hrtime.bigint() - start) / 1e9);
    }),
    await t('metrics.decision alone', () => metrics.decision('read', ALLOW, 0.0001)),
    await t('encodeDecision of a 451 (cached parts, request id spliced in)', () => encodeDecision(pipeline.geoDenial, serialize, REQUEST_ID)),
    await t('toCheckResponse + serialize of the same 451 (what the splice replaces)', () => serialize(toCheckResponse(pipeline.geoDenial, REQUEST_ID))),
    await t('decision log line (LOG_DECISIONS=all on an allow): decisionLine + pino, to a null stream', () => {
      logger.info(decisionLine(inputA, ALLOW, 'read', 0.00004), DECISION_MSG);
    }, 'serialization only; writing the line to stdout costs more (docs/operations.md "Decision log")'),
    await t('ingest: headers + window + HMAC-SHA256', () => checkIngestSignature(inputB, pipeline.ingest, nowSecs)),
    await t('ingest: parseIngestBody (JSON + strict base64)', () => parseIngestBody(body)),
    await t('ingest: SHA-256 + Ed25519 verify', () => verifyEnvelopeSignature(document, signature, pipeline.ingest.feedKeys)),
    await t('ingest: checkDocument (UTF-8 + JSON + ajv schema)', () => checkDocument(document, conditionId)),
    await t('order: orderStage (JSON + checks + market hit)', () => orderStage(inputC.body, pipeline.order)),
    ...alternating,
  ];

  log('in-process: Redis nonce write (SET NX EX), 64 in flight');
  const redis = createRedis(inp.redisUrl);
  await new Promise<void>((resolve, reject) => {
    redis.once('ready', () => resolve());
    redis.once('error', reject);
  });
  const store = new RedisNonceStore(redis);
  const prefix = `bench${process.pid.toString(16)}${Date.now().toString(16)}`;
  await cpuPerCall((i) => store.recordIfAbsent(`${prefix}w${i}`, 30), { ms: 300, concurrency: 64 });
  const rs = await cpuPerCall((i) => store.recordIfAbsent(`${prefix}m${i}`, 30), { ms: 1000, concurrency: 64 });
  redis.disconnect();
  parts.push({ name: 'ingest: RedisNonceStore.recordIfAbsent, client CPU', us: rs.cpuUs, note: 'ioredis, auto-pipelined, 64 in flight; CPU, not wall' });

  return {
    decision: {
      a: { name: '(a) geo-only GET', us: a.usPerCall },
      b: { name: '(b) signed ingest', us: b.usPerCall, note: 'nonce store in memory; the Redis write is listed below' },
      c: { name: '(c) order', us: c.usPerCall },
    },
    parts,
  };
}
