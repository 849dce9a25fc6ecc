#!/usr/bin/env bash
# package.sh — `make release` and `make deb`: builds the shipped binaries (cargo profile `dist`: release,
# thin LTO, one codegen unit, stripped) and packages them with dpkg-deb and tar; no cargo tool needed.
#
#   scripts/package.sh [all|deb|tar]   default all: both .debs and the tarball
#
# Output in $OUT (default target/dist/packages):
#   runtime-proxy_<version>_<arch>.deb   /usr/bin/runtime-proxy, runtime-proxy.service, /etc/default/runtime-proxy,
#                                        /etc/runtime/hookserver.d, man pages and shell completions, docs and examples
#                                        (Docker-mode drop-in, kubelet, the Grafana dashboard)
#   runtime-hooks_<version>_<arch>.deb   /usr/bin/runtime-hooks, runtime-hooks.service, /etc/default/runtime-hooks,
#                                        /etc/runtime-hooks/rules.yaml, /etc/runtime/hookserver.d, man pages and shell
#                                        completions, docs, deploy/ manifests the image's Dockerfile and the Grafana
#                                        dashboard
#   runtime-proxy-<version>-<arch>.tar.gz  both binaries, the units, the defaults files, usr/share/ (man pages and
#                                        completions at their installed paths), deploy/, docs, LICENSE
# The man pages (man8, gzipped) and bash, zsh and fish completions are written by the workspace's cli-docs binary
# (crates/cli-docs) from the programs' own clap definitions, built with the same profile as the programs.
# DEB_VERSION sets the packages' version (default: the workspace version in Cargo.toml); GIT_REVISION the
# revision `--version` prints (default: git rev-parse --short HEAD). RP_PACKAGE_PROFILE packages another cargo
# profile's binaries, stripped here (`make test` packages its dev build: the same code without dist's thin LTO,
# ~10 minutes on a fresh clone). Maintainer scripts: packaging/debian/*.in (what they do on install, upgrade and
# removal: docs/operations.md).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh

WHAT=${1:-all}
case $WHAT in all | deb | tar) ;; *) echo "usage: $0 [all|deb|tar]" >&2; exit 2 ;; esac
TARGET=${CARGO_TARGET_DIR:-target}
PROFILE=${RP_PACKAGE_PROFILE:-dist}
OUT=${OUT:-$TARGET/dist/packages}
STAGE=$TARGET/dist/stage
VERSION=$(awk -F'"' '/^\[workspace.package\]/ {p = 1} p && /^version *=/ {print $2; exit}' Cargo.toml)
DEB_VERSION=${DEB_VERSION:-$VERSION}
ARCH=$(dpkg --print-architecture)
MAINTAINER="runtime-proxy developers <runtime-proxy@localhost>"

log() { echo "[package.sh] $*" >&2; }

need_pkgs protobuf-compiler gcc libc6-dev dpkg-dev binutils
rm -rf "$STAGE" && mkdir -p "$STAGE" "$OUT"
log "building the $PROFILE binaries (cargo --profile $PROFILE)"
if [ "$PROFILE" = dist ]; then
  cargo build --locked --profile dist -p runtime-proxy -p runtime-hooks -p cli-docs --bins
  BIN=$TARGET/dist
  CLI_DOCS=$TARGET/dist/cli-docs
else
  # The test run's feature set (examples and tests unify dev-dependencies' features), so that nothing is rebuilt.
  cargo build --locked --profile "$PROFILE" --workspace --bins --examples
  BIN=$STAGE/bin && mkdir -p "$BIN"
  dir=$PROFILE && [ "$PROFILE" != dev ] || dir=debug
  for b in runtime-proxy runtime-hooks; do strip --strip-all -R .debug_gdb_scripts -o "$BIN/$b" "$TARGET/$dir/$b"; done
  CLI_DOCS=$TARGET/$dir/cli-docs
fi

# cli_docs PROGRAM DESTDIR: PROGRAM's man pages (gzipped) and shell completions below DESTDIR/usr/share.
cli_docs() {
  "$CLI_DOCS" "$1" "$2" >/dev/null || { log "cli-docs $1 failed"; exit 1; }
  gzip -9nf "$2"/usr/share/man/man8/"$1"*.8
}

