/**
 * Stack (2)'s authz: the transport floor. An allow-all ext_authz Check (standard proto-loader
 * service, full decode) and a minimal ext_proc that swaps the order JSON for its decoded
 * payload (no validation) — the least any processor could do on Envoy's ext_proc wire.
 */
import * as grpc from '@grpc/grpc-js';
import { loadPackageDefinition, SERVICE_NAMES } from '../proto/index.ts';
import { serveParent } from './lib/serve-parent.ts';

const pd = loadPackageDefinition();
const OK = { status: { code: 0 }, ok_response: {} };
const server = new grpc.Server({ 'grpc.max_receive_message_length': 16 * 1024 * 1024, 'grpc.keepalive_permit_without_calls': 1 });
// Same HTTP/2 reset limits as the authz server (see authz/src/grpc/server.ts), for a fair floor.
Object.assign((server as unknown as { commonServerOptions: object }).commonServerOptions, { streamResetBurst: 1_000_000, streamResetRate: 1_000_000 });
server.addService(pd[SERVICE_NAMES.authorization] as grpc.ServiceDefinition, {
  Check(_call: grpc.ServerUnaryCall<object, object>, cb: grpc.sendUnaryData<object>) {
    cb(null, OK);
  },
});
const hdr = (key: string, value: string) => ({ header: { key, raw_value: Buffer.from(value) }, append_action: 'OVERWRITE_IF_EXISTS_OR_ADD' });
server.addService(pd[SERVICE_NAMES.externalProcessor] as grpc.ServiceDefinition, {
  Process(call: grpc.ServerDuplexStream<Record<string, { body?: Buffer }>, object>) {
    call.on('data', (m) => {
      if (m['request_headers'] !== undefined) call.write({ request_headers: { response: {} } });
      else if (m['request_body'] !== undefined) {
        const bytes = Buffer.from((JSON.parse(String(m['request_body'].body)) as { payload: string }).payload, 'base64');
        call.write({ request_body: { response: { status: 'CONTINUE', header_mutation: { set_headers: [hdr('content-length', String(bytes.length)), hdr('content-type', 'application/octet-stream')] }, body_mutation: { body: bytes } } } });
      }
    });
    call.on('end', () => call.end());
  },
});
const port = await new Promise<number>((resolve, reject) => {
  server.bindAsync('127.0.0.1:0', grpc.ServerCredentials.createInsecure(), (err, p) => (err ? reject(err) : resolve(p)));
});
serveParent(port, {}, () => new Promise<void>((resolve) => server.tryShutdown(() => resolve())));
