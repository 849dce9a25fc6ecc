#!/usr/bin/env bash
# demo.sh — `make demo`: a real containerd 1.6, the release runtime-proxy (RP_DEMO_PROFILE: another cargo
# profile) in front of it, the example hook server (hook-api's annotation_hook) registered with the
# proxy, and one pod run through the proxy
# the way kubelet runs it (examples/demo_pod.rs): the pod's annotation asks the hook for 700 CPU shares
# where kubelet asks 512, and the container gets 700. Then the logs of those calls. Everything it
# starts is stopped on exit, also on failure or Ctrl-C, and everything it wrote is removed: its temp
# dirs, containerd's root and the image cache, which it keeps in containerd's root rather than the
# shared /var/cache/runtime-proxy (RP_DEMO_KEEP=1 keeps the dirs, logs included, for a look). It says
# what it builds and how long a cold build takes, and which Debian packages it installs (a service their
# install enabled or started is disabled and stopped again: lib.sh's need_pkgs). What stays, as its last
# line says: the build in $CARGO_TARGET_DIR (default target/), and the Debian packages it installed.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh

CTRD=/tmp/rp-demo-ctrd
DIR=/tmp/rp-demo
SOCK=$DIR/runtimeproxy.sock
LOG=$DIR/proxy.log
HOOK_DIR=$DIR/hookserver.d
HOOK_SOCK=$DIR/annotation-hook.sock
HOOK_LOG=$DIR/annotation-hook.log
BIN=$(demo_bin_dir)
PROXY_PID= HOOK_PID=
# the two images containerd.sh builds (pause, busybox): in containerd's root, removed with it
export RP_CACHE=$CTRD/cache
# debug for the proxy: one line per CRI call and per hook call (plain `debug` adds h2's frame-by-frame lines)
PROXY_LOG=info,runtime_proxy=debug

# stop PID: SIGTERM and wait for it (a child of this shell).
stop() { [ -z "$1" ] || { kill -TERM "$1" 2>/dev/null || true; wait "$1" 2>/dev/null || true; }; }
cleanup() {
  stop "$HOOK_PID"  # first: it unregisters itself (removes its file from $HOOK_DIR)
  stop "$PROXY_PID"
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

# the log without colours, and without the timestamp, level and module of each line
plain() { sed -e 's/\x1b\[[0-9;]*m//g' -e 's/^[0-9T:.-]*Z *[A-Z]* *[a-z_:]*: //' "$@"; }

need_pkgs "${RP_PKGS[@]}"
demo_build
scripts/containerd.sh up 1.6 "$CTRD" >/dev/null

mkdir -p "$DIR" && : >"$LOG" && : >"$HOOK_LOG"
rm -rf "$HOOK_DIR" && mkdir -p "$HOOK_DIR"  # nothing left from an earlier run
RUST_LOG=$PROXY_LOG "$BIN/runtime-proxy" --koord-runtimeproxy-endpoint "$SOCK" \
  --remote-runtime-service-endpoint "unix://$CTRD/run/containerd.sock" --hook-config-dir "$HOOK_DIR" \
  </dev/null >>"$LOG" 2>&1 &
PROXY_PID=$!
for _ in $(seq 100); do [ -S "$SOCK" ] && break; kill -0 "$PROXY_PID" 2>/dev/null || break; sleep 0.05; done
[ -S "$SOCK" ] || { cat "$LOG" >&2; echo "runtime-proxy did not start" >&2; exit 1; }
echo "runtime-proxy pid $PROXY_PID listening on $SOCK, hook servers from $HOOK_DIR (log: $LOG)"

"$BIN/examples/annotation_hook" --listen "$HOOK_SOCK" --hook-config-dir "$HOOK_DIR" </dev/null >>"$HOOK_LOG" 2>&1 &
HOOK_PID=$!
for _ in $(seq 200); do grep -q 'hook server added' "$LOG" && break; kill -0 "$HOOK_PID" 2>/dev/null || break; sleep 0.05; done
grep -q 'hook server added' "$LOG" ||
  { cat "$HOOK_LOG" "$LOG" >&2; echo "the proxy did not take up the annotation hook's registration" >&2; exit 1; }
echo "annotation_hook pid $HOOK_PID listening on $HOOK_SOCK (log: $HOOK_LOG); it registered itself:"
for f in "$HOOK_DIR"/*.json; do echo "  $f:" && awk '{print "    " $0}' "$f"; done
echo "  the proxy took it up:"
plain "$LOG" | grep 'hook server added' | sed 's/^/    /'
echo

RP_CONTAINERD_ENV=$CTRD/env "$BIN/examples/demo_pod" --endpoint "$SOCK"

echo
echo "The annotation hook's log ($HOOK_LOG):"
sed 's/^/  /' "$HOOK_LOG"
echo
echo "The proxy's log of those calls ($LOG, RUST_LOG=$PROXY_LOG):"
plain "$LOG" | grep -E 'CRI call|hook called' | sed 's/^/  /'
