#!/bin/bash
# What a network partition costs the writers (docs/benchmarks.md, "Revive"; docs/cluster.md,
# "Revive"): a real etcd and four sluice-servers, three on 127.0.0.2-4 and one (p3) in a network
# namespace this script makes, joined to the host by a veth for its clients and servers and one
# for etcd (as tests/harness/netns.h); `sluice-bench --servers ... --replication 2 --retries 3`
# runs while, 0.7 s in, one kind of fault starts, healed 10 s after it started (and the run
# waited for): p3 cut from its clients and servers, cut both ways, cut from etcd alone; and a
# clean run between each. (The other servers are host processes like the clients, so a cut from
# the writers alone is the tests' own: tests/cluster/partition_test.cc, where they live in a
# namespace.) Per run: exit, counts, elapsed, retried attempts, and the longest any mapper took
# from its first failed attempt to its commit. Needs root and iproute2.
#
#   bash bench/partition_bench.sh [BUILD_DIR=build] [extra sluice-bench flags...]
set -euo pipefail
source "$(dirname "$0")/lib.sh"
BUILD=${1:-build}
shift $(($# < 1 ? $# : 1))
SERVER=$BUILD/server/sluice-server
BENCH=$BUILD/bench/sluice-bench
CLI=$BUILD/client/sluice
ETCD=${SLUICE_ETCD_BIN:-/usr/bin/etcd}
need_built "$SERVER" "$BENCH" "$CLI" "$ETCD"
scratch sluice-partition-bench
K=$(($$ % 120))
NS=sluice-b$$
A_HOST=10.214.$((2 * K)).1 A_IN=10.214.$((2 * K)).2
B_HOST=10.214.$((2 * K + 1)).1 B_IN=10.214.$((2 * K + 1)).2
cleanup_ns() {
  ip netns del "$NS" 2>/dev/null || true
  ip link del "pa${K}h" 2>/dev/null || true
  ip link del "pb${K}h" 2>/dev/null || true
}
trap 'for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; cleanup_ns; rm -rf "$TMP"' EXIT
ip netns add "$NS"
ip -n "$NS" link set lo up
for l in a b; do
  ip link add "p${l}${K}h" type veth peer name "p${l}${K}x" netns "$NS"
  ip link set "p${l}${K}h" up
  ip -n "$NS" link set "p${l}${K}x" up
done
ip addr add "$A_HOST/24" dev "pa${K}h"; ip -n "$NS" addr add "$A_IN/24" dev "pa${K}x"
ip addr add "$B_HOST/24" dev "pb${K}h"; ip -n "$NS" addr add "$B_IN/24" dev "pb${K}x"

BASE=$((20000 + RANDOM % 20000))
EP=$BASE
"$ETCD" --name bench --data-dir "$TMP/etcd" \
  --listen-client-urls "http://127.0.0.1:$EP,http://$B_HOST:$EP" \
  --advertise-client-urls "http://127.0.0.1:$EP" \
  --listen-peer-urls "http://127.0.0.1:$((EP + 1))" \
  --initial-advertise-peer-urls "http://127.0.0.1:$((EP + 1))" \
  --initial-cluster "bench=http://127.0.0.1:$((EP + 1))" >"$TMP/etcd.log" 2>&1 &
PIDS+=($!)
wait_port 127.0.0.1 "$EP"
PORT=$((BASE + 10))
start_sluice_cluster "$SERVER" p "$PORT" 3
ip netns exec "$NS" "$SERVER" --data_dir="$TMP/p3" --listen="$A_IN:$PORT" --etcd="$B_HOST:$EP" \
  --etcd_prefix=/p/ --node_id=p3 --node_lease_s=3 --worker_threads=2 --memory_budget_mb=128 \
  --log_level=warn --plaintext >>"$TMP/p3.log" 2>&1 &
PIDS+=($!)
wait_port "$A_IN" "$PORT"
ALL="$SERVERS,$A_IN:$PORT"
field() { grep -o "\"$1\": [0-9.a-z]*" "$2" | awk '{print $2}'; }
registered() { [[ $("$CLI" nodes --server "${SERVERS%%,*}" 2>/dev/null | grep -c '^ *p[0-9]') == 4 ]]; }
for _ in $(seq 1 100); do registered && break; sleep 0.2; done

# A cut takes the host end of each veth named ("a": clients and servers, "b": etcd) down.
cut() {  # add|del  links...
  local state=$([[ $1 == add ]] && echo down || echo up) l
  shift
  for l in "$@"; do ip link set "p${l}${K}h" "$state"; done
}

run() {  # name links...
  local name=$1 rc
  shift
  "$BENCH" --servers "$ALL" --replication 2 --retries 3 $EXTRA >"$TMP/$name.out" 2>"$TMP/$name.err" &
  local bench=$!
  local healer=""
  if (($# > 0)); then
    sleep 0.7
    cut add "$@"
    (sleep 10; cut del "$@") &
    healer=$!
  fi
  wait "$bench" && rc=0 || rc=$?
  [[ -n $healer ]] && wait "$healer"
  printf "%-8s exit %d  counts_match %s  elapsed %ss (scatter %ss, reduce %ss)  retried %s  longest_retry %ss\n" "$name" \
    "$rc" "$(field counts_match "$TMP/$name.out")" "$(field elapsed_s "$TMP/$name.out")" \
    "$(field scatter_s "$TMP/$name.out")" "$(field reduce_s "$TMP/$name.out")" \
    "$(field retried_attempts "$TMP/$name.out")" "$(field longest_retry_s "$TMP/$name.out")"
  if (($# > 0)); then
    for _ in $(seq 1 150); do registered && break; sleep 0.2; done
  fi
}
EXTRA="$*"
echo "# $(date -u +%FT%TZ) $(nproc) cores; 3 servers on loopback + p3 in a namespace; R = 2, --retries 3 $EXTRA"
run clean
run clients a
run clean2
run both a b
run clean3
run etcd b
