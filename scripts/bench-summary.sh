#!/usr/bin/env bash
# Prints the summary table of `make bench` from the SUMMARY|measurement|value|target|verdict lines the
# benchmarks appended to the file named by SWITCHYARD_BENCH_SUMMARY.
# Usage: scripts/bench-summary.sh FILE
set -euo pipefail
file=${1:?usage: bench-summary.sh FILE}
export LC_ALL=C.UTF-8 2>/dev/null || true

rows=()
while IFS= read -r line; do
  [[ $line == SUMMARY\|* ]] && rows+=("${line#SUMMARY|}")
done < <(cat "$file" 2>/dev/null || true)

echo
echo "== summary against the targets (docs/benchmarks.md explains each) =="
if ((${#rows[@]} == 0)); then
  echo "no results recorded (smoke mode judges no target)"
  exit 0
fi
headers=("measurement" "value" "target" "verdict")
widths=(0 0 0 0)
measure() {
  local i=0 cell
  IFS='|' read -r -a cells <<< "$1"
  for cell in "${cells[@]}"; do
    ((${#cell} > widths[i])) && widths[i]=${#cell}
    i=$((i + 1))
  done
}
measure "$(IFS='|'; echo "${headers[*]}")"
for row in "${rows[@]}"; do measure "$row"; done
print_row() {
  local i out="" cell
  IFS='|' read -r -a cells <<< "$1"
  for i in 0 1 2 3; do
    cell=${cells[i]:-}
    out+=$cell
    ((i < 3)) && out+="$(printf '%*s' $((widths[i] - ${#cell})) '') | "
  done
  echo "$out"
}
print_row "$(IFS='|'; echo "${headers[*]}")"
print_row "$(printf '%*s' "${widths[0]}" '' | tr ' ' '-')|$(printf '%*s' "${widths[1]}" '' | tr ' ' '-')|$(printf '%*s' "${widths[2]}" '' | tr ' ' '-')|$(printf '%*s' "${widths[3]}" '' | tr ' ' '-')"
for row in "${rows[@]}"; do print_row "$row"; done
missed=0 failed=0
for row in "${rows[@]}"; do
  [[ $row == *\|MISSED ]] && missed=$((missed + 1))
  [[ $row == *\|FAILED ]] && failed=$((failed + 1))
done
echo "$missed target(s) missed (docs/benchmarks.md says why); $failed benchmark(s) failed."
