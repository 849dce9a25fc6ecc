#!/usr/bin/env bash
# build-image.sh — the cgroup v2 guest that scripts/v2vm.sh boots under qemu, from Debian packages only; run it as
# `scripts/v2vm.sh image`. Prints the image dir (the last line of stdout); diagnostics go to stderr.
#
#   kernel      Debian bookworm's (the package linux-image-amd64 depends on), downloaded and unpacked, never installed;
#               the uncompressed vmlinux inside its vmlinuz, which qemu boots directly (PVH)
#   initramfs   busybox-static and the virtio/ext4 modules the root disk needs (guest/init)
#   root        ext4 made with mmdebstrap (bookworm, minbase, eatmydata hook): systemd as PID 1 on cgroup v2, D-Bus,
#               Debian sid's containerd 2.1.x (guest/containerd.toml: CRI, SystemdCgroup = true, NRI on), Debian
#               sid's runc 1.3.x as /usr/sbin/runc (bookworm's diverted away) run with Debian trixie's glibc in
#               /opt/runc-glibc (runc 1.3 needs glibc >= 2.38, bookworm has 2.36: patchelf sets its interpreter and
#               rpath), the 9p mounts of guest/fstab, guest/rp-v2vm.service (runs the host's script), the kernel's
#               modules for what the guest loads (9p, overlay, netfilter, ...); systemd's own settings are
#               Debian's (kubelet and runc enable the controllers their cgroups need, as on a node)
#
# Cached once in $RP_CACHE/v2vm/img-KEY (RP_CACHE default /var/cache/runtime-proxy; KEY: a hash of the files that
# shape the image, see lib.sh's image_dir): vmlinux, initrd.gz, root.img (2 GiB sparse; boot it with snapshot=on),
# versions.txt. When that dir exists nothing is downloaded or built; other img-* dirs are removed when a new one is
# made. The Debian archive is the one this machine's apt sources name (scripts/containerd.sh's apt_archive); the host
# gets its build packages installed (need_pkgs) and nothing else: the downloads go through a private apt dir in the
# cache and are removed with the build dir. Needs root.
set -euo pipefail
# shellcheck source=scripts/v2vm/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

IMG=$(image_dir)
mkdir -p "$V2VM_CACHE"
exec 8>"$V2VM_CACHE/.lock" && flock 8  # one build at a time; a second caller waits and then finds it cached
if [ -f "$IMG/ok" ]; then
  v2log "cached image $IMG ($(paste -sd' ' "$IMG/versions.txt"))"
  echo "$IMG"
  exit 0
fi
v2log "building $IMG"
need_pkgs "${V2VM_BUILD_PKGS[@]}"
B=$V2VM_CACHE/build.$$
rm -rf "$V2VM_CACHE"/build.* && mkdir -p "$B"/{apt/sources,apt/prefs.d,apt/lists/partial,apt/cache/archives/partial,deb,x}
# the build dir goes in the background (its root tree takes half a minute to delete here); the next build removes
# what is left of it
trap 'mv "$B" "$B.old" && (rm -rf "$B.old" </dev/null >/dev/null 2>&1 8>&- &)' EXIT

# --- a private apt for the downloads: bookworm, trixie and sid from the archive this machine's apt uses; trixie and
# sid at a low priority, so that they are used only where named (pkg/suite)
read -r URI KEY < <(apt_archive) || true
[ -n "${URI:-}" ] || v2die "apt's sources (/etc/apt/sources.list, sources.list.d/) name no Debian archive to build the guest from"
[ "$KEY" != - ] || KEY=/usr/share/keyrings/debian-archive-keyring.gpg
printf 'Types: deb\nURIs: %s\nSuites: bookworm trixie sid\nComponents: main\nSigned-By: %s\n' "$URI" "$KEY" >"$B/apt/sources/v2vm.sources"
printf 'Package: *\nPin: release n=%s\nPin-Priority: 100\n\n' trixie sid >"$B/apt/prefs"
APT=(-q -o Dir::Etc::SourceList=/dev/null -o "Dir::Etc::SourceParts=$B/apt/sources" -o "Dir::State::Lists=$B/apt/lists"
     -o "Dir::Cache=$B/apt/cache" -o "Dir::Etc::Preferences=$B/apt/prefs" -o "Dir::Etc::PreferencesParts=$B/apt/prefs.d"
     -o APT::Sandbox::User=root)
v2log "apt-get update ($URI: bookworm trixie sid)"
apt-get "${APT[@]}" update </dev/null >/dev/null

