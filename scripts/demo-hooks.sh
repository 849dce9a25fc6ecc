#!/usr/bin/env bash
# demo-hooks.sh — `make demo-hooks`: runtime-hooks with runtime-proxy on a real containerd 1.6.
#
#  1. proxy mode: runtime-proxy in front of containerd, runtime-hooks registered in its hook config
#     directory; a BE pod with batch resources goes through the proxy the way kubelet runs it, and its
#     real cgroup files show the BatchResource policy (examples/demo_be_pod.rs).
#  2. standalone mode: runtime-hooks alone (no proxy) reconciling containerd's pods; the same pod made
#     directly on containerd starts with kubelet's values and is corrected within one interval.
# Then the log lines of runtime-hooks. Everything it starts is stopped on exit, also on failure or Ctrl-C,
# and what it wrote removed, as scripts/demo.sh does (RP_DEMO_KEEP=1 keeps the dirs).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh

CTRD=/tmp/rp-demo-hooks-ctrd
DIR=/tmp/rp-demo-hooks
BIN=$(demo_bin_dir)
PIDS=()
export RP_CACHE=$CTRD/cache  # the images containerd.sh builds: removed with containerd's root

cleanup() {
  local p
  for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
  if [ "${RP_DEMO_KEEP:-}" = 1 ]; then
    scripts/containerd.sh down "$CTRD" >/dev/null 2>&1 || true
    echo "cleaned up: every process it started stopped; kept $DIR and $CTRD (RP_DEMO_KEEP=1); $(demo_stays)"
  else
    scripts/containerd.sh purge "$CTRD" >/dev/null 2>&1 || true
    rm -rf "$DIR"
    echo "cleaned up: every process it started stopped, $DIR and $CTRD (containerd's root, the image cache) removed; $(demo_stays)"
  fi
}
demo_record_installs
trap cleanup EXIT
trap 'exit 130' INT TERM

# wait_for PID WHAT CMD...: polls CMD for up to 5 s while PID lives.
wait_for() {
  local pid=$1 what=$2 _
  shift 2
  for _ in $(seq 100); do "$@" && return 0; kill -0 "$pid" 2>/dev/null || break; sleep 0.05; done
  echo "$what did not come up; logs in $DIR" >&2
  exit 1
}

need_pkgs "${RP_PKGS[@]}"
demo_build
scripts/containerd.sh up 1.6 "$CTRD" >/dev/null
SOCK=$CTRD/run/containerd.sock
rm -rf "$DIR" && mkdir -p "$DIR/hookserver.d"

echo
echo "== 1. proxy mode: kubelet -> runtime-proxy -> containerd, hooks answered by runtime-hooks"
RUST_LOG=info "$BIN/runtime-proxy" --koord-runtimeproxy-endpoint "$DIR/runtimeproxy.sock" \
  --remote-runtime-service-endpoint "$SOCK" --hook-config-dir "$DIR/hookserver.d" </dev/null >"$DIR/proxy.log" 2>&1 &
PIDS+=($!)
wait_for "${PIDS[-1]}" runtime-proxy test -S "$DIR/runtimeproxy.sock"
RUST_LOG=info "$BIN/runtime-hooks" --listen "$DIR/runtime-hooks.sock" --hook-config-dir "$DIR/hookserver.d" \
  </dev/null >"$DIR/hooks-proxy.log" 2>&1 &
PIDS+=($!)
wait_for "${PIDS[-1]}" "runtime-hooks registration" grep -q 'hook server added.*runtime-hooks.json' "$DIR/proxy.log"
echo "runtime-proxy (pid ${PIDS[0]}) took up $DIR/hookserver.d/runtime-hooks.json:"
sed 's/^/  /' "$DIR/hookserver.d/runtime-hooks.json"
echo
RP_CONTAINERD_ENV=$CTRD/env "$BIN/examples/demo_be_pod" --endpoint "$DIR/runtimeproxy.sock"
echo
echo "runtime-hooks' log ($DIR/hooks-proxy.log):"
sed 's/\x1b\[[0-9;]*m//g' "$DIR/hooks-proxy.log" | sed 's/^[^ ]* *//; s/^/  /'
kill -TERM "${PIDS[1]}" && wait "${PIDS[1]}" 2>/dev/null || true
[ ! -e "$DIR/hookserver.d/runtime-hooks.json" ] && echo "  (stopped: registration removed)"

echo
echo "== 2. standalone mode: no proxy; runtime-hooks reconciles containerd's pods every second"
RUST_LOG=info "$BIN/runtime-hooks" --mode standalone --runtime-endpoint "$SOCK" --reconcile-interval 1s \
  </dev/null >"$DIR/hooks-standalone.log" 2>&1 &
PIDS+=($!)
wait_for "${PIDS[-1]}" "runtime-hooks standalone" grep -q 'reconciled' "$DIR/hooks-standalone.log"
echo
RP_CONTAINERD_ENV=$CTRD/env "$BIN/examples/demo_be_pod" --endpoint "$SOCK" --watch 5
echo
echo "runtime-hooks' drift report ($DIR/hooks-standalone.log):"
sed 's/\x1b\[[0-9;]*m//g' "$DIR/hooks-standalone.log" | grep -E 'drift corrected|starting' | sed 's/^[^ ]* *//; s/^/  /'
