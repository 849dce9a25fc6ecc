#!/usr/bin/env bash
# dockerd.sh — a throw-away, registry-free Docker engine (Debian's docker.io 20.10) for the Docker-mode tests.
#
#   scripts/dockerd.sh up ROOT      start a private dockerd in ROOT (does nothing if ROOT's dockerd already runs)
#   scripts/dockerd.sh down ROOT    remove its containers and stop everything started for ROOT (never fails)
#   scripts/dockerd.sh purge ROOT   down + rm -rf ROOT
#
# `up` installs missing packages (docker.io busybox-static python3), starts dockerd (log: ROOT/dockerd.log) with
# everything under ROOT: data root, exec root (its own managed containerd), socket ROOT/run/docker.sock, no bridge,
# no iptables, no ip forwarding, cgroupfs driver, every container's cgroup below $DOCKER_CGROUP_PARENT, and
# --config-file ROOT/daemon.json (so the host's /etc/docker/daemon.json does not apply). It imports busybox-static
# as localhost/busybox:local (CMD sleep 3600) and as localhost/pause:local (a sh that sleeps and exits 0 on
# SIGTERM/SIGINT), then writes ROOT/env and prints it on stdout: DOCKER_SOCK DOCKER_CLI DOCKERD_VERSION
# DOCKER_API_VERSION DOCKER_TEST_IMAGE DOCKER_PAUSE_IMAGE DOCKER_CGROUP_PARENT DOCKER_ROOT (KEY=VALUE lines).
# DOCKER_CLI is Debian's client /usr/bin/docker (the image's /usr/local/bin/docker 28.x comes first on PATH).
# Containers need `--network none` (or `container:<id>`): there is no bridge. No registry is reachable.
#
# Test-only runtime wrapper (the default runtime, "rp-runc" = ROOT/runc-wrapper): these machines lack
# CAP_SYS_RESOURCE, so runc cannot give a container a negative oom_score_adj ("can't get final child's PID from
# pipe: EOF"), yet dockershim / cri-dockerd give every pod sandbox OomScoreAdj -998. For `create` and `run` the
# wrapper raises a negative process.oomScoreAdj in the bundle's config.json to 0 (logged to
# ROOT/runc-wrapper.log), then execs runc with the same arguments — the role containerd's
# `restrict_oom_score_adj = true` plays in scripts/containerd.sh. `docker inspect` still shows the requested value.
#
# dockerd also creates a few host paths outside ROOT (/etc/docker/key.json, /run/docker/plugins, ...); `up` records
# in ROOT/host-created those that did not exist before, and `down` removes them unless another dockerd still runs
# (a harness dockerd then inherits them). Instances in different ROOTs run side by side. Diagnostics go to stderr.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"  # need_pkgs

BUSYBOX_REF=localhost/busybox:local
PAUSE_REF=localhost/pause:local
CLI=/usr/bin/docker
PKGS=(docker.io busybox-static python3)
# dockerd finds containerd, runc, docker-init on PATH: Debian's, never /usr/local/bin's
DAEMON_PATH=/usr/sbin:/usr/bin:/sbin:/bin
# host paths dockerd may create outside ROOT (removed by `down` when `up` created them)
HOST_PATHS=(/etc/docker/key.json /run/docker/plugins /run/docker /etc/docker $(printf '/sys/fs/cgroup/%s/docker ' $(ls /sys/fs/cgroup)))

log() { echo "[dockerd.sh] $*" >&2; }
die() { log "error: $*"; exit 1; }
usage() { sed -n '4,6s/^# //p' "$0" >&2; exit 2; }

