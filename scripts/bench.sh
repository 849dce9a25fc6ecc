#!/usr/bin/env bash
# bench.sh — `make bench`: the proxy's added latency per CRI call next to a raw byte relay's (socat) with
# CPU time and context switches per call, load average and the targets (benches/latency.rs), then what hooks
# cost (benches/hooks.rs: one no-op hook on CreateContainer; 50 pods at once through a 100 ms hook),
# then the store at node scale (benches/store.rs: RSS idle and with 200 pods, store memory per pod,
# recovery time after kill -9), against a real containerd 1.6, which it starts and stops (also on
# failure or Ctrl-C). Extra arguments go to every bench; RP_BENCH_CALLS sets the calls per path (defaults: latency 5000, hooks 3000).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh

CTRD=/tmp/rp-bench-ctrd
trap 'scripts/containerd.sh down "$CTRD" >/dev/null 2>&1 || true' EXIT
trap 'exit 130' INT TERM

need_pkgs "${RP_PKGS[@]}" socat
scripts/containerd.sh up 1.6 "$CTRD" >/dev/null
export RP_CONTAINERD_ENV=$CTRD/env
cargo bench --locked -p runtime-proxy --bench latency -- "$@"
echo
cargo bench --locked -p runtime-proxy --bench hooks -- "$@"
echo
cargo bench --locked -p runtime-proxy --bench store -- "$@"
