#!/bin/bash
# A server lost for good, and one decommissioned (docs/benchmarks.md, "A server lost for good";
# docs/cluster.md, "Placement epochs", "Re-replication", "Decommission"): a real etcd and four
# sluice-servers on 127.0.0.2-5, R = 2, the seed workload through `sluice-bench --servers` with
# an engine's retries.
#   1. n1 killed -9 0.4 s into the run and never restarted: the run's exit and exact counts, the
#      time from the kill to the run's end, then to every partition whole on 2 registered
#      servers again (no server's repair backlog, no partition UNDER-REPLICATED), the bytes the
#      new replicas copied and their rate.
#   2. Then n2 killed -9 too, every mapper committed: the time to every partition whole on the
#      two servers left, the bytes copied and their rate, and every record of the shuffle read
#      back (sluice fetch, counted).
#   3. A fresh shuffle kept, then n3 decommissioned while another run reads and writes: that
#      run's exit and counts, the time to "decommissioned", the bytes moved (per GiB).
#
#   bash bench/lost_server_bench.sh [BUILD_DIR=build] [DEAD_AFTER_S=5] [extra sluice-bench flags...]
set -euo pipefail
source "$(dirname "$0")/lib.sh"
BUILD=${1:-build}
DEAD=${2:-5}
shift $(($# < 2 ? $# : 2))
SERVER=$BUILD/server/sluice-server
BENCH=$BUILD/bench/sluice-bench
CLI=$BUILD/client/sluice
need_built "$SERVER" "$BENCH" "$CLI" "${SLUICE_ETCD_BIN:-/usr/bin/etcd}"
LEASE=3
scratch sluice-lost-bench
now() { date +%s.%N; }
since() { echo "$(now) - $1" | bc; }

BASE=$((20000 + RANDOM % 20000))
EP=$BASE
start_etcd "$EP" "$TMP/etcd"

declare -a SPID ADDR
start_server() {  # index
  local i=$1 host="127.0.0.$(($1 + 2))" port=$((BASE + 10))
  "$SERVER" --data_dir="$TMP/n$i" --listen="$host:$port" --etcd="127.0.0.1:$EP" --node_id="n$i" \
    --node_lease_s=$LEASE --dead_after_s="$DEAD" --worker_threads=2 --memory_budget_mb=128 \
    --log_level=warn >>"$TMP/n$i.log" 2>&1 &
  SPID[$i]=$!
  PIDS+=($!)
  ADDR[$i]="$host:$port"
  wait_port "$host" "$port"
}
for i in 0 1 2 3; do start_server "$i"; done
ALL="${ADDR[0]},${ADDR[1]},${ADDR[2]},${ADDR[3]}"
sleep 1  # every server registered

# The live servers' repair backlog (sum) and bytes copied (sum, MiB), from `sluice nodes`.
repair_state() {  # servers
  "$CLI" nodes --server "$1" 2>/dev/null | awk '
    /repair:/ { backlog += $2; mib += $(NF-2) }
    END { printf "%d %d\n", backlog, mib }'
}
whole() {  # servers shuffle
  local st backlog
  st=$("$CLI" status --server "$1" --shuffle "$2" 2>/dev/null) || return 1
  grep -q "UNDER-REPLICATED\|UNAVAILABLE" <<<"$st" && return 1
  backlog=$(repair_state "$1" | cut -d' ' -f1)
  [[ $backlog == 0 ]]
}
records() {  # servers shuffle partitions
  local n=0 p c
  for ((p = 0; p < $3; p++)); do
    # (Bounded: a fetch opened to a server killed a moment before, still registered, was seen
    # to wait for it without end; a timeout is reported as a short count.)
    c=$(timeout 120 "$CLI" fetch --server "$1" --shuffle "$2" --partition "$p" --order UNORDERED 2>/dev/null | wc -l)
    n=$((n + c))
  done
  echo "$n"
}

echo "# $(date -u +%FT%TZ) $(nproc) cores; servers $ALL; --node_lease_s=$LEASE --dead_after_s=$DEAD"
echo "## 1. n1 killed -9 0.4 s into a run, never restarted"
"$BENCH" --servers "$ALL" --replication 2 --retries 60 --keep 1 "$@" >"$TMP/lost.out" 2>"$TMP/lost.err" &
BPID=$!
sleep 0.4
KILLED=$(now)
kill -9 "${SPID[1]}"
wait "$BPID" && rc=0 || rc=$?
echo "bench exit $rc; kill -9 to the run's end: $(since "$KILLED") s"
grep RESULT "$TMP/lost.out" | sed 's/.*"items_per_sec": \([0-9]*\).*"counts_match": \([a-z]*\).*"retried_attempts": \([0-9]*\).*/items_per_sec \1, counts_match \2, retried attempts \3/'
ID=$(awk '/^KEPT/ {print $2}' "$TMP/lost.out")
EXPECTED=$(grep -o '"expected_items": [0-9]*' "$TMP/lost.out" | awk '{print $2}')
PARTS=$(grep -o '"partitions": [0-9]*' "$TMP/lost.out" | awk '{print $2}')
LIVE="${ADDR[0]},${ADDR[2]},${ADDR[3]}"
for _ in $(seq 1 600); do whole "$LIVE" "$ID" && break; sleep 0.5; done
WHOLE=$(since "$KILLED")
read -r BACKLOG MIB < <(repair_state "$LIVE")
REPAIR_S=$(echo "$WHOLE - $LEASE - $DEAD" | bc)
echo "kill -9 to every partition whole on 2 registered servers: $WHOLE s; copied $MIB MiB" \
  "(~$(echo "scale=1; $MIB / $REPAIR_S" | bc) MiB/s over the $REPAIR_S s after lease + dead_after)"

echo "## 2. then n2 killed -9 too (every mapper committed: its replicas are copied)"
LIVE="${ADDR[0]},${ADDR[3]}"
read -r _ BEFORE < <(repair_state "$LIVE")
KILLED=$(now)
kill -9 "${SPID[2]}"
sleep 1  # (the status before the servers see it go)
for _ in $(seq 1 600); do whole "$LIVE" "$ID" && break; sleep 0.5; done
WHOLE=$(since "$KILLED")
read -r _ AFTER < <(repair_state "$LIVE")
REPAIR_S=$(echo "$WHOLE - $LEASE - $DEAD" | bc)
echo "kill -9 to every partition whole on the 2 servers left: $WHOLE s; copied $((AFTER - BEFORE)) MiB" \
  "(~$(echo "scale=1; ($AFTER - $BEFORE) / $REPAIR_S" | bc) MiB/s over the $REPAIR_S s after lease + dead_after)"
GOT=$(records "$LIVE" "$ID" "$PARTS")
echo "records read back: $GOT of $EXPECTED"

echo "## 3. n3 decommissioned under load (a kept shuffle, and a run meanwhile)"
for i in 1 2; do start_server "$i"; done  # back (their data: one of them wiped is the test's)
ALL="${ADDR[0]},${ADDR[1]},${ADDR[2]},${ADDR[3]}"
sleep 1
"$BENCH" --servers "$ALL" --replication 2 --keep 1 "$@" >"$TMP/kept.out" 2>&1
KEPT=$(awk '/^KEPT/ {print $2}' "$TMP/kept.out")
STORED=$(grep -o '"stored_bytes": [0-9]*' "$TMP/kept.out" | awk '{print $2}')
read -r _ BEFORE < <(repair_state "$ALL")
"$BENCH" --servers "$ALL" --replication 2 --retries 60 "$@" >"$TMP/load.out" 2>"$TMP/load.err" &
BPID=$!
START=$(now)
"$CLI" decommission --server "${ADDR[3]}" --wait >"$TMP/decommission.out" 2>&1 && drc=0 || drc=$?
TOOK=$(since "$START")
wait "$BPID" && rc=0 || rc=$?
read -r _ AFTER < <(repair_state "$ALL")
MOVED=$((AFTER - BEFORE))
echo "decommission exit $drc in $TOOK s; moved $MOVED MiB (~$(echo "scale=1; $TOOK * 1024 / ($MOVED + 0.001)" | bc) s per GiB); kept shuffle stored $((STORED >> 20)) MiB"
echo "run meanwhile: exit $rc; $(grep RESULT "$TMP/load.out" | grep -o '"counts_match": [a-z]*')"
kill -9 "${SPID[3]}"
GOT=$(records "${ADDR[0]},${ADDR[1]},${ADDR[2]}" "$KEPT" "$PARTS")
EXP2=$(grep -o '"expected_items": [0-9]*' "$TMP/kept.out" | awk '{print $2}')
echo "after n3 killed -9: records of the kept shuffle read back: $GOT of $EXP2"
