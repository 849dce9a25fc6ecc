#!/usr/bin/env node
// The client-matrix scenario with Node's @grpc/grpc-js, the protos loaded at run time by
// @grpc/proto-loader from proto/ next to this file; target unix:PATH.
//
// The same scenario, arguments and JSON result as cri_scenario.py (its docstring has the details):
//   --socket PATH --image IMG --cgroup-parent PARENT --log-dir DIR --name UNIQUE
//   [--api v1|v1alpha2] [--events] [--annotation k=v ...] [--keep]
//
// Run with NODE_PATH=<setup dir>/node/node_modules (tests/clients/setup.sh).
'use strict';

const fs = require('fs');
const path = require('path');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

const DEADLINE_MS = 30000;
const EVENTS_WAIT_MS = 10000;
const MISSING_ID = 'no-such-container-id';

function usage(message) {
  process.stderr.write(`grpcjs_client.js: ${message}\n`);
  process.exit(2);
}

function parseArgs(argv) {
  const args = { api: 'v1', events: false, keep: false, annotation: [] };
  const valued = { '--socket': 'socket', '--image': 'image', '--cgroup-parent': 'cgroupParent', '--log-dir': 'logDir', '--name': 'name', '--api': 'api' };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    if (a === '--events') args.events = true;
    else if (a === '--keep') args.keep = true;
    else if (a === '--annotation') {
      const kv = argv[++i];
      if (kv === undefined || !kv.includes('=')) usage(`--annotation ${kv}: not K=V`);
      args.annotation.push(kv);
    } else if (valued[a]) {
      if (argv[i + 1] === undefined) usage(`${a} needs a value`);
      args[valued[a]] = argv[++i];
    } else usage(`unknown argument ${a}`);
  }
  for (const [flag, key] of Object.entries(valued)) if (args[key] === undefined) usage(`${flag} is required`);
  if (!['v1', 'v1alpha2'].includes(args.api)) usage(`--api ${args.api}: v1 or v1alpha2`);
  if (args.events && (args.api !== 'v1' || args.keep)) usage('--events needs --api v1 and no --keep');
  return args;
}

// A failed call as {code: 'NOT_FOUND', message}.
class CallError extends Error {
  constructor(code, message) {
    super(`${code} ${message}`);
    this.code = code;
    this.details = message;
  }
}

function callError(e) {
  return new CallError(grpc.status[e.code] ?? String(e.code), e.details ?? e.message);
}

