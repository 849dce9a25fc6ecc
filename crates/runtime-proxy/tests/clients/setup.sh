#!/usr/bin/env bash
# setup.sh DIR — installs the CRI clients of the client-matrix test (tests/client_matrix.rs) into DIR:
#
#   DIR/venv  a Python venv with requirements.txt (grpcio, grpcio-tools, protobuf, h2), pinned exactly;
#   DIR/gen   Python protobuf + gRPC stubs of proto/v1.proto and proto/v1alpha2.proto, and of the hook protocol
#             (crates/hook-api/proto/runtime/v1alpha1/api.proto, as the package runtime.v1alpha1.api_pb2*, for
#             hook_server.py) (grpc_tools.protoc);
#   DIR/node  `npm ci` of package.json + package-lock.json (@grpc/grpc-js, @grpc/proto-loader).
#
# proto/*.proto are verbatim copies of k8s-cri 0.11.0's proto/ (packages runtime.v1 and runtime.v1alpha2).
# That crate already dropped the gogo protobuf import and options, so protoc and proto-loader load them as
# they are; the check below fails if a future copy imports anything again.
#
# Idempotent: each part is redone only when its inputs changed (a hash in DIR/.stamp-*), under a lock,
# so parallel callers (the tests of two containerd versions, `cargo test` without scripts/test.sh) wait
# for one another. Needs python3 (3.11, with its venv module), node 20 and npm, and the PyPI and npm
# registries. Prints one summary line on success; on failure, the failing step's output, and exits 1.
set -euo pipefail

[ $# -eq 1 ] || { echo "usage: $0 DIR" >&2; exit 2; }
HERE=$(cd "$(dirname "$0")" && pwd)
HOOK_PROTO_DIR=$(cd "$HERE/../../../hook-api/proto" && pwd)
HOOK_PROTO=$HOOK_PROTO_DIR/runtime/v1alpha1/api.proto
mkdir -p "$1"
DIR=$(cd "$1" && pwd)
LOG=$DIR/setup.log

exec 9>"$DIR/.lock"
flock 9

fail() {
  echo "[setup.sh] $1 failed (in $DIR):" >&2
  [ ! -s "$LOG" ] || cat "$LOG" >&2
  exit 1
}

# run STEP CMD...: runs CMD with its output in $LOG; on failure shows it and exits.
run() {
  local step=$1
  shift
  "$@" >"$LOG" 2>&1 || fail "$step"
}

# fresh NAME FILE...: true when DIR/.stamp-NAME already holds the hash of FILE... (the part is up to date).
fresh() {
  local name=$1
  shift
  [ -f "$DIR/.stamp-$name" ] && [ "$(cat "$DIR/.stamp-$name")" = "$(cat "$@" | sha256sum)" ]
}
stamp() {
  local name=$1
  shift
  cat "$@" | sha256sum >"$DIR/.stamp-$name"
}

if grep -n '^[[:space:]]*import[[:space:]]' "$HERE"/proto/*.proto >"$LOG"; then
  fail "proto check (the copies must import nothing: strip the imports and their options)"
fi

# Python: venv + pinned packages.
if ! fresh venv "$HERE/requirements.txt" || [ ! -x "$DIR/venv/bin/python" ]; then
  rm -rf "$DIR/venv" "$DIR/.stamp-venv" "$DIR/.stamp-gen"
  run "python3 -m venv" python3 -m venv "$DIR/venv"
  run "pip install -r requirements.txt" "$DIR/venv/bin/python" -m pip install --disable-pip-version-check --no-input -q \
    -r "$HERE/requirements.txt"
  stamp venv "$HERE/requirements.txt"
fi

# Python stubs, generated from the protos with the pinned grpcio-tools.
if ! fresh gen "$HERE/requirements.txt" "$HERE"/proto/*.proto "$HOOK_PROTO" || [ ! -f "$DIR/gen/v1_pb2_grpc.py" ] ||
  [ ! -f "$DIR/gen/runtime/v1alpha1/api_pb2_grpc.py" ]; then
  rm -rf "$DIR/gen" "$DIR/.stamp-gen"
  mkdir -p "$DIR/gen"
  run "grpc_tools.protoc" "$DIR/venv/bin/python" -m grpc_tools.protoc -I"$HERE/proto" --python_out="$DIR/gen" \
    --grpc_python_out="$DIR/gen" "$HERE/proto/v1.proto" "$HERE/proto/v1alpha2.proto"
  run "grpc_tools.protoc (hook proto)" "$DIR/venv/bin/python" -m grpc_tools.protoc -I"$HOOK_PROTO_DIR" \
    --python_out="$DIR/gen" --grpc_python_out="$DIR/gen" "$HOOK_PROTO"
  stamp gen "$HERE/requirements.txt" "$HERE"/proto/*.proto "$HOOK_PROTO"
fi

# Node: the locked packages (no install scripts: protobufjs' postinstall only prints a notice).
if ! fresh node "$HERE/package.json" "$HERE/package-lock.json" || [ ! -d "$DIR/node/node_modules/@grpc/grpc-js" ]; then
  rm -rf "$DIR/node" "$DIR/.stamp-node"
  mkdir -p "$DIR/node"
  cp "$HERE/package.json" "$HERE/package-lock.json" "$DIR/node/"
  run "npm ci" npm ci --prefix "$DIR/node" --ignore-scripts --no-audit --no-fund
  stamp node "$HERE/package.json" "$HERE/package-lock.json"
fi

# The check that everything loads: a failure here is a broken install, not a test failure.
run "importing grpc, h2 and the stubs" env PYTHONPATH="$DIR/gen" "$DIR/venv/bin/python" -c \
  'import grpc, h2.connection, v1_pb2, v1_pb2_grpc, v1alpha2_pb2, v1alpha2_pb2_grpc, runtime.v1alpha1.api_pb2_grpc'
run "requiring @grpc/grpc-js and @grpc/proto-loader" env NODE_PATH="$DIR/node/node_modules" node -e \
  "require('@grpc/grpc-js'); require('@grpc/proto-loader').loadSync('$HERE/proto/v1.proto')"

py=$("$DIR/venv/bin/python" -c 'from importlib.metadata import version as v; print(", ".join(p + " " + v(p) for p in ["grpcio", "protobuf", "h2"]))')
js=$(NODE_PATH="$DIR/node/node_modules" node -p "'@grpc/grpc-js ' + require('@grpc/grpc-js/package.json').version + ', @grpc/proto-loader ' + require('@grpc/proto-loader/package.json').version")
echo "CRI clients ready in $DIR: $py; $js"
