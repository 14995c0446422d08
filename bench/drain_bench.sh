#!/bin/bash
# Drain time under load (docs/benchmarks.md, "Drain"): a sluice-server with the seed workload
# running against it (sluice-bench --server, 16 mappers x 50,000 items), SIGTERM 0.5 s into the
# run; prints how long the server took from the signal to its exit, its exit status, the
# streams open when the drain began, and how the bench fared (its pushes after the signal are
# refused: UNAVAILABLE, "draining").
#
#   bash bench/drain_bench.sh [BUILD_DIR=build] [ROUNDS=3]
set -euo pipefail
BUILD=${1:-build}
ROUNDS=${2:-3}
TMP=$(mktemp -d /tmp/sluice-drain-bench.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
for r in $(seq 1 "$ROUNDS"); do
  rm -rf "$TMP/data" && mkdir -p "$TMP/data"
  "$BUILD/server/sluice-server" --data_dir="$TMP/data" --listen=127.0.0.1:0 --worker_threads=2 \
    --memory_budget_mb=128 --drain_grace_s=30 >"$TMP/server.out" 2>"$TMP/server.err" &
  server=$!
  for _ in $(seq 1 100); do grep -q "listening on port" "$TMP/server.out" && break; sleep 0.05; done
  port=$(sed -n 's/^listening on port //p' "$TMP/server.out")
  "$BUILD/bench/sluice-bench" --server "127.0.0.1:$port" --shards 16 --retries 0 \
    >"$TMP/bench.out" 2>"$TMP/bench.err" &
  bench=$!
  sleep 0.5
  t0=$(date +%s.%N)
  kill -TERM "$server"
  wait "$server" && rc=0 || rc=$?
  t1=$(date +%s.%N)
  wait "$bench" && brc=0 || brc=$?
  drain=$(grep -o "event=drain grace_ms=[0-9]* push_streams=[0-9]* fetch_streams=[0-9]*" "$TMP/server.err" | sed 's/event=drain //')
  drained=$(grep -o "event=drained waited_ms=[0-9]*" "$TMP/server.err" | sed 's/event=drained //')
  echo "round $r: signal to exit $(echo "$t1 - $t0" | bc) s, exit $rc; at the signal: $drain; $drained; bench exit $brc: $(grep -o '"counted_items": [0-9]*, "counts_match": [a-z]*' "$TMP/bench.out") $(tail -c 160 "$TMP/bench.err" | tr '\n' ' ')"
done
