#!/bin/bash
# What metrics cost (docs/benchmarks.md, "Deployment"): the seed workload through
# `sluice-bench --server` against two sluice-servers started side by side, one without a metrics
# endpoint and one with --metrics_listen scraped every SCRAPE_MS (100 ms: 150 times Prometheus's
# default 15 s), interleaved round by round so the machine's swings hit both alike. Prints each
# round's items/s and the median ratio scraped / plain.
#
#   bash bench/metrics_bench.sh [BUILD_DIR=build] [ROUNDS=5] [SCRAPE_MS=100]
set -euo pipefail
source "$(dirname "$0")/lib.sh"
BUILD=${1:-build}
ROUNDS=${2:-5}
SCRAPE_MS=${3:-100}
SERVER=$BUILD/server/sluice-server
BENCH=$BUILD/bench/sluice-bench
need_built "$SERVER" "$BENCH"
command -v curl >/dev/null || { echo "metrics_bench: curl is missing" >&2; exit 2; }
[[ -x /usr/bin/python3 ]] || { echo "metrics_bench: /usr/bin/python3 is missing" >&2; exit 2; }

scratch sluice-metrics-bench

BASE=$((20000 + RANDOM % 20000))
PLAIN=$BASE SCRAPED=$((BASE + 1)) METRICS=$((BASE + 2))
COMMON=(--worker_threads=2 --memory_budget_mb=128 --log_level=warn)
"$SERVER" --data_dir="$TMP/plain" --listen="127.0.0.1:$PLAIN" "${COMMON[@]}" >/dev/null 2>&1 &
PIDS+=($!)
"$SERVER" --data_dir="$TMP/scraped" --listen="127.0.0.1:$SCRAPED" \
  --metrics_listen="127.0.0.1:$METRICS" "${COMMON[@]}" >/dev/null 2>&1 &
PIDS+=($!)
wait_port 127.0.0.1 "$PLAIN"
wait_port 127.0.0.1 "$SCRAPED"
wait_port 127.0.0.1 "$METRICS"

# The scraper: one process (no curl started per scrape: on 2 cores that alone cost the bench
# ~10%), a GET every SCRAPE_MS while its bench runs; it writes its count and mean latency.
scrape_loop() {
  exec /usr/bin/python3 - "$METRICS" "$SCRAPE_MS" "$TMP/scrapes" <<'PY'
import sys, time, urllib.request
port, period, out = int(sys.argv[1]), int(sys.argv[2]) / 1000, sys.argv[3]
n, spent = 0, 0.0
while True:
    t = time.perf_counter()
    urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
    spent += time.perf_counter() - t
    n += 1
    with open(out, "w") as f:
        f.write(f"{n} scrapes, {1000 * spent / n:.2f} ms each")
    time.sleep(period)
PY
}

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
      sleep 0.5  # its interpreter's start is not the endpoint's cost
    else
      sleep 0.5
    fi
    out=$("$BENCH" --server "127.0.0.1:$port" --order KEY)
    [[ $which == scraped ]] && { kill "$SCRAPER"; wait "$SCRAPER" 2>/dev/null || true; }
    grep -q '"counts_match": true' <<<"$out" || { echo "metrics_bench: counts differ: $out" >&2; exit 1; }
    ips[$which]=$(items_per_sec <<<"$out")
  done
  ratio=$(awk "BEGIN{printf \"%.3f\", ${ips[scraped]} / ${ips[plain]}}")
  RATIOS+=("$ratio")
  echo "round $r: plain ${ips[plain]} items/s, scraped ${ips[scraped]} items/s ($(cat "$TMP/scrapes")), ratio $ratio"
done
median=$(median "${RATIOS[@]}")
bytes=$(curl -sf "http://127.0.0.1:$METRICS/metrics" | wc -c)
echo "RESULT {\"rounds\": $ROUNDS, \"scrape_ms\": $SCRAPE_MS, \"median_ratio_scraped_over_plain\": $median, \"scrape_bytes\": $bytes}"
