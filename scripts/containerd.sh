#!/usr/bin/env bash
# containerd.sh — a throw-away, registry-free containerd + runc (CRI plugin on) for the proxy's integration tests.
#
#   scripts/containerd.sh up VERSION ROOT   VERSION 1.6 = Debian bookworm's package (/usr/bin/containerd),
#                                           VERSION 1.7 = Debian trixie's containerd .deb, downloaded once and
#                                           unpacked into the cache (never installed); runc stays bookworm's.
#                                           VERSION 2.1 = Debian sid's containerd 2.1.x .deb, the same way (refused if
#                                           sid offers another series); native version-3 config, CRI v1 only.
#   RP_NRI=1 scripts/containerd.sh up 1.7|2.1 ROOT  the same with containerd's NRI on: socket ROOT/run/nri.sock,
#                                           registration timeout 5 s, request timeout 2 s; NRI_SOCKET in ROOT/env
#                                           (without RP_NRI=1, 2.1's NRI, on by default, is switched off)
#   scripts/containerd.sh down ROOT         stop everything started for ROOT (never fails; keeps ROOT and cache)
#   scripts/containerd.sh purge ROOT        down + rm -rf ROOT
#
# `up` installs missing packages (containerd runc busybox-static gcc libc6-dev), builds localhost/pause:local and
# localhost/busybox:local, starts containerd (log: ROOT/containerd.log), waits for its CRI plugin and imports the
# images into namespace k8s.io; if ROOT's containerd already runs it does nothing else. It then writes ROOT/env and
# prints it on stdout: CONTAINERD_SOCK CONTAINERD_VERSION CRI_SANDBOX_IMAGE CRI_TEST_IMAGE CRI_CGROUP_PARENT
# CRI_LOG_ROOT CONTAINERD_ROOT (KEY=VALUE lines). Pods must use a cgroup_parent under $CRI_CGROUP_PARENT and host
# (NODE) network with an empty hostname (no CNI). Instances in different ROOTs run side by side.
# Cache (images, trixie's and sid's containerd): $RP_CACHE, default /var/cache/runtime-proxy. Diagnostics go to
# stderr. The trixie and sid .debs come from the Debian archive this machine's apt sources name (none named:
# `up 1.7`/`up 2.1` fails, unless the cache holds that containerd already); the script names no archive of its own.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"  # need_pkgs

PAUSE_REF=localhost/pause:local
BUSYBOX_REF=localhost/busybox:local
CACHE=${RP_CACHE:-/var/cache/runtime-proxy}
NRI=${RP_NRI:-0}
PKGS=(containerd runc busybox-static gcc libc6-dev)
BASE_PATH=$PATH

log() { echo "[containerd.sh] $*" >&2; }
die() { log "error: $*"; exit 1; }
usage() { sed -n '4,13s/^# //p' "$0" >&2; exit 2; }

