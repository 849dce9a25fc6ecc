#!/usr/bin/env bash
# bench.sh — `make bench`: the proxy's added latency per CRI call next to a raw byte relay's (socat) with CPU time and
# context switches per call, load average and the targets (benches/latency.rs), then throughput through the same three
# paths under concurrency (benches/concurrency.rs: 16 and 64 callers on 1 and on 16 connections; calls/s, p50/p99, CPU
# per call of each process), then what hooks cost (benches/hooks.rs: one no-op hook on CreateContainer; 50 pods at once
# through a 100 ms hook; benches/wake.rs: the wake-up of an idle peer by how long it was idle, the floor under every
# hop), runtime-hooks' round trip beside a no-op hook server's (runtime-hooks' benches/hook_rtt.rs), both NRI plugins on
# large nodes of the NRI stand-in (runtime-hooks' benches/large_node.rs, runtime-proxy's benches/nri_large_node.rs:
# Synchronize and CPU per pod at 10, 100 and 1,000 pods), the CRI proxy on the same nodes of a CRI stand-in
# (benches/cri_large_node.rs: CPU per pod and per update, own time per hooked call; benches/reconciler.rs: the
# standalone reconciler at 50 and 250 pods on the CRI stand-in), the per-stage
# overhead (runtime-hooks' benches/stages.rs: each hooked call of a BE pod's life direct, through the proxy without
# hook, with a no-op hook at every stage, with runtime-hooks), then the store at node scale (benches/store.rs: RSS idle
# and with RP_BENCH_STORE_PODS pods, default 200, store memory per pod and per container, recovery time after kill -9),
# against a real containerd 1.6, which it starts
# and stops (also on failure or Ctrl-C); the store at 1,000 pods × 4 containers against a stand-in runtime
# (benches/node_scale.rs: recovery time and CPU, store memory per pod and per container; no containerd); then the
# pass-through bench again against a containerd 2.1; then pod start time
# by mode (runtime-hooks' benches/pod_start.rs: BE pods on containerd alone, through runtime-proxy + runtime-hooks in
# proxy mode, and with runtime-hooks as an NRI plugin; runtime-proxy's benches/nri_front.rs: pods with one no-op hook on
# containerd alone, through the CRI proxy and through the NRI front end; runtime-hooks' benches/nri_sync.rs:
# containerd's NRI lock time when runtime-hooks synchronizes with 150 BE pods, fresh and again) against a containerd 1.7
# with NRI on and again against a 2.1 with NRI on, each started after the one before is down and stopped the same way.
# Extra arguments go to every bench; RP_BENCH_CALLS sets the calls per path (defaults: latency 5000, hooks and hook_rtt
# 3000), RP_BENCH_CONC_ROUNDS and RP_BENCH_CONC_ROUND_MS the rounds of the concurrency bench (defaults 6 and 600 ms),
# RP_BENCH_STAGE_PODS the pods per path of the per-stage bench (default 20), RP_BENCH_PODS the pods per mode of
# pod_start (default 50), RP_BENCH_BURSTS its at-once batches per mode (default 1; RP_BENCH_SEQUENTIAL=0 leaves its
# one-after-another part out), RP_BENCH_SCALE_EVENTS the pods created per size in the large-node benches (default 200),
# RP_BENCH_SYNC_PODS the pods of nri_sync (default 150), RP_BENCH_RECON_PASSES and RP_BENCH_RECON_SECS the unchanged
# passes and the steady-state seconds of the reconciler bench (defaults 20 and 60).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh

CTRD=/tmp/rp-bench-ctrd
CTRD21=/tmp/rp-bench-ctrd-2.1
NRI_CTRD=/tmp/rp-bench-nri-ctrd
trap 'for r in "$CTRD" "$CTRD21" "$NRI_CTRD-1.7" "$NRI_CTRD-2.1"; do scripts/containerd.sh down "$r" >/dev/null 2>&1 || true; done' EXIT
trap 'exit 130' INT TERM

need_pkgs "${RP_PKGS[@]}" socat
scripts/containerd.sh up 1.6 "$CTRD" >/dev/null
export RP_CONTAINERD_ENV=$CTRD/env
cargo bench --locked -p runtime-proxy --bench latency -- "$@"
echo
cargo bench --locked -p runtime-proxy --bench concurrency -- "$@"
echo
cargo bench --locked -p runtime-proxy --bench hooks -- "$@"
echo
cargo bench --locked -p runtime-proxy --bench wake -- "$@"
echo
# runtime-hooks as the hook server beside a no-op one (no containerd needed)
cargo bench --locked -p runtime-hooks --bench hook_rtt -- "$@"
echo
# large nodes on the NRI stand-in (no containerd needed): both NRI plugins at 10, 100 and 1,000 pods
cargo bench --locked -p runtime-hooks --bench large_node -- "$@"
echo
cargo bench --locked -p runtime-proxy --bench nri_large_node -- "$@"
echo
# the CRI proxy on nodes of 10, 100 and 1,000 pods of a stand-in runtime (no containerd needed)
cargo bench --locked -p runtime-proxy --bench cri_large_node -- "$@"
echo
# the standalone reconciler at 50 and 250 pods on the CRI stand-in (no containerd needed): pass CPU, files, allocations,
# steady-state CPU of the binary, RSS per pod, a rule change to all pods
cargo bench --locked -p runtime-hooks --bench reconciler -- "$@"
echo
# per-stage overhead: direct, proxy without hook, with a no-op hook, with runtime-hooks (starts
# runtime-proxy's release binary, which `cargo bench -p runtime-hooks` does not build)
cargo build --locked --release -p runtime-proxy
cargo bench --locked -p runtime-hooks --bench stages -- "$@"
echo
RP_BENCH_PODS=${RP_BENCH_STORE_PODS:-200} cargo bench --locked -p runtime-proxy --bench store -- "$@"
scripts/containerd.sh down "$CTRD" >/dev/null 2>&1
echo
# the store at 1,000 pods × 4 containers, against a stand-in runtime (no containerd)
cargo bench --locked -p runtime-proxy --bench node_scale -- "$@"
echo
# the pass-through table's containerd 2.1 rows (CRI v1 only; NRI off)
scripts/containerd.sh up 2.1 "$CTRD21" >/dev/null
RP_CONTAINERD_ENV=$CTRD21/env cargo bench --locked -p runtime-proxy --bench latency -- "$@"
scripts/containerd.sh down "$CTRD21" >/dev/null 2>&1
echo
# pod_start starts runtime-proxy's release binary (target/release/runtime-proxy), which `cargo bench -p runtime-hooks`
# does not build
cargo build --locked --release -p runtime-proxy
for v in 1.7 2.1; do
  RP_NRI=1 scripts/containerd.sh up "$v" "$NRI_CTRD-$v" >/dev/null
  RP_CONTAINERD_ENV=$NRI_CTRD-$v/env cargo bench --locked -p runtime-hooks --bench pod_start -- "$@"
  echo
  # hook servers on NRI: pod start with one no-op hook — containerd alone, CRI proxy, NRI front end
  RP_CONTAINERD_ENV=$NRI_CTRD-$v/env cargo bench --locked -p runtime-proxy --bench nri_front -- "$@"
  echo
  # Synchronize of runtime-hooks on a node of 150 BE pods: containerd's NRI lock time, fresh and when connecting again
  RP_CONTAINERD_ENV=$NRI_CTRD-$v/env cargo bench --locked -p runtime-hooks --bench nri_sync -- "$@"
  scripts/containerd.sh down "$NRI_CTRD-$v" >/dev/null 2>&1
  echo
done
