#!/bin/sh
# slim.sh — run in the guest's root file system (chroot) by build-image.sh: units a headless test guest does not need
# are masked (boot to the test run: ~10 s less), the journal stays in memory.
set -e
systemctl mask -q modprobe@drm.service modprobe@dm_mod.service modprobe@efi_pstore.service modprobe@loop.service \
  modprobe@configfs.service modprobe@fuse.service getty@tty1.service systemd-logind.service \
  systemd-journal-flush.service systemd-update-utmp.service systemd-update-utmp-runlevel.service \
  sys-kernel-debug.mount sys-kernel-tracing.mount sys-kernel-config.mount dev-hugepages.mount \
  sys-fs-fuse-connections.mount systemd-tmpfiles-clean.timer dpkg-db-backup.timer apt-daily.timer \
  apt-daily-upgrade.timer e2scrub_all.timer e2scrub_reap.service fstrim.timer systemd-timesyncd.service \
  systemd-networkd.service systemd-resolved.service 2>/dev/null || true
mkdir -p /etc/systemd/journald.conf.d
printf '[Journal]\nStorage=volatile\n' >/etc/systemd/journald.conf.d/volatile.conf
