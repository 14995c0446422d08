#!/bin/bash
# A healthy cluster's throughput, one build against another (docs/benchmarks.md, "A server lost
# for good"): two clusters side by side, each a real etcd and three sluice-servers of its build
# (A on 127.0.0.2-4, B on 127.0.0.6-8), and the seed workload through each build's
# `sluice-bench --servers ... --replication 2`, A and B alternating round by round so the
# machine's swings hit both alike. Prints each round's items/s and the median of B / A.
#
#   bash bench/cluster_ab_bench.sh BUILD_A BUILD_B [ROUNDS=5] [extra sluice-bench flags...]
set -euo pipefail
source "$(dirname "$0")/lib.sh"
A=${1:?build directory A}
B=${2:?build directory B}
ROUNDS=${3:-5}
shift $(($# < 3 ? $# : 3))
need_built "$A/server/sluice-server" "$A/bench/sluice-bench" "$B/server/sluice-server" \
  "$B/bench/sluice-bench" "${SLUICE_ETCD_BIN:-/usr/bin/etcd}"
scratch sluice-ab-bench

BASE=$((20000 + RANDOM % 20000))
declare -A SERVERS
start_cluster() {  # name build first-host-octet etcd-port
  local name=$1 build=$2 first=$3 ep=$4 list="" i host
  start_etcd "$ep" "$TMP/etcd-$name"
  for i in 0 1 2; do
    host="127.0.0.$((first + i))"
    "$build/server/sluice-server" --data_dir="$TMP/$name$i" --listen="$host:$((BASE + 10))" \
      --etcd="127.0.0.1:$ep" --node_id="$name$i" --node_lease_s=3 --worker_threads=2 \
      --memory_budget_mb=128 --log_level=warn >>"$TMP/$name$i.log" 2>&1 &
    PIDS+=($!)
    wait_port "$host" "$((BASE + 10))"
    list+="${list:+,}$host:$((BASE + 10))"
  done
  SERVERS[$name]=$list
}
start_cluster a "$A" 2 "$BASE"
start_cluster b "$B" 6 "$((BASE + 2))"
sleep 1  # every server registered

echo "# $(date -u +%FT%TZ) $(nproc) cores; A=$A (${SERVERS[a]}), B=$B (${SERVERS[b]}); R=2"
declare -a RA RB RATIO
for r in $(seq 1 "$ROUNDS"); do
  a=$("$A/bench/sluice-bench" --servers "${SERVERS[a]}" --replication 2 "$@" | grep RESULT)
  b=$("$B/bench/sluice-bench" --servers "${SERVERS[b]}" --replication 2 "$@" | grep RESULT)
  grep -q '"counts_match": true' <<<"$a" || { echo "round $r: A counts do not match: $a"; exit 1; }
  grep -q '"counts_match": true' <<<"$b" || { echo "round $r: B counts do not match: $b"; exit 1; }
  ia=$(items_per_sec <<<"$a")
  ib=$(items_per_sec <<<"$b")
  RA+=("$ia")
  RB+=("$ib")
  RATIO+=("$(echo "scale=3; $ib / $ia" | bc)")
  echo "round $r: A $ia items/s, B $ib items/s, B/A ${RATIO[-1]}"
done
echo "median: A $(median "${RA[@]}"), B $(median "${RB[@]}"), B/A $(median "${RATIO[@]}")"
