#!/usr/bin/env bash
# demo-docker.sh — `make demo-docker`: runtime-proxy in Docker mode in front of a real dockerd
# (scripts/dockerd.sh), the example hook server registered with it, and a pod created over the
# Docker Engine API the way cri-dockerd creates it (a `k8s_POD_…` sandbox, then a `k8s_main_…`
# container in it): the pod's annotation asks the hook for 700 CPU shares where kubelet asks 512,
# and the container gets 700 in its real cgroup and the hook's env. Then the plain docker CLI
# through the proxy (no hook for a container that is not a pod's), and the proxy's log of it all.
# Everything it starts is stopped on exit, also on failure or Ctrl-C, and what it wrote removed, as
# scripts/demo.sh does (RP_DEMO_KEEP=1 keeps the dirs).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh

DOCKERD=/tmp/rp-demo-dockerd
DIR=/tmp/rp-demo-docker
SOCK=$DIR/runtimeproxy.sock
LOG=$DIR/proxy.log
HOOK_DIR=$DIR/hookserver.d
HOOK_SOCK=$DIR/annotation-hook.sock
HOOK_LOG=$DIR/annotation-hook.log
BIN=$(demo_bin_dir)
PROXY_PID= HOOK_PID=
PROXY_LOG=info,runtime_proxy=debug

stop() { [ -z "$1" ] || { kill -TERM "$1" 2>/dev/null || true; wait "$1" 2>/dev/null || true; }; }
cleanup() {
  stop "$HOOK_PID"
  stop "$PROXY_PID"
  if [ "${RP_DEMO_KEEP:-}" = 1 ]; then
    scripts/dockerd.sh down "$DOCKERD" >/dev/null 2>&1 || true
    echo "cleaned up: every process it started stopped; kept $DIR and $DOCKERD (RP_DEMO_KEEP=1); $(demo_stays)"
  else
    scripts/dockerd.sh purge "$DOCKERD" >/dev/null 2>&1 || true
    rm -rf "$DIR"
    echo "cleaned up: every process it started stopped, $DIR and $DOCKERD (dockerd's root) removed; $(demo_stays)"
  fi
}
demo_record_installs
trap cleanup EXIT
trap 'exit 130' INT TERM
plain() { sed -e 's/\x1b\[[0-9;]*m//g' -e 's/^[0-9T:.-]*Z *[A-Z]* *[a-z_:]*: //' "$@"; }
# api METHOD PATH [JSON]: one Engine API call through the proxy; prints the answer body.
api() { curl -sS --fail-with-body --unix-socket "$SOCK" -X "$1" -H 'Content-Type: application/json' "http://docker/v1.41$2" ${3:+-d "$3"}; }
json_id() { python3 -c 'import json,sys; print(json.load(sys.stdin)["Id"])'; }

need_pkgs "${RP_PKGS[@]}" curl docker.io  # docker.io: dockerd.sh would install it, its stderr unseen
demo_build
scripts/dockerd.sh up "$DOCKERD" >/dev/null 2>&1 || scripts/dockerd.sh up "$DOCKERD" >/dev/null  # it writes $DOCKERD/env
DOCKER_SOCK=$(sed -n 's/^DOCKER_SOCK=//p' "$DOCKERD/env")
PARENT=$(sed -n 's/^DOCKER_CGROUP_PARENT=//p' "$DOCKERD/env")
PAUSE=$(sed -n 's/^DOCKER_PAUSE_IMAGE=//p' "$DOCKERD/env")
IMAGE=$(sed -n 's/^DOCKER_TEST_IMAGE=//p' "$DOCKERD/env")
DOCKER=(env -u DOCKER_HOST -u DOCKER_API_VERSION DOCKER_CONFIG="$DOCKERD/docker-config" /usr/bin/docker -H "unix://$SOCK")

mkdir -p "$DIR" && : >"$LOG" && : >"$HOOK_LOG"
rm -rf "$HOOK_DIR" && mkdir -p "$HOOK_DIR"
RUST_LOG=$PROXY_LOG "$BIN/runtime-proxy" --backend-runtime-mode Docker --koord-runtimeproxy-endpoint "$SOCK" \
  --remote-runtime-service-endpoint "unix://$DOCKER_SOCK" --hook-config-dir "$HOOK_DIR" --metrics-addr 127.0.0.1:0 \
  </dev/null >>"$LOG" 2>&1 &