# set_root ROOT: absolute ROOT and everything derived from it.
set_root() {
  ROOT=$(realpath -m "$1")
  [ "$ROOT" != / ] || die "ROOT must not be /"
  SOCK=$ROOT/run/docker.sock
  CTRD_SOCK=$ROOT/exec/containerd/containerd.sock
  CGROUP_PARENT=/rp-docker-$(basename "$ROOT")
  [ ${#CTRD_SOCK} -lt 94 ] || die "ROOT too long for unix socket paths: $CTRD_SOCK.ttrpc"
}
docker_() { timeout 60 "$CLI" -H "unix://$SOCK" "$@"; }
ready() { [ -S "$SOCK" ] && timeout 5 "$CLI" -H "unix://$SOCK" version >/dev/null 2>&1; }
# live PID (not a zombie: PID 1 on our VMs reaps orphans only after ~1.5 s, so `kill -0` would lie)
live() { [[ $(cat "/proc/$1/stat" 2>/dev/null) =~ \)\ [^Z] ]]; }
cmdline() { tr '\0' ' ' 2>/dev/null <"/proc/$1/cmdline"; }
# daemon_pid: prints the pid of ROOT's dockerd if it is alive (checked against its command line).
daemon_pid() {
  local pid; pid=$(cat "$ROOT/docker.pid" 2>/dev/null) || return 1
  live "$pid" && cmdline "$pid" | grep -qF -- "--data-root $ROOT/data " && echo "$pid"
}
# stop_pid PID SECONDS: SIGTERM, SIGKILL after SECONDS.
stop_pid() {
  kill -TERM "$1" 2>/dev/null || return 0
  for _ in $(seq $(($2 * 20))); do live "$1" || return 0; sleep 0.05; done
  kill -KILL "$1" 2>/dev/null || true
  for _ in $(seq 40); do live "$1" || return 0; sleep 0.05; done
}

write_files() {
  mkdir -p "$ROOT"/{data,exec,run}
  echo '{}' >"$ROOT/daemon.json"
  local runc; runc=$(PATH=$DAEMON_PATH command -v runc) || die "runc not found"
  cat >"$ROOT/runc-wrapper" <<EOF
#!/bin/bash
# Written by scripts/dockerd.sh (test-only, see its header): for \`create\`/\`run\`, raise a negative
# process.oomScoreAdj in the bundle's config.json to 0 (no CAP_SYS_RESOURCE here), then exec runc.
set -euo pipefail
args=("\$@") cmd= bundle=. i=0
while [ \$i -lt \$# ]; do
  a=\${args[i]}
  if [ -z "\$cmd" ]; then
    case \$a in
      --root | --log | --log-format | --criu | --rootless) i=\$((i + 1)) ;;  # global options with a value
      -*) ;;
      *) cmd=\$a ;;
    esac
  else
    case \$a in
      -b | --bundle) bundle=\${args[i + 1]:-.} && i=\$((i + 1)) ;;
      --bundle=*) bundle=\${a#--bundle=} ;;
    esac
  fi
  i=\$((i + 1))
done
if [ "\$cmd" = create ] || [ "\$cmd" = run ]; then
  /usr/bin/python3 - "\$bundle/config.json" "$ROOT/runc-wrapper.log" <<'PY'
import json, os, sys, time
path, log = sys.argv[1], sys.argv[2]
with open(path) as f:
    spec = json.load(f)
proc = spec.get("process") or {}
adj = proc.get("oomScoreAdj")
if isinstance(adj, int) and adj < 0:
    proc["oomScoreAdj"] = 0
    with open(path + ".rp-tmp", "w") as f:
        json.dump(spec, f)
    os.replace(path + ".rp-tmp", path)
    with open(log, "a") as f:
        f.write(f"{time.strftime('%H:%M:%S')} {os.path.dirname(os.path.abspath(path))}: oomScoreAdj {adj} -> 0\n")
PY
fi
exec $runc "\$@"
EOF
  chmod 755 "$ROOT/runc-wrapper"
}

# record_host: appends to ROOT/host-created the HOST_PATHS that do not exist now (before dockerd starts).
record_host() {
  local p
  for p in "${HOST_PATHS[@]}"; do [ -e "$p" ] || echo "$p"; done >>"$ROOT/host-created"
  sort -u -o "$ROOT/host-created" "$ROOT/host-created"
}

