#!/bin/bash
# The Python client's figures (docs/benchmarks.md, "Python client"): the seed workload (8 shards
# x 50,000 items of ~200 bytes, 10,000 keys, 8 partitions, KEY order, counts verified) four
# ways, interleaved round by round so the machine's swings hit all alike:
#   python  `python3 -m sluice.bench` (its own sluice-server child, durable commits)
#   zephyr  tests/py/zephyr_style_shuffle.py (pure Python: pickle + zstd, fsynced files, heapq)
#   cpp     `sluice-bench` (the C++ client, its own sluice-server child)
#   gen     `python3 -m sluice.bench --generate-only`: the same workers only make the items and
#           shuffle nothing; the workload's own Python, a ceiling no Python shuffle can pass
# Prints each round, then the medians and the ratios python/zephyr, cpp/python, cpp/zephyr and
# gen/zephyr.
#
#   bash bench/python_bench.sh [BUILD_DIR=build] [ROUNDS=3]
set -euo pipefail
source "$(dirname "$0")/lib.sh"
BUILD=${1:-build}
ROUNDS=${2:-3}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=/usr/bin/python3
export PYTHONPATH=$BUILD/python SLUICE_SERVER_BIN=$BUILD/server/sluice-server
field() { sed -n "s/.*\"$1\": \\([0-9.]*\\).*/\\1/p"; }
declare -A ALL=()
for r in $(seq 1 "$ROUNDS"); do
  for way in python zephyr cpp gen; do
    case $way in
      python) out=$("$PY" -m sluice.bench) ;;
      zephyr) out=$("$PY" "$ROOT/tests/py/zephyr_style_shuffle.py") ;;
      cpp) out=$("$BUILD/bench/sluice-bench" --order KEY --server-bin "$SLUICE_SERVER_BIN") ;;
      gen) out=$("$PY" -m sluice.bench --generate-only) ;;
    esac
    grep -q '"counts_match": true' <<<"$out" || { echo "python_bench: $way: counts differ: $out" >&2; exit 1; }
    ips=$(grep RESULT <<<"$out" | field items_per_sec)
    rss=$(grep RESULT <<<"$out" | field peak_rss_mb)
    rss=${rss:--}
    ALL[$way]+="$ips "
    echo "round $r: $way $ips items/s, peak RSS $rss MiB"
  done
done
# shellcheck disable=SC2086  # the lists split into numbers
p=$(median ${ALL[python]}) z=$(median ${ALL[zephyr]}) c=$(median ${ALL[cpp]}) g=$(median ${ALL[gen]})
ratio() { awk "BEGIN{printf \"%.2f\", $1/$2}"; }
echo "RESULT {\"rounds\": $ROUNDS, \"python_items_per_sec\": $p, \"zephyr_items_per_sec\": $z," \
  "\"cpp_items_per_sec\": $c, \"generate_only_items_per_sec\": $g," \
  "\"python_over_zephyr\": $(ratio "$p" "$z"), \"cpp_over_python\": $(ratio "$c" "$p")," \
  "\"cpp_over_zephyr\": $(ratio "$c" "$z"), \"generate_only_over_zephyr\": $(ratio "$g" "$z")}"
