#!/usr/bin/env bash
# test.sh — the project's test command (`make test`, CI): build everything, run the unit tests, then run every
# integration test against a real containerd 2.1 with NRI on and a smoke run against 1.6 and 1.7 (out of support
# upstream; scripts/containerd.sh), then the NRI-mode tests (crates/*/tests/nri_*.rs) against a containerd 1.7 of their
# own (they restart it and connect plugins that see every pod) and again against a 2.1 of their own, then the
# Docker-mode tests (crates/*/tests/docker_*.rs) against a real dockerd (scripts/dockerd.sh), then the cgroup v2 tests
# (crates/*/tests/v2_*.rs) inside a qemu guest with systemd and containerd 2.1 + runc 1.3 on the systemd cgroup driver
# (scripts/v2vm.sh: this machine's kernel is cgroup v1), then the Debian packages installed on this machine
# (scripts/test-packages.sh, scripts/test-operations.sh), then `make demo`, which must leave nothing behind
# (scripts/test-demo.sh).
#
# Every phase runs even when an earlier one failed; the exit code is non-zero if any failed. The last
# line is `N passed, M failed`, summed from cargo's "test result:" lines (a phase that fails without a
# failing test — a build error, a crashed test binary — counts as one failure).
set -uo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh

LOCKED=() && [ -f Cargo.lock ] && LOCKED=(--locked)
# One containerd root per checkout, so two checkouts can run their tests at the same time.
ROOT_PREFIX=/tmp/rp-test-$(printf '%s' "$PWD" | cksum | cut -c1-8)-ctrd
DOCKERD_ROOT=${ROOT_PREFIX%-ctrd}-dockerd  # short: unix socket paths below it must stay < 100 bytes
OUT=$(mktemp /tmp/rp-test-out.XXXXXX)
PASSED=0 FAILED=0 FAILED_PHASES=() TIMES=() ROOTS=() DOCKERD_ROOTS=()

cleanup() {
  local r
  for r in "${ROOTS[@]}"; do scripts/containerd.sh down "$r" 2>/dev/null || true; done
  for r in "${DOCKERD_ROOTS[@]}"; do scripts/dockerd.sh down "$r" 2>/dev/null || true; done
  rm -f "$OUT"
}
trap cleanup EXIT
trap 'echo "interrupted" >&2; exit 130' INT TERM

# phase NAME CMD...: runs CMD under a header, output teed to $OUT, and books its tests and its time.
phase() {
  local name=$1 start=$SECONDS rc p f
  shift
  printf '\n==> %s\n' "$name"
  "$@" 2>&1 | tee "$OUT"
  rc=$?
  read -r p f < <(awk '/^test result:/ { for (i = 2; i <= NF; i++) { if ($i ~ /^passed/) p += $(i-1); if ($i ~ /^failed/) f += $(i-1) } }
                       END { print p + 0, f + 0 }' "$OUT")
  [ "$rc" -eq 0 ] || [ "$f" -gt 0 ] || f=1
  PASSED=$((PASSED + p)) FAILED=$((FAILED + f))
  [ "$rc" -eq 0 ] || FAILED_PHASES+=("$name")
  TIMES+=("$(printf '%-28s %4ss  %s' "$name" $((SECONDS - start)) "$([ "$rc" -eq 0 ] && echo ok || echo FAILED)")")
}

# limited CMD...: CMD, stopped with everything it started once it has run RP_PHASE_LIMIT seconds (default 1200; a
# phase of integration tests takes about 3 minutes), so that a test that hangs fails its phase, named in the log,
# instead of using up the whole run's time.
limited() {
  local limit=${RP_PHASE_LIMIT:-1200} rc
  timeout -k 30 "$limit" "$@"
  rc=$?
  [ $rc -ne 124 ] && [ $rc -ne 137 ] || echo "stopped after ${limit}s (RP_PHASE_LIMIT): $*" >&2
  return $rc
}

# test_targets [-v] GLOB: `--test NAME` lines for the integration test targets crates/*/tests/NAME.rs (or
# NAME/main.rs) whose NAME matches GLOB (-v: does not match it).
test_targets() {
  local invert=0 f n
  [ "$1" = -v ] && invert=1 && shift
  for f in crates/*/tests/*.rs crates/*/tests/*/main.rs; do
    [ -e "$f" ] || continue
    n=${f#crates/*/tests/} && n=${n%.rs} && n=${n%/main}
    # shellcheck disable=SC2053  # GLOB is a pattern
    if [[ $n == $1 ]]; then [ $invert = 0 ] || continue; else [ $invert = 1 ] || continue; fi
    printf '%s\n' --test "$n"
  done
}

