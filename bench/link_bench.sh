#!/bin/bash
# The seed workload over a real link (docs/benchmarks.md, "Over a link"): the sluice-server in
# one network namespace, the C++ bench's clients in another, the two joined by a veth pair this
# script makes, each end shaped by a token bucket (tc tbf) to RATE; beside it, in the same round,
# one raw TCP connection over the same link (bench/tcp_rate.py: sendall and recv_into, nothing
# else), the rate the link itself gives. Rounds interleave the rates and the two sides.
# Figures: the bench's items/s, its push rate (stored bytes / scatter seconds) and its fetch
# rate (stored bytes / reduce seconds) against the raw TCP rate. "none": the veth unshaped.
# Round trips: this kernel has no netem (CONFIG_NET_SCH_NETEM is not set), so a delay of D ms
# is added by bench/delay_proxy.py, in the server's namespace, in front of the server and of the
# raw TCP receiver alike: every chunk held D/2 ms each way, so each request and its answer take
# D ms more (what the applications wait for; TCP's own acknowledgements are not delayed).
# Needs root (namespaces, tc); everything it makes is removed at exit.
#
#   bash bench/link_bench.sh [BUILD_DIR=build] [ROUNDS=3]
#   RATES="none 10gbit 1gbit" DELAYS="0 1 10" (ms a round trip) ORDER=KEY|UNORDERED
#   ITEMS=50000 (items per shard) BENCH_ARGS="--push-credit 0" (more sluice-bench flags)
#   SERVER_MB=128 (the server's --memory_budget_mb) SERVER_ARGS="--stream_window_mb=4" (more flags)
set -euo pipefail
source "$(dirname "$0")/lib.sh"
BUILD=${1:-build}
ROUNDS=${2:-3}
RATES=${RATES:-none 10gbit 1gbit}
DELAYS=${DELAYS:-0}
ORDER=${ORDER:-KEY}
ITEMS=${ITEMS:-50000}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=/usr/bin/python3
need_built "$BUILD/server/sluice-server" "$BUILD/bench/sluice-bench"
[[ $(id -u) == 0 ]] || { echo "link_bench: needs root (network namespaces, tc)" >&2; exit 2; }

SRV=slb-srv-$$ CLI=slb-cli-$$ VS=slb$$s VC=slb$$c
SRV_IP=10.77.0.1 CLI_IP=10.77.0.2 PORT=7070 RAW_PORT=7071 PROXY=100
TMP=$(mktemp -d /tmp/link-bench.XXXXXX)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  ip netns del "$SRV" 2>/dev/null || true # (the veth pair goes with it)
  ip netns del "$CLI" 2>/dev/null || true
  rm -rf "$TMP"
}
trap cleanup EXIT
ip netns add "$SRV"
ip netns add "$CLI"
ip link add "$VS" type veth peer name "$VC"
ip link set "$VS" netns "$SRV"
ip link set "$VC" netns "$CLI"
ip -n "$SRV" addr add "$SRV_IP/30" dev "$VS"
ip -n "$CLI" addr add "$CLI_IP/30" dev "$VC"
for ns in "$SRV" "$CLI"; do ip -n "$ns" link set lo up; done
ip -n "$SRV" link set "$VS" up
ip -n "$CLI" link set "$VC" up

# (Background processes are started with `ip netns exec` itself, not through these, so that
# $! is the process and the cleanup's kill reaches it.)
in_cli() { ip netns exec "$CLI" "$@"; }
# Waits until something in the server's namespace listens on PORT, seen from the clients'.
wait_link_port() {  # port
  for _ in $(seq 1 200); do
    in_cli bash -c "exec 3<>/dev/tcp/$SRV_IP/$1" 2>/dev/null && return 0
    sleep 0.05
  done
  echo "link_bench: nothing listens on $SRV_IP:$1" >&2
  exit 1
}
# Waits until FILE (the output of a raw TCP receiver or its proxy) says it listens: they take
# one connection each, so their ports are not probed.
wait_listening() {  # file
  for _ in $(seq 1 200); do
    grep -q listening "$1" && return 0
    sleep 0.05
  done
  echo "link_bench: $1 never said it listens" >&2
  exit 1
}
# Bits a second of a tc rate (10gbit, 500mbit...).
bits_of() {  # rate
  local r=${1%bit}
  numfmt --from=si "${r^^}"
}
# Both ends of the link shaped to RATE (a token bucket with a burst of 2 ms at that rate, at
# least 64 KiB), or unshaped for "none".
shape() {  # rate
  local rate=$1 ns dev
  for ns in "$SRV" "$CLI"; do
    dev=$VS
    [[ $ns == "$CLI" ]] && dev=$VC
    ip netns exec "$ns" tc qdisc del dev "$dev" root 2>/dev/null || true
    [[ $rate == none ]] && continue
    local bits
    bits=$(bits_of "$rate")
    local burst=$((bits / 8 / 500))
    ((burst < 65536)) && burst=65536
    ip netns exec "$ns" tc qdisc add dev "$dev" root tbf rate "$rate" burst "$burst" latency 20ms
  done
}