# set_root ROOT: absolute ROOT and everything derived from it; 1.7 and 2.1 put their own binaries first on PATH.
set_root() {
  ROOT=$(realpath -m "$1")
  [ "$ROOT" != / ] || die "ROOT must not be /"
  SOCK=$ROOT/run/containerd.sock
  CGROUP_PARENT=/rp-test-$(basename "$ROOT")
  [ ${#SOCK} -lt 100 ] || die "ROOT too long for a unix socket path: $SOCK"
  local v; v=$(cat "$ROOT/version" 2>/dev/null || true)
  PATH=$BASE_PATH && [ "$v" != 1.7 ] && [ "$v" != 2.1 ] || PATH=$CACHE/containerd-$v/usr/bin:$PATH
}
ctr_() { ctr --address "$SOCK" --connect-timeout 2s --timeout 60s "$@"; }
ready() { [ -S "$SOCK" ] && ctr_ version >/dev/null 2>&1; }  # (ctr alone waits 10 s for a missing socket)
# live PID (not a zombie: PID 1 on our VMs reaps orphans only after ~1.5 s, so `kill -0` would lie)
live() { [[ $(cat "/proc/$1/stat" 2>/dev/null) =~ \)\ [^Z] ]]; }
# daemon_pid: prints the pid of ROOT's containerd if it is alive (checked against its command line).
daemon_pid() {
  local pid; pid=$(cat "$ROOT/containerd.pid" 2>/dev/null) || return 1
  tr '\0' ' ' 2>/dev/null <"/proc/$pid/cmdline" | grep -qF -- "--config $ROOT/config.toml" && echo "$pid"
}

# apt_archive: "URI KEYRING" of the Debian archive this machine's apt uses, read from apt's own source lists
# (sources.list and sources.list.d/*.list, one-line format; sources.list.d/*.sources, deb822; in apt's order;
# APT_CONFIG is honoured): the first `deb` entry for this release's suite (VERSION_CODENAME in /etc/os-release),
# else the first `deb` entry that is not a security archive. KEYRING is the entry's Signed-By file, else Debian's
# archive keyring. Prints nothing when apt has no such entry.
apt_archive() {
  local sl sp codename f
  eval "$(apt-config shell sl Dir::Etc::sourcelist/f sp Dir::Etc::sourceparts/d)"
  codename=$(. /etc/os-release 2>/dev/null && echo "${VERSION_CODENAME:-}")
  {
    [ ! -f "${sl:-}" ] || awk -v format=list -f <(apt_sources_awk) "$sl"
    for f in "${sp%/}"/*; do
      case $f in
        *.list) awk -v format=list -f <(apt_sources_awk) "$f" ;;
        *.sources) awk -v format=deb822 -f <(apt_sources_awk) "$f" ;;
      esac
    done
  } | awk -v codename="$codename" '
      $1 == codename && !found { found = $2 " " $3 }
      $1 !~ /-security$/ && $2 !~ /security/ && !other { other = $2 " " $3 }
      END { if (found) print found; else if (other) print other }'
}
# apt_sources_awk: an awk program printing "SUITE URI KEYRING" ("-" for no Signed-By) for each suite of each
# enabled `deb` entry of one source file (format=list or format=deb822).
apt_sources_awk() {
  cat <<'AWK'
function emit(uris, suites, key,    u, s, nu, ns, i, j) {
  nu = split(uris, u, " "); ns = split(suites, s, " ")
  for (i = 1; i <= nu; i++) for (j = 1; j <= ns; j++) print s[j], u[i], (key == "" ? "-" : key)
}
format == "list" {
  sub(/#.*/, ""); if ($1 != "deb") next
  i = 2; key = ""
  if ($2 ~ /^\[/) {  # [opt=value ...]
    for (; i <= NF; i++) { if ($i ~ /^\[?signed-by=/) { key = $i; sub(/^\[?signed-by=/, "", key); sub(/\]$/, "", key) }
                           if ($i ~ /\]$/) { i++; break } }
  }
  emit($i, $(i + 1), key); next
}
format == "deb822" {
  if ($0 ~ /^[ \t]*$/) { flush(); next }
  if ($0 ~ /^#/ || $0 ~ /^[ \t]/) next  # comments; continuation lines (an inline key is not a file)
  field = tolower($1); sub(/:$/, "", field); value = $0; sub(/^[^:]*:[ \t]*/, "", value)
  if (field == "types") types = value; else if (field == "uris") uris = value; else if (field == "suites") suites = value
  else if (field == "signed-by" && value ~ /^\//) key = value; else if (field == "enabled") enabled = tolower(value)
}
function flush() {
  if (format == "deb822" && (" " types " ") ~ / deb / && enabled != "no") emit(uris, suites, key)
  types = uris = suites = key = enabled = ""
}
END { flush() }
AWK
}

# fetch_containerd SERIES: Debian's containerd SERIES.x (1.7: trixie's, 2.1: sid's) downloaded once into
# $CACHE/containerd-SERIES: apt pointed at a private source list for that suite (on the archive this machine's apt
# uses), `download`, `dpkg-deb -x`. Bookworm's runc stays in use (a newer suite's runc needs a newer glibc), so an
# unpacked usr/bin/runc is removed. A package of another series is refused, naming the version found.
fetch_containerd() {
  local series=$1 suite dst=$CACHE/containerd-$1 apt uri key deb ver
  case $series in 1.7) suite=trixie ;; 2.1) suite=sid ;; *) die "no Debian suite known for containerd $series" ;; esac
  apt=$CACHE/apt-$suite
  [ -x "$dst/usr/bin/containerd" ] && return 0
  read -r uri key < <(apt_archive) || true
  [ -n "${uri:-}" ] ||
    die "apt's sources (/etc/apt/sources.list, sources.list.d/*.list and *.sources) name no Debian archive to download containerd $series from: add one, or unpack a containerd $series .deb into $dst (dpkg-deb -x)"
  [ "$key" != - ] || key=/usr/share/keyrings/debian-archive-keyring.gpg
  log "downloading containerd $series from Debian $suite ($uri)"
  rm -rf "$apt" && mkdir -p "$apt/sources" "$apt/lists/partial" "$apt/cache/archives/partial" "$apt/deb"
  printf 'Types: deb\nURIs: %s\nSuites: %s\nComponents: main\nSigned-By: %s\n' "$uri" "$suite" "$key" >"$apt/sources/$suite.sources"
  local o=(-q -o Dir::Etc::SourceList=/dev/null -o "Dir::Etc::SourceParts=$apt/sources" -o "Dir::State::Lists=$apt/lists"
           -o "Dir::Cache=$apt/cache" -o APT::Sandbox::User=root)
  apt-get "${o[@]}" update </dev/null >/dev/null
  (cd "$apt/deb" && apt-get "${o[@]}" download containerd </dev/null >/dev/null)
  deb=$(echo "$apt"/deb/containerd_*.deb) && ver=$(dpkg-deb -f "$deb" Version)
  if [[ $ver != "$series".* ]]; then
    rm -rf "$apt"
    die "Debian $suite offers containerd $ver, not $series.x: this harness is pinned to the $series series" \
      "(unpack a containerd $series .deb into $dst with dpkg-deb -x to use one from elsewhere)"
  fi
  rm -rf "$dst.tmp" && dpkg-deb -x "$deb" "$dst.tmp" && rm -f "$dst.tmp/usr/bin/runc" && mv "$dst.tmp" "$dst" && rm -rf "$apt"
  log "cached $("$dst/usr/bin/containerd" --version) in $dst"
}

