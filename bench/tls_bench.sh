#!/bin/bash
# What TLS costs (docs/benchmarks.md, "TLS"): the seed workload through `sluice-bench --server`
# against three sluice-servers started side by side with the same flags, one in clear, one with
# TLS and one with mutual TLS (certificates made by tests/harness/make_certs.sh), interleaved
# round by round so the machine's swings hit all alike. Prints each round's items/s and the
# median ratios tls / plain and mtls / plain.
#
#   bash bench/tls_bench.sh [BUILD_DIR=build] [ROUNDS=7] [extra sluice-bench flags...]
set -euo pipefail
source "$(dirname "$0")/lib.sh"
BUILD=${1:-build}
ROUNDS=${2:-7}
shift $(($# < 2 ? $# : 2))
ROOT=$(cd "$(dirname "$0")/.." && pwd)
SERVER=$BUILD/server/sluice-server
BENCH=$BUILD/bench/sluice-bench
need_built "$SERVER" "$BENCH"
command -v openssl >/dev/null || { echo "tls_bench: openssl is missing" >&2; exit 2; }

scratch sluice-tls-bench
bash "$ROOT/tests/harness/make_certs.sh" "$TMP/certs" >/dev/null
C=$TMP/certs

BASE=$((20000 + RANDOM % 20000))
declare -A PORT=([plain]=$BASE [tls]=$((BASE + 1)) [mtls]=$((BASE + 2)))
declare -A SERVER_FLAGS=(
  [plain]=""
  [tls]="--tls_cert=$C/server.pem --tls_key=$C/server.key"
  [mtls]="--tls_cert=$C/server.pem --tls_key=$C/server.key --tls_client_ca=$C/ca.pem")
declare -A CLIENT_FLAGS=(
  [plain]=""
  [tls]="--tls-ca $C/ca.pem"
  [mtls]="--tls-ca $C/ca.pem --tls-cert $C/client-a.pem --tls-key $C/client-a.key")
for way in plain tls mtls; do
  # shellcheck disable=SC2086  # the flags split into words
  "$SERVER" --data_dir="$TMP/$way" --listen="127.0.0.1:${PORT[$way]}" --worker_threads=2 \
    --memory_budget_mb=128 --log_level=warn ${SERVER_FLAGS[$way]} >/dev/null 2>&1 &
  PIDS+=($!)
done
for way in plain tls mtls; do wait_port 127.0.0.1 "${PORT[$way]}"; done

declare -A ALL=()
for r in $(seq 1 "$ROUNDS"); do
  for way in plain tls mtls; do
    # shellcheck disable=SC2086
    out=$("$BENCH" --server "127.0.0.1:${PORT[$way]}" ${CLIENT_FLAGS[$way]} "$@")
    grep -q '"counts_match": true' <<<"$out" || { echo "tls_bench: $way: $out" >&2; exit 1; }
    ips=$(grep RESULT <<<"$out" | items_per_sec)
    ALL[$way]+="$ips "
    echo "round $r: $way $ips items/s"
  done
done
# shellcheck disable=SC2086
p=$(median ${ALL[plain]}) t=$(median ${ALL[tls]}) m=$(median ${ALL[mtls]})
ratio() { awk "BEGIN{printf \"%.3f\", $1/$2}"; }
echo "RESULT {\"rounds\": $ROUNDS, \"plain_items_per_sec\": $p, \"tls_items_per_sec\": $t," \
  "\"mtls_items_per_sec\": $m, \"tls_over_plain\": $(ratio "$t" "$p")," \
  "\"mtls_over_plain\": $(ratio "$m" "$p")}"
