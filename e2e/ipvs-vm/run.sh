#!/usr/bin/env bash
# ipvs-vm: boots Debian's own kernel in qemu (software emulation, TCG) with a small initramfs and runs
# the IPVS scenarios inside it, because the machines this project builds on have no ip_vs.
#
#   Debian packages (apt) ─► tools + current kernel .deb (cached) ─► initramfs (busybox, tools with
#   their libraries, netfilter/IPVS/ipset modules, init.sh) ─► qemu -accel tcg -nic none under timeout
#   ─► guest: scenarios.sh (topology.sh first, switch.sh last; the agent binary comes through a 9p share)
#   ─► "ok"/"not ok" lines and IPVS-VM-RESULT on the serial console, the same in <share>/result.txt
#   ─► "ipvs-vm: N passed, M failed"
#
# Usage: e2e/ipvs-vm/run.sh [--binary PATH] [--scenarios FILE] [--keep]
# Environment: SWITCHYARD_LAB_BIN (default target/debug/switchyard-lab), SWITCHYARD_VM_CACHE (default
# ~/.cache/switchyard/ipvs-vm), SWITCHYARD_VM_TIMEOUT (seconds, default 480), SWITCHYARD_VM_ACCEL (tcg, or
# kvm on a real VT-x/AMD-V host), SWITCHYARD_VM_OFFLINE=1 (no apt at all: use what is installed and cached).
# Exit: 0 when every scenario passed, 1 when one failed or the VM gave no verdict, 2 when it could not
# be set up (missing tools or kernel and no apt access).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
binary=${SWITCHYARD_LAB_BIN:-$root/target/debug/switchyard-lab}
scenarios=$here/scenarios.sh
cache=${SWITCHYARD_VM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/switchyard/ipvs-vm}
timeout_s=${SWITCHYARD_VM_TIMEOUT:-480}
accel=${SWITCHYARD_VM_ACCEL:-tcg}
keep=0

while (($#)); do
  case $1 in
    --binary) binary=$2; shift 2 ;;
    --scenarios) scenarios=$2; shift 2 ;;
    --keep) keep=1; shift ;;
    *) echo "usage: $0 [--binary PATH] [--scenarios FILE] [--keep]" >&2; exit 2 ;;
  esac
done

say() { echo "ipvs-vm: $*" >&2; }
setup_failed() { say "setup failed: $*"; exit 2; }

