#!/usr/bin/env bash
# The layering rule (docs/architecture.md), checked: no project file includes one from a layer
# above it, codec/ sees no gRPC, and the client sees it only in its transport (client/grpc/).
#   base < codec < proto < rpc < cluster < server, client < bench < tests (base/: the status
#   macros, which every layer may include); objstore/ (the object store, over libcurl) sees
#   only base/ and codec/endian.h (and nlohmann/json) and is seen by cluster/, the server and
#   the client
# Inside server/ (its rooms, each a sub-folder):
#   runtime < metrics < storage < tier < security < rules < service < the wiring (server/*.cc)
# (tier/: the object tier, over storage and objstore/)
# storage never includes security, rules or the service; the counters (metrics/) include nothing
# of the server's; gRPC is seen only by service/ and the wiring.
# bench/ sees the wire protocol (sluice/v1/) only where a bench plays a misbehaving client
# (tenants_bench.cc: tenant A announces frames it never sends and opens fetches it never reads)
# or asks what the client does not (restart_bench.cc: GetNode), and never the server: a start's
# data directory is written by sluice-fill (server/fill_main.cc).
set -uo pipefail
cd "$(dirname "$0")/.."
status=0
# allowed "..." include prefixes per folder (its own files, not its sub-folders'; system <...>
# includes are checked separately)
declare -A allowed=(
  [base]="base/ absl/"
  [codec]="base/ codec/ absl/"
  [objstore]="base/ objstore/ codec/endian.h absl/ nlohmann/"
  [rpc]="base/ rpc/ codec/ absl/ sluice/v1/"
  [cluster]="base/ cluster/ objstore/ rpc/ codec/ absl/ etcd/ spdlog/ nlohmann/"
  [server/runtime]="base/ server/runtime/ absl/"
  [server/net]="base/ server/net/ absl/ spdlog/"
  [server/metrics]="base/ server/metrics/ absl/"
  [server/storage]="base/ server/storage/ server/runtime/ server/metrics/ codec/ absl/ spdlog/"
  [server/tier]="base/ server/tier/ server/storage/ server/runtime/ server/metrics/ objstore/
                 codec/ absl/ spdlog/"
  [server/security]="base/ server/security/ server/storage/shuffle_id.h server/runtime/ rpc/tls.h
                     rpc/tls_options.h codec/ absl/ spdlog/"
  [server/rules]="base/ server/rules/ server/security/ server/storage/ server/runtime/
                  server/metrics/ server/tier/ objstore/
                  cluster/ rpc/error_reason.h codec/ absl/ spdlog/"
  [server/service]="base/ server/ cluster/ rpc/ codec/ absl/ sluice/v1/ spdlog/"
  [server]="base/ server/ cluster/ objstore/ rpc/ codec/ absl/ sluice/v1/ spdlog/"
  [client]="base/ client/ objstore/ rpc/ codec/ absl/ nlohmann/"
  [client/grpc]="base/ client/ rpc/ codec/ absl/ sluice/v1/"
  [client/python]="base/ client/ rpc/error_reason.h codec/endian.h codec/msgpack_scan.h absl/"
  [bench]="base/ bench/ client/ objstore/ codec/ rpc/error_reason.h rpc/tls_options.h sluice/v1/ absl/"
)
for dir in "${!allowed[@]}"; do
  while IFS=: read -r file line inc; do
    ok=0
    for prefix in ${allowed[$dir]}; do
      [[ $inc == "$prefix"* ]] && ok=1
    done
    if ((ok == 0)); then
      echo "$file:$line includes \"$inc\", from outside the layers $dir/ may use"
      status=1
    fi
  done < <(grep -Hn '^#include "' "$dir"/*.h "$dir"/*.cc 2>/dev/null |
           sed -E 's/^([^:]+):([0-9]+):#include "([^"]+)".*/\1:\2:\3/')
done
# Every server file is in a room the rule above knows.
for d in server/*/; do
  d=${d%/}
  [[ -n ${allowed[$d]+x} ]] || { echo "$d/ is a server room tests/check_layers.sh does not know"; status=1; }
done
# gRPC stays out of codec/ entirely, out of the client but its transport (client/grpc/), and in
# the server out of everything but the service (server/service/) and the wiring
# (server/sluice_server.cc).
if grep -Hn -E '#include [<"](grpc|grpcpp|sluice/v1|etcd/)' codec/*.h codec/*.cc client/*.h client/*.cc cluster/*.h \
    client/python/*.h client/python/*.cc server/*.h \
    $(ls server/*/*.h server/*/*.cc | grep -v '^server/service/'); then
  echo "the lines above include gRPC or generated code where no gRPC may be seen"
  status=1
fi
# The client's gRPC transport (client/grpc/) is included only by itself.
if grep -Hn '#include "client/grpc/' client/*.h client/*.cc client/python/*.h client/python/*.cc \
    bench/*.cc tests/*/*.h tests/*/*.cc 2>/dev/null; then
  echo "the lines above include the client's gRPC transport outside client/grpc/"
  status=1
fi
# The service's headers (which may show gRPC types) are included only by the service and the
# wiring.
if grep -Hn '#include "server/service/' $(ls server/*/*.h server/*/*.cc | grep -v '^server/service/') \
    client/*.h client/*.cc bench/*.cc tests/*/*.h tests/*/*.cc 2>/dev/null; then
  echo "the lines above include the gRPC service's headers outside server/service/ and the wiring"
  status=1
fi
((status == 0)) && echo "layers: ok"
exit $status
