#!/usr/bin/env bash
# test-operations.sh — the operations phase of `make test`: the procedures of docs/operations.md, run on this
# machine with the installed packages and a real containerd 1.6 (scripts/containerd.sh up 1.6 ROOT) in the
# node's place. As root on Debian 12; machine-wide (dpkg, /etc, the proxy's default socket), so runs of two
# checkouts take turns (a lock in /run/lock).
#
#  1. install: dpkg -i both .debs (scripts/package.sh deb); nothing starts;
#  2. configure: --remote-runtime-service-endpoint in /etc/default/runtime-proxy and --runtime-endpoint in
#     /etc/default/runtime-hooks pointed at the test containerd (conffile edits; they must survive the upgrade);
#  3. start both services the way their units do (run_unit below: the EnvironmentFile, ExecStart, a clean
#     environment, NOTIFY_SOCKET and the wait for READY=1, the unit's CapabilityBoundingSet and NoNewPrivileges
#     through setpriv, and ProtectSystem=strict approximated in a private mount namespace: every mount
#     read-only except /dev, /proc, /sys and the unit's RuntimeDirectory and ReadWritePaths. Not emulated:
#     PrivateTmp and the other Protect*/Restrict* settings, which systemd-analyze verify checks only for syntax);
#     runtime-hooks registers itself in /etc/runtime/hookserver.d and the proxy calls it;
#  4. a pod through the proxy's default socket with the example hook (annotation_hook) registered: cpu.shares
#     700 where kubelet asked 512, and the hook's env;
#  5. metrics and health on 127.0.0.1:9318: /healthz, hook and CRI counters; `runtime-proxy status` (exit 0, both hook
#     servers called ok, the backend up, the pod in the store); `runtime-hooks status` with no flags (its admin socket
#     beside --listen in the unit's RuntimeDirectory: exit 0, its plugins and registration); then `systemctl reload` of
#     both (their ExecReload, SIGHUP): the proxy rescans its hook config directory, runtime-hooks re-reads its rules
#     file, both keep running;
#  6. upgrade with the pod running: the packages again as VERSION+ops1, dpkg -i (the conffile edit kept), the
#     proxy restarted (SIGTERM: STOPPING=1 and a clean exit; the new one READY=1); the pod's container is the same
#     process, never restarted; the store recovered; UpdateContainerResources through the new proxy is hooked
#     again (700 stays where kubelet sends 512); a new pod is hooked;
#  7. troubleshooting: with the hook server down (Ignore) a new pod starts with kubelet's values;
#  8. roll back: the pods, seen directly on containerd (kubelet pointed back), run on;
#  9. removal with pods running: the services stopped, dpkg --purge both; the pod still runs; then torn down.
#
# Prints `ok`/`FAIL` per check and a cargo-style `test result:` line that scripts/test.sh counts.
set -uo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh

TARGET=${CARGO_TARGET_DIR:-target}
CTRD=/tmp/rp-ops-ctrd
TMP=$(mktemp -d /tmp/rp-ops.XXXXXX)
SOCK=/var/run/koord-runtimeproxy/runtimeproxy.sock
HOOK_SOCK=/run/rp-ops-annotation-hook.sock
MARK=/run/runtime-proxy-test-packages
PASS=0 FAIL=0 PIDS=() STATES=()

log() { echo "[test-operations.sh] $*" >&2; }
# check NAME CMD...: runs CMD in this shell (so that it may set variables and wait for this shell's children);
# `ok NAME` and CMD's output, or `FAIL NAME` and CMD's output.
check() {
  local name=$1
  shift
  if "$@" >"$TMP/check.out" 2>&1; then
    echo "ok    $name" && PASS=$((PASS + 1))
  else
    echo "FAIL  $name" && FAIL=$((FAIL + 1))
  fi
  sed 's/^/      /' "$TMP/check.out"
}
installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'ok installed'; }
stop_pid() { [ -n "${1:-}" ] && kill -TERM "$1" 2>/dev/null && for _ in $(seq 300); do kill -0 "$1" 2>/dev/null || return 0; sleep 0.1; done; kill -KILL "$1" 2>/dev/null || true; }
cleanup() {
  local p
  for p in "${PIDS[@]}"; do stop_pid "$p"; done
  for p in "$TMP"/pod[0-9]; do
    [ ! -f "$p" ] || RP_CONTAINERD_ENV=$CTRD/env "$OPS" remove --endpoint "$CTRD/run/containerd.sock" --state "$p" >/dev/null 2>&1
  done
  dpkg --purge runtime-proxy runtime-hooks >/dev/null 2>&1 || true
  restore_dirs
  rm -f "$MARK" "$HOOK_SOCK"
  scripts/containerd.sh down "$CTRD" >/dev/null 2>&1 || true
  rm -rf "$TMP"
}

