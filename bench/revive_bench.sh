#!/bin/bash
# A lost server costs one retry (docs/benchmarks.md, "Revive"; docs/cluster.md, "Revive"): a
# real etcd and, per run, four fresh sluice-servers on 127.0.0.2-5 (--node_lease_s=3, the
# rest as bench/lib.sh starts them: --dead_after_s at its default, 60), the seed workload through
# `sluice-bench --servers ... --replication 2 --retries 3`. Each round runs it twice, in
# alternating order: once with no fault, once with one server killed -9 0.7 s into the run and
# never restarted. Per run: exit, counts, elapsed, retried attempts, and the longest any mapper
# took from its first failed attempt to its commit; per round the killed run's elapsed over the
# clean one's.
#
#   bash bench/revive_bench.sh [BUILD_DIR=build] [ROUNDS=3] [extra sluice-bench flags...]
set -euo pipefail
source "$(dirname "$0")/lib.sh"
BUILD=${1:-build}
ROUNDS=${2:-3}
shift $(($# < 2 ? $# : 2))
SERVER=$BUILD/server/sluice-server
BENCH=$BUILD/bench/sluice-bench
need_built "$SERVER" "$BENCH" "${SLUICE_ETCD_BIN:-/usr/bin/etcd}"
scratch sluice-revive-bench
now() { date +%s.%N; }

BASE=$((20000 + RANDOM % 20000))
EP=$BASE
start_etcd "$EP" "$TMP/etcd"
field() { grep -o "\"$1\": [0-9.a-z]*" "$2" | awk '{print $2}'; }

# One run on a fresh cluster; `kill`: server 1 killed -9 0.7 s in. Prints one line and sets
# ELAPSED.
run() {  # name kill(0|1) [bench flags...]
  local name=$1 kill=$2 port=$((BASE + 10 + RANDOM % 5000)) rc
  shift 2
  local first=${#PIDS[@]}
  start_sluice_cluster "$SERVER" "$name" "$port" 4
  local victim=${PIDS[$((first + 1))]}
  sleep 1  # every server registered
  "$BENCH" --servers "$SERVERS" --replication 2 --retries 3 "$@" >"$TMP/$name.out" 2>"$TMP/$name.err" &
  local bench=$!
  if [[ $kill == 1 ]]; then
    sleep 0.7
    kill -9 "$victim"
    wait "$victim" 2>/dev/null || true
  fi
  wait "$bench" && rc=0 || rc=$?
  ELAPSED=$(field elapsed_s "$TMP/$name.out")
  printf '%-8s exit %d  counts_match %s  elapsed %ss  items/s %s  retried %s  longest_retry %ss\n' \
    "$name" "$rc" "$(field counts_match "$TMP/$name.out")" "$ELAPSED" \
    "$(field items_per_sec "$TMP/$name.out")" "$(field retried_attempts "$TMP/$name.out")" \
    "$(field longest_retry_s "$TMP/$name.out")"
  for p in "${PIDS[@]:$first}"; do kill -9 "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]:$first}"; do wait "$p" 2>/dev/null || true; done
}

echo "# $(date -u +%FT%TZ) $(nproc) cores; 4 servers, --node_lease_s=3, R = 2, --retries 3 $*"
RATIOS=()
for r in $(seq 1 "$ROUNDS"); do
  if ((r % 2)); then
    run "clean$r" 0 "$@"; CLEAN=$ELAPSED
    run "kill$r" 1 "$@"; KILLED=$ELAPSED
  else
    run "kill$r" 1 "$@"; KILLED=$ELAPSED
    run "clean$r" 0 "$@"; CLEAN=$ELAPSED
  fi
  RATIO=$(echo "scale=3; $KILLED / $CLEAN" | bc)
  RATIOS+=("$RATIO")
  echo "round $r: killed / clean elapsed $RATIO"
done
echo "RESULT {\"rounds\": $ROUNDS, \"median_killed_over_clean\": $(median "${RATIOS[@]}")}"
