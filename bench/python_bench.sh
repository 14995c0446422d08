#!/bin/bash
# The Python client's figures (docs/benchmarks.md, "Python client" and "Python columns"): the
# seed workload (8 shards x 50,000 items of ~200 bytes, 10,000 keys, 8 partitions, KEY order,
# counts verified) six ways, interleaved round by round so the machine's swings hit all alike:
#   columns `python3 -m sluice.bench --columns`: numpy columns, Writer.write_columns, then
#           Reader.frame_groups (its own sluice-server child, durable commits)
#   python  `python3 -m sluice.bench`: dicts through write_many, then groups()
#   dask    bench/dask_shuffle.py: the same columns as pandas frames through Dask's dataframe
#           shuffle (shuffle="disk", threads scheduler, 2 workers), each partition grouped by key
#   zephyr  tests/py/zephyr_style_shuffle.py (pure Python: pickle + zstd, fsynced files, heapq)
#   cpp     `sluice-bench` (the C++ client, its own sluice-server child)
#   gen     `python3 -m sluice.bench --generate-only`: the same workers only make the dict items
#           and shuffle nothing; the workload's own Python, a ceiling no dict shuffle can pass
#   colgen  `python3 -m sluice.bench --generate-only --columns`: the same for the numpy columns
#           (with PAYLOAD=same nearly free: then cpp, which converts nothing in Python, is what a
#           columns way without conversions could at best approach; cpp_over_dask)
# Every way makes the very same items (sluice.bench.columns reproduces the C++ bench's
# generator): PAYLOAD=random (the default) gives each item 168 random alphanumeric characters
# of its own, PAYLOAD=same one run of 'x' for all (which pickle's memo writes once a batch).
# PREMADE=1: only the columns and dask ways, each with its items made before the clock starts
# (--premade: the shuffles alone are timed, on the same frames).
# Prints each round, then the medians and the ratios.
# Installs Debian's python3-dask (and numpy, pandas) if missing: a bench dependency, not a
# build one.
#
#   bash bench/python_bench.sh [BUILD_DIR=build] [ROUNDS=3]
set -euo pipefail
source "$(dirname "$0")/lib.sh"
BUILD=${1:-build}
ROUNDS=${2:-3}
PAYLOAD=${PAYLOAD:-random}
PREMADE=${PREMADE:-0}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=/usr/bin/python3
need_built "$BUILD/server/sluice-server" "$BUILD/bench/sluice-bench"
if ! "$PY" -c "import dask.dataframe, numpy, pandas" 2>/dev/null; then
  echo "python_bench: installing python3-dask, python3-numpy, python3-pandas" >&2
  apt-get install -y -q python3-dask python3-numpy python3-pandas >/dev/null
fi
export PYTHONPATH=$BUILD/python SLUICE_SERVER_BIN=$BUILD/server/sluice-server
declare -A ALL=()
WAYS="columns python dask zephyr cpp gen colgen" PRE=()
if [ "$PREMADE" = 1 ]; then WAYS="columns dask" PRE=(--premade); fi
for r in $(seq 1 "$ROUNDS"); do
  for way in $WAYS; do
    case $way in
      columns) out=$("$PY" -m sluice.bench --columns --payload "$PAYLOAD" "${PRE[@]}") ;;
      python) out=$("$PY" -m sluice.bench --payload "$PAYLOAD") ;;
      dask) out=$("$PY" "$ROOT/bench/dask_shuffle.py" --payload "$PAYLOAD" "${PRE[@]}") ;;
      zephyr) out=$("$PY" "$ROOT/tests/py/zephyr_style_shuffle.py" --payload "$PAYLOAD") ;;
      cpp) out=$("$BUILD/bench/sluice-bench" --order KEY --payload "$PAYLOAD" \
                 --server-bin "$SLUICE_SERVER_BIN") ;;
      gen) out=$("$PY" -m sluice.bench --generate-only --payload "$PAYLOAD") ;;
      colgen) out=$("$PY" -m sluice.bench --generate-only --columns --payload "$PAYLOAD") ;;
    esac
    grep -q '"counts_match": true' <<<"$out" || { echo "python_bench: $way: counts differ: $out" >&2; exit 1; }
    ips=$(grep RESULT <<<"$out" | field items_per_sec)
    rss=$(grep RESULT <<<"$out" | field peak_rss_mb)
    rss=${rss:--}
    ALL[$way]+="$ips "
    echo "round $r: $way $ips items/s, peak RSS $rss MiB"
  done
done
ratio() { awk "BEGIN{printf \"%.2f\", $1/$2}"; }
# shellcheck disable=SC2086  # the lists split into numbers
col=$(median ${ALL[columns]}) d=$(median ${ALL[dask]})
if [ "$PREMADE" = 1 ]; then
  echo "RESULT {\"rounds\": $ROUNDS, \"payload\": \"$PAYLOAD\", \"premade\": true," \
    "\"columns_items_per_sec\": $col, \"dask_items_per_sec\": $d," \
    "\"columns_over_dask\": $(ratio "$col" "$d")}"
  exit 0
fi
# shellcheck disable=SC2086
p=$(median ${ALL[python]})
# shellcheck disable=SC2086
z=$(median ${ALL[zephyr]}) c=$(median ${ALL[cpp]}) g=$(median ${ALL[gen]})
# shellcheck disable=SC2086
cg=$(median ${ALL[colgen]})
echo "RESULT {\"rounds\": $ROUNDS, \"payload\": \"$PAYLOAD\", \"columns_items_per_sec\": $col," \
  "\"python_items_per_sec\": $p, \"dask_items_per_sec\": $d, \"zephyr_items_per_sec\": $z," \
  "\"cpp_items_per_sec\": $c, \"generate_only_items_per_sec\": $g," \
  "\"generate_columns_only_items_per_sec\": $cg, \"cpp_over_dask\": $(ratio "$c" "$d")," \
  "\"columns_over_dask\": $(ratio "$col" "$d"), \"cpp_over_columns\": $(ratio "$c" "$col")," \
  "\"columns_over_python\": $(ratio "$col" "$p"), \"python_over_zephyr\": $(ratio "$p" "$z")," \
  "\"cpp_over_python\": $(ratio "$c" "$p"), \"cpp_over_zephyr\": $(ratio "$c" "$z")," \
  "\"generate_only_over_zephyr\": $(ratio "$g" "$z")}"
