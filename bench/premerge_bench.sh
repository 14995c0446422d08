#!/bin/bash
# The background pre-merge (--premerge_mb_per_s; docs/storage.md, "Pre-merged runs") on and off,
# run in turn round by round on the same build, each run with a fresh sluice-server child:
#
# 1. The runs curve: one partition of 400,000 ~200-byte items built from N mappers of one run each
#    (N = 100, 1,000, 10,000), read once in KEY order. With pre-merge the bench waits for it
#    (--premerge-wait: until the partition is one pre-merged run, or it stops changing for 1 s)
#    and times the read after; settle_s is that wait.
# 2. The seed workload (`sluice-bench --order KEY`: 8 mappers, 8 partitions; never pre-merged,
#    fewer runs than --premerge_min_runs) and the same 400,000 items from 64 mappers (pre-merged
#    while the scatter and the reduce run, nobody waiting for it): items/s on against off.
#
#   bash bench/premerge_bench.sh [ROUNDS=2] [BUILD_DIR=build]
#
# RUNS="100 1000" picks the curve's points (RUNS= skips the curve); SHARDS="8 64" the mapper
# counts of part 2 (SHARDS= skips it).
set -euo pipefail
source "$(dirname "$0")/lib.sh"
ROUNDS=${1:-2}
BUILD=${2:-build}
BENCH=$BUILD/bench/sluice-bench
need_built "$BENCH" "$BUILD/server/sluice-server"
scratch sluice-premerge
run() {  # on|off bench flags...
  local side=$1
  shift
  local args=()
  [[ $side == off ]] && args+=(--server-args=--premerge_mb_per_s=0)
  local out
  out=$("$BENCH" --server-bin "$BUILD/server/sluice-server" --data-dir "$TMP/run" "${args[@]}" "$@")
  rm -rf "$TMP/run"
  grep -q '"counts_match": true' <<<"$out" || { echo "premerge_bench: counts differ: $out" >&2; exit 1; }
  echo "$out"
}

echo "== KEY read of one partition against its runs (400,000 items)"
for n in ${RUNS-100 1000 10000}; do
  per=$((400000 / n))
  for r in $(seq 1 "$ROUNDS"); do
    sides=(off on)
    ((r % 2 == 0)) && sides=(on off)
    for s in "${sides[@]}"; do
      wait_flag=()
      [[ $s == on ]] && wait_flag=(--premerge-wait 300)
      out=$(run "$s" --shards "$n" --items-per-shard "$per" --partitions 1 --order KEY \
        "${wait_flag[@]}")
      echo "runs=$n round=$r premerge=$s scatter_s=$(field scatter_s <<<"$out")" \
        "settle_s=$(field settle_s <<<"$out") reduce_s=$(field reduce_s <<<"$out")"
    done
  done
done

echo "== items/s, pre-merge on against off (KEY; no wait)"
for shards in ${SHARDS-8 64}; do
  per=$((400000 / shards))
  declare -a RATIOS=()
  for r in $(seq 1 $((ROUNDS * 2 + 1))); do
    sides=(off on)
    ((r % 2 == 0)) && sides=(on off)
    declare -A ips=()
    for s in "${sides[@]}"; do
      ips[$s]=$(run "$s" --shards "$shards" --items-per-shard "$per" --order KEY | items_per_sec)
    done
    ratio=$(awk "BEGIN{printf \"%.3f\", ${ips[on]} / ${ips[off]}}")
    RATIOS+=("$ratio")
    echo "shards=$shards round=$r off=${ips[off]} on=${ips[on]} on/off=$ratio"
  done
  echo "shards=$shards median on/off: $(median "${RATIOS[@]}")"
done
