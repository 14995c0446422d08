#!/bin/bash
# The object tier's upload rate (docs/benchmarks.md, "The object tier"): sluice-object-bench
# against an s3rver on loopback (npm's, in .tools/; SLUICE_S3RVER names another), one object of
# MB MiB at 1, 4 and 16 parts in flight, beside this machine's disk taking the same bytes, the
# sides interleaved round by round.
#
#   bash bench/object_upload_bench.sh [BUILD=build] [ROUNDS=3] [MB=256]
set -euo pipefail
source "$(dirname "$0")/lib.sh"
BUILD=${1:-build}
ROUNDS=${2:-3}
MB=${3:-256}
need_built "$BUILD/bench/sluice-object-bench" "$S3RVER"
scratch sluice-upload-bench
PORT=$((20000 + RANDOM % 20000))
start_s3rver "$PORT" sluice-bench
"$BUILD/bench/sluice-object-bench" --store s3://sluice-bench/up \
  --endpoint "http://127.0.0.1:$PORT" --mb "$MB" --rounds "$ROUNDS" --dir "$TMP"