# mkimage OUT REF ROOTFS CONFIG: a deterministic single-layer docker-archive ("docker save" layout).
mkimage() {
  local out=$1 ref=$2 rootfs=$3 conf=$4 w layer cfg
  local tarx=(tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner)
  w=$(mktemp -d "$CACHE/tmp.XXXXXX")
  "${tarx[@]}" -C "$rootfs" -cf "$w/layer.tar" .
  layer=$(sha256sum "$w/layer.tar" | cut -d' ' -f1)
  mkdir "$w/$layer" && mv "$w/layer.tar" "$w/$layer/layer.tar"
  printf '{"architecture":"%s","os":"linux","created":"1970-01-01T00:00:00Z","config":%s,"rootfs":{"type":"layers","diff_ids":["sha256:%s"]}}' \
    "$(dpkg --print-architecture)" "$conf" "$layer" >"$w/config.json"
  cfg=$(sha256sum "$w/config.json" | cut -d' ' -f1)
  mv "$w/config.json" "$w/$cfg.json"
  printf '[{"Config":"%s.json","RepoTags":["%s"],"Layers":["%s/layer.tar"]}]' "$cfg" "$ref" "$layer" >"$w/manifest.json"
  "${tarx[@]}" -C "$w" -cf "$w/image.tar" manifest.json "$cfg.json" "$layer"
  mv "$w/image.tar" "$out" && rm -rf "$w"
}

build_images() {
  local env='"Env":["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],"WorkingDir":"/"' d a
  if [ ! -s "$CACHE/images/pause.tar" ]; then
    log "building $PAUSE_REF"
    d=$(mktemp -d "$CACHE/tmp.XXXXXX") && mkdir "$d/rootfs"
    # pause: exits 0 on SIGINT/SIGTERM, reaps children, sleeps otherwise.
    gcc -Os -static -s -o "$d/rootfs/pause" -x c - <<'EOF'
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
static void quit(int s) { (void)s; _exit(0); }
static void reap(int s) { (void)s; while (waitpid(-1, 0, WNOHANG) > 0) {} }
int main(void) {
  struct sigaction q = {.sa_handler = quit}, r = {.sa_handler = reap, .sa_flags = SA_NOCLDSTOP};
  sigaction(SIGINT, &q, 0); sigaction(SIGTERM, &q, 0); sigaction(SIGCHLD, &r, 0);
  for (;;) pause();
}
EOF
    mkimage "$CACHE/images/pause.tar" "$PAUSE_REF" "$d/rootfs" "{$env,\"Entrypoint\":[\"/pause\"]}"
    rm -rf "$d"
  fi
  if [ ! -s "$CACHE/images/busybox.tar" ]; then
    log "building $BUSYBOX_REF"
    d=$(mktemp -d "$CACHE/tmp.XXXXXX") && mkdir -p "$d"/{bin,etc,tmp,root,proc,sys,dev}
    cp /bin/busybox "$d/bin/busybox"
    # hard links, not symlinks: masking e.g. /bin/ls must not mask busybox itself
    for a in $(/bin/busybox --list); do [ -e "$d/bin/$a" ] || ln "$d/bin/busybox" "$d/bin/$a"; done
    echo 'root:x:0:0:root:/root:/bin/sh' >"$d/etc/passwd" && echo 'root:x:0:' >"$d/etc/group"
    chmod 1777 "$d/tmp"
    mkimage "$CACHE/images/busybox.tar" "$BUSYBOX_REF" "$d" "{$env,\"Cmd\":[\"sh\"]}"
    rm -rf "$d"
  fi
}

