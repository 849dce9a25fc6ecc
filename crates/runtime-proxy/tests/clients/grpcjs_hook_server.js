#!/usr/bin/env node
// A runtime hook server (runtime.v1alpha1.RuntimeHookService) written with Node's @grpc/grpc-js
// (its HTTP/2 is Node's own, nghttp2), the proto loaded at run time by @grpc/proto-loader from
// crates/hook-api/proto: a hook server whose gRPC side we did not write, for
// tests/client_matrix.rs.
//
// It answers sparsely, as third-party servers may:
//   PreCreateContainerHook: the env JS_HOOK=grpc-js and the request's container resources with
//     cpu_shares = 444;
//   every other stage: an empty answer (no change).
// It prints one line per call: `call <Method> <pod name>`.
//
//   grpcjs_hook_server.js --socket PATH
//
// Run with NODE_PATH=<setup dir>/node/node_modules (tests/clients/setup.sh).
'use strict';

const path = require('path');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

const args = process.argv.slice(2);
const at = args.indexOf('--socket');
if (at < 0 || args[at + 1] === undefined) {
  process.stderr.write('grpcjs_hook_server.js: --socket PATH is required\n');
  process.exit(2);
}
const socket = args[at + 1];

const protoDir = path.join(__dirname, '..', '..', '..', 'hook-api', 'proto');
const definition = protoLoader.loadSync(path.join(protoDir, 'runtime', 'v1alpha1', 'api.proto'), {
  includeDirs: [protoDir],
  keepCase: true,
  longs: Number,
  defaults: true,
});
const api = grpc.loadPackageDefinition(definition).runtime.v1alpha1;

function logged(method, answer) {
  return (call, callback) => {
    const pod = call.request.pod_meta ? call.request.pod_meta.name : '';
    process.stdout.write(`call ${method} ${pod}\n`);
    callback(null, answer(call.request));
  };
}

const service = {};
for (const method of Object.keys(api.RuntimeHookService.service)) {
  service[method] = logged(method, () => ({}));
}
service.PreCreateContainerHook = logged('PreCreateContainerHook', (req) => ({
  container_envs: { JS_HOOK: 'grpc-js' },
  container_resources: Object.assign({}, req.container_resources, { cpu_shares: 444 }),
}));

const server = new grpc.Server();
server.addService(api.RuntimeHookService.service, service);
server.bindAsync(`unix:${socket}`, grpc.ServerCredentials.createInsecure(), (err) => {
  if (err) {
    process.stderr.write(`grpcjs_hook_server.js: cannot listen on ${socket}: ${err.message}\n`);
    process.exit(1);
  }
  process.stdout.write(`listening on ${socket}\n`);
});
for (const signal of ['SIGTERM', 'SIGINT']) {
  process.on(signal, () => server.tryShutdown(() => process.exit(0)));
}
