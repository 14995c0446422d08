#!/bin/bash
# Starts one etcd and two clusters of three sluice-servers on 127.0.0.2-4 (etcd prefixes /split/
# and /whole/, the second with --partition_split_mb=0) and runs bench/segment_reader_cost.py on
# them: what a reader's fresh read of the record costs (docs/benchmarks.md, "Huge partitions
# over servers").
#
#   bash bench/segment_reader_cost.sh [BUILD_DIR=build]
set -euo pipefail
source "$(dirname "$0")/lib.sh"
BUILD=${1:-build}
need_built "$BUILD/server/sluice-server" "${SLUICE_ETCD_BIN:-/usr/bin/etcd}"
scratch sluice-reader-cost
BASE=$((20000 + RANDOM % 20000))
EP=$BASE
start_etcd "$EP" "$TMP/etcd"
start_cluster() {  # name port split_mb -> sets SERVERS (not in a subshell: PIDS must keep them)
  local list=""
  for i in 0 1 2; do
    local host="127.0.0.$((i + 2))"
    "$BUILD/server/sluice-server" --data_dir="$TMP/$1$i" --listen="$host:$2" \
      --etcd="127.0.0.1:$EP" --etcd_prefix="/$1/" --node_id="$1$i" --node_lease_s=3 \
      --worker_threads=2 --memory_budget_mb=128 --partition_split_mb="$3" --log_level=warn \
      >>"$TMP/$1$i.log" 2>&1 &
    PIDS+=($!)
    wait_port "$host" "$2"
    list+="${list:+,}$host:$2"
  done
  SERVERS=$list
}
start_cluster split $((BASE + 10)) 1024
SPLIT=$SERVERS
start_cluster whole $((BASE + 11)) 0
WHOLE=$SERVERS
sleep 1
echo "# $(date -u +%FT%TZ) $(nproc) cores"
/usr/bin/python3 "$(dirname "$0")/segment_reader_cost.py" "$BUILD" "$SPLIT" "$WHOLE"
