# lib.sh — shell helpers shared by the scripts in this directory (source it, don't run it).

# Debian packages the build, the tests and the demo need (cargo, rustc, cargo-nextest are preinstalled).
RP_PKGS=(protobuf-compiler containerd runc busybox-static gcc libc6-dev make)
# The cargo profile the demos build and run (RP_DEMO_PROFILE: release unless set; the test run's demo phase uses dev,
# the build its first phase made) and where its binaries are.
RP_DEMO_PROFILE=${RP_DEMO_PROFILE:-release}
demo_bin_dir() { if [ "$RP_DEMO_PROFILE" = dev ]; then echo "${CARGO_TARGET_DIR:-target}/debug"; else echo "${CARGO_TARGET_DIR:-target}/$RP_DEMO_PROFILE"; fi; }
# demo_build: the binaries and examples the demos run, built in RP_DEMO_PROFILE for the whole workspace at once. One
# selection for every demo: a package's own (`-p runtime-proxy`) resolves its dependencies' features differently
# from the workspace's and builds them again (in a fresh clone, ~8 minutes of `make test`'s demo phase after its
# build phase had built them all).
demo_build() { cargo build -q --locked --profile "$RP_DEMO_PROFILE" --workspace --bins --examples; }

export DEBIAN_FRONTEND=noninteractive
# rustup's cargo when it is not on PATH already (e.g. a CI shell without the login profile)
command -v cargo >/dev/null || [ ! -x "$HOME/.cargo/bin/cargo" ] || PATH=$HOME/.cargo/bin:$PATH

# need_pkgs PKG...: apt-get installs the packages that are not installed yet, with no prompt and no stdin;
# when the install fails (stale package lists) it runs `apt-get update` and tries once more.
need_pkgs() {
  local p missing=()
  for p in "$@"; do dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' || missing+=("$p"); done
  [ ${#missing[@]} -gt 0 ] || return 0
  echo "[${0##*/}] installing ${missing[*]}" >&2
  local install=(apt-get install -y -q --no-install-recommends "${missing[@]}")
  "${install[@]}" </dev/null >/dev/null 2>&1 || { apt-get update -q </dev/null >/dev/null && "${install[@]}" </dev/null >/dev/null; }
}
