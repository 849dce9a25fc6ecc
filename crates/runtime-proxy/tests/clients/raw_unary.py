"""One unary gRPC call of any method with Python's grpcio (gRPC C-core), the request and the answer
as raw message bytes (no generated stubs): for methods newer than the clients' protos
(RestorePod, Kubernetes 1.37).

Usage: raw_unary.py --socket PATH --method /runtime.v1.RuntimeService/RestorePod --request HEX
Prints one JSON object: {"code": "OK" or the status code's name, "details": the status message,
"response": the answer's bytes in hex, or null}.

Run by <setup dir>/venv/bin/python (tests/clients/setup.sh).
"""

import argparse
import json

import grpc


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--socket", required=True)
    p.add_argument("--method", required=True)
    p.add_argument("--request", required=True, help="the request message, hex")
    args = p.parse_args()
    with grpc.insecure_channel(f"unix:{args.socket}") as channel:
        # No serializers: grpcio sends and returns the bytes as they are.
        call = channel.unary_unary(args.method)
        try:
            response = call(bytes.fromhex(args.request), timeout=30)
            result = {"code": "OK", "details": "", "response": response.hex()}
        except grpc.RpcError as e:
            result = {"code": e.code().name, "details": e.details() or "", "response": None}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
