"""A runtime hook server (runtime.v1alpha1.RuntimeHookService) written with Python's grpcio (gRPC
C-core) and the stubs grpc_tools.protoc generated from crates/hook-api/proto (tests/clients/setup.sh),
for tests/client_matrix.rs: a hook server we did not write the gRPC side of.

It answers sparsely, as third-party servers may (koordlet echoes the whole request instead):

* PreRunPodSandboxHook: the label `py-hook: yes`; a pod labelled `py-hook/quota: exhausted` is
  refused with PERMISSION_DENIED "quota 100% used" (the `%` is percent-encoded on the wire);
* PreCreateContainerHook: the env PY_HOOK=grpcio and PY_HOOK_POD_LABEL=<the pod's py-hook label as
  the request carries it>, the container annotation `py-hook/annotated: yes`, and the request's
  container resources with cpu_shares = 333;
* every other stage: an empty answer (no change).

Every call is appended to --record as one JSON line: the stage, the pod name, the seconds the
call had left when the handler ran (grpcio's context.time_remaining(), derived from the
`grpc-timeout` the caller sent; null without one), and for container stages the names of the
container's envs and annotations the request carried (sorted).

Run with PYTHONPATH=<setup dir>/gen, by <setup dir>/venv/bin/python:

    hook_server.py --socket PATH --record FILE
"""

import argparse
import json
import signal
import threading
from concurrent import futures

import grpc

from runtime.v1alpha1 import api_pb2, api_pb2_grpc

DENY_LABEL = ("py-hook/quota", "exhausted")
# More seconds left than this means the caller sent no grpc-timeout.
NO_DEADLINE = 1e9


class Recorder:
    """Appends one JSON line per call to a file, one writer at a time."""

    def __init__(self, path):
        self._path = path
        self._lock = threading.Lock()

    def add(self, stage, pod_meta, context, request=None):
        remaining = context.time_remaining()
        if remaining is not None and remaining > NO_DEADLINE:
            remaining = None  # C-core reports an infinite deadline as ~9.2e18 s
        record = {"stage": stage, "pod": pod_meta.name, "time_remaining": remaining}
        if request is not None:
            record["envs"] = sorted(request.container_envs)
            record["annotations"] = sorted(request.container_annotations)
            record["pod_annotations"] = sorted(request.pod_annotations)
        line = json.dumps(record)
        with self._lock, open(self._path, "a", encoding="utf-8") as f:
            f.write(line + "\n")


class HookServer(api_pb2_grpc.RuntimeHookServiceServicer):
    def __init__(self, recorder):
        self._record = recorder.add

    def PreRunPodSandboxHook(self, request, context):
        self._record("PreRunPodSandbox", request.pod_meta, context)
        if request.labels.get(DENY_LABEL[0]) == DENY_LABEL[1]:
            context.abort(grpc.StatusCode.PERMISSION_DENIED, "quota 100% used")
        return api_pb2.PodSandboxHookResponse(labels={"py-hook": "yes"})

    def PostStopPodSandboxHook(self, request, context):
        self._record("PostStopPodSandbox", request.pod_meta, context)
        return api_pb2.PodSandboxHookResponse()

    def PreCreateContainerHook(self, request, context):
        self._record("PreCreateContainer", request.pod_meta, context, request)
        resources = api_pb2.LinuxContainerResources()
        resources.CopyFrom(request.container_resources)
        resources.cpu_shares = 333
        return api_pb2.ContainerResourceHookResponse(
            container_envs={"PY_HOOK": "grpcio", "PY_HOOK_POD_LABEL": request.pod_labels.get("py-hook", "")},
            container_annotations={"py-hook/annotated": "yes"},
            container_resources=resources,
        )

    def _unchanged(self, stage, request, context):
        self._record(stage, request.pod_meta, context, request)
        return api_pb2.ContainerResourceHookResponse()

    def PreStartContainerHook(self, request, context):
        return self._unchanged("PreStartContainer", request, context)

    def PostStartContainerHook(self, request, context):
        return self._unchanged("PostStartContainer", request, context)

    def PostStopContainerHook(self, request, context):
        return self._unchanged("PostStopContainer", request, context)

    def PreUpdateContainerResourcesHook(self, request, context):
        return self._unchanged("PreUpdateContainerResources", request, context)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--socket", required=True, help="unix socket path to serve on")
    p.add_argument("--record", required=True, help="file to append one JSON line per call to")
    args = p.parse_args()

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    api_pb2_grpc.add_RuntimeHookServiceServicer_to_server(HookServer(Recorder(args.record)), server)
    if server.add_insecure_port(f"unix:{args.socket}") == 0:
        raise SystemExit(f"cannot listen on unix:{args.socket}")
    server.start()
    print(f"listening on unix:{args.socket}", flush=True)
    signal.signal(signal.SIGTERM, lambda *_: server.stop(0))
    server.wait_for_termination()


if __name__ == "__main__":
    main()
