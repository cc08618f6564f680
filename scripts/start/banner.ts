/**
 * `npm start`'s banner: what it says once the stack is ready (or sealed): where each component
 * listens, what the edge answers this machine, and the commands to try it. Words only: nothing
 * here starts or stops anything.
 */
import { readFileSync } from 'node:fs';
import { get as httpsGet } from 'node:https';
import type { TLSSocket } from 'node:tls';
import { join, relative } from 'node:path';
import type { Config } from '../../authz/src/common/config.ts';
import { readSealFile, unsealHint } from '../../authz/src/common/seal-file.ts';
import { failure } from './probes.ts';
import type { StartEnv } from './preflight.ts';

/** What the banner is made of. */
export interface BannerInput {
  readonly config: Config;
  /** The environment the TS service was given (AUTHZ_ADMIN_TOKEN_FILE, GEOIP_DB). */
  readonly env: StartEnv;
  /** The run directory. */
  readonly run: string;
  /** AUTHZ_SEAL_FILE. */
  readonly sealFile: string;
  /** The development CA of the client port's certificate (DEV_EDGE_TLS=1), if npm start issued it. */
  readonly edgeCaFile: string | undefined;
  /** MARKET_SOCKET when the TS service's own GET /healthz is asked on it only. */
  readonly marketVia: string | undefined;
  /** How the banner names a file in the run directory. */
  readonly shown: (file: string) => string;
}

/** The edge's base URL: http://127.0.0.1:EDGE_PORT, or https://localhost:EDGE_PORT with TLS. */
export const edgeUrl = (config: Config): string =>
  (config.edgeTls === undefined ? `http://127.0.0.1:${config.edgePort}` : `https://localhost:${config.edgePort}`);

/** The banner of a sealed stack. */
export function sealedBanner(b: BannerInput): string {
  const { config, run: RUN, sealFile: SEAL_FILE, shown } = b;
  const edge = edgeUrl(config);
  /** How the banner names a file given by path (inside the run directory or not). */
  const shownPath = (file: string): string => shown(relative(RUN, file));
  const record = readSealFile(SEAL_FILE)?.record;
  return `SEALED  ${edge}/healthz → 503 sealed${record === undefined ? '' : ` (sealed ${record.sealedAt} by ${record.reason === 'admin' ? 'POST /admin/seal' : record.reason})`}
  ${shownPath(SEAL_FILE)} is present: the TS service started without loading any key, and every request is answered 503 sealed.
  ${unsealHint(SEAL_FILE)}
  Ctrl-C stops everything.`;
}