KPKG=$(apt-cache "${APT[@]}" depends linux-image-amd64 | awk '$1 == "Depends:" && $2 ~ /^linux-image-[0-9]/ {print $2; exit}')
[ -n "$KPKG" ] || v2die "linux-image-amd64 depends on no linux-image-VERSION package"
KVER=${KPKG#linux-image-}
v2log "apt-get download $KPKG containerd/sid runc/sid libc6/trixie"
(cd "$B/deb" && apt-get "${APT[@]}" download "$KPKG" containerd/sid runc/sid libc6/trixie </dev/null >/dev/null)
deb() { local f; f=$(echo "$B/deb/$1"_*.deb) && [ -f "$f" ] && echo "$f"; }
CTRD_DEB=$(deb containerd) RUNC_DEB=$(deb runc) LIBC_DEB=$(deb libc6)
v=$(dpkg-deb -f "$CTRD_DEB" Version)
[[ $v == 2.1.* ]] ||
  v2die "Debian sid offers containerd $v, not 2.1.x: the guest is pinned to the 2.1 series (as scripts/containerd.sh up 2.1)"
v=$(dpkg-deb -f "$RUNC_DEB" Version)
[[ $v == 1.3.* ]] || v2die "Debian sid offers runc $v, not 1.3.x: the guest is pinned to the 1.3 series"

# --- kernel: unpacked; the xz payload of the bzImage is the ELF vmlinux qemu boots through its PVH note
dpkg-deb -x "$(deb "$KPKG")" "$B/x/kernel"
KMOD=$B/x/kernel/lib/modules/$KVER
VMLINUZ=$B/x/kernel/boot/vmlinuz-$KVER
off=$(perl -0777 -ne 'print index($_, "\xfd7zXZ\x00")' "$VMLINUZ")
[ "$off" -ge 0 ] || v2die "no xz payload in $VMLINUZ"
# the xz stream is followed by other data: xz reports it, its output is whole
tail -c +$((off + 1)) "$VMLINUZ" | xz -dc 2>/dev/null >"$B/vmlinux" || true
[ "$(head -c 4 "$B/vmlinux" | od -An -c | tr -d ' ')" = 177ELF ] || v2die "no ELF vmlinux in $VMLINUZ"

# --- root file system
R=$B/root
v2log "mmdebstrap bookworm (+ containerd $(dpkg-deb -f "$CTRD_DEB" Version) from sid)"
mmdebstrap --variant=minbase -q --hook-dir=/usr/share/mmdebstrap/hooks/eatmydata \
  --include=systemd,systemd-sysv,udev,dbus,kmod,runc,libseccomp2,iproute2,procps,psmisc,less \
  --customize-hook="copy-in $CTRD_DEB /tmp" --customize-hook="chroot \"\$1\" dpkg -i /tmp/${CTRD_DEB##*/}" \
  --customize-hook="rm \"\$1\"/tmp/${CTRD_DEB##*/}" \
  bookworm "$R" "deb [signed-by=$KEY] $URI bookworm main" </dev/null >"$B/mmdebstrap.log" 2>&1 ||
  { tail -n 30 "$B/mmdebstrap.log" >&2; v2die "mmdebstrap failed"; }
G=$V2VM_SRC/guest
echo v2vm >"$R/etc/hostname"
# containerd copies both into a host-network pod (minbase has no netbase; the guest has no network)
printf '127.0.0.1\tlocalhost\n127.0.1.1\tv2vm\n::1\tlocalhost ip6-localhost ip6-loopback\n' >"$R/etc/hosts"
echo '# v2vm guest: no network' >"$R/etc/resolv.conf"
cp "$G/fstab" "$R/etc/fstab"
mkdir -p "$R/mnt/rp" "$R/mnt/rp-bin" "$R/opt/nri/plugins" "$R/etc/nri/conf.d" \
  "$R/etc/systemd/system/serial-getty@ttyS0.service.d"
cp "$G/containerd.toml" "$R/etc/containerd/config.toml"
cp "$G/autologin.conf" "$R/etc/systemd/system/serial-getty@ttyS0.service.d/"
cp "$G/rp-v2vm.service" "$R/etc/systemd/system/"
chroot "$R" passwd -dq root
chroot "$R" systemctl enable -q rp-v2vm.service containerd.service
cp "$G/slim.sh" "$R/tmp/" && chroot "$R" sh /tmp/slim.sh && rm "$R/tmp/slim.sh"

# runc: sid's 1.3 as /usr/sbin/runc (bookworm's, which containerd's package depends on, moved aside by dpkg-divert),
# with trixie's glibc beside it
dpkg-deb -x "$RUNC_DEB" "$B/x/runc" && dpkg-deb -x "$LIBC_DEB" "$B/x/libc6"
mkdir -p "$R/opt/runc-glibc"
cp -a "$B/x/libc6/usr/lib/x86_64-linux-gnu/." "$R/opt/runc-glibc/"
chroot "$R" dpkg-divert --quiet --local --rename --add /usr/sbin/runc
cp "$B/x/runc/usr/sbin/runc" "$R/usr/sbin/runc"
patchelf --set-interpreter /opt/runc-glibc/ld-linux-x86-64.so.2 --force-rpath --set-rpath /opt/runc-glibc "$R/usr/sbin/runc"
RUNC_V=$(chroot "$R" /usr/sbin/runc --version 2>&1) || true
[[ $RUNC_V == "runc version 1.3."* ]] || v2die "sid's runc does not run in the guest's root: $RUNC_V"

# kernel modules (virtio, 9p, overlay, netfilter, ...), depmod run in the root (the host may have no kmod)
mkdir -p "$R/lib/modules/$KVER/kernel/drivers"
cp "$KMOD"/modules.order "$KMOD"/modules.builtin* "$R/lib/modules/$KVER/"
for d in fs net lib crypto block arch drivers/virtio drivers/block drivers/char drivers/md; do
  [ ! -d "$KMOD/kernel/$d" ] || cp -a "$KMOD/kernel/$d" "$R/lib/modules/$KVER/kernel/$d"
done
chroot "$R" /sbin/depmod "$KVER"

# shellcheck disable=SC2016  # dpkg-query's format
{
  echo "kernel=$KPKG $(dpkg-deb -f "$(deb "$KPKG")" Version) (Debian bookworm)"
  echo "systemd=$(chroot "$R" dpkg-query -W -f='${Version}' systemd) (Debian bookworm)"
  echo "containerd=$(chroot "$R" dpkg-query -W -f='${Version}' containerd) (Debian sid)"
  echo "runc=$(dpkg-deb -f "$RUNC_DEB" Version) (Debian sid, /usr/sbin/runc)"
  echo "runc_glibc=$(dpkg-deb -f "$LIBC_DEB" Version) (Debian trixie, /opt/runc-glibc)"
  echo "glibc=$(chroot "$R" dpkg-query -W -f='${Version}' libc6) (Debian bookworm)"
} >"$B/versions.txt"
rm -rf "$R"/var/cache/apt/archives/*.deb "$R"/var/lib/apt/lists/* "$R"/usr/share/doc "$R"/usr/share/man
v2log "mkfs.ext4 ($(du -sm "$R" | cut -f1) MiB)"
mkfs.ext4 -q -F -L v2vm-root -d "$R" "$B/root.img" 2G >/dev/null

# --- initramfs: busybox, the modules /dev/vda and ext4 need (in dependency order; those built into the kernel are
# skipped), guest/init
D=$B/initrd
mkdir -p "$D"/{bin,dev,proc,sys,newroot,lib/modules}
cp /bin/busybox "$D/bin/" && cp "$G/init" "$D/init"
for m in virtio_ring virtio virtio_pci_legacy_dev virtio_pci_modern_dev virtio_pci virtio_blk crc16 mbcache jbd2 crc32c_generic ext4; do
  f=$(cd "$KMOD" && find kernel -name "$m.ko*" | head -n 1)
  if [ -n "$f" ]; then
    cp "$KMOD/$f" "$D/lib/modules/" && echo "${f##*/}" >>"$D/modules"
  else
    grep -q "/$m.ko" "$KMOD/modules.builtin" || v2die "kernel $KVER has no module $m"
  fi
done
(cd "$D" && find . | LC_ALL=C sort | cpio -o -H newc --quiet | gzip -1 >"$B/initrd.gz")

rm -rf "$IMG.tmp" && mkdir -p "$IMG.tmp"
mv "$B/vmlinux" "$B/initrd.gz" "$B/root.img" "$B/versions.txt" "$IMG.tmp/"
for old in "$V2VM_CACHE"/img-*; do [ "$old" = "$IMG" ] || [ "$old" = "$IMG.tmp" ] || rm -rf "$old"; done
mv "$IMG.tmp" "$IMG" && touch "$IMG/ok"
v2log "built $IMG ($(paste -sd' ' "$IMG/versions.txt"))"
echo "$IMG"