# config_version: the config version the containerd on PATH writes itself (`containerd config default`'s
# `version = N`: 2 for 1.6/1.7, 3 for 2.0-2.2, 4 for 2.3+); a config of an older version is migrated at every start
# (containerd 2.x logs "Configuration migrated from version N"), so the script writes the runtime's own.
config_version() {
  containerd config default 2>/dev/null | awk '$1 == "version" && $2 == "=" { print $3; found = 1; exit } END { if (!found) print 2 }'
}

# write_config: ROOT/config.toml in the format of the runtime's own `config default` (1.6, 1.7: version 2; 2.1:
# version 3), NRI section when RP_NRI=1.
write_config() {
  mkdir -p "$ROOT"/{root,state,run,runc,opt,logs,cni/bin,cni/net.d,certs.d}
  local v; v=$(config_version)
  case $v in
    2) config_v2 ;;
    3) config_v3 ;;
    *) die "containerd $VERSION writes config version $v, which this script has no layout for (it knows 2 and 3)" ;;
  esac >"$ROOT/config.toml"
  # 2.x has NRI on by default (socket /var/run/nri/nri.sock): off unless asked for, so nothing leaves ROOT
  if [ "$NRI" != 1 ]; then
    [ "$VERSION" != 2.1 ] || printf '[plugins."io.containerd.nri.v1.nri"]\n  disable = true\n' >>"$ROOT/config.toml"
    return 0
  fi
  mkdir -p "$ROOT/nri/plugins" "$ROOT/nri/conf.d"
  cat >>"$ROOT/config.toml" <<EOF
[plugins."io.containerd.nri.v1.nri"]
  disable = false
  disable_connections = false
  socket_path = "$ROOT/run/nri.sock"
  plugin_path = "$ROOT/nri/plugins"
  plugin_config_path = "$ROOT/nri/conf.d"
  plugin_registration_timeout = "5s"
  plugin_request_timeout = "2s"
EOF
}

