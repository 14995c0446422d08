#!/bin/bash
# Disks as a cache (docs/benchmarks.md, "The object tier"): two clusters side by side on one etcd
# and one s3rver, three sluice-servers each at R = 2 with --object_store, --disk_high_water_pct=90
# and --object_evict_pct=60, each server's data directory on a tmpfs of its own: "small" of
# SMALL_MIB (smaller than the shuffles the rounds keep), "big" of 4 GiB (larger than all of them;
# tmpfs takes only what is written). Each round runs the
# seed workload through `sluice-bench --keep 1 --retries 60` on each, alternating, every shuffle
# kept: the small disks keep taking writes by evicting the shuffles already in the store (a push
# refused UNAVAILABLE while the last ones upload is retried by the bench's mapper, as by an
# engine). Prints each round's items/s on both and the ratio, the small disks' fullest use, the
# evictions; then the first round's shuffle (evicted on small) read partition by partition with
# `sluice fetch` through small (each partition read back from the store first) and through big
# (on its disk): the time to the first partition, to the last, and MiB/s.
#
#   bash bench/object_evict_bench.sh [BUILD=build] [ROUNDS=6] [SMALL_MIB=160] [sluice-bench flags...]
set -euo pipefail
source "$(dirname "$0")/lib.sh"
BUILD=${1:-build}
ROUNDS=${2:-6}
SMALL_MIB=${3:-160}
BIG_MIB=4096
shift $(($# < 3 ? $# : 3))
need_built "$BUILD/server/sluice-server" "$BUILD/bench/sluice-bench" "$BUILD/client/sluice" \
  "${SLUICE_ETCD_BIN:-/usr/bin/etcd}" "$S3RVER"
scratch sluice-evict-bench
MOUNTS=()
trap 'for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true
      for m in "${MOUNTS[@]}"; do umount -l "$m" 2>/dev/null || true; done; rm -rf "$TMP"' EXIT

BASE=$((20000 + RANDOM % 20000))
EP=$BASE
S3PORT=$((BASE + 5))
BUCKET=sluice-bench
start_etcd "$EP" "$TMP/etcd"
start_s3rver "$S3PORT" "$BUCKET"
TIER=(--object_store="s3://$BUCKET/evict" --object_endpoint="http://127.0.0.1:$S3PORT"
  --disk_high_water_pct=90 --object_evict_pct=60)

declare -A SERVERS METRICS_OF
start_cluster() {  # name first-host-octet disk-MiB
  local name=$1 first=$2 list="" metrics="" i host dir
  for i in 0 1 2; do
    host="127.0.0.$((first + i))"
    dir="$TMP/$name$i"
    mkdir -p "$dir"
    mount -t tmpfs -o "size=${3}m" tmpfs "$dir"
    MOUNTS+=("$dir")
    "$BUILD/server/sluice-server" --data_dir="$dir" --listen="$host:$((BASE + 10))" \
      --etcd="127.0.0.1:$EP" --etcd_prefix="/$name/" --node_id="$name$i" --node_lease_s=3 \
      --worker_threads=2 --memory_budget_mb=128 --log_level=warn "${TIER[@]}" \
      --metrics_listen="127.0.0.1:$((BASE + 20 + first + i))" >>"$TMP/$name$i.log" 2>&1 &
    PIDS+=($!)
    wait_port "$host" "$((BASE + 10))"
    list+="${list:+,}$host:$((BASE + 10))"
    metrics+="${metrics:+ }$((BASE + 20 + first + i))"
  done
  SERVERS[$name]=$list
  METRICS_OF[$name]=$metrics
}
start_cluster small 2 "$SMALL_MIB"
start_cluster big 6 "$BIG_MIB"
sleep 1  # every server registered

metric() {  # cluster name: the sum over its servers
  for p in ${METRICS_OF[$1]}; do curl -s "http://127.0.0.1:$p/metrics"; done |
    awk -v m="$2" '$1 == m {s += $2} END {printf "%d", s}'
}
fullest() {  # the small disks' fullest use now, percent
  df --output=pcent "$TMP"/small0 "$TMP"/small1 "$TMP"/small2 | tail -n +2 | tr -d ' %' | sort -n | tail -1
}

echo "# $(date -u +%FT%TZ) $(nproc) cores; $BUILD; 3 servers a cluster, R=2, tmpfs of" \
  "$SMALL_MIB MiB (small) and $BIG_MIB MiB (big) a server; store: s3rver on loopback;" \
  "flags: ${*:-(defaults)}"
declare -a RSMALL RBIG RATIO IDS
PEAK=0
for r in $(seq 1 "$ROUNDS"); do
  s_out=$("$BUILD/bench/sluice-bench" --servers "${SERVERS[small]}" --replication 2 --keep 1 \
    --retries 60 "$@")
  p=$(fullest)
  ((p > PEAK)) && PEAK=$p
  b_out=$("$BUILD/bench/sluice-bench" --servers "${SERVERS[big]}" --replication 2 --keep 1 \
    --retries 60 "$@")
  for o in "$s_out" "$b_out"; do
    grep -q '"counts_match": true' <<<"$o" || { echo "round $r: counts do not match: $o"; exit 1; }
  done
  IDS+=("$(sed -n 's/^KEPT //p' <<<"$s_out") $(sed -n 's/^KEPT //p' <<<"$b_out")")
  is=$(grep RESULT <<<"$s_out" | items_per_sec)
  ib=$(grep RESULT <<<"$b_out" | items_per_sec)
  RSMALL+=("$is")
  RBIG+=("$ib")
  RATIO+=("$(echo "scale=3; $is / $ib" | bc)")
  printf 'round %d: small %d items/s, big %d items/s, small/big %s; small disks at most %d%% full; evicted so far %d shuffle copies\n' \
    "$r" "$is" "$ib" "${RATIO[-1]}" "$p" "$(metric small sluice_evicted_shuffles_total)"
done
du_small=$(du -sm "$TMP"/small0 | cut -f1)
du_big=$(du -sm "$TMP"/big0 | cut -f1)
echo "median: small $(median "${RSMALL[@]}"), big $(median "${RBIG[@]}"), small/big $(median "${RATIO[@]}");" \
  "fullest small disk ${PEAK}%; server 0 holds ${du_small} MiB on small, ${du_big} MiB on big;" \
  "evicted $(metric small sluice_evicted_shuffles_total) shuffle copies, $(($(metric small sluice_evicted_bytes_total) / 1048576)) MiB"

# Reads every partition of shuffle ID through SERVERS (retrying one refused); prints the seconds
# to the first partition read, to the last, and the values' MiB.
PARTITIONS=$(sed -n 's/.*"partitions": \([0-9]*\).*/\1/p' <<<"$s_out" | head -1)
PARTITIONS=${PARTITIONS:-8}
read_all() {  # servers id
  local start first="" bytes=0 p
  start=$(date +%s.%N)
  for p in $(seq 0 $((PARTITIONS - 1))); do
    local tries=0
    until "$BUILD/client/sluice" fetch --server "$1" --shuffle "$2" --partition "$p" \
        --format msgpack --output "$TMP/part" 2>"$TMP/fetch.err"; do
      if ((++tries > 600)); then
        echo "partition $p not read in a minute: $(cat "$TMP/fetch.err")" >&2
        exit 1
      fi
      sleep 0.1
    done
    [[ -n $first ]] || first=$(echo "$(date +%s.%N) - $start" | bc)
    bytes=$((bytes + $(stat -c %s "$TMP/part")))
  done
  printf '%.2f %.2f %.1f\n' "$first" "$(echo "$(date +%s.%N) - $start" | bc)" \
    "$(echo "scale=1; $bytes / 1048576" | bc)"
}
read -r first_small first_big <<<"${IDS[0]}"
before=$(metric small sluice_read_back_bytes_total)
read -r f l mb <<<"$(read_all "${SERVERS[small]}" "$first_small")"
back=$(($(metric small sluice_read_back_bytes_total) - before))
printf 'round 1 read on small (evicted): first partition %5.2f s, all %5.2f s, %s MiB, %.0f MiB/s; %d MiB read back from the store\n' \
  "$f" "$l" "$mb" "$(echo "$mb / $l" | bc -l)" "$((back / 1048576))"
read -r f l mb <<<"$(read_all "${SERVERS[big]}" "$first_big")"
printf 'round 1 read on big (on disk):  first partition %5.2f s, all %5.2f s, %s MiB, %.0f MiB/s\n' \
  "$f" "$l" "$mb" "$(echo "$mb / $l" | bc -l)"
