/**
 * The market HTTP service as the benchmarks run it: `createMarketService` over a given store,
 * logging nothing, on a free loopback port. And a market put into a store the normal way: its
 * signed ingest body POSTed to that service, whose write path verifies the envelope and the
 * document and calls `store.put` (the HMAC and nonce are Envoy's and the authz Check's business).
 */
import type { KeyObject } from 'node:crypto';
import { Writable } from 'node:stream';
import { Registry } from 'prom-client';
import { createLogger } from '../../authz/src/common/log.ts';
import { createMarketService, type MarketService } from '../../authz/src/market/http.ts';
import type { MarketStore } from '../../authz/src/market/store.ts';

/** Starts the service over `store`; resolves with it and the port it listens on. */
export async function startMarketService(store: MarketStore, feedKeys: readonly KeyObject[]): Promise<{ service: MarketService; port: number }> {
  const service = createMarketService({
    store, feedKeys, ingestMaxBytes: 1 << 20,
    logger: createLogger('silent', new Writable({ write: (_c, _e, cb) => cb() })), registry: new Registry(),
    readiness: () => ({ store: store.ready() }), isSealed: () => false, host: '127.0.0.1', port: 0,
  });
  return { service, port: await service.listen() };
}

/** Ingests a signed ingest body (`{conditionId, d, s, k}`) into `store`; throws unless it is stored. */
export async function ingestInto(store: MarketStore, feedKeys: readonly KeyObject[], body: Buffer): Promise<void> {
  const { service, port } = await startMarketService(store, feedKeys);
  try {
    const res = await fetch(`http://127.0.0.1:${port}/internal/ingest/market`, {
      method: 'POST', body: new Uint8Array(body), headers: { 'content-type': 'application/json' },
    });
    if (res.status !== 200) throw new Error(`ingest into the market store: ${res.status} ${await res.text()}`);
  } finally {
    await service.close();
  }
}
