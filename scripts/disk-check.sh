#!/usr/bin/env bash
# Stops a run before it starts when the disk it writes to is nearly full, saying how much is free and
# which command frees what: a full disk fails a build or a suite midway with "No space left on device"
# and then stops everything on the machine, the shell included.
#
#   scripts/disk-check.sh [WHAT]      # WHAT names the run in the message (default: make test)
#
# Checked: every filesystem the run writes to: the build output (CARGO_TARGET_DIR, else target/),
# temporary files (TMPDIR, else /tmp), the labs' state (SWITCHYARD_LAB_DIR, else /tmp/switchyard-lab)
# and the caches (~/.cache/switchyard). Each needs SWITCHYARD_MIN_FREE_GB (default 15) GB free; `df`
# says what the filesystem itself gives, so a machine whose root reserves part of its size is read
# right. SWITCHYARD_MIN_FREE_GB=0 turns the check off.
set -euo pipefail
cd "$(dirname "$0")/.."

what=${1:-make test}
need_gb=${SWITCHYARD_MIN_FREE_GB:-15}
[[ $need_gb =~ ^[0-9]+$ ]] || { echo "disk-check: SWITCHYARD_MIN_FREE_GB=$need_gb is not a whole number of GB" >&2; exit 2; }
((need_gb > 0)) || exit 0

target=${CARGO_TARGET_DIR:-target}
cache=${XDG_CACHE_HOME:-$HOME/.cache}/switchyard
paths=("$target" "${TMPDIR:-/tmp}" "${SWITCHYARD_LAB_DIR:-/tmp/switchyard-lab}" "$cache")

# The nearest existing folder of PATH (a run creates the rest).
existing() {
  local path=$1
  while [[ ! -e $path && $path != / && $path != . ]]; do path=$(dirname "$path"); done
  echo "$path"
}

short=()
declare -A seen=()
for path in "${paths[@]}"; do
  # mount point, available KiB
  read -r mount avail < <(df -Pk "$(existing "$path")" | awk 'NR==2 {print $6, $4}')
  [[ -n ${seen[$mount]:-} ]] && continue
  seen[$mount]=1
  if ((avail < need_gb * 1024 * 1024)); then
    short+=("$mount: $((avail / 1024 / 1024)) GB free (holds $path)")
  fi
done
((${#short[@]})) || exit 0

size_of() { # PATH: its size, or "-" when absent
  [[ -e $1 ]] || { echo "-"; return; }
  timeout 30 du -sh --one-file-system "$1" 2>/dev/null | cut -f1 || echo "?"
}
{
  echo "$what: stopped before starting: less than $need_gb GB free where it writes:"
  printf '  %s\n' "${short[@]}"
  echo "What frees space (sizes now):"
  echo "  make clean          build output: $target ($(size_of "$target"))"
  echo "  make clean-labs     labs and clusters left by killed runs, and their scratch folders"
  echo "                      ($(size_of "${SWITCHYARD_LAB_DIR:-/tmp/switchyard-lab}") of lab state; never one whose processes still run)"
  echo "  make clean-caches   the above, the IPVS VM's kernel and the image bases ($cache: $(size_of "$cache")),"
  echo "                      and the unpacked Kubernetes binaries (/var/cache/switchyard-k8s: $(size_of /var/cache/switchyard-k8s))"
  echo "Other clones' target/ folders and old CI clones are often the largest: du -xhd2 / | sort -rh | head"
  echo "(SWITCHYARD_MIN_FREE_GB=N sets the threshold; 0 turns this check off.)"
} >&2
exit 1
