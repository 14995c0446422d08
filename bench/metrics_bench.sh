#!/bin/bash
# What metrics cost (docs/benchmarks.md, "Deployment"): the seed workload through
# `sluice-bench --server` against two sluice-servers started side by side, one without a metrics
# endpoint and one with --metrics_listen scraped every SCRAPE_MS (100 ms: 150 times Prometheus's
# default 15 s), interleaved round by round so the machine's swings hit both alike. Prints each
# round's items/s and the median ratio scraped / plain.
#
#   bash bench/metrics_bench.sh [BUILD_DIR=build] [ROUNDS=5] [SCRAPE_MS=100]
set -euo pipefail
BUILD=${1:-build}
ROUNDS=${2:-5}
SCRAPE_MS=${3:-100}
SERVER=$BUILD/server/sluice-server
BENCH=$BUILD/bench/sluice-bench
for f in "$SERVER" "$BENCH"; do
  [[ -x $f ]] || { echo "metrics_bench: $f is missing (build first)" >&2; exit 2; }
done
command -v curl >/dev/null || { echo "metrics_bench: curl is missing" >&2; exit 2; }

TMP=$(mktemp -d /tmp/sluice-metrics-bench.XXXXXX)
declare -a PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$TMP"
}
trap cleanup EXIT

wait_port() {  # port
  for _ in $(seq 1 200); do
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
    sleep 0.05
  done
  echo "metrics_bench: nothing listens on 127.0.0.1:$1" >&2
  return 1
}

BASE=$((20000 + RANDOM % 20000))
PLAIN=$BASE SCRAPED=$((BASE + 1)) METRICS=$((BASE + 2))
COMMON=(--worker_threads=2 --memory_budget_mb=128 --log_level=warn)
"$SERVER" --data_dir="$TMP/plain" --listen="127.0.0.1:$PLAIN" "${COMMON[@]}" >/dev/null 2>&1 &
PIDS+=($!)
"$SERVER" --data_dir="$TMP/scraped" --listen="127.0.0.1:$SCRAPED" \
  --metrics_listen="127.0.0.1:$METRICS" "${COMMON[@]}" >/dev/null 2>&1 &
PIDS+=($!)
wait_port "$PLAIN"
wait_port "$SCRAPED"
wait_port "$METRICS"

# The scraper: every SCRAPE_MS while its bench runs (started and stopped around it).
scrape_loop() {
  local n=0
  while :; do
    curl -sf "http://127.0.0.1:$METRICS/metrics" -o /dev/null && n=$((n + 1))
    echo "$n" >"$TMP/scrapes"
    sleep "$(awk "BEGIN{print $SCRAPE_MS/1000}")"
  done
}

items() { sed -n 's/.*"items_per_sec": \([0-9]*\).*/\1/p'; }
declare -a RATIOS=()
for r in $(seq 1 "$ROUNDS"); do
  # Alternate which goes first, so neither always runs on a warmer machine.
  order=(plain scraped)
  ((r % 2 == 0)) && order=(scraped plain)
  declare -A ips=()
  for which in "${order[@]}"; do
    port=$PLAIN
    if [[ $which == scraped ]]; then
      port=$SCRAPED
      scrape_loop &
      SCRAPER=$!
    fi
    out=$("$BENCH" --server "127.0.0.1:$port" --order KEY)
    [[ $which == scraped ]] && { kill "$SCRAPER"; wait "$SCRAPER" 2>/dev/null || true; }
    grep -q '"counts_match": true' <<<"$out" || { echo "metrics_bench: counts differ: $out" >&2; exit 1; }
    ips[$which]=$(items <<<"$out")
  done
  ratio=$(awk "BEGIN{printf \"%.3f\", ${ips[scraped]} / ${ips[plain]}}")
  RATIOS+=("$ratio")
  echo "round $r: plain ${ips[plain]} items/s, scraped ${ips[scraped]} items/s ($(cat "$TMP/scrapes") scrapes during it), ratio $ratio"
done
median=$(printf '%s\n' "${RATIOS[@]}" | sort -n | awk '{a[NR]=$1} END{print a[int((NR+1)/2)]}')
bytes=$(curl -sf "http://127.0.0.1:$METRICS/metrics" | wc -c)
t0=$(date +%s%N)
for _ in $(seq 1 100); do curl -sf "http://127.0.0.1:$METRICS/metrics" -o /dev/null; done
t1=$(date +%s%N)
echo "RESULT {\"rounds\": $ROUNDS, \"scrape_ms\": $SCRAPE_MS, \"median_ratio_scraped_over_plain\": $median, \"scrape_bytes\": $bytes, \"ms_per_scrape_with_curl_start\": $(awk "BEGIN{printf \"%.2f\", ($t1 - $t0) / 100 / 1e6}")}"