exec 8>/run/lock/runtime-proxy-test-packages.lock && flock 8
for p in runtime-proxy runtime-hooks; do
  if installed "$p"; then
    [ -e "$MARK" ] || { log "$p is installed on this machine already; not touching it"; exit 1; }
    dpkg --purge runtime-proxy runtime-hooks >/dev/null
  fi
done
need_pkgs "${RP_PKGS[@]}" util-linux procps python3 curl
# dpkg removes the packages' empty directories at purge even when they existed before the install: note which
# did, to put them back (empty, as they were).
KEEP_DIRS=()
for d in /etc/runtime /etc/runtime/hookserver.d /etc/runtime-hooks; do [ ! -d "$d" ] || KEEP_DIRS+=("$d"); done
restore_dirs() { local d; for d in "${KEEP_DIRS[@]}"; do [ -d "$d" ] || mkdir -p "$d"; done; }
trap cleanup EXIT
trap 'exit 130' INT TERM
fatal() { log "$1"; echo "test result: FAILED. $PASS passed; $((FAIL + 1)) failed;"; exit 1; }

bash scripts/package.sh deb >/dev/null || fatal "building the packages failed"
# ops_pod and annotation_hook; the workspace's examples as one selection, whose features are the build phase's (a
# package's own selection builds its dependencies again: scripts/lib.sh, demo_build)
cargo build -q --locked --workspace --examples || fatal "building the examples failed"
OPS=$TARGET/debug/examples/ops_pod
HOOK=$TARGET/debug/examples/annotation_hook
scripts/containerd.sh up 1.6 "$CTRD" >/dev/null || fatal "containerd did not start"
export RP_CONTAINERD_ENV=$CTRD/env
VERSION=$(awk -F'"' '/^\[workspace.package\]/ {p = 1} p && /^version *=/ {print $2; exit}' Cargo.toml)
ARCH=$(dpkg --print-architecture)
DEBS=("$TARGET/dist/packages/runtime-proxy_${VERSION}_$ARCH.deb" "$TARGET/dist/packages/runtime-hooks_${VERSION}_$ARCH.deb")

# notify_receiver NAME: a stand-in for systemd's notification socket: every datagram to $TMP/NAME.notify is
# appended as a line to $TMP/NAME.states.
notify_receiver() {
  python3 - "$TMP/$1.notify" "$TMP/$1.states" <<'PY' &
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind(sys.argv[1])
while True:
    data = s.recv(4096)
    with open(sys.argv[2], "a") as f:
        f.write(data.decode(errors="replace") + "\n")
PY
  PIDS+=($!)
  for _ in $(seq 50); do [ -S "$TMP/$1.notify" ] && return 0; sleep 0.1; done
  return 1
}

