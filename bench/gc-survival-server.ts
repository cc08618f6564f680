/**
 * One server for bench/gc-survival.ts, chosen by MODE, so each transport's garbage can be
 * measured alone (the parent starts it with `--trace-gc --trace-gc-nvp`):
 * - `http1`:  node:http answering a small JSON body (the market service's transport).
 * - `h2`:     node:http2 answering a gRPC-shaped response (headers, 7 bytes, trailers): the
 *             HTTP/2 stream alone, no gRPC library.
 * - `grpc`:   the service's own ext_authz server (createGrpcServer: lean decode, cached
 *             response encodings), every Check allowed.
 */
import * as http from 'node:http';
import * as http2 from 'node:http2';
import { ALLOW } from '../authz/src/decision.ts';
import { createGrpcServer } from '../authz/src/grpc/server.ts';
import { frameGrpc } from './lib/grpc-wire.ts';
import { serveParent } from './lib/serve-parent.ts';

const mode = process.env['MODE'] ?? '';
/** A framed CheckResponse with an OK status (field 1, empty google.rpc.Status). */
const GRPC_OK = frameGrpc(Buffer.from([0x0a, 0x00]));
const JSON_BODY = Buffer.from('{"data":[{"conditionId":"0xbench","question":"bench?","active":true}],"next_cursor":"LTE="}');

function listen(server: http.Server | http2.Http2Server): Promise<number> {
  return new Promise((resolve) => server.listen(0, '127.0.0.1', () => resolve((server.address() as { port: number }).port)));
}

let port: number;
if (mode === 'http1') {
  port = await listen(http.createServer((_req, res) => {
    res.writeHead(200, { 'content-type': 'application/json', 'content-length': JSON_BODY.length });
    res.end(JSON_BODY);
  }));
} else if (mode === 'h2') {
  const server = http2.createServer();
  server.on('stream', (stream) => {
    stream.resume();
    stream.on('end', () => {
      stream.respond({ ':status': 200, 'content-type': 'application/grpc' }, { waitForTrailers: true });
      stream.once('wantTrailers', () => stream.sendTrailers({ 'grpc-status': '0' }));
      stream.end(GRPC_OK);
    });
  });
  port = await listen(server);
} else if (mode === 'grpc') {
  const grpc = createGrpcServer({ evaluate: () => ALLOW, observe: () => {}, onError: () => {} });
  port = await grpc.listen('127.0.0.1', 0);
} else {
  throw new Error(`unknown MODE ${mode}`);
}
// The parent brackets each run with a forced scavenge (needs --expose-gc), so the V8 GC lines in
// between account for exactly the run's allocations.
const gc = (globalThis as { gc?: (opts: { type: 'minor' }) => void }).gc;
serveParent(port, { minorGc: () => { gc?.({ type: 'minor' }); return gc !== undefined; } });
