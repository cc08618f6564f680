/**
 * The floor: the cheapest ext_authz Check server grpc-js allows without custom code on the
 * wire. Standard service definition from loadPackageDefinition (proto-loader's full decode
 * of every CheckRequest, PROTO_LOADER_OPTIONS), and an OK CheckResponse for every call.
 * Same server options as the authz server. Whatever the authz service costs above this is
 * the price of its decisions; what this costs is the transport and the framework.
 *
 * Started by bench/authz.ts through forkNode(); answers 'stats' with its call count.
 */
import * as grpc from '@grpc/grpc-js';
import { loadPackageDefinition, SERVICE_NAMES } from '../proto/index.ts';
import { serveParent } from './lib/serve-parent.ts';

const service = loadPackageDefinition()[SERVICE_NAMES.authorization] as grpc.ServiceDefinition;
const OK = { status: { code: 0 }, ok_response: {} };
let checks = 0;

const server = new grpc.Server({
  'grpc.max_receive_message_length': 16 * 1024 * 1024,
  'grpc.keepalive_permit_without_calls': 1,
});
server.addService(service, {
  Check(_call: grpc.ServerUnaryCall<object, object>, callback: grpc.sendUnaryData<object>) {
    checks++;
    callback(null, OK);
  },
});
const port = await new Promise<number>((resolve, reject) => {
  server.bindAsync('127.0.0.1:0', grpc.ServerCredentials.createInsecure(), (err, p) => (err ? reject(err) : resolve(p)));
});

serveParent(port, { stats: () => ({ checks }) }, () => new Promise<void>((resolve) => server.tryShutdown(() => resolve())));