PROXY_PID=$!
for _ in $(seq 100); do [ -S "$SOCK" ] && break; kill -0 "$PROXY_PID" 2>/dev/null || break; sleep 0.05; done
[ -S "$SOCK" ] || { cat "$LOG" >&2; echo "runtime-proxy did not start" >&2; exit 1; }
echo "runtime-proxy (Docker mode) pid $PROXY_PID on $SOCK, forwarding to dockerd at $DOCKER_SOCK (log: $LOG)"
"$BIN/examples/annotation_hook" --listen "$HOOK_SOCK" --hook-config-dir "$HOOK_DIR" </dev/null >>"$HOOK_LOG" 2>&1 &
HOOK_PID=$!
for _ in $(seq 200); do grep -q 'hook server added' "$LOG" && break; sleep 0.05; done
grep -q 'hook server added' "$LOG" || { cat "$HOOK_LOG" "$LOG" >&2; echo "hook not taken up" >&2; exit 1; }
echo "annotation_hook registered in $HOOK_DIR"
echo

UID_=demo-$$
POD_PARENT=$PARENT/pod$UID_
echo "A pod the way cri-dockerd creates it, over the Docker Engine API through the proxy:"
SB=$(api POST "/containers/create?name=k8s_POD_web_default_${UID_}_0" "{\"Image\":\"$PAUSE\",\"Labels\":{\"io.kubernetes.docker.type\":\"podsandbox\",\"io.kubernetes.container.name\":\"POD\",\"app\":\"web\",\"annotation.example.runtime-proxy.dev/cpu-shares\":\"700\"},\"HostConfig\":{\"CgroupParent\":\"$POD_PARENT\",\"NetworkMode\":\"none\",\"OomScoreAdj\":-998}}" | json_id)
api POST "/containers/$SB/start" >/dev/null
echo "  sandbox k8s_POD_web_default_${UID_}_0: ${SB:0:12}, cgroup parent $POD_PARENT"
CT=$(api POST "/containers/create?name=k8s_main_web_default_${UID_}_0" "{\"Image\":\"$IMAGE\",\"Cmd\":[\"sleep\",\"3600\"],\"Env\":[\"GREETING=hello\"],\"Labels\":{\"io.kubernetes.docker.type\":\"container\",\"io.kubernetes.sandbox.id\":\"$SB\"},\"HostConfig\":{\"CgroupParent\":\"$POD_PARENT\",\"CpuShares\":512,\"NetworkMode\":\"container:$SB\"}}" | json_id)
api POST "/containers/$CT/start" >/dev/null
echo "  container k8s_main_web_default_${UID_}_0: ${CT:0:12}, kubelet asked for CpuShares 512"
echo "  its cgroup: $(cat "/sys/fs/cgroup/cpu$POD_PARENT/$CT/cpu.shares") CPU shares (/sys/fs/cgroup/cpu$POD_PARENT/$CT/cpu.shares)"
echo "  its env: $("${DOCKER[@]}" exec "$CT" sh -c 'echo GREETING=$GREETING HOOKED_BY=$HOOKED_BY CPU_SHARES=$CPU_SHARES')"
api POST "/containers/$CT/stop?t=0" >/dev/null; api POST "/containers/$SB/stop?t=0" >/dev/null
api DELETE "/containers/$CT" >/dev/null; api DELETE "/containers/$SB" >/dev/null
echo "  stopped and removed"
echo
echo "The docker CLI through the proxy (a plain container: no hook is called):"
echo "  \$ docker run --rm --network none $IMAGE sh -c 'echo out; echo err >&2; exit 3'"
set +e
"${DOCKER[@]}" run --rm --network none "$IMAGE" sh -c 'echo out; echo err >&2; exit 3' 2>&1 | sed 's/^/    /'
echo "    exit code ${PIPESTATUS[0]}"
set -e
echo
echo "The annotation hook's log:"; sed 's/^/  /' "$HOOK_LOG"
echo
echo "The proxy's log of those calls ($LOG):"
plain "$LOG" | grep -E 'Docker API call|hook called' | sed 's/^/  /'
