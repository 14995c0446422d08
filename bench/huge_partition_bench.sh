#!/bin/bash
# Huge partitions over a cluster (docs/benchmarks.md, "Huge partitions"; docs/cluster.md): one
# etcd and two clusters of five sluice-servers on 127.0.0.2-6 (etcd prefixes /split/ and
# /whole/), the first with --partition_split_mb=SPLIT_MB, the second never splitting. The same
# skewed workload (90% of the items on partition 0, KEY order, counts checked) runs on each in
# turn, round by round: the SPREAD line says how many stored partitions partition 0 took, and
# how much of it each server keeps; RESULT lines give items/s of both side by side.
#
#   bash bench/huge_partition_bench.sh [BUILD_DIR=build] [ROUNDS=3] [SPLIT_MB=64] [R=1]
#                                      [extra sluice-bench flags...]
set -euo pipefail
source "$(dirname "$0")/lib.sh"
BUILD=${1:-build}
ROUNDS=${2:-3}
SPLIT_MB=${3:-64}
R=${4:-1}
shift $(($# < 4 ? $# : 4))
SERVER=$BUILD/server/sluice-server
BENCH=$BUILD/bench/sluice-bench
need_built "$SERVER" "$BENCH" "${SLUICE_ETCD_BIN:-/usr/bin/etcd}"
scratch sluice-huge-bench

BASE=$((20000 + RANDOM % 20000))
EP=$BASE
start_etcd "$EP" "$TMP/etcd"

start_sluice_cluster "$SERVER" split $((BASE + 10)) 5 --partition_split_mb="$SPLIT_MB"
SPLIT_SERVERS=$SERVERS
start_sluice_cluster "$SERVER" whole $((BASE + 11)) 5 --partition_split_mb=0
WHOLE_SERVERS=$SERVERS
sleep 1  # every server registered

# 400,000 items of ~1 KiB, 90% of them on partition 0, read in key order and as 16 slices.
WORKLOAD=(--skew 0.9 --item-bytes 1024 --items-per-shard 50000 --shards 8 --split 16
  --replication "$R" "$@")
echo "# $(date -u +%FT%TZ) $(nproc) cores; split at $SPLIT_MB MiB, R=$R; 5 servers each"
for r in $(seq 1 "$ROUNDS"); do
  echo "## round $r"
  echo "split:"
  "$BENCH" --servers "$SPLIT_SERVERS" "${WORKLOAD[@]}" | grep -E "RESULT|SPLIT|SPREAD"
  echo "whole:"
  "$BENCH" --servers "$WHOLE_SERVERS" "${WORKLOAD[@]}" | grep -E "RESULT|SPLIT|SPREAD"
done
