#!/usr/bin/env bash
# Installs what the network-namespace lab needs on a fresh Debian machine (root only).
set -euo pipefail
# apt and debconf progress goes to a log, shown only when apt fails: the demo's output stays the demo.
apt_quiet() {
  local log
  log=$(mktemp /tmp/switchyard-demo-apt.XXXXXX)
  if ! DEBIAN_FRONTEND=noninteractive apt-get "$@" >"$log" 2>&1; then
    tail -n 30 "$log" >&2
    echo "apt-get $1 failed (full log: $log); install the packages above by hand and run make demo again" >&2
    exit 2
  fi
  rm -f "$log"
}
if [ "$(id -u)" != 0 ]; then
  echo "make demo builds network namespaces, veth pairs and iptables rules: it needs root (try: sudo make demo)" >&2
  exit 2
fi
if ! command -v cargo >/dev/null 2>&1; then
  echo "cargo is not on PATH: install Rust >= 1.89 with rustup (https://rustup.rs); under sudo keep its PATH: sudo env \"PATH=\$PATH\" make demo" >&2
  exit 2
fi
if ! command -v cc >/dev/null 2>&1; then
  echo "installing gcc (the Rust build needs a C linker)"
  apt_quiet update -qq
  apt_quiet install -y -qq --no-install-recommends gcc libc6-dev
fi
declare -A tools=([ip]=iproute2 [iptables-restore]=iptables [conntrack]=conntrack [nft]=nftables)
missing=()
for tool in "${!tools[@]}"; do
  command -v "$tool" >/dev/null 2>&1 || missing+=("${tools[$tool]}")
done
if ((${#missing[@]})); then
  echo "installing ${missing[*]} (apt-get)"
  apt_quiet update -qq
  apt_quiet install -y -qq --no-install-recommends "${missing[@]}"
fi
