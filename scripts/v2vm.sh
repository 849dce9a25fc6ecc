#!/usr/bin/env bash
# v2vm.sh — integration tests on a real cgroup v2 node: a qemu guest (software CPU) with Debian's kernel, systemd as
# PID 1 and containerd 2.1 + runc 1.3 with the systemd cgroup driver (this machine's own kernel is cgroup v1).
#
#   scripts/v2vm.sh image                     build the guest once (scripts/v2vm/build-image.sh; ~2 min), cached in
#                                             $RP_CACHE/v2vm (default /var/cache/runtime-proxy/v2vm) under a hash of
#                                             the scripts (a change rebuilds it); prints its dir
#   scripts/v2vm.sh test TARGET... [-- ARG...]  build the integration test targets TARGET (crates/*/tests/TARGET.rs
#                                             or TARGET/main.rs; the guest's are named v2_*) and the workspace's
#                                             binaries and examples on this machine, boot the guest, run each target
#                                             there (--test-threads=1, then ARGs: a test name filter, --nocapture)
#                                             and print its output; exits non-zero when a test failed or the guest did
#                                             not finish within RP_V2VM_LIMIT seconds (default 900)
#   scripts/v2vm.sh shell [TARGET...]         the same, with the guest's console on this terminal and the guest kept
#                                             up afterwards (root logged in; `poweroff` ends it), for debugging
#
# In the guest the tests find RP_V2_GUEST=1 and RP_CONTAINERD_ENV=/run/rp-v2vm/env (scripts/containerd.sh's keys, plus
# CGROUP_DRIVER=systemd and RUNC_VERSION); the binaries sit in /mnt/rp-bin/debug as in target/debug (debug info
# stripped). The last run's out.log (the tests' output), journal.log (the guest's journal) and console.log (its serial
# console) are kept in $RP_CACHE/v2vm/last (RP_V2VM_KEEP=1 keeps the whole share dir). Needs root; installs its host
# packages with apt-get; changes nothing else on this machine.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/v2vm/lib.sh
. scripts/v2vm/lib.sh

usage() { sed -n '5,16s/^# \{0,1\}//p' "$0" >&2; exit 2; }

# executables: the "executable" paths of cargo's compiler-artifact messages (--message-format=json) on stdin.
executables() { grep '"reason":"compiler-artifact"' | grep -o '"executable":"[^"]*"' | cut -d'"' -f4; }

# prepare SHARE TARGET... [-- ARG...]: builds the targets, fills SHARE/bin (stripped copies of the test executables,
# the workspace's binaries and examples, laid out as target/debug) and SHARE/rp (the guest's script, the test list,
# the arguments, the images).
prepare() {
  local share=$1 locked=() targets=() args=() t exe f bins tests
  shift
  while [ $# -gt 0 ]; do
    [ "$1" != -- ] || { shift; args=("$@"); break; }
    targets+=("$1") && shift
  done
  [ -f Cargo.lock ] && locked=(--locked)
  mkdir -p "$share/rp/images" "$share/bin/debug/deps" "$share/bin/debug/examples"
  # the images scripts/containerd.sh builds for the host's containerd (one builder, one cache)
  mkdir -p "$CACHE/images"
  (exec 9>"$CACHE/.lock" && flock 9 && need_pkgs busybox-static gcc libc6-dev && build_images)
  cp "$CACHE/images/pause.tar" "$CACHE/images/busybox.tar" "$share/rp/images/"

  v2log "cargo build --workspace --bins --examples; cargo test --no-run ${targets[*]/#/--test }"
  bins=$(cargo build "${locked[@]}" --workspace --bins --examples --message-format=json-render-diagnostics | executables)
  tests=
  [ ${#targets[@]} -eq 0 ] ||
    tests=$(cargo test "${locked[@]}" --workspace --no-run --message-format=json-render-diagnostics "${targets[@]/#/--test=}" | executables)
  for f in $bins; do
    case $f in */examples/*) exe=examples/${f##*/} ;; *) exe=${f##*/} ;; esac
    objcopy --strip-debug "$f" "$share/bin/debug/$exe"
  done
  for t in "${targets[@]}"; do
    exe=$(grep -E "/deps/${t}-[0-9a-f]+$" <<<"$tests" | head -n 1) || v2die "cargo built no test executable for $t"
    objcopy --strip-debug "$exe" "$share/bin/debug/deps/${exe##*/}"
    echo "$t ${exe##*/}" >>"$share/rp/tests"
  done
  touch "$share/rp/tests"
  v2log "share: $(du -sh "$share/bin" | cut -f1) of binaries; tests: $(cut -d' ' -f1 "$share/rp/tests" | paste -sd' ')"
  [ ${#args[@]} -eq 0 ] || printf '%s\n' "${args[@]}" >"$share/rp/args"
  install -m 755 scripts/v2vm/guest/run-tests.sh "$share/rp/run.sh"
}

# run_guest MODE TARGET...: image, prepare, boot (MODE test or shell); keeps the logs in $V2VM_CACHE/last.
run_guest() {
  local mode=$1 img share rc=0
  shift
  need_pkgs "${V2VM_RUN_PKGS[@]}"
  img=$(scripts/v2vm/build-image.sh | tail -n 1)
  share=$(mktemp -d "${TMPDIR:-/tmp}/rp-v2vm.XXXXXX")
  # shellcheck disable=SC2064  # the dir is known now
  [ "${RP_V2VM_KEEP:-0}" = 1 ] || trap "rm -rf '$share'" EXIT
  prepare "$share" "$@"
  V2VM_SECONDS=$SECONDS RP_V2VM_INTERACTIVE=$([ "$mode" = shell ] && echo 1 || echo 0) scripts/v2vm/run.sh "$img" "$share" || rc=$?
  mkdir -p "$V2VM_CACHE/last"
  rm -f "$V2VM_CACHE"/last/*.log
  cp "$share/rp/out.log" "$share/rp/journal.log" "$share/console.log" "$V2VM_CACHE/last/" 2>/dev/null || true
  [ $rc -eq 0 ] || v2log "this run's logs: $V2VM_CACHE/last/{out,journal,console}.log"
  [ "${RP_V2VM_KEEP:-0}" != 1 ] || v2log "kept the share: $share"
  return $rc
}

case "${1:-}" in
  image) [ $# -eq 1 ] || usage; scripts/v2vm/build-image.sh ;;
  test) if [ $# -lt 2 ] || [ "$2" = -- ]; then usage; fi; shift; run_guest test "$@" ;;
  shell) shift; run_guest shell "$@" ;;
  *) usage ;;
esac
