"""A runtime-hooks hook call from Python's grpcio (gRPC C-core), as a hook client we did not write
the gRPC side of: PreCreateContainerHook for the issue's BE pod, container "main", whose container
annotation io.kubernetes.container.preStopHandler holds a handler of N `<` characters, each
JSON-escaped to six bytes (as kubelet copies it), so the request is about 6 N bytes.

Prints one JSON line: the request's size and the answer's cpu_shares, cpu_period, cpu_quota,
memory_limit_in_bytes and the number of container annotations it carries; on a gRPC error, the
code and details instead.

Run with PYTHONPATH=<setup dir>/gen (crates/runtime-proxy/tests/clients/setup.sh), by
<setup dir>/venv/bin/python:

    big_hook_request.py --socket PATH --n 1000000
"""

import argparse
import json

import grpc

from runtime.v1alpha1 import api_pb2, api_pb2_grpc

SPEC = ('{"containers": {"main": {"requests": {"kubernetes.io/batch-cpu": "500"}, '
        '"limits": {"kubernetes.io/batch-cpu": "1000", "kubernetes.io/batch-memory": "128Mi"}}}}')


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--socket", required=True)
    p.add_argument("--n", type=int, required=True)
    a = p.parse_args()
    handler = '{"exec":{"command":["sh","-c","%s"]}}' % ("\\u003c" * a.n)
    req = api_pb2.ContainerResourceHookRequest(
        pod_meta=api_pb2.PodSandboxMetadata(name="big", namespace="default", uid="uid-big"),
        container_meta=api_pb2.ContainerMetadata(name="main"),
        pod_labels={"koordinator.sh/qosClass": "BE"},
        pod_annotations={"node.koordinator.sh/extended-resource-spec": SPEC},
        pod_cgroup_parent="/kubepods/besteffort/poduid-big",
        container_annotations={"io.kubernetes.container.preStopHandler": handler},
        container_resources=api_pb2.LinuxContainerResources(cpu_shares=2, cpu_period=100000),
    )
    limit = 64 << 20
    opts = [("grpc.max_send_message_length", limit), ("grpc.max_receive_message_length", limit)]
    with grpc.insecure_channel("unix://" + a.socket, options=opts) as ch:
        stub = api_pb2_grpc.RuntimeHookServiceStub(ch)
        try:
            r = stub.PreCreateContainerHook(req, timeout=30)
        except grpc.RpcError as e:
            print(json.dumps({"code": e.code().name, "details": e.details()}))
            return
        res = r.container_resources
        print(json.dumps({
            "request_bytes": req.ByteSize(),
            "cpu_shares": res.cpu_shares,
            "cpu_period": res.cpu_period,
            "cpu_quota": res.cpu_quota,
            "memory_limit_in_bytes": res.memory_limit_in_bytes,
            "annotations": len(r.container_annotations),
        }))


if __name__ == "__main__":
    main()
