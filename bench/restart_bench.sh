#!/bin/bash
# The start benchmark (docs/benchmarks.md, "Start"; issue 33), as root (it drops the page cache
# before each start). Fills data directories with sluice-fill, then starts a server
# on each, cold, ROUNDS times, interleaved: 1, 8 and 32 GiB of 256 KiB incompressible frames;
# 10,000 shuffles x 64 partitions; 51.2 million frames in 50 shuffles of 4,096 partitions. With
# OLD_SERVER=path (a sluice-server built before fast start), each start is paired with that
# server's on the same data in log version 3, which both read. Needs ~90 GB free in WORK.
#
#   bash bench/restart_bench.sh [BUILD_DIR=build] [ROUNDS=2] [WORK=/var/tmp/sluice-restart]
set -euo pipefail
BUILD=${1:-build}
ROUNDS=${2:-2}
WORK=${3:-/var/tmp/sluice-restart}
RB=$BUILD/bench/sluice-restart-bench
FILL=$BUILD/server/sluice-fill
NEW=$BUILD/server/sluice-server
OLD=${OLD_SERVER:-}
[[ -x $RB && -x $FILL && -x $NEW ]] || { echo "restart_bench: build sluice-restart-bench and sluice-fill first" >&2; exit 2; }
mkdir -p "$WORK"
VERSION=4
[[ -n $OLD ]] && VERSION=3  # (what both servers read)

fill() {  # NAME ARGS...
  local name=$1
  shift
  [[ -d $WORK/$name ]] || "$FILL" --data_dir "$WORK/$name" --log_version "$VERSION" "$@"
}
start() {  # NAME SHUFFLE
  for r in $(seq 1 "$ROUNDS"); do
    echo -n "$1 new: "
    "$RB" start --server "$NEW" --data_dir "$WORK/$1" --shuffle "$2" --cold 1
    if [[ -n $OLD ]]; then
      echo -n "$1 old: "
      timeout 600 "$RB" start --server "$OLD" --data_dir "$WORK/$1" --shuffle "$2" --cold 1 ||
        echo "(did not serve within 600 s)"
    fi
  done
}

for gib in 1 8 32; do
  fill "g$gib" --shuffles 4 --partitions 64 --mappers 16 --frames "$gib" --frame_bytes 262144
  start "g$gib" s3
  rm -rf "${WORK:?}/g$gib"
done
fill w10k --shuffles 10000 --partitions 64 --mappers 2 --frames 1 --frame_bytes 1024
start w10k s9999
rm -rf "${WORK:?}/w10k"
fill f50 --shuffles 50 --partitions 4096 --mappers 25 --frames 10 --frame_bytes 16
start f50 s49
rm -rf "${WORK:?}/f50"

# The scrub's cost: `sluice bench` with the scrub at its default rate and off, interleaved.
for r in $(seq 1 5); do
  for s in 16 0; do
    echo -n "bench scrub_mb_per_s=$s: "
    "$BUILD/client/sluice" bench --items-per-shard 400000 --server-args=--scrub_mb_per_s=$s 2>&1 |
      grep RESULT | cut -c8- | python3 -c 'import sys,json; d=json.load(sys.stdin); print(d["items_per_sec"], d["counts_match"])'
  done
done
