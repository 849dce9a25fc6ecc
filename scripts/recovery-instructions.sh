#!/usr/bin/env bash
# Counts the instructions a runtime-proxy binary executes from its start to its "store recovered"
# line on the stand-in node of 1,000 pods x 4 containers (the node_scale bench's), under valgrind's
# callgrind. Unlike wall or CPU time on a shared VM, whose speed drifts 2-3x within an hour, the
# count repeats to within 0.1 %, so two builds compare in one number each.
#
# Usage: scripts/recovery-instructions.sh BINARY [BINARY...]
#   e.g. scripts/recovery-instructions.sh /tmp/rp-before target/release/runtime-proxy
# Needs valgrind (apt-get install valgrind). Each binary takes ~10 s under callgrind.
set -euo pipefail

if [ $# -eq 0 ]; then
    sed -n '2,9p' "$0"
    exit 2
fi
command -v valgrind >/dev/null || { echo "valgrind not found (apt-get install valgrind)" >&2; exit 1; }

work=$(mktemp -d /tmp/rp-instructions.XXXXXX)
serve_pid=
cleanup() {
    [ -n "$serve_pid" ] && kill -- "-$serve_pid" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

# The stand-in node, in a process group of its own (RP_BENCH_SERVE: serve only, print the socket).
cd "$(dirname "$0")/.."
RP_BENCH_SERVE=1000 setsid cargo bench -q -p runtime-proxy --bench node_scale >"$work/serve.out" 2>"$work/serve.err" &
serve_pid=$!
for _ in $(seq 1 600); do
    socket=$(grep -m1 '\.sock$' "$work/serve.out" || true)
    [ -n "$socket" ] && break
    sleep 0.5
done
[ -n "${socket:-}" ] || { echo "the stand-in node did not start:" >&2; cat "$work/serve.err" >&2; exit 1; }

for bin in "$@"; do
    dir="$work/$(basename "$bin").$RANDOM"
    mkdir -p "$dir/hooks"
    RUST_LOG=info valgrind --tool=callgrind --callgrind-out-file="$dir/callgrind.out" "$bin" \
        --koord-runtimeproxy-endpoint "$dir/proxy.sock" --remote-runtime-service-endpoint "unix://$socket" \
        --hook-config-dir "$dir/hooks" --metrics-addr 127.0.0.1:0 >"$dir/log" 2>&1 &
    proxy=$!
    for _ in $(seq 1 600); do
        grep -q "store recovered" "$dir/log" && break
        sleep 0.5
    done
    line=$(grep -o "store recovered: [^\"]*ms" "$dir/log" || echo "no 'store recovered' line")
    kill -INT "$proxy"
    wait "$proxy" || true
    total=$(sed -n 's/^summary: //p' "$dir/callgrind.out")
    printf '%s: %s instructions (%s under callgrind)\n' "$bin" "$total" "$line"
done