# depends BINARY: the Depends: line for BINARY's shared libraries (Debian package of each, with the newest
# glibc symbol version it uses as libc6's minimum).
depends() {
  local lib path pkg glibc deps=()
  glibc=$(objdump -T "$1" | grep -o 'GLIBC_[0-9.]*' | sed 's/GLIBC_//' | sort -uV | tail -n1)
  for lib in $(objdump -p "$1" | awk '$1 == "NEEDED" {print $2}'); do
    path=$(ldconfig -p | awk -v l="$lib" '$1 == l && /x86-64|AArch64|64bit/ {print $NF; exit}')
    [ -n "$path" ] || path=$(ldconfig -p | awk -v l="$lib" '$1 == l {print $NF; exit}')
    # the path as dpkg recorded it: either spelling on a merged-/usr system
    pkg=$( (dpkg -S "$path" || dpkg -S "$(realpath "$path")") 2>/dev/null | head -n1 | cut -d: -f1) || true
    [ -n "$pkg" ] || { log "no package owns $lib ($path)"; exit 1; }
    if [ "$pkg" = libc6 ]; then pkg="libc6 (>= $glibc)"; fi
    deps+=("$pkg")
  done
  printf '%s\n' "${deps[@]}" | sort -u | paste -sd, | sed 's/,/, /g'
}

# script PKG VAR RUNDIR NOTE: the maintainer scripts of PKG from packaging/debian/*.in.
scripts() {
  local s
  for s in postinst prerm postrm; do
    sed -e "s|@PKG@|$1|g" -e "s|@VAR@|$2|g" -e "s|@RUNDIR@|$3|g" -e "s|@REMOVE_NOTE@|$4|g" \
      "packaging/debian/$s.in" >"$D/DEBIAN/$s"
    chmod 0755 "$D/DEBIAN/$s"
  done
}

# deb PKG SUMMARY EXTRA-CONTROL-LINES DESCRIPTION-FILE: stages $D (filled by the caller) into $OUT/PKG_VERSION_ARCH.deb.
deb() {
  local pkg=$1 size deps
  mkdir -p "$D/usr/share/doc/$pkg"
  printf 'Files: *\nCopyright: the runtime-proxy developers\nLicense: Apache-2.0\n On Debian systems the full text is in /usr/share/common-licenses/Apache-2.0.\n' \
    >"$D/usr/share/doc/$pkg/copyright"
  gzip -9n <CHANGELOG.md >"$D/usr/share/doc/$pkg/changelog.gz"
  cp docs/operations.md "$D/usr/share/doc/$pkg/operations.md"
  (cd "$D" && find etc -type f 2>/dev/null | sed 's|^|/|' | sort) >"$D/DEBIAN/conffiles"
  [ -s "$D/DEBIAN/conffiles" ] || rm "$D/DEBIAN/conffiles"
  size=$(du -sk --exclude=DEBIAN "$D" | cut -f1)
  deps=$(depends "$D/usr/bin/$pkg") || exit 1
  {
    printf 'Package: %s\nVersion: %s\nArchitecture: %s\nMaintainer: %s\nInstalled-Size: %s\n' "$pkg" "$DEB_VERSION" "$ARCH" "$MAINTAINER" "$size"
    printf 'Depends: %s\n' "$deps"
    printf '%s' "$3"
    printf 'Section: admin\nPriority: optional\nDescription: %s\n' "$2"
    sed 's/^/ /; s/^ $/ ./' "$4"
  } >"$D/DEBIAN/control"
  find "$D" -type d -exec chmod 0755 {} +
  dpkg-deb --root-owner-group -Zxz --build "$D" "$OUT/${pkg}_${DEB_VERSION}_${ARCH}.deb" >/dev/null
  log "$OUT/${pkg}_${DEB_VERSION}_${ARCH}.deb ($(du -k "$OUT/${pkg}_${DEB_VERSION}_${ARCH}.deb" | cut -f1) KiB, installed ${size} KiB)"
}

