"""The client-matrix scenario, shared by the Python CRI clients (grpcio_client.py, h2_client.py).

tests/client_matrix.rs runs every client once directly on containerd and once through runtime-proxy
and compares what they print. A client supplies a transport (how a call goes on the wire); this
module parses the common arguments, runs the scenario over the transport and prints the one JSON
result. grpcjs_client.js is the same scenario in JavaScript.

Arguments: --socket PATH --image IMG --cgroup-parent PARENT --log-dir DIR --name UNIQUE
[--api v1|v1alpha2] [--events] [--annotation k=v ...] [--keep]

 1. Version;
 2. with --events, GetContainerEvents in the background;
 3. RunPodSandbox (host network, cgroup parent PARENT/podUNIQUE, uid UNIQUE);
 4. CreateContainer `sleep 3600` with GREETING=hello and cpu_shares 512;
 5. StartContainer, ContainerStatus;
 6. ExecSync `echo $GREETING; echo ${HOOKED_BY:-none}`;
 7. ContainerStatus of a container that does not exist (the error's code and message);
 8. StopContainer, RemoveContainer, StopPodSandbox, RemovePodSandbox (skipped with --keep: the
    pod stays for the caller to inspect and remove);
 9. with --events, the event types of our container until CONTAINER_DELETED_EVENT (10 s at most).

Prints {"client", "api", "version", "sandbox_id", "container_id", "container_state", "exec",
"not_found", "events"} and exits 0; when a step fails, the same object with "error":
"<step>: <CODE> <message>", after removing the sandbox (best effort), and exits 1.

Run with PYTHONPATH=<setup dir>/gen (the generated stubs: v1_pb2, v1alpha2_pb2, ...).
"""

import argparse
import importlib
import json
import os
import sys
import time

# Deadline of every unary call, in seconds.
DEADLINE = 30
# How long step 9 waits for CONTAINER_DELETED_EVENT, in seconds.
EVENTS_WAIT = 10
# The container ID of step 7.
MISSING_ID = "no-such-container-id"

# gRPC status codes by number (https://grpc.github.io/grpc/core/md_doc_statuscodes.html).
CODE_NAMES = [
    "OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
    "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED",
    "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED",
]


def code_name(code):
    """The name of gRPC status code number `code` (the number itself when unknown)."""
    return CODE_NAMES[code] if 0 <= code < len(CODE_NAMES) else str(code)


class CallError(Exception):
    """A call that ended with a gRPC status other than OK: `code` is its name, e.g. NOT_FOUND."""

    def __init__(self, code, message):
        super().__init__(f"{code} {message}")
        self.code = code
        self.message = message


