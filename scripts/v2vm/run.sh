#!/usr/bin/env bash
# run.sh IMG SHARE — boots the guest of build-image.sh (IMG: its dir) once, through `scripts/v2vm.sh test|shell`.
#
# qemu's software CPU (TCG: this machine's KVM cannot run a stock kernel at a usable speed), 2 vCPUs, 1 GiB
# (RP_V2VM_CPUS, RP_V2VM_MEM in MiB), no network, root.img with snapshot=on (writes go to a temp file: every boot
# starts from the image). Two 9p shares: SHARE/rp is the guest's /mnt/rp (read-write, cache=none: scripts in,
# results out) and SHARE/bin its /mnt/rp-bin (read-only, cache=loose: executables). The guest's rp-v2vm.service runs
# SHARE/rp/run.sh once containerd and D-Bus are up, appends its output to SHARE/rp/out.log, writes its exit status to
# SHARE/rp/rc and powers off; qemu then exits by itself.
#
# Prints out.log as it grows, then exits with the status in rc: 124 when the guest did not finish within
# RP_V2VM_LIMIT seconds (default 900; qemu is killed), 1 when it stopped without a status; both print the serial
# console's last lines (all of it: SHARE/console.log; the guest's journal: SHARE/rp/journal.log).
# RP_V2VM_INTERACTIVE=1: the console is this terminal (root logged in) and the guest stays up after run.sh
# (SHARE/rp/keep-running) until `poweroff` (or Ctrl-A X); no time limit.
set -euo pipefail
# shellcheck source=scripts/v2vm/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
[ $# -eq 2 ] || { sed -n '2,15s/^# \{0,1\}//p' "$0" >&2; exit 2; }
IMG=$1 SHARE=$(realpath "$2") SECONDS=${V2VM_SECONDS:-0}  # (v2log's clock goes on from scripts/v2vm.sh's)
LIMIT=${RP_V2VM_LIMIT:-900} INTERACTIVE=${RP_V2VM_INTERACTIVE:-0}
[ -f "$IMG/ok" ] || v2die "no guest image in $IMG (scripts/v2vm.sh image makes one)"
[ -x "$SHARE/rp/run.sh" ] || v2die "$SHARE has no rp/run.sh"
[ -d "$SHARE/bin" ] || v2die "$SHARE has no bin/"
need_pkgs "${V2VM_RUN_PKGS[@]}"

OUT=$SHARE/rp/out.log CONSOLE=$SHARE/console.log
rm -f "$SHARE/rp/rc" "$CONSOLE" && : >"$OUT"
# shellcheck disable=SC2054  # commas inside qemu's options
QEMU=(qemu-system-x86_64 -accel tcg,thread=multi,tb-size=256 -cpu max -machine q35 -smp "${RP_V2VM_CPUS:-2}"
      -m "${RP_V2VM_MEM:-1024}" -nographic -nodefaults -no-reboot -nic none
      -kernel "$IMG/vmlinux" -initrd "$IMG/initrd.gz"
      -append "console=ttyS0 root=/dev/vda rw quiet panic=-1 mitigations=off systemd.unified_cgroup_hierarchy=1"
      -drive "file=$IMG/root.img,if=virtio,format=raw,snapshot=on"
      -virtfs "local,path=$SHARE/rp,mount_tag=rp,security_model=none,id=rp"
      -virtfs "local,path=$SHARE/bin,mount_tag=rp-bin,security_model=none,readonly=on,id=rp-bin")

if [ "$INTERACTIVE" = 1 ]; then
  touch "$SHARE/rp/keep-running"
  v2log "booting the guest; its console follows (root logged in; the tests' output: /mnt/rp/out.log, printed here" \
    "when the guest is off; \`poweroff\` or Ctrl-A X ends it)"
  "${QEMU[@]}" -serial mon:stdio || true
  cat "$OUT"
  exit "$(cat "$SHARE/rp/rc" 2>/dev/null || echo 1)"
fi

rm -f "$SHARE/rp/keep-running"
v2log "booting the guest (limit ${LIMIT}s, RP_V2VM_LIMIT)"
"${QEMU[@]}" -monitor none -serial "file:$CONSOLE" </dev/null >"$SHARE/qemu.log" 2>&1 &
QPID=$!
trap 'kill -TERM "$QPID" 2>/dev/null || true' EXIT
trap 'exit 130' INT TERM
# show: prints what out.log has gained since the last call
shown=0
show() {
  local size; size=$(stat -c %s "$OUT")
  [ "$size" -gt "$shown" ] || return 0
  tail -c +$((shown + 1)) "$OUT" | head -c $((size - shown))
  shown=$size
}
end=$((SECONDS + LIMIT)) timed_out=0
while kill -0 "$QPID" 2>/dev/null; do
  show
  if [ "$SECONDS" -ge $end ]; then
    timed_out=1
    kill -TERM "$QPID" 2>/dev/null || true
    break
  fi
  sleep 1
done
qrc=0 && wait "$QPID" || qrc=$?
trap - EXIT
show
tail_console() { echo "--- the guest's console, last 40 lines"; tail -n 40 "$CONSOLE" 2>/dev/null | tr -d '\r'; }
if [ $timed_out = 1 ]; then
  v2log "the guest did not finish within ${LIMIT}s (RP_V2VM_LIMIT): qemu stopped"
  tail_console
  exit 124
fi
if [ ! -s "$SHARE/rp/rc" ]; then
  v2log "the guest stopped (qemu exit status $qrc) without a test status"
  cat "$SHARE/qemu.log" >&2
  tail_console
  exit 1
fi
rc=$(cat "$SHARE/rp/rc")
v2log "the guest powered off; status $rc"
exit "$rc"