# run_unit NAME: starts the installed NAME.service as systemd would (see the header) with its output in
# $TMP/NAME.log, and waits up to 30 s for READY=1; UNIT_PID is the service's main process.
run_unit() {
  local name=$1 unit=/lib/systemd/system/$1.service exec envfile caps rundir rw
  exec=$(sed -n 's/^ExecStart=//p' "$unit")
  envfile=$(sed -n 's/^EnvironmentFile=-\?//p' "$unit")
  caps=$(sed -n 's/^CapabilityBoundingSet=//p' "$unit" | tr ' ' '\n' | sed 's/^CAP_//' | tr 'A-Z' 'a-z' | sed 's/^/+/' | paste -sd,)
  rundir=/run/$(sed -n 's/^RuntimeDirectory=//p' "$unit")
  rw="$rundir $(sed -n 's/^ReadWritePaths=//p' "$unit")"
  grep -qx 'NoNewPrivileges=yes' "$unit" && grep -qx 'ProtectSystem=strict' "$unit" || { echo "$unit: not the sandbox this emulates"; return 1; }
  mkdir -p "$rundir"
  [ -S "$TMP/$name.notify" ] || notify_receiver "$name" || return 1
  : >"$TMP/$name.states"
  UNIT_EXEC=$exec UNIT_ENVFILE=$envfile UNIT_CAPS=$caps UNIT_RW=$rw NOTIFY=$TMP/$name.notify \
    unshare -m --propagation private bash -c '
      set -e
      for m in $(awk '"'"'{print $5}'"'"' /proc/self/mountinfo | grep -vE "^/(proc|sys|dev)(/|$)" | sort -u); do
        mount -o remount,bind,ro "$m" 2>/dev/null || true
      done
      for p in $UNIT_RW; do mount --rbind "$p" "$p" && mount -o remount,bind,rw "$p"; done
      exec setpriv --no-new-privs --inh-caps=-all --bounding-set=-all,$UNIT_CAPS -- \
        env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin NOTIFY_SOCKET="$NOTIFY" UNIT_EXEC="$UNIT_EXEC" UNIT_ENVFILE="$UNIT_ENVFILE" \
        bash -c '"'"'set -a; [ ! -f "$UNIT_ENVFILE" ] || . "$UNIT_ENVFILE"; set +a; unset UNIT_ENVFILE; eval "exec $UNIT_EXEC"'"'"'
    ' </dev/null >>"$TMP/$name.log" 2>&1 &
  UNIT_PID=$!
  PIDS+=("$UNIT_PID")
  for _ in $(seq 300); do
    grep -qx 'READY=1' "$TMP/$name.states" && return 0
    kill -0 "$UNIT_PID" 2>/dev/null || break
    sleep 0.1
  done
  echo "$name: no READY=1"; tail -n 20 "$TMP/$name.log"; return 1
}
# stop_unit NAME PID: SIGTERM (KillSignal), STOPPING=1 and exit 0 within the unit's TimeoutStopSec. PID is
# this shell's child: unshare, setpriv, env and bash all exec, so it is the service's process itself.
stop_unit() {
  local t rc
  t=$(sed -n 's/^TimeoutStopSec=\([0-9]*\)s$/\1/p' "/lib/systemd/system/$1.service")
  kill -TERM "$2"
  for _ in $(seq $((t * 10))); do kill -0 "$2" 2>/dev/null || break; sleep 0.1; done
  wait "$2"; rc=$?
  [ "$rc" -eq 0 ] || { echo "$1 exited $rc"; tail -n 20 "$TMP/$1.log"; return 1; }
  grep -qx 'STOPPING=1' "$TMP/$1.states" || { echo "$1: no STOPPING=1"; return 1; }
}
ops() { "$OPS" "$1" --endpoint "${ENDPOINT:-$SOCK}" --state "$TMP/$2" ${3:+--expect-shares "$3"}; }
metric() { curl -sf http://127.0.0.1:9318/metrics | grep -F "$1"; }

echo "==> 1. install"
check "dpkg -i both packages" dpkg -i "${DEBS[@]}"
: >"$MARK"
check "nothing started by the install" bash -c '! pgrep -f "^/usr/bin/runtime-(proxy|hooks)"'

echo "==> 2. configure"
edit_endpoint() {
  sed -i "s|--remote-runtime-service-endpoint [^ \"]*|--remote-runtime-service-endpoint $CTRD/run/containerd.sock|" /etc/default/runtime-proxy &&
    grep -q -- "--remote-runtime-service-endpoint $CTRD/run/containerd.sock" /etc/default/runtime-proxy
}
check "/etc/default/runtime-proxy: the runtime endpoint" edit_endpoint
edit_hooks_endpoint() {  # the reconciler's runtime socket: a pass that cannot list the runtime makes status exit 1
  sed -i "s|--runtime-endpoint [^ \"]*|--runtime-endpoint $CTRD/run/containerd.sock|" /etc/default/runtime-hooks &&
    grep -q -- "--runtime-endpoint $CTRD/run/containerd.sock" /etc/default/runtime-hooks
}
check "/etc/default/runtime-hooks: the runtime endpoint" edit_hooks_endpoint

echo "==> 3. start the services as their units do"
start_proxy() { run_unit runtime-proxy && PROXY_PID=$UNIT_PID && [ -S "$SOCK" ] && grep -q 'runtime-proxy serving' "$TMP/runtime-proxy.log"; }
check "runtime-proxy.service: READY=1, serving $SOCK" start_proxy
start_hooks() { run_unit runtime-hooks && HOOKS_PID=$UNIT_PID && [ -f /etc/runtime/hookserver.d/runtime-hooks.json ] && /usr/bin/runtime-hooks --probe; }
check "runtime-hooks.service: READY=1, registered, --probe answers" start_hooks
check "the proxy took up runtime-hooks" bash -c "for _ in \$(seq 50); do grep -q 'hook server added.*runtime-hooks.json' $TMP/runtime-proxy.log && exit 0; sleep 0.1; done; exit 1"

echo "==> 4. a pod through the proxy, hooked"
"$HOOK" --listen "$HOOK_SOCK" --hook-config-dir /etc/runtime/hookserver.d >>"$TMP/annotation-hook.log" 2>&1 </dev/null &
HOOK_PID=$!
PIDS+=("$HOOK_PID")
check "annotation hook registered and taken up" bash -c "for _ in \$(seq 100); do grep -q 'hook server added.*annotation-hook.json' $TMP/runtime-proxy.log && exit 0; sleep 0.1; done; exit 1"
check "pod 1: cpu.shares 700 from the hook (kubelet: 512), env HOOKED_BY" ops run pod1 700

echo "==> 5. metrics and health"
check "/healthz 200" bash -c '[ "$(curl -s -o /dev/null -w "%{http_code}" http://127.0.0.1:9318/healthz)" = 200 ]'
hook_metrics() {
  metric 'runtime_proxy_hook_requests_total{stage="PreCreateContainer",server="annotation-hook.json",result="ok"}' &&
    metric 'runtime_proxy_hook_requests_total{stage="PreCreateContainer",server="runtime-hooks.json",result="ok"}'
}
check "hook calls counted: annotation-hook.json and runtime-hooks.json ok" hook_metrics
check "CRI calls counted, backend up" bash -c "curl -sf http://127.0.0.1:9318/metrics | grep -F -e 'runtime_proxy_cri_requests_total{method=\"/runtime.v1.RuntimeService/RunPodSandbox\",code=\"OK\"}' -e 'runtime_proxy_backend_up 1'"

proxy_status() {  # the installed binary's `status` against the running proxy: exit 0, what docs/operations.md shows
  local json
  json=$(/usr/bin/runtime-proxy status --output json) || { /usr/bin/runtime-proxy status; return 1; }
  python3 -c 'import json, sys
d = json.loads(sys.argv[1])
health = {s["name"]: s["health"] for s in d["hook_servers"]}
assert d["healthy"] and d["backend"]["up"], d
assert health.get("annotation-hook.json") == "ok" and health.get("runtime-hooks.json") == "ok", health
assert d["store"]["pod_sandboxes"] >= 1, d["store"]' "$json" && /usr/bin/runtime-proxy status | grep -q '^hook servers$'
}
check "runtime-proxy status: exit 0, both hook servers ok, backend up, the pod stored" proxy_status
hooks_status() {  # as packaged, no flags: the admin socket beside --listen, which the unit's RuntimeDirectory holds
  local json
  json=$(/usr/bin/runtime-hooks status --output json) || { /usr/bin/runtime-hooks status; return 1; }
  python3 -c 'import json, sys
d = json.loads(sys.argv[1])
assert d["program"] == "runtime-hooks" and d["healthy"] and d["mode"] == "proxy", d
assert "GroupIdentity" in d["plugins"] and d["registration"]["in_place"], d
assert d["reconciler"]["passes"] >= 1, d["reconciler"]' "$json" && /usr/bin/runtime-hooks status | grep -E '^(plugins|registration) '
}
check "runtime-hooks status (no flags): exit 0, proxy mode, plugins, registration in place, a reconcile pass" hooks_status
echo "==> 5b. systemctl reload (the units' ExecReload: SIGHUP)"
# reload_unit NAME PID LINE: runs NAME.service's ExecReload as systemd would ($MAINPID = PID), then waits for LINE
# in its log; the service must still run and serve.
reload_unit() {
  local exec MAINPID=$2
  exec=$(sed -n 's/^ExecReload=//p' "/lib/systemd/system/$1.service")
  [ -n "$exec" ] || { echo "$1.service has no ExecReload"; return 1; }
  eval "$exec" || return 1
  for _ in $(seq 50); do grep -q "$3" "$TMP/$1.log" && break; sleep 0.1; done
  grep "$3" "$TMP/$1.log" | tail -n 1 && kill -0 "$2"
}
check "reload runtime-proxy: hook config directory rescanned, still running" \
  reload_unit runtime-proxy "$PROXY_PID" 'reloaded: hook config directory rescanned.*runtime-hooks.json'
check "reload runtime-hooks: rules file re-read, still running" reload_unit runtime-hooks "$HOOKS_PID" 'reloaded: the rules in force stay'
check "pod 1 still hooked after the reloads: 700" ops check pod1 700

echo "==> 6. upgrade with the pod running"
repackage() { DEB_VERSION=$VERSION+ops1 OUT=$TMP/upgrade bash scripts/package.sh deb >/dev/null 2>&1 && ls "$TMP"/upgrade/*+ops1_*.deb; }
check "packages $VERSION+ops1 built" repackage
check "dpkg -i the upgrade (conffiles kept)" bash -c "dpkg -i --force-confold $TMP/upgrade/*.deb >/dev/null &&
  [ \"\$(dpkg-query -W -f='\${Version}' runtime-proxy)\" = '$VERSION+ops1' ] &&
  grep -q -- '--remote-runtime-service-endpoint $CTRD/run/containerd.sock' /etc/default/runtime-proxy"
check "pod 1 unaffected by the package upgrade" ops check pod1 700
check "restart: the old proxy drains and exits 0 (STOPPING=1)" stop_unit runtime-proxy "$PROXY_PID"
check "restart: the new proxy READY=1" start_proxy
check "store recovered from containerd" bash -c "grep -E 'store recovered: [1-9][0-9]* pod sandboxes' $TMP/runtime-proxy.log | tail -n1"
check "pod 1: the same container, never restarted, 700" ops check pod1 700
check "pod 1: UpdateContainerResources through the new proxy hooked (kubelet 512 → 700)" ops update pod1 700
check "pod 2 through the upgraded proxy: 700" ops run pod2 700

echo "==> 7. hook server down (failure-policy Ignore)"
check "annotation hook stopped, unregistered" bash -c "kill -TERM $HOOK_PID && wait $HOOK_PID 2>/dev/null; for _ in \$(seq 50); do grep -q 'hook server removed.*annotation-hook.json' $TMP/runtime-proxy.log && exit 0; sleep 0.1; done; grep hook $TMP/runtime-proxy.log | tail -3; exit 1"
check "pod 3: starts with kubelet's 512" ops run pod3 512

echo "==> 8. roll back: kubelet pointed at containerd again"
direct() { for p in pod1 pod2 pod3; do ENDPOINT=$CTRD/run/containerd.sock ops "$1" "$p" || return 1; done; }
check "pods 1-3 run on, seen directly on containerd" direct check

echo "==> 9. removal with pods running"
stop_hooks() { stop_unit runtime-hooks "$HOOKS_PID" && [ ! -e /etc/runtime/hookserver.d/runtime-hooks.json ]; }
check "runtime-hooks stopped: STOPPING=1, exit 0, unregistered" stop_hooks
check "runtime-proxy stopped: STOPPING=1, exit 0" stop_unit runtime-proxy "$PROXY_PID"
check "dpkg --purge both" dpkg --purge runtime-proxy runtime-hooks
restore_dirs
check "pod 1 still running after the purge, 700" env ENDPOINT="$CTRD/run/containerd.sock" "$OPS" check --endpoint "$CTRD/run/containerd.sock" --state "$TMP/pod1" --expect-shares 700
teardown() { direct remove && rm -f "$TMP"/pod[123]; }
check "pods torn down directly on containerd" teardown

echo
echo "test result: $([ $FAIL -eq 0 ] && echo ok || echo FAILED). $PASS passed; $FAIL failed;"
[ $FAIL -eq 0 ]
