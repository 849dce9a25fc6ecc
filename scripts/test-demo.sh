#!/usr/bin/env bash
# test-demo.sh — the demo phase of `make test` (also on its own, as root): runs `make demo` (scripts/demo.sh,
# demo-hooks.sh, demo-docker.sh) and checks that it leaves nothing behind that it created:
#
#   * each demo exits 0 and says what it cleaned up, as its last line;
#   * no /tmp/rp-demo* (temp dirs, containerd's and dockerd's roots);
#   * the shared containerd cache (/var/cache/runtime-proxy, or $RP_CACHE) exactly as before: the demos keep the
#     images they build in their own containerd root;
#   * no process of theirs still running, no cgroup of their pods (/sys/fs/cgroup/*/rp-test-rp-demo*, rp-docker-rp-demo*).
#
# The demos run the dev build (RP_DEMO_PROFILE=dev unless set: the test run built it already; `make demo` alone builds
# release). That build in target/ and Debian packages installed on the way stay (the demos say so in their headers).
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
cache_state() { [ ! -d "$CACHE" ] || find "$CACHE" ! -name .lock -printf '%p %s %T@\n' | sort; }
# (run in this shell only: a command line holding the pattern would match itself)
leftovers() {
  ls -d /tmp/rp-demo* /sys/fs/cgroup/*/rp-test-rp-demo* /sys/fs/cgroup/*/rp-docker-rp-demo* 2>/dev/null
  pgrep -af '(containerd|dockerd|runtime-proxy|runtime-hooks|annotation_hook).*/tmp/rp-demo' || true
}

[ -z "$(leftovers)" ] || { echo "leftovers of an earlier demo run, not ours to remove:"; leftovers; echo "test result: FAILED. 0 passed; 1 failed;"; exit 1; }
cache_state >"$OUT/cache.before"

PROFILE=${RP_DEMO_PROFILE:-dev}
for demo in demo demo-hooks demo-docker; do
  RP_DEMO_PROFILE=$PROFILE make --no-print-directory "$demo" >"$OUT/$demo.log" 2>&1
  rc=$?
  check "make $demo runs the $PROFILE build" bash -c "head -n 1 '$OUT/$demo.log' | grep -qx 'building ($PROFILE)...' || head -n 1 '$OUT/$demo.log'"
  check "make $demo exits 0" bash -c "[ $rc -eq 0 ] || { tail -n 30 '$OUT/$demo.log'; exit 1; }"
  check "make $demo: its last line says what it cleaned up" bash -c "tail -n 1 '$OUT/$demo.log' | grep -q '^cleaned up: every process it started stopped, .* removed' || tail -n 3 '$OUT/$demo.log'"
done
leftovers >"$OUT/leftovers"
check "no /tmp/rp-demo*, no process or cgroup of the demos left" bash -c "[ ! -s '$OUT/leftovers' ] || { cat '$OUT/leftovers'; exit 1; }"
cache_state >"$OUT/cache.after"
check "the shared cache $CACHE as before" diff "$OUT/cache.before" "$OUT/cache.after"

echo
echo "test result: $([ $FAIL -eq 0 ] && echo ok || echo FAILED). $PASS passed; $FAIL failed;"
[ $FAIL -eq 0 ]
