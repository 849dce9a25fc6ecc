"""The client-matrix scenario (cri_scenario.py) with Python's grpcio (gRPC C-core) and its generated stubs.

--authority default: the channel's default options on target unix:PATH; C-core (>= 1.57) then sends
    the percent-encoded socket path as :authority.
--authority raw: option grpc.default_authority = the socket path, so :authority is the raw path,
    as crictl 1.26 and grpc-go-era kubelets send it.

Run with PYTHONPATH=<setup dir>/gen, by <setup dir>/venv/bin/python (tests/clients/setup.sh).
"""

import importlib
import threading

import grpc

import cri_scenario
from cri_scenario import DEADLINE, CallError


def call_error(e):
    """The CallError of a failed grpcio call."""
    return CallError(e.code().name, e.details() or "")


class GrpcioWatch(cri_scenario.Watch):
    """A server-streaming call read by a thread."""

    def __init__(self, call):
        super().__init__()
        self._call = call
        self._cancelled = False
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self):
        try:
            for event in self._call:
                self._add(event)
        except grpc.RpcError as e:
            if not self._cancelled:
                self._fail(call_error(e))

    def cancel(self):
        self._cancelled = True
        self._call.cancel()
        self._thread.join(5)


class GrpcioTransport:
    """Calls through the generated RuntimeServiceStub on one channel."""

    def __init__(self, args):
        options = [("grpc.default_authority", args.socket)] if args.authority == "raw" else []
        self._channel = grpc.insecure_channel(f"unix:{args.socket}", options=options)
        self._stub = importlib.import_module(f"{args.api}_pb2_grpc").RuntimeServiceStub(self._channel)

    def unary(self, method, request, _response_class):
        try:
            return getattr(self._stub, method)(request, timeout=DEADLINE)
        except grpc.RpcError as e:
            raise call_error(e) from None

    def watch(self, method, request, _response_class):
        return GrpcioWatch(getattr(self._stub, method)(request))

    def close(self):
        self._channel.close()


def add_args(p):
    p.add_argument("--authority", choices=["default", "raw"], default="default",
                   help="default channel options, or grpc.default_authority = the socket path")


if __name__ == "__main__":
    cri_scenario.main(lambda args: f"grpcio-{args.authority}-authority", GrpcioTransport, add_args)
