#!/bin/bash
# Two sluice-server binaries side by side (an earlier build against this one, say), the default
# workload (`sluice-bench`) against each in turn, the order alternating round by round so the
# machine's swings hit both alike. Prints each round's items/s and the median ratio B / A per
# fetch order.
#
#   bash bench/server_ab.sh SERVER_A SERVER_B [ROUNDS=9] [BUILD_DIR=build] [extra server flags...]
#
# ORDERS="KEY UNORDERED" runs both fetch orders (default: KEY). CHILD=1 starts a fresh server
# child for every run instead of two long-lived servers (`sluice-bench --server-bin`: a new data
# directory each run) and reports each run's server peak RSS too; extra flags are not passed then.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
A=$1
B=$2
ROUNDS=${3:-9}
BUILD=${4:-build}
shift $(($# < 4 ? $# : 4))
BENCH=$BUILD/bench/sluice-bench
ORDERS=${ORDERS:-KEY}
CHILD=${CHILD:-0}
need_built "$A" "$B" "$BENCH"
scratch sluice-ab
declare -A BIN=([a]=$A [b]=$B)
if ((CHILD == 0)); then
  BASE=$((20000 + RANDOM % 20000))
  declare -A PORT=([a]=$BASE [b]=$((BASE + 1)))
  for s in a b; do
    "${BIN[$s]}" --data_dir="$TMP/$s" --listen="127.0.0.1:${PORT[$s]}" --worker_threads=2 \
      --memory_budget_mb=128 --log_level=warn "$@" >/dev/null 2>&1 &
    PIDS+=($!)
  done
  for s in a b; do wait_port 127.0.0.1 "${PORT[$s]}"; done
fi
run() {  # side order
  if ((CHILD == 0)); then
    "$BENCH" --server "127.0.0.1:${PORT[$1]}" --order "$2"
  else
    "$BENCH" --server-bin "${BIN[$1]}" --data-dir "$TMP/run" --order "$2"
  fi
}
for order in $ORDERS; do
  declare -a RATIOS=()
  for r in $(seq 1 "$ROUNDS"); do
    sides=(a b)
    ((r % 2 == 0)) && sides=(b a)
    declare -A ips=() rss=()
    for s in "${sides[@]}"; do
      out=$(run "$s" "$order")
      grep -q '"counts_match": true' <<<"$out" || { echo "server_ab: counts differ: $out" >&2; exit 1; }
      ips[$s]=$(items_per_sec <<<"$out")
      rss[$s]=$(sed -n 's/.*"server_peak_rss_mb": \([0-9.]*\).*/\1/p' <<<"$out")
      rm -rf "$TMP/run"
    done
    ratio=$(awk "BEGIN{printf \"%.3f\", ${ips[b]} / ${ips[a]}}")
    RATIOS+=("$ratio")
    line="round $r $order: A ${ips[a]} items/s, B ${ips[b]} items/s, B/A $ratio"
    ((CHILD == 0)) || line+=", server peak RSS A ${rss[a]} MiB, B ${rss[b]} MiB"
    echo "$line"
  done
  echo "RESULT {\"order\": \"$order\", \"rounds\": $ROUNDS, \"median_ratio_b_over_a\": $(median "${RATIOS[@]}")}"
done
