# Helpers the benchmark scripts share (sourced, not run).

# Waits until something listens on HOST:PORT (10 s at most); names it and fails otherwise.
wait_port() {  # host port
  for _ in $(seq 1 200); do
    (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null && return 0
    sleep 0.05
  done
  echo "$(basename "$0"): nothing listens on $1:$2" >&2
  return 1
}

# Fails, naming them, unless the built files given are there and executable.
need_built() {  # file...
  for f in "$@"; do
    [[ -x $f ]] || { echo "$(basename "$0"): $f is missing (build first)" >&2; exit 2; }
  done
}

# The items/s of a RESULT line on stdin.
items_per_sec() { sed -n 's/.*"items_per_sec": \([0-9]*\).*/\1/p'; }

# The number a JSON line on stdin gives for key $1 (a RESULT line's field).
field() { sed -n "s/.*\"$1\": \([0-9.]*\).*/\1/p"; }

# The median of the numbers given as arguments.
median() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END{print a[int((NR+1)/2)]}'; }

# A scratch directory in $TMP and a list $PIDS of background processes, cleaned up at exit:
# the processes killed and waited for, the directory removed.
scratch() {  # name
  TMP=$(mktemp -d "/tmp/$1.XXXXXX")
  PIDS=()
  trap 'for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$TMP"' EXIT
}

# A one-member etcd on 127.0.0.1:PORT (its peers' port PORT+1), its data in DIR and its log in
# DIR.log, its pid added to $PIDS; returns once it listens.
start_etcd() {  # port dir
  "${SLUICE_ETCD_BIN:-/usr/bin/etcd}" --name bench --data-dir "$2" \
    --listen-client-urls "http://127.0.0.1:$1" --advertise-client-urls "http://127.0.0.1:$1" \
    --listen-peer-urls "http://127.0.0.1:$(($1 + 1))" \
    --initial-advertise-peer-urls "http://127.0.0.1:$(($1 + 1))" \
    --initial-cluster "bench=http://127.0.0.1:$(($1 + 1))" >"$2.log" 2>&1 &
  PIDS+=($!)
  wait_port 127.0.0.1 "$1"
}

# N sluice-servers on 127.0.0.2, .3, ... at PORT, registered as NAME0, NAME1, ... under the etcd
# prefix /NAME/ of the etcd on 127.0.0.1:$EP, their data and logs in $TMP, their pids added to
# $PIDS (call it directly, not in $(...), so that the cleanup sees them); the list in $SERVERS.
start_sluice_cluster() {  # server_bin name port n [flags...]
  local bin=$1 name=$2 port=$3 n=$4 list=""
  shift 4
  for i in $(seq 0 $((n - 1))); do
    local host="127.0.0.$((i + 2))"
    "$bin" --data_dir="$TMP/$name$i" --listen="$host:$port" --etcd="127.0.0.1:$EP" \
      --etcd_prefix="/$name/" --node_id="$name$i" --node_lease_s=3 --worker_threads=2 \
      --memory_budget_mb=128 --log_level=warn "$@" >>"$TMP/$name$i.log" 2>&1 &
    PIDS+=($!)
    wait_port "$host" "$port"
    list+="${list:+,}$host:$port"
  done
  SERVERS=$list
}

# npm's s3rver (in .tools/ of the source tree; $SLUICE_S3RVER names another) on
# 127.0.0.1:PORT with bucket BUCKET, its data in $TMP/s3 and its log in $TMP/s3rver.log, its pid
# added to $PIDS; returns once it listens, with AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY
# exported as s3rver's own pair.
start_s3rver() {  # port bucket
  mkdir -p "$TMP/s3"
  NODE_OPTIONS=--openssl-legacy-provider "$S3RVER" --directory "$TMP/s3" --address 127.0.0.1 \
    --port "$1" --configure-bucket "$2" --silent >"$TMP/s3rver.log" 2>&1 &
  PIDS+=($!)
  wait_port 127.0.0.1 "$1"
  export AWS_ACCESS_KEY_ID=S3RVER AWS_SECRET_ACCESS_KEY=S3RVER
}

# Where s3rver is: $SLUICE_S3RVER, else this source tree's .tools/.
S3RVER=${SLUICE_S3RVER:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/.tools/node_modules/.bin/s3rver}
