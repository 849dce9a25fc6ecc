# shellcheck shell=bash disable=SC2034  # (the variables are for the scripts that source it)
# lib.sh — what the scripts of scripts/v2vm/ share (source it, don't run it): scripts/containerd.sh's functions
# (apt_archive, build_images, need_pkgs from scripts/lib.sh, CACHE), the cache layout and the image key.
# shellcheck source=scripts/containerd.sh
. "$(dirname "${BASH_SOURCE[0]}")/../containerd.sh"

V2VM_SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
V2VM_CACHE=$CACHE/v2vm
# Host packages: building the image (kernel unpacking, mmdebstrap, runc's glibc, ext4 and initramfs), the test
# binaries' copies (objcopy) and booting the guest.
V2VM_BUILD_PKGS=(mmdebstrap eatmydata busybox-static cpio e2fsprogs xz-utils patchelf gzip)
V2VM_RUN_PKGS=(qemu-system-x86 binutils)

v2log() { echo "[v2vm ${SECONDS}s] $*" >&2; }
v2die() { v2log "error: $*"; exit 1; }

# image_dir: the cache dir of the image the current scripts make, $V2VM_CACHE/img-KEY, KEY a hash of every file that
# shapes the image (build-image.sh, this file, guest/*; not guest/run-tests.sh, which each test run copies in).
image_dir() {
  local key
  key=$(cd "$V2VM_SRC" && { cat build-image.sh lib.sh; find guest -type f ! -name run-tests.sh -print0 | LC_ALL=C sort -z | xargs -0 cat; } |
    sha256sum | cut -c1-12)
  echo "$V2VM_CACHE/img-$key"
}
