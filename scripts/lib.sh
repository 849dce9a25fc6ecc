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
# from the workspace's, and would build them again after `make test`'s build phase. It says first what it builds,
# where, and how long a cold build takes when there is no earlier one (measured on 2 cores: release ~17 minutes,
# dev ~10), and shows cargo's progress (stderr). Its first line is `building (PROFILE)...` (test-demo.sh reads it).
demo_build() {
  local profile bin
  profile=$(demo_profile) bin=$(demo_bin_dir)
  echo "building ($profile)..."
  echo "  runtime-proxy, runtime-hooks and the demos' examples: cargo build --profile $profile --workspace --bins --examples, into $bin"
  if [ -x "$bin/runtime-proxy" ] && [ -x "$bin/runtime-hooks" ]; then
    echo "  an earlier $profile build is there: only what changed is rebuilt"
  elif [ "$profile" = release ]; then
    echo "  no earlier release build there: a cold build takes about 17 minutes on 2 cores (RP_DEMO_PROFILE=dev: about 10)"
  else
    echo "  no earlier $profile build there: a cold build takes about 10 minutes on 2 cores"
  fi
  cargo build --locked --profile "$profile" --workspace --bins --examples
}
export DEBIAN_FRONTEND=noninteractive
# rustup's cargo when it is not on PATH already (e.g. a CI shell without the login profile)
command -v cargo >/dev/null || [ ! -x "$HOME/.cargo/bin/cargo" ] || PATH=$HOME/.cargo/bin:$PATH

# need_pkgs PKG...: apt-get installs the packages that are not installed yet, with no prompt and no stdin, after
# saying which (stderr); when the install fails (stale package lists) it runs `apt-get update` and tries once more.
# The system is left as it was found but for the packages: a systemd unit the install enabled (Debian's containerd
# and docker.io enable and start their daemons in postinst) is disabled and stopped again, as is a SysV init script
# the install added and started (no systemd). With RP_INSTALL_RECORD naming a file, it appends `package NAME` for
# each package the install added (dependencies too) and `unit NAME` for each unit or script it turned off.
need_pkgs() {
  local p missing=()
  for p in "$@"; do dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' || missing+=("$p"); done
  [ ${#missing[@]} -gt 0 ] || return 0
  echo "[${0##*/}] installing Debian packages (apt-get; they stay installed): ${missing[*]}, and what they depend on" >&2
  local before; before=$(mktemp -d)
  system_state "$before"
  local install=(apt-get install -y -q --no-install-recommends "${missing[@]}") rc=0
  "${install[@]}" </dev/null >/dev/null 2>&1 || { apt-get update -q </dev/null >/dev/null && "${install[@]}" </dev/null >/dev/null; } || rc=$?
  undo_service_changes "$before"
  rm -rf "$before"
  return $rc
}

# system_state DIR: what need_pkgs compares across an install: the installed packages, the enabled and (with systemd
# running) active service, socket and timer units, and the SysV init scripts, one file each.
system_state() {
  dpkg-query -W -f='${db:Status-Abbrev} ${Package}\n' 2>/dev/null | awk '$1 ~ /^.i/ {print $2}' | sort >"$1/packages"
  { systemctl list-unit-files --state=enabled --no-legend --no-pager 2>/dev/null || true; } |
    awk '$1 ~ /\.(service|socket|timer)$/ {print $1}' | sort >"$1/enabled"
  if [ -d /run/systemd/system ]; then
    systemctl list-units --state=active --no-legend --no-pager --plain 2>/dev/null |
      awk '$1 ~ /\.(service|socket|timer)$/ {print $1}' | sort >"$1/active"
  else
    : >"$1/active"
  fi
  { find /etc/init.d -maxdepth 1 -type f -printf '%f\n' 2>/dev/null || true; } | sort >"$1/initd"
}

# undo_service_changes DIR: after an install, turns off what it turned on (DIR: system_state before it); says what.
undo_service_changes() {
  local now u p
  now=$(mktemp -d)
  system_state "$now"
  record() { [ -z "${RP_INSTALL_RECORD:-}" ] || echo "$1" >>"$RP_INSTALL_RECORD"; }
  for p in $(comm -13 "$1/packages" "$now/packages"); do record "package $p"; done
  for u in $(comm -13 "$1/active" "$now/active"); do
    echo "[${0##*/}] stopping $u (the install started it)" >&2
    systemctl stop "$u" >/dev/null 2>&1 || echo "[${0##*/}] could not stop $u" >&2
    record "unit $u"
  done
  for u in $(comm -13 "$1/enabled" "$now/enabled"); do
    echo "[${0##*/}] disabling $u (the install enabled it)" >&2
    systemctl disable --quiet "$u" >/dev/null 2>&1 || echo "[${0##*/}] could not disable $u" >&2
    record "unit $u"
  done
  if [ ! -d /run/systemd/system ]; then
    for u in $(comm -13 "$1/initd" "$now/initd"); do
      if "/etc/init.d/$u" status >/dev/null 2>&1; then
        echo "[${0##*/}] stopping /etc/init.d/$u (the install started it)" >&2
        "/etc/init.d/$u" stop >/dev/null 2>&1 || echo "[${0##*/}] could not stop /etc/init.d/$u" >&2
      fi
      update-rc.d "$u" disable >/dev/null 2>&1 || true
      record "unit /etc/init.d/$u"
    done
  fi
  rm -rf "$now"
}

# install_record_line FILE: what the demos' last line says stays of the packages need_pkgs installed
# (RP_INSTALL_RECORD), e.g. `Debian packages containerd runc (services disabled: containerd.service)`; empty when
# nothing was installed.
install_record_line() {
  [ -s "$1" ] || return 0
  local pkgs units
  pkgs=$(awk '$1 == "package" {print $2}' "$1" | sort -u | tr '\n' ' ')
  units=$(awk '$1 == "unit" {print $2}' "$1" | sort -u | tr '\n' ' ')
  [ -z "$pkgs" ] || printf 'Debian packages %s' "${pkgs% }"
  [ -z "$units" ] || printf ' (turned off again: %s)' "${units% }"
}

# demo_record_installs: a demo's RP_INSTALL_RECORD (exported: containerd.sh and dockerd.sh install too), read and
# removed by demo_stays.
demo_record_installs() { RP_INSTALL_RECORD=$(mktemp /tmp/rp-install-record.XXXXXX) && export RP_INSTALL_RECORD; }
# demo_stays: what a demo leaves on the machine, for its last line: `stays: the PROFILE build in DIR` and the Debian
# packages it installed (RP_INSTALL_RECORD), with the units it turned off again.
demo_stays() {
  local pkgs; pkgs=$(install_record_line "${RP_INSTALL_RECORD:-/dev/null}")
  [ -z "${RP_INSTALL_RECORD:-}" ] || rm -f "$RP_INSTALL_RECORD"
  printf 'stays: the %s build in %s%s\n' "$(demo_profile)" "$(demo_bin_dir)" "${pkgs:+, $pkgs}"
}
