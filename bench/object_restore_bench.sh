#!/bin/bash
# Every server lost (docs/benchmarks.md, "The object tier"): a real etcd, an s3rver on loopback
# and three sluice-servers with --object_store at R = 2; the seed workload written through
# `sluice-bench --keep 1` and waited for in the store (its manifest). Then every partition read
# (`sluice fetch`, UNORDERED, raw values to /dev/null) three ways, each timed: through the live
# servers; straight from the store with no server (`--object-store`); and, after every server is
# killed -9 and its disk wiped, through three new servers (new ids, --dead_after_s=2) from their
# start: the time to the first partition read and to the last, as the new servers take the
# shuffle over and restore it from the store.
#
#   bash bench/object_restore_bench.sh [BUILD=build] [extra sluice-bench flags...]
set -euo pipefail
source "$(dirname "$0")/lib.sh"
BUILD=${1:-build}
shift $(($# < 1 ? $# : 1))
need_built "$BUILD/server/sluice-server" "$BUILD/bench/sluice-bench" "$BUILD/client/sluice" \
  "${SLUICE_ETCD_BIN:-/usr/bin/etcd}" "$S3RVER"
scratch sluice-restore-bench

BASE=$((20000 + RANDOM % 20000))
EP=$BASE
S3PORT=$((BASE + 5))
start_etcd "$EP" "$TMP/etcd"
start_s3rver "$S3PORT" sluice-bench
STORE="s3://sluice-bench/tier"
ENDPOINT="http://127.0.0.1:$S3PORT"
TIER=(--object_store="$STORE" --object_endpoint="$ENDPOINT" --dead_after_s=2)

SERVER_PIDS=()
start_servers() {  # first-host-octet first-node-index
  local i host list=""
  SERVER_PIDS=()
  for i in 0 1 2; do
    host="127.0.0.$(($1 + i))"
    "$BUILD/server/sluice-server" --data_dir="$TMP/n$(($2 + i))" --listen="$host:$((BASE + 10))" \
      --etcd="127.0.0.1:$EP" --node_id="n$(($2 + i))" --node_lease_s=2 --worker_threads=2 \
      --memory_budget_mb=128 --log_level=warn "${TIER[@]}" >>"$TMP/n$(($2 + i)).log" 2>&1 &
    PIDS+=($!)
    SERVER_PIDS+=($!)
    list+="${list:+,}$host:$((BASE + 10))"
  done
  for i in 0 1 2; do wait_port "127.0.0.$(($1 + i))" "$((BASE + 10))"; done
  SERVERS=$list
}
start_servers 2 0
sleep 1
out=$("$BUILD/bench/sluice-bench" --servers "$SERVERS" --replication 2 --keep 1 "$@")
grep -q '"counts_match": true' <<<"$out" || { echo "the run's counts do not match: $out"; exit 1; }
ID=$(sed -n 's/^KEPT //p' <<<"$out")
PARTITIONS=$(sed -n 's/.*"partitions": \([0-9]*\).*/\1/p' <<<"$out" | head -1)
PARTITIONS=${PARTITIONS:-8}
for _ in $(seq 1 1200); do
  curl -sf -o /dev/null "$ENDPOINT/sluice-bench/tier/$ID/manifest.json" && break
  sleep 0.05
done

# Reads every partition (retrying one that is refused) with `sluice fetch ARGS`; prints the
# seconds to the first partition read, to the last, and the values' MiB.
read_all() {  # args...
  local start first="" bytes=0 p size
  start=$(date +%s.%N)
  for p in $(seq 0 $((PARTITIONS - 1))); do
    local tries=0
    until "$BUILD/client/sluice" fetch --shuffle "$ID" --partition "$p" --format msgpack \
        --output "$TMP/part" "$@" 2>"$TMP/fetch.err"; do
      if ((++tries > 1200)); then
        echo "partition $p not read in a minute: $(cat "$TMP/fetch.err")" >&2
        exit 1
      fi
      sleep 0.05
    done
    [[ -n $first ]] || first=$(echo "$(date +%s.%N) - $start" | bc)
    size=$(stat -c %s "$TMP/part")
    bytes=$((bytes + size))
  done
  printf '%.2f %.2f %.1f\n' "$first" "$(echo "$(date +%s.%N) - $start" | bc)" \
    "$(echo "scale=1; $bytes / 1048576" | bc)"
}
echo "# $(date -u +%FT%TZ) $(nproc) cores; $BUILD; 3 servers, R=2, s3rver on loopback;" \
  "$PARTITIONS partitions; flags: ${*:-(defaults)}"
read -r f l mb <<<"$(read_all --server "$SERVERS")"
printf 'live servers:      first partition %5.2f s, all %5.2f s, %s MiB, %.0f MiB/s\n' "$f" "$l" "$mb" "$(echo "$mb / $l" | bc -l)"
read -r f l mb <<<"$(read_all --object-store "$STORE" --object-endpoint "$ENDPOINT")"
printf 'store, no server:  first partition %5.2f s, all %5.2f s, %s MiB, %.0f MiB/s\n' "$f" "$l" "$mb" "$(echo "$mb / $l" | bc -l)"
for p in "${SERVER_PIDS[@]}"; do kill -9 "$p"; done
wait "${SERVER_PIDS[@]}" 2>/dev/null || true
rm -rf "$TMP/n0" "$TMP/n1" "$TMP/n2"
start_at=$(date +%s.%N)
start_servers 6 3
read -r f l mb <<<"$(read_all --server "$SERVERS")"
since=$(echo "$(date +%s.%N) - $start_at" | bc)
printf 'new servers:       first partition %5.2f s, all %5.2f s after their start (%.2f s incl. the start), %s MiB\n' \
  "$f" "$l" "$since" "$mb"
