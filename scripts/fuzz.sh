#!/usr/bin/env bash
# fuzz.sh [SECONDS] — runs every cargo-fuzz (libFuzzer) target in fuzz/ for SECONDS each (default 60),
# starting from its corpus in fuzz/corpus/TARGET (seeds and the inputs of crashes fixed since); fails if any
# target crashes (a panic, a failed assertion, a timeout of 10 s on one input, over 2 GiB of memory). A
# crash's input is left in fuzz/artifacts/TARGET/ and its reproduction command printed.
#
# cargo fuzz needs nightly-only compiler flags (-Cpasses=sancov-module, -Z…); on the stable toolchain
# RUSTC_BOOTSTRAP=1 lets the stable compiler accept them. cargo-fuzz itself is installed with `cargo install` if
# missing. By hand, in fuzz/:
#   RUSTC_BOOTSTRAP=1 RUSTFLAGS=--cap-lints=warn cargo fuzz run -s none TARGET [INPUT | DIR…] [-- -max_total_time=N]
#
# Environment: FUZZ_RUNS=N runs N inputs per target instead of SECONDS, and FUZZ_SEED=N fixes libFuzzer's
# random seed: with both, a run is the same every time for the same code and corpus (what `make test` does, so
# that its verdict depends on the change, not on luck; `make fuzz` explores with a new seed each time).
# FUZZ_SANITIZER (default none: the code under test is safe Rust, and ASan costs about 2× the
# executions; address works too), FUZZ_KEEP_CORPUS=1 merges the new coverage-increasing inputs of this run into
# fuzz/corpus (otherwise they go to a scratch directory and the tree is left as it was).
#
# Prints one line per target (runs, exec/s, outcome) and `test result: ok. N passed; M failed` for test.sh.
set -uo pipefail
cd "$(dirname "$0")/../fuzz"

SECS=${1:-60}
SANITIZER=${FUZZ_SANITIZER:-none}
if [ -n "${FUZZ_RUNS:-}" ]; then limit=(-runs="$FUZZ_RUNS") budget="$FUZZ_RUNS runs"; else limit=(-max_total_time="$SECS") budget="$SECS s"; fi
[ -z "${FUZZ_SEED:-}" ] || { limit+=(-seed="$FUZZ_SEED"); budget+=", seed $FUZZ_SEED"; }
export RUSTC_BOOTSTRAP=1
# cargo fuzz builds with --cfg fuzzing, which turns on vendor/h2's fuzz_bridge module, whose missing docs
# h2 denies; a path dependency's lints are not capped by cargo, so cap them here (clippy runs separately).
export RUSTFLAGS="${RUSTFLAGS:-} --cap-lints=warn"

if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "installing cargo-fuzz (cargo install --locked cargo-fuzz)"
  cargo install --locked cargo-fuzz || { echo "cargo install cargo-fuzz failed" >&2; exit 1; }
fi
# cargo fuzz has no --locked: check that fuzz/Cargo.lock needs no change before it builds anything.
cargo metadata --locked --format-version 1 >/dev/null || { echo "fuzz/Cargo.lock is out of date" >&2; exit 1; }

start=$SECONDS
cargo fuzz build -s "$SANITIZER" || { echo "building the fuzz targets failed" >&2; exit 1; }
echo "build: $((SECONDS - start)) s"

mapfile -t targets < <(cargo fuzz list)
work=$(mktemp -d /tmp/rp-fuzz.XXXXXX)
trap 'rm -rf "$work"' EXIT
passed=0 failed=0 lines=()
for t in "${targets[@]}"; do
  mkdir -p "$work/$t" "corpus/$t"
  log=$work/$t.log
  printf '\n==> fuzz %s (%s)\n' "$t" "$budget"
  # New inputs go to the first directory (scratch); fuzz/corpus/$t is read. -timeout: one input, seconds.
  cargo fuzz run -s "$SANITIZER" "$t" "$work/$t" "corpus/$t" -- \
    "${limit[@]}" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 >"$log" 2>&1
  rc=$?
  runs=$(awk '/^stat::number_of_executed_units:/ { print $2 }' "$log" | tail -1)
  secs=$(awk '/^Done [0-9]+ runs in/ { print $5 }' "$log" | tail -1)
  rate=$(awk '/^stat::average_exec_per_sec:/ { print $2 }' "$log" | tail -1)
  if [ "$rc" -eq 0 ]; then
    passed=$((passed + 1)) outcome=ok
  else
    failed=$((failed + 1)) outcome=CRASH
    grep -E 'panicked at|^(thread|SUMMARY)|Test unit written|^Failing input|cargo fuzz run' -A2 "$log" | head -40
    echo "(full log: last 60 lines)"
    tail -60 "$log"
  fi
  lines+=("$(printf '%-20s %12s runs %6s s %10s exec/s  %s' "$t" "${runs:-?}" "${secs:-?}" "${rate:-?}" "$outcome")")
  tail -3 "$log"
  if [ "${FUZZ_KEEP_CORPUS:-0}" = 1 ] && [ "$rc" -eq 0 ]; then
    cargo fuzz run -s "$SANITIZER" "$t" "corpus/$t" "$work/$t" -- -merge=1 >"$log.merge" 2>&1 || tail -20 "$log.merge"
  fi
done

printf '\n==> fuzz summary (%s per target, sanitizer %s, %s s in all)\n' "$budget" "$SANITIZER" "$((SECONDS - start))"
printf '%s\n' "${lines[@]}"
echo "test result: $([ "$failed" -eq 0 ] && echo ok || echo FAILED). $passed passed; $failed failed (fuzz targets)"
[ "$failed" -eq 0 ]