read -r -a SERVER_FLAGS <<<"${SERVER_ARGS:-}"  # (more server flags, space-separated)
ip netns exec "$SRV" "$BUILD/server/sluice-server" --data_dir="$TMP/data" --listen="$SRV_IP:$PORT" \
  --plaintext --worker_threads=2 --memory_budget_mb="${SERVER_MB:-128}" --log_level=warn \
  "${SERVER_FLAGS[@]}" >"$TMP/server.log" 2>&1 &
PIDS+=($!)
wait_link_port "$PORT"

declare -A RAW=() IPS=() PUSH=() FETCH=()
CASES=()
for delay in $DELAYS; do for rate in $RATES; do CASES+=("$rate@${delay}ms"); done; done
for r in $(seq 1 "$ROUNDS"); do
  for delay in $DELAYS; do
    port=$PORT raw_port=$RAW_PORT proxies=()
    if [[ $delay != 0 ]]; then  # both through a delay line of their own
      port=$((PORT + PROXY)) raw_port=$((RAW_PORT + PROXY))
      for pair in "$port:$PORT" "$raw_port:$RAW_PORT"; do
        ip netns exec "$SRV" "$PY" "$ROOT/bench/delay_proxy.py" "$SRV_IP:${pair%%:*}" \
          "$SRV_IP:${pair##*:}" "$delay" >"$TMP/proxy.${pair%%:*}" 2>&1 &
        proxies+=($!)
        PIDS+=($!)
      done
      wait_link_port "$port"
      wait_listening "$TMP/proxy.$raw_port"  # (the raw receiver's proxy, as the receiver)
    fi
    for rate in $RATES; do
      shape "$rate"
      case_name="$rate@${delay}ms"
      # Raw TCP: as many MB as the rate carries in about 2 s (1 GB unshaped).
      mb=1000
      [[ $rate != none ]] && mb=$(($(bits_of "$rate") * 2 / 8 / 1000000))
      ip netns exec "$SRV" "$PY" "$ROOT/bench/tcp_rate.py" serve "$SRV_IP" "$RAW_PORT" \
        >"$TMP/raw.out" &
      raw_pid=$!
      wait_listening "$TMP/raw.out"
      in_cli "$PY" "$ROOT/bench/tcp_rate.py" send "$SRV_IP" "$raw_port" "$mb"
      wait "$raw_pid"
      raw=$(grep RESULT "$TMP/raw.out" | field mb_per_sec)
      # shellcheck disable=SC2086  # BENCH_ARGS: flags, split
      out=$(in_cli "$BUILD/bench/sluice-bench" --server "$SRV_IP:$port" --order "$ORDER" \
        --payload random --items-per-shard "$ITEMS" ${BENCH_ARGS:-})
      if ! grep -q '"counts_match": true' <<<"$out"; then
        echo "link_bench: counts differ: $out" >&2
        exit 1
      fi
      line=$(grep RESULT <<<"$out")
      ips=$(field items_per_sec <<<"$line")
      stored=$(field stored_bytes <<<"$line")
      push=$(awk "BEGIN{printf \"%.1f\", $stored / $(field scatter_s <<<"$line") / 1e6}")
      fetch=$(awk "BEGIN{printf \"%.1f\", $stored / $(field reduce_s <<<"$line") / 1e6}")
      RAW[$case_name]+="$raw " IPS[$case_name]+="$ips " PUSH[$case_name]+="$push "
      FETCH[$case_name]+="$fetch "
      echo "round $r, $rate, ${delay} ms: raw TCP $raw MB/s; sluice $ips items/s," \
        "push $push MB/s, fetch $fetch MB/s (stored $stored bytes)"
    done
    for p in "${proxies[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
  done
done
json=""
for case_name in "${CASES[@]}"; do
  # shellcheck disable=SC2086  # the lists split into numbers
  raw=$(median ${RAW[$case_name]}) ips=$(median ${IPS[$case_name]})
  # shellcheck disable=SC2086
  push=$(median ${PUSH[$case_name]}) fetch=$(median ${FETCH[$case_name]})
  json+="${json:+, }\"$case_name\": {\"raw_tcp_mb_per_sec\": $raw, \"items_per_sec\": $ips,"
  json+=" \"push_mb_per_sec\": $push, \"fetch_mb_per_sec\": $fetch,"
  json+=" \"push_over_raw\": $(awk "BEGIN{printf \"%.2f\", $push / $raw}"),"
  json+=" \"fetch_over_raw\": $(awk "BEGIN{printf \"%.2f\", $fetch / $raw}")}"
done
echo "RESULT {\"order\": \"$ORDER\", \"rounds\": $ROUNDS, $json}"
