#!/bin/bash
# The wide-shuffle curve (docs/benchmarks.md, "Wide shuffles"), before and after, interleaved:
# each shape, the OLD and the NEW build alternately (the order flips every round), each
# against its own fresh sluice-server on 127.0.0.1:7399 (started with --max_fetch_streams 4096,
# so a bench that runs all 2,048 reducers at once is admitted), the server's peak RSS from
# /proc VmHWM. OLD and NEW are directories holding sluice-bench and sluice-server.
#
# PARALLEL (default 8) is passed as --parallel, the mappers and then reducers at once, to each
# bench that has the flag (a bench from before 0411fae has none: it ran every mapper, then every
# reducer, at once; from 0411fae to 82c29fc the default was 256, since then 4 per hardware
# thread).
#
#   OLD=/path/to/old NEW=build-dir-copy ROUNDS=3 PARALLEL=8 OUT=curve.jsonl bash bench/wide_curve.sh
OLD=${OLD:?directory of the old sluice-bench and sluice-server}
NEW=${NEW:?directory of the new sluice-bench and sluice-server}
ROUNDS=${ROUNDS:-3}
OUT=${OUT:-/tmp/curve.jsonl}
PARALLEL=${PARALLEL:-8}
: > $OUT
run() {  # ver dir shards parts items
  local ver=$1 dir=$2 sh=$3 pa=$4 it=$5
  local dd=$(mktemp -d /tmp/curve-XXXX)
  $dir/sluice-server --data_dir $dd --max_fetch_streams 4096 --listen 127.0.0.1:7399 > $dd.log 2>&1 &
  local pid=$!
  for i in $(seq 50); do grep -q event=started $dd.log && break; sleep 0.1; done
  local par=""
  if grep -qa -- "--parallel" $dir/sluice-bench; then par="--parallel $PARALLEL"; fi
  local res=$($dir/sluice-bench --server 127.0.0.1:7399 --shards $sh --partitions $pa --items-per-shard $it $par 2>&1 | grep RESULT)
  local hwm=$(grep VmHWM /proc/$pid/status | awk '{print $2}')
  kill $pid; wait $pid 2>/dev/null
  rm -rf $dd $dd.log
  echo "{\"ver\": \"$ver\", \"server_hwm_kb\": $hwm, \"r\": ${res#RESULT }}" >> $OUT
}
for r in $(seq $ROUNDS); do
  for shape in "8 8 50000" "64 64 6250" "200 512 2000" "400 2048 1000"; do
    if (( r % 2 )); then order="old new"; else order="new old"; fi
    for v in $order; do
      if [ $v = old ]; then run old "$OLD" $shape; else run new "$NEW" $shape; fi
    done
  done
done