def parse_args(extra=None):
    """The scenario's arguments; `extra(parser)` may add a client's own."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--socket", required=True, help="the CRI socket (containerd's or the proxy's)")
    p.add_argument("--image", required=True)
    p.add_argument("--cgroup-parent", required=True, help="pods go to PARENT/pod<NAME>")
    p.add_argument("--log-dir", required=True, help="the pod's log directory (created)")
    p.add_argument("--name", required=True, help="unique: the pod's name and uid")
    p.add_argument("--api", choices=["v1", "v1alpha2"], default="v1")
    p.add_argument("--events", action="store_true", help="watch GetContainerEvents (v1, containerd 1.7)")
    p.add_argument("--annotation", action="append", default=[], metavar="K=V", help="a pod annotation")
    p.add_argument("--keep", action="store_true", help="leave the pod running (no step 8, no events)")
    if extra:
        extra(p)
    args = p.parse_args()
    if args.events and (args.api != "v1" or args.keep):
        p.error("--events needs --api v1 and no --keep")
    for a in args.annotation:
        if "=" not in a:
            p.error(f"--annotation {a!r}: not K=V")
    return args


def run(args, client, transport):
    """Runs the scenario over `transport` and prints the result; returns the exit code.

    A transport has `unary(method, request, response_class)` (returns the response or raises
    CallError), `watch(method, request, response_class)` (returns a Watch) and `close()`.
    """
    pb = importlib.import_module(f"{args.api}_pb2")
    result = {
        "client": client, "api": args.api, "version": None, "sandbox_id": None, "container_id": None,
        "container_state": None, "exec": None, "not_found": None, "events": None,
    }
    step = "Version"
    watch = None
    try:
        v = transport.unary("Version", pb.VersionRequest(version=args.api), pb.VersionResponse)
        result["version"] = {
            "version": v.version, "runtime_name": v.runtime_name,
            "runtime_version": v.runtime_version, "runtime_api_version": v.runtime_api_version,
        }

        if args.events:
            step = "GetContainerEvents"
            watch = transport.watch("GetContainerEvents", pb.GetEventsRequest(), pb.ContainerEventResponse)

        step = "RunPodSandbox"
        os.makedirs(args.log_dir, exist_ok=True)
        config = pb.PodSandboxConfig(
            metadata=pb.PodSandboxMetadata(name=args.name, uid=args.name, namespace="default", attempt=0),
            log_directory=args.log_dir,
            labels={"client-matrix": "1"},
            annotations=dict(a.split("=", 1) for a in args.annotation),
            linux=pb.LinuxPodSandboxConfig(
                cgroup_parent=f"{args.cgroup_parent}/pod{args.name}",
                security_context=pb.LinuxSandboxSecurityContext(
                    namespace_options=pb.NamespaceOption(network=pb.NODE)),
            ),
        )
        sandbox_id = transport.unary(
            "RunPodSandbox", pb.RunPodSandboxRequest(config=config), pb.RunPodSandboxResponse).pod_sandbox_id
        result["sandbox_id"] = sandbox_id

        step = "CreateContainer"
        container = pb.ContainerConfig(
            metadata=pb.ContainerMetadata(name="main"),
            image=pb.ImageSpec(image=args.image),
            command=["sleep", "3600"],
            envs=[pb.KeyValue(key="GREETING", value="hello")],
            log_path="main.log",
            linux=pb.LinuxContainerConfig(resources=pb.LinuxContainerResources(cpu_shares=512)),
        )
        container_id = transport.unary(
            "CreateContainer",
            pb.CreateContainerRequest(pod_sandbox_id=sandbox_id, config=container, sandbox_config=config),
            pb.CreateContainerResponse,
        ).container_id
        result["container_id"] = container_id

        step = "StartContainer"
        transport.unary("StartContainer", pb.StartContainerRequest(container_id=container_id), pb.StartContainerResponse)
        step = "ContainerStatus"
        status = transport.unary(
            "ContainerStatus", pb.ContainerStatusRequest(container_id=container_id), pb.ContainerStatusResponse)
        result["container_state"] = pb.ContainerState.Name(status.status.state)

        step = "ExecSync"
        out = transport.unary(
            "ExecSync",
            pb.ExecSyncRequest(container_id=container_id, cmd=["sh", "-c", "echo $GREETING; echo ${HOOKED_BY:-none}"],
                               timeout=10),
            pb.ExecSyncResponse,
        )
        result["exec"] = {"exit_code": out.exit_code, "stdout": out.stdout.decode("utf-8", "replace")}

        step = "ContainerStatus (missing)"
        try:
            transport.unary("ContainerStatus", pb.ContainerStatusRequest(container_id=MISSING_ID), pb.ContainerStatusResponse)
            raise CallError("OK", f"ContainerStatus of {MISSING_ID} succeeded")
        except CallError as e:
            if e.code == "OK":
                raise
            result["not_found"] = {"code": e.code, "message": e.message}

        if not args.keep:
            step = "StopContainer"
            transport.unary("StopContainer", pb.StopContainerRequest(container_id=container_id, timeout=0),
                            pb.StopContainerResponse)
            step = "RemoveContainer"
            transport.unary("RemoveContainer", pb.RemoveContainerRequest(container_id=container_id),
                            pb.RemoveContainerResponse)
            step = "StopPodSandbox"
            transport.unary("StopPodSandbox", pb.StopPodSandboxRequest(pod_sandbox_id=sandbox_id),
                            pb.StopPodSandboxResponse)
            step = "RemovePodSandbox"
            transport.unary("RemovePodSandbox", pb.RemovePodSandboxRequest(pod_sandbox_id=sandbox_id),
                            pb.RemovePodSandboxResponse)

        if watch:
            step = "GetContainerEvents"
            deleted = pb.CONTAINER_DELETED_EVENT
            end = time.monotonic() + EVENTS_WAIT
            while time.monotonic() < end and watch.error is None and (container_id, deleted) not in watch.seen():
                time.sleep(0.05)
            watch.cancel()
            if watch.error:
                raise watch.error
            result["events"] = [pb.ContainerEventType.Name(t) for (cid, t) in watch.seen() if cid == container_id]
    except CallError as e:
        result["error"] = f"{step}: {e}"
        if result["sandbox_id"]:
            for method, request, response in [
                ("StopPodSandbox", pb.StopPodSandboxRequest(pod_sandbox_id=result["sandbox_id"]), pb.StopPodSandboxResponse),
                ("RemovePodSandbox", pb.RemovePodSandboxRequest(pod_sandbox_id=result["sandbox_id"]), pb.RemovePodSandboxResponse),
            ]:
                try:
                    transport.unary(method, request, response)
                except CallError:
                    pass
    finally:
        if watch:
            watch.cancel()
        transport.close()
    print(json.dumps(result, sort_keys=True))
    return 1 if "error" in result else 0


class Watch:
    """A server stream read in the background: `seen()` lists (container_id, event type) in order,
    `error` is the CallError it ended with (None while it runs or when cancelled), `cancel()` stops
    it. Transports subclass it, implementing `cancel`, and call `_add` and `_fail`."""

    def __init__(self):
        self._seen = []
        self.error = None

    def seen(self):
        return list(self._seen)

    def _add(self, event):
        self._seen.append((event.container_id, event.container_event_type))

    def _fail(self, error):
        self.error = error

    def cancel(self):
        raise NotImplementedError


def main(client, make_transport, extra=None):
    """Parses the arguments, makes the transport with `make_transport(args)` and runs the scenario."""
    args = parse_args(extra)
    sys.exit(run(args, client(args) if callable(client) else client, make_transport(args)))
