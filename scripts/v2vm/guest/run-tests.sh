#!/bin/bash
# run-tests.sh — runs in the v2vm guest (copied by `scripts/v2vm.sh test` to the share as /mnt/rp/run.sh, started by
# rp-v2vm.service once containerd and D-Bus are up; its output goes to the host).
#
# Waits for containerd's CRI plugin, imports localhost/pause:local and localhost/busybox:local (/mnt/rp/images) into
# namespace k8s.io, writes /run/rp-v2vm/env in scripts/containerd.sh's format plus CGROUP_DRIVER and RUNC_VERSION,
# then runs each test executable named in /mnt/rp/tests ("TARGET EXE" lines; EXE in /mnt/rp-bin/debug/deps) with
# --test-threads=1 and the arguments in /mnt/rp/args (one a line), RP_CONTAINERD_ENV and RP_V2_GUEST=1 set.
# Exit status: 0 when every test executable passed. The guest's journal goes to /mnt/rp/journal.log at the end.
set -uo pipefail
trap 'journalctl -b --no-pager -o short-monotonic >/mnt/rp/journal.log 2>&1' EXIT
BIN=/mnt/rp-bin/debug H=/run/rp-v2vm
log() { echo "[v2vm guest $(cut -d' ' -f1 /proc/uptime)s] $*"; }
die() { log "error: $*"; exit 1; }

ctr_() { ctr --connect-timeout 2s --timeout 60s "$@"; }
for _ in $(seq 600); do ctr_ version >/dev/null 2>&1 && break; sleep 0.1; done
ctr_ version >/dev/null || { journalctl -u containerd --no-pager | tail -n 30; die "containerd does not answer"; }
for _ in $(seq 100); do ctr_ plugins ls | awk '$2 == "cri" && $NF == "ok" {ok = 1} END {exit !ok}' && break; sleep 0.1; done
ctr_ plugins ls | awk '$2 == "cri" && $NF == "ok" {ok = 1} END {exit !ok}' || { ctr_ plugins ls; die "containerd's CRI plugin is not ok"; }
for i in pause busybox; do ctr_ -n k8s.io images import /mnt/rp/images/$i.tar >/dev/null || die "importing $i.tar"; done

mkdir -p "$H/logs"
systemctl show -p MainPID --value containerd >"$H/containerd.pid"
printf '%s\n' "CONTAINERD_SOCK=/run/containerd/containerd.sock" \
  "CONTAINERD_VERSION=$(containerd --version | awk '{print $3}')" \
  "CRI_SANDBOX_IMAGE=localhost/pause:local" "CRI_TEST_IMAGE=localhost/busybox:local" \
  "CRI_CGROUP_PARENT=kubepods.slice" "CRI_LOG_ROOT=$H/logs" "CONTAINERD_ROOT=$H" \
  "NRI_SOCKET=/var/run/nri/nri.sock" "CGROUP_DRIVER=systemd" \
  "RUNC_VERSION=$(runc --version | awk 'NR == 1 {print $3}')" >"$H/env"
log "ready: kernel $(uname -r), systemd $(systemctl --version | awk 'NR == 1 {print $2}'), $(stat -fc %T /sys/fs/cgroup)" \
  "(root's subtree_control: $(cat /sys/fs/cgroup/cgroup.subtree_control)); $H/env:"
sed 's/^/    /' "$H/env"

export RP_CONTAINERD_ENV=$H/env RP_V2_GUEST=1 RUST_BACKTRACE=1
args=()
if [ -s /mnt/rp/args ]; then mapfile -t args </mnt/rp/args; fi
rc=0
while read -r target exe; do
  log "test target $target ($exe)"
  (cd /tmp && "$BIN/deps/$exe" --test-threads=1 "${args[@]}") </dev/null 2>&1
  r=$?
  [ $r -eq 0 ] || { log "test target $target failed (exit status $r)"; rc=1; }
done </mnt/rp/tests
exit $rc