start_dockerd() {
  local pid driver offset
  for driver in overlay2 ''; do
    rm -f "$SOCK" "$ROOT/docker.pid"
    offset=$(stat -c %s "$ROOT/dockerd.log" 2>/dev/null || echo 0)
    PATH=$DAEMON_PATH setsid dockerd --config-file "$ROOT/daemon.json" \
      --data-root "$ROOT/data" --exec-root "$ROOT/exec" -H "unix://$SOCK" --pidfile "$ROOT/docker.pid" \
      --bridge=none --iptables=false --ip-masq=false --ip6tables=false --ip-forward=false --userland-proxy=false \
      --exec-opt native.cgroupdriver=cgroupfs --cgroup-parent "$CGROUP_PARENT" \
      --add-runtime "rp-runc=$ROOT/runc-wrapper" --default-runtime rp-runc \
      ${driver:+--storage-driver "$driver"} </dev/null >>"$ROOT/dockerd.log" 2>&1 &
    pid=$!
    for _ in $(seq 600); do ready && break; live "$pid" || break; sleep 0.05; done
    ready && break
    live "$pid" && { stop_pid "$pid" 5; tail -n 20 "$ROOT/dockerd.log" >&2; die "dockerd did not answer within 30 s"; }
    [ -n "$driver" ] && tail -c +$((offset + 1)) "$ROOT/dockerd.log" | grep -qiE 'overlay|graphdriver|storage.driver' ||
      { tail -n 20 "$ROOT/dockerd.log" >&2; die "dockerd did not come up (see $ROOT/dockerd.log)"; }
    log "dockerd with storage driver $driver failed; retrying with the default driver"
  done
  log "dockerd $(docker_ version --format '{{.Server.Version}}') up: pid $pid, socket $SOCK, storage $(docker_ info --format '{{.Driver}}')"
}

# import_busybox CMD_JSON REF: busybox-static as a one-layer image (hard links, not symlinks: masking e.g.
# /bin/ls must not mask busybox itself).
import_busybox() {
  docker_ image inspect "$2" >/dev/null 2>&1 && return 0
  local d a
  d=$(mktemp -d "$ROOT/tmp.XXXXXX") && mkdir -p "$d"/{bin,etc,tmp,root,proc,sys,dev}
  cp /bin/busybox "$d/bin/busybox"
  for a in $(/bin/busybox --list); do [ -e "$d/bin/$a" ] || ln "$d/bin/busybox" "$d/bin/$a"; done
  echo 'root:x:0:0:root:/root:/bin/sh' >"$d/etc/passwd" && echo 'root:x:0:' >"$d/etc/group"
  chmod 1777 "$d/tmp"
  tar --sort=name --owner=0 --group=0 --numeric-owner -C "$d" -c . |
    docker_ import -c 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' -c 'WORKDIR /' \
      -c "CMD $1" - "$2" >/dev/null
  rm -rf "$d"
  log "imported $2"
}

write_env() {
  printf '%s\n' "DOCKER_SOCK=$SOCK" "DOCKER_CLI=$CLI" \
    "DOCKERD_VERSION=$(docker_ version --format '{{.Server.Version}}')" \
    "DOCKER_API_VERSION=$(docker_ version --format '{{.Server.APIVersion}}')" \
    "DOCKER_TEST_IMAGE=$BUSYBOX_REF" "DOCKER_PAUSE_IMAGE=$PAUSE_REF" \
    "DOCKER_CGROUP_PARENT=$CGROUP_PARENT" "DOCKER_ROOT=$ROOT" | tee "$ROOT/env"
}

up() {
  set_root "$1"
  mkdir -p "$ROOT"
  if [ -n "$(daemon_pid)" ]; then
    ready || die "dockerd pid $(daemon_pid) of $ROOT does not answer; run down first"
    log "dockerd already running in $ROOT"
  else
    # a dockerd that died (kill -9, reboot of the VM) leaves its containerd, shims, containers and mounts behind:
    # a new dockerd would wait for the old containerd, then kill each old container after a 10 s grace period
    [ ! -e "$ROOT/docker.pid" ] || { log "cleaning up after a dead dockerd in $ROOT"; down "$ROOT" || true; }
    need_pkgs "${PKGS[@]}"
    [ -x "$CLI" ] || die "$CLI missing (package docker.io)"
    write_files
    record_host
    start_dockerd
    # containers left by a dockerd that died are of no use to anyone now
    local ids; ids=$(docker_ ps -aq)
    [ -z "$ids" ] || { docker_ rm -f -v $ids >/dev/null && log "removed $(wc -w <<<"$ids") stale containers"; }
  fi
  import_busybox '["/bin/sleep","3600"]' "$BUSYBOX_REF"
  import_busybox '["/bin/sh","-c","trap \"exit 0\" TERM INT; while :; do sleep 3600 & wait; done"]' "$PAUSE_REF"
  write_env
}

