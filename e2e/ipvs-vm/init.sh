#!/bin/busybox sh
# The guest's /init: mount the basics, mount the host's 9p share, run the scenarios, power off.
# Whatever happens, the last line on the console is an IPVS-VM-RESULT marker (or nothing, when the VM
# died, which the driver treats as a failure). panic=-1 and -no-reboot end qemu if this script dies.
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
/bin/busybox mount -t proc proc /proc
/bin/busybox mount -t sysfs sys /sys
/bin/busybox mount -t devtmpfs dev /dev
/bin/busybox mount -t tmpfs tmpfs /run
/bin/busybox mount -t tmpfs tmpfs /tmp
/bin/busybox mkdir -p /run/netns /var/run
/bin/busybox ln -sf /run /var/run 2>/dev/null
/usr/sbin/modprobe virtio_pci && /usr/sbin/modprobe 9pnet_virtio && /usr/sbin/modprobe 9p
if ! /bin/busybox mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 host /mnt/host; then
  echo "# cannot mount the 9p share"
  echo "IPVS-VM-RESULT: FAIL"
  /bin/busybox poweroff -f
fi
cd /tmp
/bin/busybox sh -c '. /mnt/host/lib.sh; . /mnt/host/scenarios.sh; finish' </dev/null
sync
/bin/busybox poweroff -f