# config_v2: containerd 1.6/1.7's CRI plugin (io.containerd.grpc.v1.cri), on stdout.
config_v2() {
  local cri='plugins."io.containerd.grpc.v1.cri"'
  cat <<EOF
version = 2
root = "$ROOT/root"
state = "$ROOT/state"
grpc = { address = "$SOCK" }
ttrpc = { address = "$SOCK.ttrpc" }
debug = { address = "$ROOT/run/debug.sock" }
[plugins."io.containerd.internal.v1.opt"]
  path = "$ROOT/opt"
[$cri]
  sandbox_image = "$PAUSE_REF"
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  disable_apparmor = true
  # REQUIRED here: CAP_SYS_RESOURCE is not in the bounding set, so runc cannot give the sandbox
  # oom_score_adj=-998 (RunPodSandbox would fail: "can't get final child's PID from pipe: EOF")
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  cni = { bin_dir = "$ROOT/cni/bin", conf_dir = "$ROOT/cni/net.d" }
  registry = { config_path = "$ROOT/certs.d" }
[$cri.containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"
[$cri.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
  options = { SystemdCgroup = false, Root = "$ROOT/runc" }
EOF
}

# config_v3: containerd 2.x's native config, the same settings as config_v2 with the CRI plugin split into
# io.containerd.cri.v1.runtime (runtimes, CNI, security), io.containerd.cri.v1.images (snapshotter, sandbox
# image, registry) and io.containerd.grpc.v1.cri (the stream server), on stdout. CDI specs are read from ROOT/cdi.
config_v3() {
  local rt='plugins."io.containerd.cri.v1.runtime"' im='plugins."io.containerd.cri.v1.images"'
  cat <<EOF
version = 3
root = "$ROOT/root"
state = "$ROOT/state"
grpc = { address = "$SOCK" }
ttrpc = { address = "$SOCK.ttrpc" }
debug = { address = "$ROOT/run/debug.sock" }
[plugins."io.containerd.internal.v1.opt"]
  path = "$ROOT/opt"
[plugins."io.containerd.grpc.v1.cri"]
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
[$im]
  snapshotter = "overlayfs"
  pinned_images = { sandbox = "$PAUSE_REF" }
  registry = { config_path = "$ROOT/certs.d" }
[$rt]
  disable_apparmor = true
  # REQUIRED here: CAP_SYS_RESOURCE is not in the bounding set, so runc cannot give the sandbox
  # oom_score_adj=-998 (RunPodSandbox would fail: "can't get final child's PID from pipe: EOF")
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  cdi_spec_dirs = ["$ROOT/cdi"]
  cni = { bin_dirs = ["$ROOT/cni/bin"], conf_dir = "$ROOT/cni/net.d" }
[$rt.containerd]
  default_runtime_name = "runc"
[$rt.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
  options = { SystemdCgroup = false, Root = "$ROOT/runc" }
EOF
}

start_containerd() {
  local pid && rm -f "$SOCK" "$SOCK.ttrpc" "$ROOT/run/debug.sock"
  setsid containerd --config "$ROOT/config.toml" </dev/null >>"$ROOT/containerd.log" 2>&1 &
  pid=$! && echo "$pid" >"$ROOT/containerd.pid"
  for _ in $(seq 400); do ready && break; live "$pid" || break; sleep 0.05; done
  ready || { tail -n 20 "$ROOT/containerd.log" >&2; die "containerd did not come up"; }
  ctr_ plugins ls | awk '$2 == "cri" && $NF == "ok" {ok = 1} END {exit !ok}' ||
    { ctr_ plugins ls >&2; die "CRI plugin is not ok (see $ROOT/containerd.log)"; }
  log "containerd $VERSION up: pid $pid, socket $SOCK"
  ! grep -qi 'migrat' "$ROOT/containerd.log" ||
    log "warning: containerd migrated ROOT/config.toml at start (its version is not the runtime's own):" \
      "$(grep -i -m1 'migrat' "$ROOT/containerd.log")"
}

nri_on() { grep -qF "socket_path = \"$ROOT/run/nri.sock\"" "$ROOT/config.toml" 2>/dev/null; }

write_env() {
  printf '%s\n' "CONTAINERD_SOCK=$SOCK" "CONTAINERD_VERSION=$(containerd --version | awk '{print $3}')" \
    "CRI_SANDBOX_IMAGE=$PAUSE_REF" "CRI_TEST_IMAGE=$BUSYBOX_REF" "CRI_CGROUP_PARENT=$CGROUP_PARENT" \
    "CRI_LOG_ROOT=$ROOT/logs" "CONTAINERD_ROOT=$ROOT" $(nri_on && echo "NRI_SOCKET=$ROOT/run/nri.sock") | tee "$ROOT/env"
}

up() {
  VERSION=$1
  case $VERSION in 1.6 | 1.7 | 2.1) ;; *) die "VERSION must be 1.6, 1.7 or 2.1, not '$VERSION'" ;; esac
  [ "$NRI" = 0 ] || [ "$VERSION" != 1.6 ] || die "RP_NRI=1 needs containerd 1.7 or 2.1 (1.6 has no NRI)"
  set_root "$2"
  mkdir -p "$ROOT"
  if [ -n "$(daemon_pid)" ]; then
    local was; was=$(cat "$ROOT/version" 2>/dev/null || true)
    [ "$was" = "$VERSION" ] || die "$ROOT already runs containerd $was; run down first"
    [ "$NRI" = "$(nri_on && echo 1 || echo 0)" ] || die "$ROOT already runs containerd with NRI $(nri_on && echo on || echo off); run down first"
    ready || die "containerd pid $(daemon_pid) of $ROOT does not answer; run down first"
    log "containerd $VERSION already running in $ROOT"
  else
    # one instance at a time installs, downloads and builds images (fd 9 is closed before containerd starts)
    mkdir -p "$CACHE/images" && exec 9>"$CACHE/.lock" && flock 9
    need_pkgs "${PKGS[@]}"
    [ "$VERSION" = 1.6 ] || fetch_containerd "$VERSION"
    build_images
    exec 9>&-
    echo "$VERSION" >"$ROOT/version"
    set_root "$ROOT"
    write_config
    start_containerd
    local have; have=$(ctr_ -n k8s.io images ls -q)
    grep -qxF "$PAUSE_REF" <<<"$have" || ctr_ -n k8s.io images import "$CACHE/images/pause.tar" >/dev/null
    grep -qxF "$BUSYBOX_REF" <<<"$have" || ctr_ -n k8s.io images import "$CACHE/images/busybox.tar" >/dev/null
  fi
  write_env
}

down() {
  set_root "$1"
  [ -d "$ROOT" ] || { log "nothing in $ROOT"; return 0; }
  local pid ns id ids d args
  pid=$(daemon_pid || true)
  # 1. kill and delete every task (this makes the shims exit), then delete the containers
  if [ -n "$pid" ] && ready; then
    for ns in $(ctr_ namespaces ls -q 2>/dev/null); do
      for id in $(ctr_ -n "$ns" tasks ls -q 2>/dev/null); do ctr_ -n "$ns" tasks kill -s SIGKILL "$id" >/dev/null 2>&1 || true; done
      # re-list until none is left: the CRI plugin itself deletes most of them as their exits arrive
      for _ in $(seq 40); do
        ids=$(ctr_ -n "$ns" tasks ls -q 2>/dev/null || true) && [ -n "$ids" ] || break
        for id in $ids; do ctr_ -n "$ns" tasks delete -f "$id" >/dev/null 2>&1 || true; done
        sleep 0.05
      done
      for id in $(ctr_ -n "$ns" containers ls -q 2>/dev/null); do ctr_ -n "$ns" containers delete "$id" >/dev/null 2>&1 || true; done
    done
  fi
  # 2. SIGTERM containerd (by pid), SIGKILL after 5 s
  if [ -n "$pid" ]; then
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 100); do live "$pid" || break; sleep 0.05; done
    live "$pid" && kill -KILL "$pid" 2>/dev/null || true
    log "stopped containerd pid $pid"
  fi
  rm -f "$ROOT/containerd.pid"
  # 3. leftover shims serving our socket (argv "... -address $SOCK ..."), by pid
  for d in /proc/[0-9]*; do
    args=$(tr '\0' ' ' 2>/dev/null <"$d/cmdline") || continue
    [[ $args == *containerd-shim*" -address $SOCK "* ]] || continue
    log "killing leftover shim ${d#/proc/}" && kill -KILL "${d#/proc/}" 2>/dev/null || true
  done
  # ...whose sockets stay behind in /run/containerd/s/sha256(<our socket>/<namespace>/<id>)
  for d in "$ROOT"/state/io.containerd.runtime.v2.task/*/*/; do
    d=${d%/} && [ -d "$d" ] || continue
    rm -f "/run/containerd/s/$(printf '%s' "$SOCK/$(basename "${d%/*}")/${d##*/}" | sha256sum | cut -c1-64)"
  done
  # 4. containers orphaned by a dead shim are still known to runc under our own runc root
  for d in "$ROOT"/runc/*/; do
    for id in $(runc --root "$d" list -q 2>/dev/null); do runc --root "$d" delete --force "$id" >/dev/null 2>&1 || true; done
  done
  # 5. mounts under ROOT (rootfs overlays, shm, netns), deepest first
  awk -v r="$ROOT/" 'index($5, r) == 1 {print $5}' /proc/self/mountinfo | sort -r | while read -r d; do
    umount -l "$d" 2>/dev/null || true
  done
  # 6. pod cgroups (kubelet would remove them) in every hierarchy; rmdir only succeeds on unused ones
  for d in /sys/fs/cgroup/{,*/}{"${CGROUP_PARENT#/}",k8s.io}; do
    [ -d "$d" ] && find "$d" -depth -type d -exec rmdir {} + 2>/dev/null || true
  done
  log "down: $ROOT"
}

# Sourced (scripts/v2vm/lib.sh: apt_archive, build_images), it only defines the functions above.
[ "${BASH_SOURCE[0]}" = "$0" ] || return 0
case "${1:-}" in
  up) [ $# -eq 3 ] || usage; up "$2" "$3" ;;
  down) [ $# -eq 2 ] || usage; down "$2" ;;
  purge) [ $# -eq 2 ] || usage; down "$2" && rm -rf "$ROOT" && log "purged $ROOT" ;;
  *) usage ;;
esac