# integration VERSION: containerd VERSION up (its root must be in ROOTS for the trap; 1.7 and 2.1 with NRI on and no
# plugin connected, as nodes that enable it run — 2.x has it on by default), the integration test targets against it,
# down. The newest (2.1) gets every target but the Docker-mode ones (docker_*: they need dockerd), the NRI-mode ones
# (nri_*: nri_integration) and the cgroup v2 ones (v2_*: v2_guest); the releases out of support upstream get a smoke
# run (docs/tests.md, "Which runtimes get the full run").
integration() {
  local root=$ROOT_PREFIX-$1 tests nri=0
  [ "$1" = 1.6 ] || nri=1
  case $1 in
    1.6) tests=(--test passthrough_containerd --test hooks_containerd) ;;  # end of life 2025-08
    1.7) tests=(--test passthrough_containerd --test hooks_containerd --test cri_v1alpha2) ;;  # 2026-09; v1alpha2: no 2.x serves it
    *) mapfile -t tests < <(test_targets -v '@(docker|nri|v2)_*') ;;
  esac
  [ ${#tests[@]} -gt 0 ] || { echo "no integration test targets"; return 0; }
  RP_NRI=$nri scripts/containerd.sh up "$1" "$root" >/dev/null || return 1
  RP_CONTAINERD_ENV=$root/env limited cargo test "${LOCKED[@]}" --workspace "${tests[@]}" --no-fail-fast
  local rc=$?
  scripts/containerd.sh down "$root"
  return $rc
}

# nri_integration VERSION: a containerd VERSION (1.7, 2.1) with NRI on in its own root (it must be in ROOTS for the
# trap), the nri_* test targets against it, down.
nri_integration() {
  local root=$ROOT_PREFIX-nri-$1 tests
  mapfile -t tests < <(test_targets 'nri_*')
  RP_NRI=1 scripts/containerd.sh up "$1" "$root" >/dev/null || return 1
  RP_CONTAINERD_ENV=$root/env limited cargo test "${LOCKED[@]}" --workspace "${tests[@]}" --no-fail-fast
  local rc=$?
  scripts/containerd.sh down "$root"
  return $rc
}

# docker_integration: dockerd up in $DOCKERD_ROOT (it must be in DOCKERD_ROOTS for the trap), the docker_* test
# targets against it, down.
docker_integration() {
  local tests
  mapfile -t tests < <(test_targets 'docker_*')
  scripts/dockerd.sh up "$DOCKERD_ROOT" >/dev/null || return 1
  RP_DOCKERD_ENV=$DOCKERD_ROOT/env limited cargo test "${LOCKED[@]}" --workspace "${tests[@]}" --no-fail-fast
  local rc=$?
  scripts/dockerd.sh down "$DOCKERD_ROOT"
  return $rc
}

# v2_guest: the v2_* test targets inside the cgroup v2 guest (scripts/v2vm.sh test: builds the guest once into the
# cache, the targets on this machine, boots the guest under qemu and runs them there; prints their output).
v2_guest() {
  local tests
  mapfile -t tests < <(test_targets 'v2_*' | awk 'NR % 2 == 0')  # the names, without the --test lines
  limited scripts/v2vm.sh test "${tests[@]}"
}

# lint: rustfmt (rustfmt.toml), every relative link of the Markdown files (scripts/check-links.py), the one line
# width of code and prose (scripts/line-width.py), no import cycle in runtime-proxy or runtime-hooks
# (scripts/check-modules.py), clippy with warnings as errors and rustdoc with warnings as errors (a doc link that does
# not resolve, or points at a private item), over the whole workspace and the fuzz targets (fuzz/, a workspace of its
# own).
lint() {
  cargo fmt --all -- --check || return 1
  python3 scripts/check-links.py || return 1
  python3 scripts/line-width.py || return 1
  python3 scripts/check-modules.py || return 1
  cargo clippy "${LOCKED[@]}" --workspace --all-targets -- -D warnings || return 1
  RUSTDOCFLAGS="-D warnings" cargo doc "${LOCKED[@]}" --workspace --no-deps || return 1
  # In the root's target directory: the dependencies both workspaces share are checked once.
  (cd fuzz && cargo fmt -- --check && CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-../target}" cargo clippy --locked --all-targets -- -D warnings)
}

printf '==> dependencies\n'
need_pkgs "${RP_PKGS[@]}" || { echo "installing ${RP_PKGS[*]} failed" >&2; exit 1; }
for tool in cargo rustc; do command -v $tool >/dev/null || { echo "$tool not found (it should be preinstalled)" >&2; exit 1; }; done

phase "build" cargo build "${LOCKED[@]}" --workspace --all-targets
phase "fmt and clippy" lint
phase "unit tests" limited cargo test "${LOCKED[@]}" --workspace --lib --bins --no-fail-fast
# cargo fuzz targets (fuzz/): scripts/fuzz.sh, FUZZ_RUNS inputs each (default 300000) from seed FUZZ_SEED
# (default 1), so that the verdict is the same on every run of the same tree; FUZZ_RUNS=0 skips the phase.
# Exploring with new seeds is `make fuzz`, whose crashes join fuzz/corpus as regression inputs.
[ "${FUZZ_RUNS:-300000}" = 0 ] || FUZZ_RUNS=${FUZZ_RUNS:-300000} FUZZ_SEED=${FUZZ_SEED:-1} phase "fuzz" scripts/fuzz.sh
phase "CRI clients" bash crates/runtime-proxy/tests/clients/setup.sh target/cri-clients  # for tests/client_matrix.rs
for v in 1.6 1.7 2.1; do
  ROOTS+=("$ROOT_PREFIX-$v")  # for the trap: phase runs integration in a subshell
  phase "integration (containerd $v)" integration "$v"
done
if compgen -G 'crates/*/tests/nri_*.rs' >/dev/null; then
  for v in 1.7 2.1; do
    ROOTS+=("$ROOT_PREFIX-nri-$v")  # for the trap, as above
    phase "integration (NRI, ctrd $v)" nri_integration "$v"
  done
fi
if compgen -G 'crates/*/tests/docker_*.rs' >/dev/null; then
  DOCKERD_ROOTS+=("$DOCKERD_ROOT")  # for the trap, as above
  phase "integration (dockerd)" docker_integration
fi

if compgen -G 'crates/*/tests/v2_*' >/dev/null; then
  phase "cgroup v2 guest" v2_guest
fi

# The packages hold the dev build, stripped (scripts/package.sh): make deb's dist profile would add ~10 minutes.
export RP_PACKAGE_PROFILE=${RP_PACKAGE_PROFILE:-dev}
phase "packages" limited scripts/test-packages.sh
phase "operations" limited scripts/test-operations.sh
phase "demo" limited scripts/test-demo.sh

printf '\n==> summary\n'
printf '%s\n' "${TIMES[@]}"
[ ${#FAILED_PHASES[@]} -eq 0 ] || { printf -v list '%s, ' "${FAILED_PHASES[@]}"; echo "failed phases: ${list%, }"; }
echo "$PASSED passed, $FAILED failed"
[ ${#FAILED_PHASES[@]} -eq 0 ]
