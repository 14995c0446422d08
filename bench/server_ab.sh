#!/bin/bash
# Two sluice-server binaries side by side (an earlier build against this one, say), the default
# workload (`sluice-bench --order KEY`) against each in turn, the order alternating round by
# round so the machine's swings hit both alike. Prints each round's items/s and the median
# ratio B / A.
#
#   bash bench/server_ab.sh SERVER_A SERVER_B [ROUNDS=9] [BUILD_DIR=build] [extra server flags...]
set -euo pipefail
source "$(dirname "$0")/lib.sh"
A=$1
B=$2
ROUNDS=${3:-9}
BUILD=${4:-build}
shift $(($# < 4 ? $# : 4))
BENCH=$BUILD/bench/sluice-bench
for f in "$A" "$B" "$BENCH"; do
  [[ -x $f ]] || { echo "server_ab: $f is missing" >&2; exit 2; }
done
scratch sluice-ab
BASE=$((20000 + RANDOM % 20000))
declare -A PORT=([a]=$BASE [b]=$((BASE + 1)))
declare -A BIN=([a]=$A [b]=$B)
for s in a b; do
  "${BIN[$s]}" --data_dir="$TMP/$s" --listen="127.0.0.1:${PORT[$s]}" --worker_threads=2 \
    --memory_budget_mb=128 --log_level=warn "$@" >/dev/null 2>&1 &
  PIDS+=($!)
done
for s in a b; do wait_port 127.0.0.1 "${PORT[$s]}"; done
declare -a RATIOS=()
for r in $(seq 1 "$ROUNDS"); do
  order=(a b)
  ((r % 2 == 0)) && order=(b a)
  declare -A ips=()
  for s in "${order[@]}"; do
    out=$("$BENCH" --server "127.0.0.1:${PORT[$s]}" --order KEY)
    grep -q '"counts_match": true' <<<"$out" || { echo "server_ab: counts differ: $out" >&2; exit 1; }
    ips[$s]=$(items_per_sec <<<"$out")
  done
  ratio=$(awk "BEGIN{printf \"%.3f\", ${ips[b]} / ${ips[a]}}")
  RATIOS+=("$ratio")
  echo "round $r: A ${ips[a]} items/s, B ${ips[b]} items/s, B/A $ratio"
done
median=$(median "${RATIOS[@]}")
echo "RESULT {\"rounds\": $ROUNDS, \"median_ratio_b_over_a\": $median}"
