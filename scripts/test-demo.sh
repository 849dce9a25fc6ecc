#!/usr/bin/env bash
# test-demo.sh — the demo phase of `make test` (also on its own, as root): runs `make demo` (scripts/demo.sh,
# demo-hooks.sh, demo-docker.sh) and checks that it leaves nothing behind that it created:
#
#   * each demo says what it builds, where, and how long a cold build takes, shows cargo's progress, exits 0 and says
#     what it cleaned up and what stays, as its last line;
#   * no systemd unit enabled that was not before (need_pkgs turns off what an install turned on: checked with a
#     stand-in apt-get and systemctl, as this machine has the packages already);
#   * no /tmp/rp-demo* (temp dirs, containerd's and dockerd's roots);
#   * the shared containerd cache (/var/cache/runtime-proxy, or $RP_CACHE) exactly as before: the demos keep the
#     images they build in their own containerd root;
#   * no process of theirs still running, no cgroup of their pods (/sys/fs/cgroup/*/rp-test-rp-demo*,
#     rp-docker-rp-demo*).
#
# The demos run the dev build (RP_DEMO_PROFILE=dev unless set: the test run built it already; `make demo` alone builds
# release). That build and Debian packages installed on the way stay (each demo's last line says so).
# Prints `ok`/`FAIL` per check and a cargo-style `test result:` line that scripts/test.sh counts.
set -uo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh

# The demos' paths are fixed (/tmp/rp-demo*): runs of two checkouts take turns.
exec 8>/run/lock/runtime-proxy-test-demo.lock && flock 8
CACHE=${RP_CACHE:-/var/cache/runtime-proxy}
PASS=0 FAIL=0 OUT=$(mktemp -d /tmp/rp-test-demo.XXXXXX)
trap 'rm -rf "$OUT"' EXIT

check() {  # NAME CMD...: `ok NAME`, or `FAIL NAME` with CMD's output
  local name=$1 out
  shift
  if out=$("$@" 2>&1); then
    echo "ok    $name" && PASS=$((PASS + 1))
  else
    echo "FAIL  $name" && sed 's/^/      /' <<<"$out" && FAIL=$((FAIL + 1))
  fi
}
# state: what the demos must leave as it was (the cache's files with sizes and times; not the lock file, which any
# other checkout's containerd.sh opens meanwhile) or not leave at all
enabled_units() { systemctl list-unit-files --state=enabled --no-legend --no-pager 2>/dev/null | awk '{print $1}' | sort; }
cache_state() { [ ! -d "$CACHE" ] || find "$CACHE" ! -name .lock -printf '%p %s %T@\n' | sort; }
# (run in this shell only: a command line holding the pattern would match itself)
leftovers() {
  ls -d /tmp/rp-demo* /sys/fs/cgroup/*/rp-test-rp-demo* /sys/fs/cgroup/*/rp-docker-rp-demo* 2>/dev/null
  pgrep -af '(containerd|dockerd|runtime-proxy|runtime-hooks|annotation_hook).*/tmp/rp-demo' || true
}

[ -z "$(leftovers)" ] || { echo "leftovers of an earlier demo run, not ours to remove:"; leftovers; echo "test result: FAILED. 0 passed; 1 failed;"; exit 1; }
cache_state >"$OUT/cache.before"
enabled_units >"$OUT/units.before"

# need_pkgs with stand-ins: an install that adds package fakepkg and enables b.service (as Debian's containerd's
# postinst enables containerd.service) leaves b.service disabled again, and records what stays.
need_pkgs_undoes() {
  local s; s=$(mktemp -d)
  echo a.service >"$s/enabled" && echo 'ii  base' >"$s/pkgs"
  # shellcheck disable=SC2317  # the stand-ins are called by need_pkgs
  systemctl() {
    case $1 in
      list-unit-files) sed 's/$/ enabled enabled/' "$s/enabled" ;;
      disable) grep -vx "$3" "$s/enabled" >"$s/e" || true; mv "$s/e" "$s/enabled"; echo "$3" >>"$s/disabled" ;;
    esac
  }
  # shellcheck disable=SC2317
  dpkg-query() { case $2 in *'{Status}'*) return 1 ;; *) cat "$s/pkgs" ;; esac; }
  # shellcheck disable=SC2317
  apt-get() { echo 'ii  fakepkg' >>"$s/pkgs"; echo b.service >>"$s/enabled"; }
  RP_INSTALL_RECORD=$s/record need_pkgs fakepkg 2>"$s/said"
  local line; line=$(install_record_line "$s/record")
  grep -q 'installing Debian packages.*fakepkg' "$s/said" && grep -q 'disabling b.service' "$s/said" &&
    [ "$(cat "$s/disabled")" = b.service ] && [ "$(cat "$s/enabled")" = a.service ] &&
    [ "$line" = "Debian packages fakepkg (turned off again: b.service)" ] ||
    { cat "$s/said"; echo "disabled: $(cat "$s/disabled" 2>/dev/null); record line: $line"; rm -rf "$s"; return 1; }
  rm -rf "$s"
}
check "need_pkgs: a unit the install enabled is disabled again, and said" need_pkgs_undoes

PROFILE=${RP_DEMO_PROFILE:-dev}
for demo in demo demo-hooks demo-docker; do
  RP_DEMO_PROFILE=$PROFILE make --no-print-directory "$demo" >"$OUT/$demo.log" 2>&1
  rc=$?
  check "make $demo runs the $PROFILE build" bash -c "grep -qx 'building ($PROFILE)...' '$OUT/$demo.log' || head -n 3 '$OUT/$demo.log'"
  check "make $demo says what it builds, where, and shows cargo's progress" bash -c "grep -q '^  runtime-proxy, runtime-hooks and the demos. examples: cargo build --profile $PROFILE .*, into $(demo_bin_dir)\$' '$OUT/$demo.log' && grep -Eq '^  (an earlier $PROFILE build is there|no earlier .* a cold build takes about [0-9]+ minutes)' '$OUT/$demo.log' && grep -q '^ *Finished ' '$OUT/$demo.log' || head -n 5 '$OUT/$demo.log'"
  check "make $demo exits 0" bash -c "[ $rc -eq 0 ] || { tail -n 30 '$OUT/$demo.log'; exit 1; }"
  check "make $demo: its last line says what it cleaned up and what stays" bash -c "tail -n 1 '$OUT/$demo.log' | grep -q '^cleaned up: every process it started stopped, .* removed; stays: the $PROFILE build in $(demo_bin_dir)' || tail -n 3 '$OUT/$demo.log'"
done
leftovers >"$OUT/leftovers"
check "no /tmp/rp-demo*, no process or cgroup of the demos left" bash -c "[ ! -s '$OUT/leftovers' ] || { cat '$OUT/leftovers'; exit 1; }"
cache_state >"$OUT/cache.after"
check "the shared cache $CACHE as before" diff "$OUT/cache.before" "$OUT/cache.after"
enabled_units >"$OUT/units.after"
check "no systemd unit enabled that was not before" diff "$OUT/units.before" "$OUT/units.after"

echo
echo "test result: $([ $FAIL -eq 0 ] && echo ok || echo FAILED). $PASS passed; $FAIL failed;"
[ $FAIL -eq 0 ]
