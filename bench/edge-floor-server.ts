/**
 * Stack (2)'s authz: the transport floor. An allow-all ext_authz Check (standard proto-loader
 * service, full decode of every CheckRequest). For an order it also hands the envelope's
 * payload to the order-body Lua filter as dynamic metadata (JSON.parse, no validation): the
 * least any Check could do for the same filter chain to deliver the order.
 */
import * as grpc from '@grpc/grpc-js';
import { loadPackageDefinition, SERVICE_NAMES } from '../proto/index.ts';
import { ALLOW } from '../authz/src/authz/decision.ts';
import { toCheckResponse } from '../authz/src/authz/codec/response.ts';
import { ORDER_PAYLOAD_METADATA_KEY } from '../authz/src/common/contract.ts';
import { serveParent } from './lib/serve-parent.ts';

interface Req { attributes?: { request?: { http?: { path?: string; raw_body?: Buffer } } } }

const pd = loadPackageDefinition();
const OK = { status: { code: 0 }, ok_response: {} };
const server = new grpc.Server({ 'grpc.max_receive_message_length': 16 * 1024 * 1024, 'grpc.keepalive_permit_without_calls': 1 });
// Same HTTP/2 reset limits as the authz server (see authz/src/authz/grpc-server.ts), for a fair floor.
Object.assign((server as unknown as { commonServerOptions: object }).commonServerOptions, { streamResetBurst: 1_000_000, streamResetRate: 1_000_000 });
server.addService(pd[SERVICE_NAMES.authorization] as grpc.ServiceDefinition, {
  Check(call: grpc.ServerUnaryCall<Req, object>, cb: grpc.sendUnaryData<object>) {
    const http = call.request.attributes?.request?.http;
    if (http?.path !== '/v1/orders' || http.raw_body === undefined) {
      cb(null, OK);
      return;
    }
    const { payload } = JSON.parse(String(http.raw_body)) as { payload: string };
    // The service's own CheckResponse mapping, so the metadata is encoded exactly as in production.
    cb(null, toCheckResponse({ ...ALLOW, metadata: { [ORDER_PAYLOAD_METADATA_KEY]: payload } }));
  },
});
const port = await new Promise<number>((resolve, reject) => {
  server.bindAsync('127.0.0.1:0', grpc.ServerCredentials.createInsecure(), (err, p) => (err ? reject(err) : resolve(p)));
});
serveParent(port, {}, () => new Promise<void>((resolve) => server.tryShutdown(() => resolve())));
