#!/bin/bash
# Servers lost one after another under a long run (docs/benchmarks.md, "Revive"): a real etcd
# and four sluice-servers on 127.0.0.2-5 (--node_lease_s=3, --dead_after_s at its default 60),
# `sluice-bench --servers ... --replication 2 --retries 6` on a run long enough to span the
# kills; one server killed -9 every KILL_EVERY_S seconds, three times, none restarted. Then: the
# run's exit and counts, the attempts retried, the placement epochs of its shuffle (revives),
# and the revocations (none should be needed: `sluice status` lists no LOST partition).
#
#   bash bench/revive_kills_bench.sh [BUILD_DIR=build] [KILL_EVERY_S=20] [extra sluice-bench flags...]
set -euo pipefail
source "$(dirname "$0")/lib.sh"
BUILD=${1:-build}
EVERY=${2:-20}
shift $(($# < 2 ? $# : 2))
SERVER=$BUILD/server/sluice-server
BENCH=$BUILD/bench/sluice-bench
CLI=$BUILD/client/sluice
need_built "$SERVER" "$BENCH" "$CLI" "${SLUICE_ETCD_BIN:-/usr/bin/etcd}"
scratch sluice-kills-bench
BASE=$((20000 + RANDOM % 20000))
EP=$BASE
start_etcd "$EP" "$TMP/etcd"
start_sluice_cluster "$SERVER" k "$((BASE + 10))" 4
sleep 1
echo "# $(date -u +%FT%TZ) $(nproc) cores; 4 servers, --node_lease_s=3, R = 2, a kill -9 every $EVERY s x 3 $*"
START=$(date +%s.%N)
"$BENCH" --servers "$SERVERS" --replication 2 --retries 6 --keep 1 "$@" >"$TMP/run.out" 2>"$TMP/run.err" &
BENCH_PID=$!
LEFT=$SERVERS
for k in 1 2 3; do
  sleep "$EVERY"
  if ! kill -0 "$BENCH_PID" 2>/dev/null; then echo "the run ended before kill $k"; break; fi
  victim=${PIDS[$((k + 1))]}  # (PIDS[0] is etcd, servers k0..k3 PIDS[1..4]; k0 stays)
  kill -9 "$victim"
  wait "$victim" 2>/dev/null || true
  LEFT=$(echo "$LEFT" | tr ',' '\n' | grep -v "127.0.0.$((k + 2)):" | paste -sd, -)
  echo "kill $k at $(echo "$(date +%s.%N) - $START" | bc | cut -c1-5) s: server k$k"
done
wait "$BENCH_PID" && rc=0 || rc=$?
echo "run exit $rc after $(echo "$(date +%s.%N) - $START" | bc | cut -c1-5) s"
grep RESULT "$TMP/run.out" | grep -o '"elapsed_s": [0-9.]*\|"items_per_sec": [0-9]*\|"counts_match": [a-z]*\|"retried_attempts": [0-9]*\|"longest_retry_s": [0-9.]*' | paste -sd' ' -
ID=$(awk '/^KEPT/ {print $2}' "$TMP/run.out")
if [[ -n $ID ]]; then
  "$CLI" status --server "${LEFT%%,*}" --shuffle "$ID" >"$TMP/status.out" 2>&1 || true
  echo "LOST partitions: $(grep -c LOST "$TMP/status.out" || true) (none: no revocation needed)"
fi
echo "revives (one line per epoch):"
grep -h "event=revive" "$TMP"/k*.log | sed 's/.* shuffle=[^ ]* //' || true