# release_host: removes the host paths `up` created, or hands them to another harness dockerd still running.
release_host() {
  [ -s "$ROOT/host-created" ] || return 0
  local d pid other=
  for d in /proc/[0-9]*; do
    pid=${d#/proc/}
    [ "$(cat "$d/comm" 2>/dev/null)" = dockerd ] && live "$pid" || continue
    other=$pid
    local r; r=$(cmdline "$pid" | sed -n 's/.*--data-root \([^ ]*\)\/data .*/\1/p')
    if [ -n "$r" ] && [ -f "$r/host-created" ]; then
      cat "$ROOT/host-created" >>"$r/host-created" && log "host paths handed over to $r" && break
    fi
  done
  if [ -z "$other" ]; then
    while read -r d; do
      if [ -d "$d" ]; then rmdir "$d" 2>/dev/null || true; else rm -f "$d"; fi
    done < <(sort -r "$ROOT/host-created")  # children before parents
  fi
  rm -f "$ROOT/host-created"
}

down() {
  set_root "$1"
  [ -d "$ROOT" ] || { log "nothing in $ROOT"; return 0; }
  local pid ids d id
  pid=$(daemon_pid || true)
  # 1. remove every container (and its anonymous volumes) while dockerd runs
  if [ -n "$pid" ] && ready; then
    ids=$(docker_ ps -aq 2>/dev/null || true)
    [ -z "$ids" ] || docker_ rm -f -v $ids >/dev/null 2>&1 || log "docker rm -f failed for some of: $ids"
  fi
  # 2. SIGTERM dockerd (by pid), SIGKILL after 15 s
  if [ -n "$pid" ]; then stop_pid "$pid" 15 && log "stopped dockerd pid $pid"; fi
  rm -f "$ROOT/docker.pid"
  # 3. its managed containerd (argv "containerd --config ROOT/exec/containerd/..."), then leftover shims whose
  # -address is that containerd's socket, by pid
  for d in /proc/[0-9]*; do
    [[ $(cmdline "${d#/proc/}") == containerd\ *"--config $ROOT/exec/containerd/"* ]] || continue
    log "stopping managed containerd ${d#/proc/}" && stop_pid "${d#/proc/}" 5
  done
  for d in /proc/[0-9]*; do
    [[ $(cmdline "${d#/proc/}") == *containerd-shim*" -address $CTRD_SOCK "* ]] || continue
    log "killing leftover shim ${d#/proc/}" && kill -KILL "${d#/proc/}" 2>/dev/null || true
  done
  # ...whose sockets stay behind in /run/containerd/s/sha256(<containerd socket>/<namespace>/<id>)
  for d in "$ROOT"/exec/containerd/daemon/io.containerd.runtime.v2.task/*/*/; do
    d=${d%/} && [ -d "$d" ] || continue
    rm -f "/run/containerd/s/$(printf '%s' "$CTRD_SOCK/$(basename "${d%/*}")/${d##*/}" | sha256sum | cut -c1-64)"
  done
  # 4. containers orphaned by a dead shim are still known to runc under the runtime roots
  for d in "$ROOT"/exec/runtime-*/*/; do
    [ -d "$d" ] || continue
    for id in $(runc --root "$d" list -q 2>/dev/null); do runc --root "$d" delete --force "$id" >/dev/null 2>&1 || true; done
  done
  # 5. mounts under ROOT (overlays, shm, the netns nsfs mounts that survive dockerd), deepest first
  awk -v r="$ROOT/" 'index($5, r) == 1 {print $5}' /proc/self/mountinfo | sort -r | while read -r d; do
    umount -l "$d" 2>/dev/null || true
  done
  # 6. container cgroups in every hierarchy; rmdir only succeeds on unused ones
  for d in /sys/fs/cgroup/{,*/}"${CGROUP_PARENT#/}"; do
    [ -d "$d" ] && find "$d" -depth -type d -exec rmdir {} + 2>/dev/null || true
  done
  # 7. host paths outside ROOT that `up` created
  release_host
  log "down: $ROOT"
}

case "${1:-}" in
  up) [ $# -eq 2 ] || usage; up "$2" ;;
  down) [ $# -eq 2 ] || usage; down "$2" || true ;;
  purge) [ $# -eq 2 ] || usage; down "$2" || true; rm -rf "$ROOT" && log "purged $ROOT" ;;
  *) usage ;;
esac
