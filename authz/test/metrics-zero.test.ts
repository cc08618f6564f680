/**
 * The labelled series whose label values are known at start are exported at 0 before anything
 * happened (a dashboard tells "none yet" from "not exported"; `rate()` counts the first
 * increment), and every series the alerts select exists from the first scrape.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { Writable } from 'node:stream';
import { fileURLToPath } from 'node:url';
import { Registry } from 'prom-client';
import { createLogger } from '../src/common/log.ts';
import { createMarketService } from '../src/market/http.ts';
import { MemoryMarketStore } from '../src/market/store.ts';
import {
  createMetrics, DECISION_CODES, GEO_VERDICTS, GEOIP_RELOAD_RESULTS, MARKET_INGEST_OUTCOMES, MARKET_REQUEST_STATUSES, RATE_LIMIT_CODES, REDIS_OPS,
} from '../src/common/metrics.ts';
import { newFeedKey } from '../../testkit/feed.ts';

const logger = createLogger('silent', new Writable({ write: (_c, _e, cb) => cb() }));

/** `name{labels} value` lines of the exposition text, labels parsed. */
function series(text: string): { name: string; labels: Record<string, string>; value: number }[] {
  const out: { name: string; labels: Record<string, string>; value: number }[] = [];
  for (const line of text.split('\n')) {
    const m = /^([a-z_]+)\{(.*)\} (\S+)$/.exec(line);
    if (m === null) continue;
    const labels: Record<string, string> = {};
    for (const l of m[2]!.matchAll(/([a-z_]+)="((?:[^"\\]|\\.)*)"/g)) labels[l[1]!] = l[2]!;
    out.push({ name: m[1]!, labels, value: Number(m[3]) });
  }
  return out;
}

async function startScrape(): Promise<{ text: string; market: ReturnType<typeof createMarketService>; registry: Registry }> {
  const metrics = createMetrics({ geoipBuildEpochSecs: () => 0, defaultMetrics: false });
  const market = createMarketService({
    store: new MemoryMarketStore(), feedKeys: [newFeedKey().publicKey], ingestMaxBytes: 1_048_576, logger, registry: metrics.registry,
    readiness: () => ({ store: true }), isSealed: () => false, host: '127.0.0.1', port: 0,
  });
  return { text: await metrics.registry.metrics(), market, registry: metrics.registry };
}

test('metrics: every known (route, code), verdict, reload result, Redis op, market (route, status), ingest outcome and global rate limit answer is exported at 0 at start', async () => {
  const { text } = await startScrape();
  const all = series(text);
  const has = (name: string, labels: Record<string, string>): boolean =>
    all.some((s) => s.name === name && s.value === 0 && Object.entries(labels).every(([k, v]) => s.labels[k] === v));
  for (const [route, codes] of Object.entries(DECISION_CODES)) {
    for (const code of codes) {
      assert.ok(has('edge_authz_decisions_total', { route, outcome: code === 'ok' ? 'allow' : 'deny', code }), `decisions ${route} ${code}`);
    }
  }
  for (const verdict of GEO_VERDICTS) assert.ok(has('edge_geo_verdicts_total', { verdict }), verdict);
  for (const result of GEOIP_RELOAD_RESULTS) assert.ok(has('edge_geoip_reloads_total', { result }), result);
  for (const op of REDIS_OPS) assert.ok(has('edge_redis_errors_total', { op }), op);
  for (const [route, statuses] of Object.entries(MARKET_REQUEST_STATUSES)) {
    for (const status of statuses) assert.ok(has('edge_market_requests_total', { route, status: String(status) }), `${route} ${status}`);
  }
  for (const outcome of MARKET_INGEST_OUTCOMES) assert.ok(has('edge_market_ingest_total', { outcome }), outcome);
  for (const code of RATE_LIMIT_CODES) assert.ok(has('edge_ratelimit_decisions_total', { code }), `rate limit ${code}`);
  for (const name of ['edge_ratelimit_redis_errors_total', 'edge_ratelimit_late_total']) assert.match(text, new RegExp(`^${name} 0$`, 'm'), name);
  // Nothing but zeros: no decision was made, no request served.
  assert.deepEqual(all.filter((s) => s.value !== 0).map((s) => s.name), []);
});

test('metrics: every series an alert selects (deploy/prometheus/alerts.yaml) exists from the first scrape', async () => {
  const all = series((await startScrape()).text);
  const alerts = readFileSync(fileURLToPath(new URL('../../deploy/prometheus/alerts.yaml', import.meta.url)), 'utf8');
  const selectors = [...alerts.matchAll(/(edge_[a-z_]+_total)\{([^}]*)\}/g)];
  assert.ok(selectors.length >= 5, 'the alerts select labelled counters');
  for (const [selector, name, matchers] of selectors) {
    const tests = [...matchers!.matchAll(/([a-z_]+)(=~|=)"([^"]*)"/g)].map(([, label, op, value]) =>
      (labels: Record<string, string>): boolean => (op === '=' ? labels[label!] === value : new RegExp(`^(?:${value})$`).test(labels[label!] ?? '')));
    assert.ok(all.some((s) => s.name === name && tests.every((t) => t(s.labels))), `${selector} has a series at start`);
  }
});

test('metrics: the market service labels its answers with exactly the routes the table names (no series outside it for the usual answers)', async () => {
  const { market, registry } = await startScrape();
  const port = await market.listen();
  try {
    const before = series(await registry.metrics()).filter((s) => s.name === 'edge_market_requests_total').map((s) => JSON.stringify(s.labels)).sort();
    const base = `http://127.0.0.1:${port}`;
    for (const path of ['/', '/healthz', '/v1/markets', '/v1/quotes', '/v1/markets?limit=x', '/nowhere']) await (await fetch(`${base}${path}`)).arrayBuffer();
    await (await fetch(`${base}/internal/ingest/market`, { method: 'POST', body: '{' })).arrayBuffer();
    const after = series(await registry.metrics()).filter((s) => s.name === 'edge_market_requests_total');
    assert.deepEqual(after.map((s) => JSON.stringify(s.labels)).sort(), before, 'the answers counted into series that existed at start');
    assert.equal(after.reduce((n, s) => n + s.value, 0), 7);
  } finally {
    await market.close();
  }
});
