#!/bin/bash
# The object tier on a healthy cluster (docs/benchmarks.md, "The object tier"): two clusters
# side by side on one etcd, each three sluice-servers of this build at R = 2 (off on
# 127.0.0.2-4; on, with --object_store to an s3rver on loopback, on 127.0.0.6-8), and the seed
# workload through `sluice-bench`, off and on alternating round by round so the machine's swings
# hit both alike. The tier-on run keeps its shuffle; then it is timed until its manifest is in
# the store (every partition uploaded and recorded), its objects are counted, and it is deleted.
# Prints each round's items/s, the ratio on / off, the upload's lag after the run, and at the
# end the store's requests by type per shuffle (the servers' sluice_object_requests_total).
#
#   bash bench/object_tier_bench.sh [BUILD=build] [ROUNDS=5] [extra sluice-bench flags...]
set -euo pipefail
source "$(dirname "$0")/lib.sh"
BUILD=${1:-build}
ROUNDS=${2:-5}
shift $(($# < 2 ? $# : 2))
need_built "$BUILD/server/sluice-server" "$BUILD/bench/sluice-bench" "$BUILD/client/sluice" \
  "${SLUICE_ETCD_BIN:-/usr/bin/etcd}" "$S3RVER"
scratch sluice-tier-bench

BASE=$((20000 + RANDOM % 20000))
EP=$BASE
S3PORT=$((BASE + 5))
BUCKET=sluice-bench
start_etcd "$EP" "$TMP/etcd"
start_s3rver "$S3PORT" "$BUCKET"

declare -A SERVERS
start_cluster() {  # name first-host-octet [flags...]
  local name=$1 first=$2 list="" i host
  shift 2
  for i in 0 1 2; do
    host="127.0.0.$((first + i))"
    "$BUILD/server/sluice-server" --data_dir="$TMP/$name$i" --listen="$host:$((BASE + 10))" \
      --etcd="127.0.0.1:$EP" --etcd_prefix="/$name/" --node_id="$name$i" --node_lease_s=3 \
      --worker_threads=2 --memory_budget_mb=128 --log_level=warn "$@" \
      ${METRICS_AT:+--metrics_listen=127.0.0.1:$((METRICS_AT + i))} >>"$TMP/$name$i.log" 2>&1 &
    PIDS+=($!)
    wait_port "$host" "$((BASE + 10))"
    list+="${list:+,}$host:$((BASE + 10))"
  done
  SERVERS[$name]=$list
}
METRICS_AT=
start_cluster off 2
METRICS_AT=$((BASE + 20))
start_cluster on 6 --object_store="s3://$BUCKET/tier" --object_endpoint="http://127.0.0.1:$S3PORT"
METRICS=("$METRICS_AT" "$((METRICS_AT + 1))" "$((METRICS_AT + 2))")
sleep 1  # every server registered

# The keys under the store's PREFIX (s3rver checks no signature: a plain GET lists).
count_keys() {  # prefix
  curl -s "http://127.0.0.1:$S3PORT/$BUCKET?list-type=2&prefix=$1" | grep -o '<Key>' | wc -l
}

echo "# $(date -u +%FT%TZ) $(nproc) cores; $BUILD; 3 servers a cluster, R=2; store: s3rver on" \
  "loopback; flags: ${*:-(defaults)}"
declare -a ROFF RON RATIO LAG
for r in $(seq 1 "$ROUNDS"); do
  off=$("$BUILD/bench/sluice-bench" --servers "${SERVERS[off]}" --replication 2 "$@" | grep RESULT)
  out=$("$BUILD/bench/sluice-bench" --servers "${SERVERS[on]}" --replication 2 --keep 1 "$@")
  done_at=$(date +%s.%N)
  on=$(grep RESULT <<<"$out")
  id=$(sed -n 's/^KEPT //p' <<<"$out")
  grep -q '"counts_match": true' <<<"$off" || { echo "round $r: off counts do not match: $off"; exit 1; }
  grep -q '"counts_match": true' <<<"$on" || { echo "round $r: on counts do not match: $on"; exit 1; }
  # Until the manifest is there: every partition uploaded and recorded.
  for _ in $(seq 1 1200); do
    curl -sf -o /dev/null "http://127.0.0.1:$S3PORT/$BUCKET/tier/$id/manifest.json" && break
    sleep 0.05
  done
  lag=$(echo "$(date +%s.%N) - $done_at" | bc)
  objects=$(count_keys "tier/$id/")
  "$BUILD/client/sluice" delete --server "${SERVERS[on]%%,*}" --shuffle "$id" >/dev/null
  ioff=$(items_per_sec <<<"$off")
  ion=$(items_per_sec <<<"$on")
  ROFF+=("$ioff")
  RON+=("$ion")
  RATIO+=("$(echo "scale=3; $ion / $ioff" | bc)")
  LAG+=("$lag")
  printf 'round %d: off %d items/s, on %d items/s, on/off %s; uploaded %.2f s after the run, %d objects\n' \
    "$r" "$ioff" "$ion" "${RATIO[-1]}" "$lag" "$objects"
done
echo "median: off $(median "${ROFF[@]}"), on $(median "${RON[@]}"), on/off $(median "${RATIO[@]}"), upload lag $(median "${LAG[@]}") s"
sleep 3  # (the deletes' sweeps)
echo "store requests per shuffle (the servers' sluice_object_requests_total / $ROUNDS, deletes included):"
for p in "${METRICS[@]}"; do curl -s "http://127.0.0.1:$p/metrics"; done |
  sed -n 's/^sluice_object_requests_total{request="\([A-Za-z0-9]*\)"} \([0-9.e+]*\)$/\1 \2/p' |
  awk -v n="$ROUNDS" '{s[$1] += $2} END {for (k in s) if (s[k] > 0) printf "  %s %.1f\n", k, s[k] / n}' | sort
