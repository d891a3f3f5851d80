#!/usr/bin/env bash
# Runs COMMAND... so that it leaves the disk as it found it, besides the build output and the caches.
#
#   scripts/scoped-run.sh COMMAND...
#
# 1. Leftovers of earlier runs that were killed (Ctrl-C, SIGKILL, a lost machine) are removed first:
#    `switchyard-lab gc` takes down labs and clusters whose owning process is gone (never one whose
#    processes still run) and removes scratch folders named after processes that are gone.
# 2. COMMAND runs with a TMPDIR of its own (a scratch folder named after this script's process), so
#    every temporary file of every test, bench, lab and VM is below it.
# 3. However COMMAND ends (success, failure, Ctrl-C, SIGTERM), the labs its processes left are taken
#    down and its TMPDIR is removed, never across a mount; then the disk use before and after is said.
# The exit status is COMMAND's.
set -uo pipefail
cd "$(dirname "$0")/.."

((EUID == 0)) || { exec "$@"; }  # labs need root; without it the suites skip them and make no labs

cargo=${CARGO:-cargo}
lab=${CARGO_TARGET_DIR:-target}/debug/switchyard-lab
$cargo build -q --locked -p switchyard-e2e --bin switchyard-lab || exit

free_kb() { df -Pk "${CARGO_TARGET_DIR:-target}" | awk 'NR==2 {print $4}'; }
free_before=$(free_kb)

gc() {
  # One line per thing removed or kept; silent when there was nothing.
  "$lab" gc 2>&1 | sed 's/^/scoped-run: /'
}
gc

# This process's start time (field 22 of /proc/PID/stat; the command name may hold spaces): with the
# pid it names the scratch folder, so a later gc knows when this run is gone.
stat=$(</proc/$$/stat)
fields=(${stat##*) })
run_dir=$(mktemp -d "${TMPDIR:-/tmp}/switchyard-scratch.$$.${fields[19]}.run.XXXXXX") || exit

finish() {
  local status=$?
  trap - EXIT INT TERM HUP
  gc
  if grep -q " ${run_dir}[/ ]" /proc/self/mountinfo; then
    echo "scoped-run: not removing $run_dir: something is still mounted below it" >&2
  else
    rm -rf --one-file-system "$run_dir"
  fi
  local free_after
  free_after=$(free_kb)
  echo "scoped-run: disk: $((free_before / 1024)) MiB free before, $((free_after / 1024)) MiB after" \
    "($(((free_before - free_after) / 1024)) MiB used by this run, build output included)"
  exit "$status"
}
trap finish EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP

TMPDIR=$run_dir "$@"
