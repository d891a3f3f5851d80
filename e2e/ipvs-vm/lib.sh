# Helpers for the guest's scenarios (busybox ash). The scenario file defines the tests; this file
# gives them TAP-like reporting and the real tools, since busybox's shell runs its own applets (its
# `ip` has no netns) before anything on PATH.
ip() { /usr/sbin/ip "$@"; }
modprobe() { /usr/sbin/modprobe "$@"; }
lsmod() { /usr/sbin/lsmod "$@"; }
agent() { /mnt/host/switchyard-lab agent "$@"; }
lab() { /mnt/host/switchyard-lab "$@"; }

PASSED=0
FAILED=0
RESULT=/mnt/host/result.txt
: >"$RESULT"

say() { echo "$*" | tee -a "$RESULT"; }
diag() { echo "# $*" | sed '2,$s/^/# /' | tee -a "$RESULT"; }
pass() { PASSED=$((PASSED + 1)); say "ok $((PASSED + FAILED)) - $1"; }
fail() { FAILED=$((FAILED + 1)); say "not ok $((PASSED + FAILED)) - $1"; shift; [ $# -gt 0 ] && diag "$*"; return 0; }
# check NAME COMMAND...: passes when the command succeeds; shows its output when it fails.
check() {
  local name="$1" out
  shift
  if out=$("$@" 2>&1); then pass "$name"; else fail "$name" "$out"; fi
}
# eventually SECONDS COMMAND...: retries every 0.2 s until the command succeeds.
eventually() {
  local limit="$1" deadline
  shift
  deadline=$(($(date +%s) + limit))
  while :; do
    "$@" >/dev/null 2>&1 && return 0
    [ "$(date +%s)" -ge "$deadline" ] && { "$@"; return 1; }
    sleep 0.2
  done
}
finish() {
  if [ "$FAILED" -eq 0 ] && [ "$PASSED" -gt 0 ]; then verdict=PASS; else verdict=FAIL; fi
  say "IPVS-VM-RESULT: $verdict passed=$PASSED failed=$FAILED"
  sync
}
