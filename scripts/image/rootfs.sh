#!/usr/bin/env bash
# The base root filesystem of one image, as a tar, made by mmdebstrap from Debian packages.
#
#   scripts/image/rootfs.sh agent|controller|agnhost OUT.tar
#
# Packages are unpacked (variant `extract`), not installed: no maintainer scripts, no dpkg, apt,
# shell or perl in the image. What the maintainer scripts would have done and a running image needs
# is done by the extract hooks below (Debian's iptables alternatives, the CA bundle, ld.so.cache).
# With SOURCE_DATE_EPOCH set (build.sh sets the commit time) the tar is reproducible for the same
# package versions; a Debian point release changes it, and that is the only thing that does.
#
# Dockerfile.agent and Dockerfile.controller run this same script, so an image built with
# Docker/BuildKit has the same base contents.
set -euo pipefail

component=${1:?usage: rootfs.sh agent|controller|agnhost OUT.tar}
out=${2:?usage: rootfs.sh agent|controller|agnhost OUT.tar}
mirror=${SWITCHYARD_DEBIAN_MIRROR:-http://deb.debian.org/debian}

suite=bookworm
case "$component" in
  # The tools the agent drives: iptables (iptables-nft and iptables-legacy), nftables (`nft`),
  # ipset and iptables glue for IPVS, conntrack (stale UDP entries), iproute2 (`ip`), kmod
  # (modprobe for IPVS modules), netbase (/etc/protocols, /etc/services), CA roots.
  agent) packages=iptables,nftables,ipset,conntrack,iproute2,kmod,netbase,ca-certificates ;;
  # The controller is one Rust binary: libc and libgcc's unwinder, nothing else (in a pod the
  # service-account CA is the only root it uses).
  controller) packages=libc6,libgcc-s1 ;;
  # The Kubernetes e2e test image's tools (upstream agnhost: a Debian base with curl, netcat,
  # dnsutils and iproute2). busybox comes from trixie: bookworm's 1.35 crashes on `wget -T`, which
  # the e2e Service specs run.
  agnhost)
    suite=trixie
    packages=curl,netcat-openbsd,bind9-dnsutils,iproute2,busybox-static,ca-certificates,netbase
    ;;
  *) echo "rootfs.sh: unknown component '$component' (agent, controller, agnhost)" >&2; exit 2 ;;
esac

command -v mmdebstrap >/dev/null || {
  echo "rootfs.sh: mmdebstrap is not installed (apt-get install mmdebstrap)" >&2
  exit 2
}

# Left out of every image: documentation, manual pages, translations, charset converters.
excludes=(
  --dpkgopt='path-exclude=/usr/share/doc/*'
  --dpkgopt='path-include=/usr/share/doc/*/copyright'
  --dpkgopt='path-exclude=/usr/share/man/*'
  --dpkgopt='path-exclude=/usr/share/info/*'
  --dpkgopt='path-exclude=/usr/share/locale/*'
  --dpkgopt='path-exclude=/usr/share/lintian/*'
  --dpkgopt='path-exclude=/usr/lib/x86_64-linux-gnu/gconv/*'
)

hooks=(
  # /tmp for the tools that want one, mode 1777 as in any Debian root.
  --extract-hook='mkdir -p "$1/tmp" "$1/run" && chmod 1777 "$1/tmp"'
  # The dynamic linker's cache, written by the host's ldconfig for the image's root.
  --extract-hook='ldconfig -r "$1"'
)
case "$component" in
  agent)
    hooks+=(
      # Debian's default alternatives: the plain names are iptables-nft (the agent chooses the
      # variant the host uses and calls iptables-nft-* or iptables-legacy-* by name).
      --extract-hook='for t in iptables ip6tables; do for s in "" -restore -save; do
          ln -sf "$t-nft$s" "$1/usr/sbin/$t$s"; done; done'
      # What update-ca-certificates makes: one bundle of the Mozilla roots.
      --extract-hook='mkdir -p "$1/etc/ssl/certs" && cat "$1"/usr/share/ca-certificates/mozilla/*.crt > "$1/etc/ssl/certs/ca-certificates.crt"'
    )
    ;;
  agnhost)
    hooks+=(
      --extract-hook='mkdir -p "$1/etc/ssl/certs" && cat "$1"/usr/share/ca-certificates/mozilla/*.crt > "$1/etc/ssl/certs/ca-certificates.crt"'
      # busybox's applets (sh, wget, sleep, ...) where Debian ships no program of that name.
      --extract-hook='for applet in $("$1/usr/bin/busybox" --list); do
          [ -e "$1/usr/bin/$applet" ] || [ -e "$1/usr/sbin/$applet" ] || ln -s busybox "$1/usr/bin/$applet"; done'
    )
    ;;
esac

mkdir -p "$(dirname "$out")"
# merged /usr (/bin, /sbin, /lib, /lib64 link into /usr), as every Debian root since bookworm.
# (the merged-usr hook's dpkg chatter goes to stderr with the rest of mmdebstrap's output)
mmdebstrap --quiet --variant=extract --include="$packages" --format=tar \
  --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr "${excludes[@]}" "${hooks[@]}" "$suite" "$out.partial" "$mirror" >&2
mv "$out.partial" "$out"