if [ "$WHAT" != tar ]; then
  # runtime-proxy
  D=$STAGE/runtime-proxy
  mkdir -p "$D/DEBIAN" "$D/usr/bin" "$D/lib/systemd/system" "$D/etc/default" "$D/etc/runtime/hookserver.d" \
    "$D/usr/share/doc/runtime-proxy/examples"
  install -m 0755 "$BIN/runtime-proxy" "$D/usr/bin/"
  cli_docs runtime-proxy "$D"
  install -m 0644 packaging/systemd/runtime-proxy.service "$D/lib/systemd/system/"
  install -m 0644 packaging/default/runtime-proxy "$D/etc/default/"
  install -m 0644 packaging/examples/runtime-proxy-docker.conf deploy/kubelet/* deploy/grafana-dashboard.json \
    "$D/usr/share/doc/runtime-proxy/examples/"
  scripts runtime-proxy RUNTIME_PROXY koord-runtimeproxy " If kubelet still points at the proxy, point it back at the runtime (docs/operations.md, Roll back)."
  cat >"$STAGE/proxy.desc" <<'EOT'
kubelet talks CRI to runtime-proxy instead of containerd; the proxy forwards
every call and, at the pod and container life-cycle points, calls the runtime
hook servers registered in /etc/runtime/hookserver.d and applies their answers
(cgroup parent, CPU and memory resources, cpuset, env, annotations).

A drop-in replacement for Koordinator's koord-runtime-proxy (same flags, same
registrations). Installing does not enable the service: see
/usr/share/doc/runtime-proxy/operations.md.
EOT
  deb runtime-proxy "CRI proxy that calls runtime hook servers (koord-runtime-proxy compatible)" \
    "Recommends: containerd | docker.io
Suggests: runtime-hooks
" "$STAGE/proxy.desc"

  # runtime-hooks
  D=$STAGE/runtime-hooks
  mkdir -p "$D/DEBIAN" "$D/usr/bin" "$D/lib/systemd/system" "$D/etc/default" "$D/etc/runtime/hookserver.d" \
    "$D/etc/runtime-hooks" "$D/usr/share/doc/runtime-hooks/examples/deploy/crds"
  install -m 0755 "$BIN/runtime-hooks" "$D/usr/bin/"
  cli_docs runtime-hooks "$D"
  install -m 0644 packaging/systemd/runtime-hooks.service "$D/lib/systemd/system/"
  install -m 0644 packaging/default/runtime-hooks "$D/etc/default/"
  install -m 0644 packaging/examples/rules.yaml "$D/etc/runtime-hooks/"
  install -m 0644 deploy/*.yaml deploy/grafana-dashboard.json deploy/Dockerfile "$D/usr/share/doc/runtime-hooks/examples/deploy/"
  install -m 0644 deploy/crds/*.yaml "$D/usr/share/doc/runtime-hooks/examples/deploy/crds/"
  scripts runtime-hooks RUNTIME_HOOKS runtime-hooks " Its registration was removed; the proxy no longer calls it."
  cat >"$STAGE/hooks.desc" <<'EOT'
A runtime hook server in the role of koordlet's runtime hooks, with its QoS
plugins (GroupIdentity, BatchResource, CPUSet): it serves runtime.v1alpha1
hooks to runtime-proxy (or koord-runtime-proxy) and writes pod cgroups, or
reconciles the pods' cgroups on its own (standalone mode).

Installing does not enable the service: see
/usr/share/doc/runtime-hooks/operations.md.
EOT
  deb runtime-hooks "Runtime hook server with koordlet's QoS plugins, for runtime-proxy" \
    "Suggests: runtime-proxy
" "$STAGE/hooks.desc"
fi

if [ "$WHAT" != deb ]; then
  T=$STAGE/runtime-proxy-$DEB_VERSION-$ARCH
  mkdir -p "$T/bin" "$T/systemd" "$T/default" "$T/examples"
  install -m 0755 "$BIN/runtime-proxy" "$BIN/runtime-hooks" "$T/bin/"
  cli_docs runtime-proxy "$T" && cli_docs runtime-hooks "$T"
  install -m 0644 packaging/systemd/*.service "$T/systemd/"
  install -m 0644 packaging/default/* "$T/default/"
  install -m 0644 packaging/examples/* "$T/examples/"
  cp -r deploy "$T/deploy"
  cp -r docs "$T/docs"
  install -m 0644 LICENSE CHANGELOG.md README.md "$T/"
  tar --sort=name --owner=0 --group=0 --numeric-owner -C "$STAGE" -czf "$OUT/runtime-proxy-$DEB_VERSION-$ARCH.tar.gz" "$(basename "$T")"
  log "$OUT/runtime-proxy-$DEB_VERSION-$ARCH.tar.gz ($(du -k "$OUT/runtime-proxy-$DEB_VERSION-$ARCH.tar.gz" | cut -f1) KiB)"
fi
for b in runtime-proxy runtime-hooks; do log "$("$BIN/$b" --version): $(du -k "$BIN/$b" | cut -f1) KiB"; done