async function main() {
  const args = parseArgs(process.argv.slice(2));
  const definition = protoLoader.loadSync(path.join(__dirname, 'proto', `${args.api}.proto`), {
    keepCase: true, longs: String, enums: String, defaults: true, oneofs: true,
  });
  const Service = grpc.loadPackageDefinition(definition).runtime[args.api].RuntimeService;
  const client = new Service(`unix:${args.socket}`, grpc.credentials.createInsecure());
  const unary = (method, request) => new Promise((resolve, reject) => {
    client[method](request, { deadline: Date.now() + DEADLINE_MS }, (e, response) => (e ? reject(callError(e)) : resolve(response)));
  });

  const result = {
    client: 'grpc-js', api: args.api, version: null, sandbox_id: null, container_id: null,
    container_state: null, exec: null, not_found: null, events: null,
  };
  let step = 'Version';
  let watch = null;
  try {
    const v = await unary('Version', { version: args.api });
    result.version = { version: v.version, runtime_name: v.runtime_name, runtime_version: v.runtime_version, runtime_api_version: v.runtime_api_version };

    if (args.events) {
      step = 'GetContainerEvents';
      const call = client.GetContainerEvents({});
      watch = { call, seen: [], error: null, cancelled: false };
      call.on('data', (event) => watch.seen.push([event.container_id, event.container_event_type]));
      call.on('error', (e) => { if (!watch.cancelled) watch.error = callError(e); });
      call.on('end', () => { if (!watch.cancelled && !watch.error) watch.error = new CallError('OK', 'the event stream ended'); });
    }

    step = 'RunPodSandbox';
    fs.mkdirSync(args.logDir, { recursive: true });
    const config = {
      metadata: { name: args.name, uid: args.name, namespace: 'default', attempt: 0 },
      log_directory: args.logDir,
      labels: { 'client-matrix': '1' },
      annotations: Object.fromEntries(args.annotation.map((kv) => [kv.slice(0, kv.indexOf('=')), kv.slice(kv.indexOf('=') + 1)])),
      linux: {
        cgroup_parent: `${args.cgroupParent}/pod${args.name}`,
        security_context: { namespace_options: { network: 'NODE' } },
      },
    };
    result.sandbox_id = (await unary('RunPodSandbox', { config })).pod_sandbox_id;

    step = 'CreateContainer';
    const container = {
      metadata: { name: 'main' },
      image: { image: args.image },
      command: ['sleep', '3600'],
      envs: [{ key: 'GREETING', value: 'hello' }],
      log_path: 'main.log',
      linux: { resources: { cpu_shares: 512 } },
    };
    const containerId = (await unary('CreateContainer', { pod_sandbox_id: result.sandbox_id, config: container, sandbox_config: config })).container_id;
    result.container_id = containerId;

    step = 'StartContainer';
    await unary('StartContainer', { container_id: containerId });
    step = 'ContainerStatus';
    result.container_state = (await unary('ContainerStatus', { container_id: containerId })).status.state;

    step = 'ExecSync';
    const out = await unary('ExecSync', { container_id: containerId, cmd: ['sh', '-c', 'echo $GREETING; echo ${HOOKED_BY:-none}'], timeout: 10 });
    result.exec = { exit_code: out.exit_code, stdout: Buffer.from(out.stdout).toString('utf8') };

    step = 'ContainerStatus (missing)';
    const missing = await unary('ContainerStatus', { container_id: MISSING_ID }).then(() => null, (e) => e);
    if (!missing) throw new CallError('OK', `ContainerStatus of ${MISSING_ID} succeeded`);
    result.not_found = { code: missing.code, message: missing.details };

    if (!args.keep) {
      step = 'StopContainer';
      await unary('StopContainer', { container_id: containerId, timeout: 0 });
      step = 'RemoveContainer';
      await unary('RemoveContainer', { container_id: containerId });
      step = 'StopPodSandbox';
      await unary('StopPodSandbox', { pod_sandbox_id: result.sandbox_id });
      step = 'RemovePodSandbox';
      await unary('RemovePodSandbox', { pod_sandbox_id: result.sandbox_id });
    }

    if (watch) {
      step = 'GetContainerEvents';
      const end = Date.now() + EVENTS_WAIT_MS;
      const deleted = () => watch.seen.some(([id, type]) => id === containerId && type === 'CONTAINER_DELETED_EVENT');
      while (Date.now() < end && !watch.error && !deleted()) await new Promise((r) => setTimeout(r, 50));
      if (watch.error) throw watch.error;
      result.events = watch.seen.filter(([id]) => id === containerId).map(([, type]) => type);
    }
  } catch (e) {
    if (!(e instanceof CallError)) throw e;
    result.error = `${step}: ${e.message}`;
    if (result.sandbox_id) {
      await unary('StopPodSandbox', { pod_sandbox_id: result.sandbox_id }).catch(() => {});
      await unary('RemovePodSandbox', { pod_sandbox_id: result.sandbox_id }).catch(() => {});
    }
  } finally {
    if (watch) {
      watch.cancelled = true;
      watch.call.cancel();
    }
    client.close();
  }
  process.stdout.write(`${JSON.stringify(result)}\n`);
  process.exitCode = result.error ? 1 : 0;
}

main().catch((e) => {
  process.stderr.write(`grpcjs_client.js: ${e.stack || e}\n`);
  process.exit(1);
});
