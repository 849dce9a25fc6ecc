#!/usr/bin/env bash
# demo.sh — `make demo`: a real containerd 1.6, the release runtime-proxy in front of it, and one pod
# run through the proxy the way kubelet runs it (examples/demo_pod.rs); then the proxy's own log of
# those calls. Everything it starts is stopped on exit, also on failure or Ctrl-C.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh

CTRD=/tmp/rp-demo-ctrd
DIR=/tmp/rp-demo
SOCK=$DIR/runtimeproxy.sock
LOG=$DIR/proxy.log
BIN=${CARGO_TARGET_DIR:-target}/release
PROXY_PID=
# debug for the proxy: one line per CRI call (plain `debug` adds h2's frame-by-frame lines)
PROXY_LOG=info,runtime_proxy=debug

cleanup() {
  if [ -n "$PROXY_PID" ]; then
    kill -TERM "$PROXY_PID" 2>/dev/null || true
    wait "$PROXY_PID" 2>/dev/null || true
  fi
  scripts/containerd.sh down "$CTRD" >/dev/null 2>&1 || true
}
trap cleanup EXIT
trap 'exit 130' INT TERM

need_pkgs "${RP_PKGS[@]}"
echo "building (release)..."
cargo build -q --release --locked -p runtime-proxy --examples --bins
scripts/containerd.sh up 1.6 "$CTRD" >/dev/null

mkdir -p "$DIR" && : >"$LOG"
RUST_LOG=$PROXY_LOG "$BIN/runtime-proxy" --koord-runtimeproxy-endpoint "$SOCK" \
  --remote-runtime-service-endpoint "unix://$CTRD/run/containerd.sock" </dev/null >>"$LOG" 2>&1 &
PROXY_PID=$!
for _ in $(seq 100); do [ -S "$SOCK" ] && break; kill -0 "$PROXY_PID" 2>/dev/null || break; sleep 0.05; done
[ -S "$SOCK" ] || { cat "$LOG" >&2; echo "runtime-proxy did not start" >&2; exit 1; }
echo "runtime-proxy pid $PROXY_PID listening on $SOCK (log: $LOG)"
echo

RP_CONTAINERD_ENV=$CTRD/env "$BIN/examples/demo_pod" --endpoint "$SOCK"

echo
echo "The proxy's log of those calls ($LOG, RUST_LOG=$PROXY_LOG):"
sed 's/\x1b\[[0-9;]*m//g' "$LOG" | grep 'CRI call' | sed 's/^/  /'
