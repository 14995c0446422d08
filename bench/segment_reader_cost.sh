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
start_sluice_cluster "$BUILD/server/sluice-server" split $((BASE + 10)) 3 --partition_split_mb=1024
SPLIT=$SERVERS
start_sluice_cluster "$BUILD/server/sluice-server" whole $((BASE + 11)) 3 --partition_split_mb=0
WHOLE=$SERVERS
sleep 1
echo "# $(date -u +%FT%TZ) $(nproc) cores"
/usr/bin/python3 "$(dirname "$0")/segment_reader_cost.py" "$BUILD" "$SPLIT" "$WHOLE"
