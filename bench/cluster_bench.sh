#!/bin/bash
# The cluster benchmark (docs/benchmarks.md, "Cluster"): a real etcd and three sluice-servers on
# 127.0.0.2-4, and the seed workload through `sluice-bench --servers` at R=1 and R=2, with the
# single-server bench (its own embedded server) beside them, interleaved round by round so the
# machine's swings hit all three alike. Then the failover run: R=2 with one server killed -9
# during the scatter and restarted 1.5 s later; it reports the time from the kill to the
# shuffle's completion.
#
#   bash bench/cluster_bench.sh [BUILD_DIR=build] [ROUNDS=3] [extra sluice-bench flags...]
set -euo pipefail
source "$(dirname "$0")/lib.sh"
BUILD=${1:-build}
ROUNDS=${2:-3}
shift $(($# < 2 ? $# : 2))
SERVER=$BUILD/server/sluice-server
BENCH=$BUILD/bench/sluice-bench
ETCD=${SLUICE_ETCD_BIN:-/usr/bin/etcd}
for f in "$SERVER" "$BENCH" "$ETCD"; do
  [[ -x $f ]] || { echo "cluster_bench: $f is missing (build first; etcd: apt-get install etcd-server)" >&2; exit 2; }
done

TMP=$(mktemp -d /tmp/sluice-cluster-bench.XXXXXX)
declare -a PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$TMP"
}
trap cleanup EXIT

BASE=$((20000 + RANDOM % 20000))
EP=$BASE
start_etcd "$EP" "$TMP/etcd"

declare -a SPID ADDR
start_server() {  # index
  local i=$1 host="127.0.0.$(($1 + 2))" port=$((BASE + 10))
  "$SERVER" --data_dir="$TMP/n$i" --listen="$host:$port" --etcd="127.0.0.1:$EP" --node_id="n$i" \
    --node_lease_s=3 --worker_threads=2 --memory_budget_mb=128 --log_level=warn \
    >>"$TMP/n$i.log" 2>&1 &
  SPID[$i]=$!
  PIDS+=($!)
  ADDR[$i]="$host:$port"
  wait_port "$host" "$port"
}
for i in 0 1 2; do start_server "$i"; done
SERVERS="${ADDR[0]},${ADDR[1]},${ADDR[2]}"
sleep 1  # every server registered

echo "# $(date -u +%FT%TZ) $(nproc) cores; servers $SERVERS; etcd 127.0.0.1:$EP"
for r in $(seq 1 "$ROUNDS"); do
  echo "## round $r"
  echo -n "single "; "$BENCH" "$@" | grep RESULT
  echo -n "R=1    "; "$BENCH" --servers "$SERVERS" --replication 1 "$@" | grep RESULT
  echo -n "R=2    "; "$BENCH" --servers "$SERVERS" --replication 2 "$@" | grep RESULT
done

echo "## failover: R=2, n1 killed -9 0.4 s into the run, restarted 1.5 s later"
"$BENCH" --servers "$SERVERS" --replication 2 "$@" >"$TMP/failover.out" 2>"$TMP/failover.err" &
BPID=$!
sleep 0.4
KILLED=$(date +%s.%N)
kill -9 "${SPID[1]}"
sleep 1.5
start_server 1
wait "$BPID" && rc=0 || rc=$?
DONE=$(date +%s.%N)
grep RESULT "$TMP/failover.out" || true
grep -c "retrying" "$TMP/failover.err" | sed 's/^/retried mapper attempts (stderr): /' || true
echo "bench exit $rc; kill -9 to completion: $(echo "$DONE - $KILLED" | bc) s"