/** The banner of a ready stack; asks the edge GET /healthz as this machine. */
export async function readyBanner(b: BannerInput): Promise<string> {
  const { config, env, run: RUN, sealFile: SEAL_FILE, edgeCaFile, marketVia, shown } = b;
  const authzGrpcShown = config.authzGrpcSocket === undefined
    ? `127.0.0.1:${config.authzGrpcPort}   (.venv/bin/grpcurl -plaintext 127.0.0.1:${config.authzGrpcPort} list)`
    : `${config.authzGrpcSocket}${config.authzGrpcTcp ? ` and 127.0.0.1:${config.authzGrpcPort}` : ''}   (.venv/bin/grpcurl -plaintext -unix ${config.authzGrpcSocket} list)`;
  const marketShown = config.marketSocket === undefined ? `127.0.0.1:${config.marketPort}`
    : `${config.marketSocket}${config.marketTcp ? ` and 127.0.0.1:${config.marketPort}` : ''}   (curl --unix-socket ${config.marketSocket} http://market/healthz)`;
  const edge = edgeUrl(config);
  /** With TLS: the `curl --cacert <CA>` a client of the edge needs (the development CA, or "your CA"). */
  const cacert = config.edgeTls === undefined ? '' : `--cacert ${edgeCaFile === undefined ? '<the CA of EDGE_TLS_CERT_FILE>' : shown('pki/edge-ca.crt')} `;
  /** Where ingests go: the ingest listener (INGEST_PORT, reached on loopback when it binds every address), else Envoy's client port. */
  const ingestHost = ['0.0.0.0', '::'].includes(config.ingestBindAddress) ? '127.0.0.1' : config.ingestBindAddress;
  const ingestUrl = config.ingestPort === undefined ? edge : `http://${ingestHost.includes(':') ? `[${ingestHost}]` : ingestHost}:${config.ingestPort}`;
  /** What the edge answers this machine's GET /healthz (the whole path: Envoy, rate limit, geo, the TS service). */
  async function throughTheEdge(): Promise<string> {
    if (config.proxyProtocol === 'required') return 'not asked (EDGE_PROXY_PROTOCOL=required closes a connection without a PROXY header)';
    if (config.edgeTls !== undefined) {
      if (edgeCaFile === undefined) return `not asked (TLS with your certificate: curl ${cacert}${edge}/healthz)`;
      const ca = readFileSync(edgeCaFile);
      return new Promise((resolve) => {
        const req = httpsGet(`${edge}/healthz`, { ca, timeout: 2000 }, (res) => {
          res.resume();
          resolve(`${res.statusCode ?? 0} over ${(res.socket as TLSSocket).getProtocol() ?? 'TLS'}`);
        });
        req.on('timeout', () => req.destroy(new Error('no answer within 2 s')));
        req.on('error', (err) => resolve(failure(err)));
      });
    }
    try {
      const res = await fetch(`${edge}/healthz`, { signal: AbortSignal.timeout(2000) });
      const text = await res.text();
      if (res.status === 200) return '200';
      let code = '';
      try {
        code = (JSON.parse(text) as { error?: string }).error ?? '';
      } catch { /* not JSON */ }
      const why = res.status === 451 ? ' (geo judges 127.0.0.1 like any client: it is not in GEO_TRUSTED_CIDRS)' : '';
      return `${res.status}${code === '' ? '' : ` ${code}`}${why}`;
    } catch (err) {
      return failure(err);
    }
  }
  /** How the banner names a file given by path (inside the run directory or not). */
  const shownPath = (file: string): string => shown(relative(RUN, file));
  return `READY  the TS service GET ${marketVia === undefined ? `127.0.0.1:${config.marketPort}/healthz` : `/healthz over ${marketVia}`} → 200, Envoy admin GET /ready → 200
  this machine  GET ${edge}/healthz → ${await throughTheEdge()}
  clients       ${edge}   ${config.edgeTls === undefined ? '' : `(TLS: curl ${cacert}${edge}/healthz) `}(Envoy; per-IP rate limit ${config.rpsPerIp}/s burst ${config.rateBurst}, ${config.rateLimitScope === 'global' ? 'global: across replicas, in Redis' : 'local: per Envoy'})
  ingest        ${config.ingestPort === undefined ? `${edge}/internal/ingest/market   (the client port: INGEST_PORT unset)` : `${ingestUrl}/internal/ingest/market   (its own listener, INGEST_PORT on ${config.ingestBindAddress}; the client port answers that path 404)`}
  authz gRPC    ${authzGrpcShown}
  market        ${marketShown}
  metrics       http://127.0.0.1:${config.authzAdminPort}/metrics
  seal          curl -X POST -H "authorization: Bearer $(cat ${shownPath(env['AUTHZ_ADMIN_TOKEN_FILE'] ?? '')})" http://127.0.0.1:${config.authzAdminPort}/admin/seal
                (kept in ${shownPath(SEAL_FILE)}: restarts stay sealed until it is removed; docs/operations.md "Seal and unseal")
  envoy admin   http://127.0.0.1:${config.envoyAdminPort}${config.envoyStatsPort === undefined ? '' : `\n  envoy stats   http://127.0.0.1:${config.envoyStatsPort}/stats/prometheus   (ENVOY_STATS_PORT, all interfaces: that path only)`}
  geoip         ${env['GEOIP_DB'] === join(RUN, 'geoip', 'country.mmdb') ? `${shown('geoip/country.mmdb')} (replace it by rename: docs/operations.md)` : config.geoipDb}
  try it:
    set -a; . ${shown('dev.env')}; set +a
    ${config.ingestPort !== undefined ? `scripts/node scripts/edge-client.ts demo-ingest 0xdemo --url ${ingestUrl}` : config.edgeTls === undefined ? `EDGE_PORT=${config.edgePort} scripts/node scripts/edge-client.ts demo-ingest 0xdemo` : `NODE_EXTRA_CA_CERTS=${edgeCaFile === undefined ? '<the CA of EDGE_TLS_CERT_FILE>' : shown('pki/edge-ca.crt')} scripts/node scripts/edge-client.ts demo-ingest 0xdemo --url ${edge}`}
    curl -s ${cacert}${edge}/v1/markets | head -c 300; echo
    head -c 64 /dev/urandom > ${shown('order.bin')}
    ${config.edgeTls === undefined ? `EDGE_PORT=${config.edgePort} scripts/node scripts/edge-client.ts order 0xdemo 10 ${shown('order.bin')}` : `NODE_EXTRA_CA_CERTS=${edgeCaFile === undefined ? '<the CA of EDGE_TLS_CERT_FILE>' : shown('pki/edge-ca.crt')} scripts/node scripts/edge-client.ts order 0xdemo 10 ${shown('order.bin')} --url ${edge}`}
  A TS service, Redis or demo backend that exits is restarted; Ctrl-C seals and stops everything.`;
}