started=$(date +%s)
# Named after this process (pid and start time, as test-support's scratch folders are), so that
# `switchyard-lab gc` removes it if this run is killed before its trap runs.
stat=$(</proc/$$/stat); fields=(${stat##*) })
work=$(mktemp -d "${TMPDIR:-/tmp}/switchyard-scratch.$$.${fields[19]}.ipvs-vm.XXXXXX")
cleanup() { if ((keep)); then say "kept $work"; else rm -rf "$work"; fi; }
trap cleanup EXIT

[[ -x $binary ]] || setup_failed "no agent binary at $binary (build it: cargo build -p switchyard-e2e --bin switchyard-lab)"
[[ -f $scenarios ]] || setup_failed "no scenario file $scenarios"

# --- 1. tools from Debian -------------------------------------------------------------------------
# package:file that proves it is installed
needs=(qemu-system-x86:/usr/bin/qemu-system-x86_64 cpio:/usr/bin/cpio kmod:/usr/bin/kmod
  busybox-static:/bin/busybox ipvsadm:/usr/sbin/ipvsadm ipset:/usr/sbin/ipset iproute2:/usr/sbin/ip
  iptables:/usr/sbin/xtables-nft-multi netbase:/etc/protocols socat:/usr/bin/socat nftables:/usr/sbin/nft)
apt_updated=0
apt_update() {
  ((apt_updated)) && return 0
  [[ ${SWITCHYARD_VM_OFFLINE:-0} == 1 ]] && return 1
  [[ $(id -u) == 0 ]] || return 1
  say "apt-get update"
  DEBIAN_FRONTEND=noninteractive apt-get update -qq >"$work/apt-update.log" 2>&1 || { cat "$work/apt-update.log" >&2; return 1; }
  apt_updated=1
}
missing=()
for need in "${needs[@]}"; do
  pkg=${need%%:*} file=${need#*:}
  [[ -e $file ]] || missing+=("$pkg")
done
# busybox must be the static build: the initramfs has no libc for it.
if [[ -e /bin/busybox ]] && ldd /bin/busybox >/dev/null 2>&1; then missing+=(busybox-static); fi
if ((${#missing[@]})); then
  if [[ ${SWITCHYARD_VM_OFFLINE:-0} == 1 || $(id -u) != 0 ]]; then
    setup_failed "missing packages ${missing[*]} (install them as root: apt-get install --no-install-recommends ${missing[*]})"
  fi
  apt_update || setup_failed "apt-get update failed; cannot install ${missing[*]}"
  say "apt-get install ${missing[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >"$work/apt-install.log" 2>&1 \
    || { cat "$work/apt-install.log" >&2; setup_failed "apt-get install ${missing[*]} failed"; }
fi

# --- 2. the current Debian kernel, downloaded once into the cache ----------------------------------
mkdir -p "$cache"
abi_of() { apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/ {print $2; exit}'; }
abi=""
if [[ ${SWITCHYARD_VM_OFFLINE:-0} != 1 ]]; then
  abi=$(abi_of || true)
  if [[ -z $abi ]] && apt_update; then abi=$(abi_of || true); fi
fi
deb=""
if [[ -n $abi ]]; then
  deb=$(ls -1 "$cache/${abi}"_*.deb 2>/dev/null | tail -n 1 || true)
  if [[ -z $deb ]]; then
    say "downloading $abi"
    # The ABI package of a stale package list may have left the mirror: refresh once and retry.
    if ! (cd "$cache" && apt-get download "$abi" >"$work/download.log" 2>&1); then
      apt_update && (cd "$cache" && apt-get download "$abi" >"$work/download.log" 2>&1) || cat "$work/download.log" >&2
    fi
    deb=$(ls -1 "$cache/${abi}"_*.deb 2>/dev/null | tail -n 1 || true)
  fi
fi
if [[ -z $deb ]]; then
  # No apt (or the download failed): the newest kernel cached by an earlier run will do.
  deb=$(ls -1t "$cache"/linux-image-*.deb 2>/dev/null | head -n 1 || true)
  [[ -n $deb ]] || setup_failed "no Debian kernel: apt-cache/apt-get download of linux-image-amd64 failed and $cache has none"
  say "using cached $(basename "$deb")"
fi
unpacked=$cache/$(basename "$deb" .deb)
if [[ ! -f $unpacked/.ready ]]; then
  rm -rf "$unpacked"
  dpkg -x "$deb" "$unpacked"
  kv=$(ls "$unpacked/lib/modules")
  # The .deb has no modules.dep (its postinst makes it).
  depmod -b "$unpacked" "$kv"
  touch "$unpacked/.ready"
fi
kv=$(ls "$unpacked/lib/modules")
# Only the kernel in use stays cached: older ones (Debian moved on) are removed, deb and unpacked.
for old in "$cache"/linux-image-*; do
  [[ $old == "$deb" || $old == "$unpacked" ]] || rm -rf "$old"
done
vmlinuz=$unpacked/boot/vmlinuz-$kv
[[ -f $vmlinuz ]] || setup_failed "no $vmlinuz in $(basename "$deb")"

# --- 3. the initramfs ------------------------------------------------------------------------------
rootfs=$work/root
mkdir -p "$rootfs"/{bin,usr/bin,usr/sbin,usr/lib,etc/modprobe.d,proc,sys,dev,run,tmp,mnt/host,var}
ln -s usr/sbin "$rootfs/sbin"
ln -s usr/lib "$rootfs/lib"
ln -s usr/lib "$rootfs/lib64"
cp /bin/busybox "$rootfs/bin/busybox"
for applet in $("$rootfs/bin/busybox" --list); do
  [[ -e $rootfs/bin/$applet ]] || ln -s busybox "$rootfs/bin/$applet"
done

# Copies an executable and the shared libraries ldd names (ldd exits 1 for static binaries).
copy_with_libs() {
  local src=$1 dest=${2:-$1} libs
  install -D -m 0755 "$(readlink -f "$src")" "$rootfs$dest"
  libs=$(ldd "$src" 2>/dev/null | awk '/=> \// {print $3} /^\t\/[^ ]+ \(/ {print $1}' || true)
  for lib in $libs; do
    [[ -e $rootfs$lib ]] || install -D -m 0755 "$(readlink -f "$lib")" "$rootfs$lib"
  done
}
copy_with_libs /usr/sbin/ip
copy_with_libs /usr/sbin/ipvsadm
copy_with_libs /usr/sbin/ipset
copy_with_libs /usr/bin/socat
copy_with_libs /usr/bin/kmod
copy_with_libs /usr/sbin/nft # the nftables backend (backend switches)
for tool in modprobe insmod lsmod rmmod depmod modinfo; do ln -s ../bin/kmod "$rootfs/usr/sbin/$tool"; done
copy_with_libs /usr/sbin/xtables-nft-multi
for tool in iptables iptables-save iptables-restore ip6tables ip6tables-save ip6tables-restore \
  iptables-nft iptables-nft-save iptables-nft-restore ip6tables-nft ip6tables-nft-save ip6tables-nft-restore; do
  ln -s xtables-nft-multi "$rootfs/usr/sbin/$tool"
done
xtables=/usr/lib/x86_64-linux-gnu/xtables
mkdir -p "$rootfs$xtables"
cp "$xtables"/*.so "$rootfs$xtables/"
for so in "$xtables"/*.so; do copy_with_libs "$so" >/dev/null; done
if command -v strace >/dev/null; then copy_with_libs "$(command -v strace)" /usr/bin/strace; fi
cp /etc/protocols /etc/services "$rootfs/etc/" # ipset parses tcp:80 with them
[[ -f /etc/ethertypes ]] && cp /etc/ethertypes "$rootfs/etc/"
echo 'root:x:0:0:root:/root:/bin/sh' >"$rootfs/etc/passwd"
echo 'root:x:0:' >"$rootfs/etc/group"

# Modules: every netfilter module (IPVS, ipset, nf_tables, xt_*) plus the devices, each with its
# dependencies (modprobe --show-depends also pulls soft dependencies such as crc32c).
moddir=$unpacked/lib/modules/$kv
modules=$(find "$moddir/kernel/net/netfilter" "$moddir/kernel/net/ipv4/netfilter" "$moddir/kernel/net/ipv6/netfilter" \
  -name '*.ko' -printf '%f\n' | sed 's/\.ko$//')
modules+=" dummy veth virtio_pci 9p 9pnet_virtio"
for module in $modules; do
  modprobe -S "$kv" -d "$unpacked" --show-depends "$module" 2>/dev/null | awk '$1 == "insmod" {print $2}'
done | sort -u | while read -r ko; do
  install -D -m 0644 "$ko" "$rootfs${ko#"$unpacked"}"
done
cp "$moddir"/modules.builtin* "$moddir"/modules.order "$rootfs/lib/modules/$kv/"
depmod -b "$rootfs" "$kv"

# The agent binary comes through the share (too big for a fast initramfs); its libraries go here.
libs=$(ldd "$binary" 2>/dev/null | awk '/=> \// {print $3}' || true)
for lib in $libs; do
  [[ -e $rootfs$lib ]] || install -D -m 0755 "$(readlink -f "$lib")" "$rootfs$lib"
done
install -m 0755 "$here/init.sh" "$rootfs/init"
(cd "$rootfs" && find . | cpio -o -H newc --quiet | gzip -1) >"$work/initrd.gz"

share=$work/share
mkdir -p "$share"
cp "$binary" "$share/switchyard-lab"
cp "$scenarios" "$share/scenarios.sh"
cp "$here/lib.sh" "$here/topology.sh" "$here/switch.sh" "$share/"
say "initramfs $(du -h "$work/initrd.gz" | cut -f1), kernel $kv, ready in $(($(date +%s) - started)) s"

# --- 4. boot -----------------------------------------------------------------------------------------
case $accel in
  tcg) accel_args=(-accel tcg,thread=multi -cpu max) ;;
  kvm) accel_args=(-accel kvm -cpu host) ;;
  *) setup_failed "SWITCHYARD_VM_ACCEL must be tcg or kvm" ;;
esac
serial=$work/serial.log
booted=$(date +%s)
set +e
timeout -k 5 "$timeout_s" qemu-system-x86_64 "${accel_args[@]}" -m 1536 -smp 2 \
  -display none -monitor none -serial "file:$serial" -no-reboot -nic none \
  -kernel "$vmlinuz" -initrd "$work/initrd.gz" \
  -append "console=ttyS0 panic=-1 quiet loglevel=3" \
  -virtfs "local,path=$share,mount_tag=host,security_model=none,id=host" </dev/null
qemu_status=$?
set -e
vm_seconds=$(($(date +%s) - booted))

# --- 5. verdict ----------------------------------------------------------------------------------------
# The serial console speaks CRLF and SeaBIOS escape codes; qemu exits 0 whatever happened inside.
log=$work/serial.txt
tr -d '\r' <"$serial" | sed 's/\x1b\[[0-9;?]*[a-zA-Z]//g' >"$log" || true
grep -E '^(ok|not ok|#) ' "$log" || true
passed=$(grep -c '^ok ' "$log" || true)
failed=$(grep -c '^not ok ' "$log" || true)
marker=$(grep -o 'IPVS-VM-RESULT: [A-Z]*' "$log" | tail -n 1 || true)
file_marker=$(grep -o 'IPVS-VM-RESULT: [A-Z]*' "$share/result.txt" 2>/dev/null | tail -n 1 || true)
verdict=ok
if ((qemu_status == 124 || qemu_status == 137)); then
  say "qemu was killed after ${timeout_s} s (timeout)"; verdict=bad
fi
if [[ -z $marker ]]; then say "no IPVS-VM-RESULT marker on the serial console"; verdict=bad; fi
if [[ $marker != "$file_marker" ]]; then say "the 9p result file says '${file_marker:-nothing}', the console '${marker:-nothing}'"; verdict=bad; fi
[[ $marker == "IPVS-VM-RESULT: PASS" ]] || verdict=bad
((passed > 0)) || verdict=bad
if [[ $verdict != ok ]] && ((failed == 0)); then failed=1; fi
if [[ $verdict != ok ]]; then
  say "last lines of the serial console:"
  tail -n 60 "$log" >&2
fi
say "VM ran ${vm_seconds} s; total $(($(date +%s) - started)) s"
echo "ipvs-vm: $passed passed, $failed failed"
[[ $verdict == ok ]]
