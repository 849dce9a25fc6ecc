# lib.sh — shell helpers shared by the scripts in this directory (source it, don't run it).

# Debian packages the build, the tests and the demo need (cargo, rustc, cargo-nextest are preinstalled; dbus-daemon:
# runtime-hooks' systemd tests start a private bus; python3: the link check and the CRI client tests).
RP_PKGS=(protobuf-compiler containerd runc busybox-static gcc libc6-dev make dbus-daemon python3)
# demo_profile: the cargo profile the demos build and run, RP_DEMO_PROFILE (release unless set; the test run's demo
# phase sets dev, the build its first phase made). Read when used, not when this file is sourced, so that a script
# that sources it can still set the variable for the demos it runs. demo_bin_dir: where that profile's binaries are.
demo_profile() { echo "${RP_DEMO_PROFILE:-release}"; }
demo_bin_dir() { local p; p=$(demo_profile); [ "$p" != dev ] || p=debug; echo "${CARGO_TARGET_DIR:-target}/$p"; }
# demo_build: the binaries and examples the demos run, built in demo_profile for the whole workspace at once. One
# selection for every demo: a package's own (`-p runtime-proxy`) resolves its dependencies' features differently
# from the workspace's, and would build them again after `make test`'s build phase.
demo_build() { cargo build -q --locked --profile "$(demo_profile)" --workspace --bins --examples; }

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
